#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <variant>

#include "nanoctrl/store.h"

namespace dlslime::nanoctrl {

// The single-host store: everything in one process's memory, guarded by one mutex.
// Blocked list_pop calls wait on a condition variable per key, so a push wakes exactly
// the receivers of that mailbox within microseconds.
class MemoryStore final : public Store {
 public:
  MemoryStore() = default;

  std::string kind() const override { return "memory"; }
  std::string describe() const override { return "memory"; }
  void ping() override {}

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
  using Clock = std::chrono::steady_clock;
  using Value = std::variant<std::string, std::deque<std::string>, std::set<std::string>>;
  struct Entry {
    Value value;
    Clock::time_point expires_at = Clock::time_point::max();
  };
  struct Waiters {
    std::condition_variable cv;
    int count = 0;
  };

  // Returns the live entry or nullptr (erasing it when expired). Caller holds mu_.
  Entry* find_live(const std::string& key, Clock::time_point now);
  // Drops expired entries, at most once a second. Caller holds mu_.
  void maybe_purge(Clock::time_point now);
  static Clock::time_point deadline(Clock::time_point now, Millis ttl);

  std::mutex mu_;
  std::map<std::string, Entry> data_;
  std::map<std::string, Waiters> waiters_;
  Clock::time_point last_purge_{};
  bool interrupted_ = false;
};

}  // namespace dlslime::nanoctrl
