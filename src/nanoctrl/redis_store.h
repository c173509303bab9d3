#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "nanoctrl/store.h"

struct redisContext;
struct redisReply;

namespace dlslime::nanoctrl {

// redis://[[user]:password@]host[:port][/db]
struct RedisUrl {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string user;
  std::string password;
  int db = 0;

  // Throws InvalidArgumentError saying what is wrong with the URL.
  static RedisUrl parse(const std::string& url);
  std::string to_string() const;  // without the password
};

// Redis through hiredis (Redis >= 6). Ordinary commands borrow a connection from a pool;
// each blocked list_pop (BLPOP) holds its own connection for the wait, so a waiter on one
// NanoCtrl wakes as soon as any NanoCtrl pushes to that list. Connection or I/O errors throw
// StoreUnavailable; broken connections are dropped and the next call connects again, so the
// store recovers by itself when Redis comes back.
class RedisStore final : public Store {
 public:
  RedisStore(const RedisUrl& url, Millis timeout);
  ~RedisStore() override;

  std::string kind() const override { return "redis"; }
  std::string describe() const override { return url_.to_string(); }
  void ping() override;

  std::optional<std::string> get(const std::string& key) override;
  std::vector<std::optional<std::string>> mget(const std::vector<std::string>& keys) override;
  void set(const std::string& key, const std::string& value, Millis ttl) override;
  bool set_if_absent(const std::string& key, const std::string& value, Millis ttl) override;
  bool del_if_equal(const std::string& key, const std::string& value) override;
  bool expire(const std::string& key, Millis ttl) override;
  std::size_t del(const std::vector<std::string>& keys) override;
  int64_t incr(const std::string& key) override;
  std::vector<std::string> keys(const std::string& pattern) override;

  std::optional<std::size_t> list_push(const std::string& key, const std::string& value, std::size_t max_len,
                                       Millis ttl) override;
  std::size_t list_len(const std::string& key) override;
  std::vector<std::string> list_pop(const std::string& key, std::size_t max, Millis wait) override;

  void set_add(const std::string& key, const std::string& member) override;
  std::vector<std::string> set_members(const std::string& key) override;

  void interrupt() override;

 private:
  struct ContextDeleter {
    void operator()(redisContext* c) const;
  };
  struct ReplyDeleter {
    void operator()(redisReply* r) const;
  };
  using Conn = std::unique_ptr<redisContext, ContextDeleter>;
  using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

  Conn connect();
  Conn acquire(bool* reused);
  void release(Conn conn);
  void drop_idle();
  // Runs one command on `conn`; nullptr on an I/O error (the connection is then unusable).
  Reply run(redisContext* conn, const std::vector<std::string>& args);
  // Runs one command on a pooled connection, retrying once on a fresh connection when a
  // reused one turns out dead (Redis restarted). Error replies throw.
  Reply command(const std::vector<std::string>& args);
  [[noreturn]] void unavailable(const std::string& what, const redisContext* conn) const;

  RedisUrl url_;
  Millis timeout_;
  std::mutex mu_;
  std::vector<Conn> idle_;
  std::set<int> blocked_fds_;  // connections inside BLPOP, shut down by interrupt()
  std::atomic<bool> interrupted_{false};
};

}  // namespace dlslime::nanoctrl
