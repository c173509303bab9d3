#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

// The storage NanoCtrl keeps its state in. NanoCtrl itself is stateless over a Store: with
// the Redis store several servers share one state, and restarting a server loses nothing.
// Keys and values are opaque strings (values are JSON text); the key layout lives in
// control_service.cpp. Every operation is atomic on its own.
namespace dlslime::nanoctrl {

using Millis = std::chrono::milliseconds;

// The backing store cannot be reached (Redis down). Requests get 503 with this message;
// the store reconnects on its own once the backend is back.
class StoreUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Store {
 public:
  virtual ~Store() = default;

  virtual std::string kind() const = 0;      // "memory" or "redis"
  virtual std::string describe() const = 0;  // e.g. "redis://127.0.0.1:6379/0" (no password)
  // Throws StoreUnavailable when the backend cannot be reached.
  virtual void ping() = 0;

  // Strings. `ttl` 0 means no expiry.
  virtual std::optional<std::string> get(const std::string& key) = 0;
  virtual std::vector<std::optional<std::string>> mget(const std::vector<std::string>& keys) = 0;
  virtual void set(const std::string& key, const std::string& value, Millis ttl) = 0;
  // Sets only when the key does not exist; false if it did.
  virtual bool set_if_absent(const std::string& key, const std::string& value, Millis ttl) = 0;
  // Deletes the key only if it holds exactly `value` (one atomic compare-and-delete); false
  // if it is missing or holds something else.
  virtual bool del_if_equal(const std::string& key, const std::string& value) = 0;
  // Restarts the key's expiry; false if the key does not exist.
  virtual bool expire(const std::string& key, Millis ttl) = 0;
  // Deletes the keys; returns how many existed.
  virtual std::size_t del(const std::vector<std::string>& keys) = 0;
  virtual int64_t incr(const std::string& key) = 0;
  // Live keys matching a glob where only '*' is a wildcard and '\' escapes (see glob_escape).
  virtual std::vector<std::string> keys(const std::string& pattern) = 0;

  // Lists (mailboxes). push appends unless the list already holds `max_len` items
  // (then nullopt) and restarts the list's expiry; it returns the new length.
  virtual std::optional<std::size_t> list_push(const std::string& key, const std::string& value,
                                               std::size_t max_len, Millis ttl) = 0;
  virtual std::size_t list_len(const std::string& key) = 0;
  // Removes and returns up to `max` items from the front, waiting up to `wait` for the first
  // one. Returns early (possibly empty) after interrupt().
  virtual std::vector<std::string> list_pop(const std::string& key, std::size_t max, Millis wait) = 0;

  // Sets of strings (no expiry).
  virtual void set_add(const std::string& key, const std::string& member) = 0;
  virtual std::vector<std::string> set_members(const std::string& key) = 0;

  // Wakes every blocked list_pop and makes later ones return at once (server shutdown).
  virtual void interrupt() = 0;
};

// Escapes the glob characters * ? [ ] \ so that `s` matches only itself.
std::string glob_escape(const std::string& s);
// Matches `text` against a glob of literal characters, '\'-escapes and '*' wildcards.
bool glob_match(const std::string& pattern, const std::string& text);
// The literal part of `pattern` before its first wildcard (a key range to scan).
std::string glob_literal_prefix(const std::string& pattern);

}  // namespace dlslime::nanoctrl
