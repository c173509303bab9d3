#include "nanoctrl/memory_store.h"

#include <algorithm>
#include <stdexcept>

namespace dlslime::nanoctrl {

namespace {

// A key holding another type than the operation expects is a programming error in the
// service's key layout, reported as 500 by the HTTP layer.
[[noreturn]] void wrong_type(const std::string& key) {
  throw std::logic_error("store key '" + key + "' holds another type");
}

}  // namespace

std::string glob_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

std::string glob_literal_prefix(const std::string& pattern) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      out.push_back(pattern[++i]);
    } else if (c == '*' || c == '?' || c == '[') {
      break;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

bool glob_match(const std::string& pattern, const std::string& text) {
  // Iterative wildcard match with backtracking to the last '*': O(|p|*|t|) worst case.
  std::size_t p = 0, t = 0, star_p = std::string::npos, star_t = 0;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star_p = p++;
      star_t = t;
      continue;
    }
    if (p < pattern.size()) {
      char want = pattern[p];
      std::size_t step = 1;
      if (want == '\\' && p + 1 < pattern.size()) {
        want = pattern[p + 1];
        step = 2;
      }
      if (want == text[t]) {
        p += step;
        ++t;
        continue;
      }
    }
    if (star_p == std::string::npos) return false;
    p = star_p + 1;
    t = ++star_t;
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

MemoryStore::Clock::time_point MemoryStore::deadline(Clock::time_point now, Millis ttl) {
  return ttl.count() > 0 ? now + ttl : Clock::time_point::max();
}

MemoryStore::Entry* MemoryStore::find_live(const std::string& key, Clock::time_point now) {
  auto it = data_.find(key);
  if (it == data_.end()) return nullptr;
  if (it->second.expires_at <= now) {
    data_.erase(it);
    return nullptr;
  }
  return &it->second;
}

void MemoryStore::maybe_purge(Clock::time_point now) {
  if (now - last_purge_ < std::chrono::seconds(1)) return;
  last_purge_ = now;
  std::erase_if(data_, [now](const auto& kv) { return kv.second.expires_at <= now; });
}

std::optional<std::string> MemoryStore::get(const std::string& key) {
  std::lock_guard lock(mu_);
  Entry* e = find_live(key, Clock::now());
  if (!e) return std::nullopt;
  auto* s = std::get_if<std::string>(&e->value);
  if (!s) wrong_type(key);
  return *s;
}

std::vector<std::optional<std::string>> MemoryStore::mget(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  auto now = Clock::now();
  std::vector<std::optional<std::string>> out;
  out.reserve(keys.size());
  for (const auto& key : keys) {
    Entry* e = find_live(key, now);
    auto* s = e ? std::get_if<std::string>(&e->value) : nullptr;
    out.push_back(s ? std::optional<std::string>(*s) : std::nullopt);
  }
  return out;
}

void MemoryStore::set(const std::string& key, const std::string& value, Millis ttl) {
  std::lock_guard lock(mu_);
  auto now = Clock::now();
  maybe_purge(now);
  data_[key] = Entry{value, deadline(now, ttl)};
}

bool MemoryStore::set_if_absent(const std::string& key, const std::string& value, Millis ttl) {
  std::lock_guard lock(mu_);
  auto now = Clock::now();
  maybe_purge(now);
  if (find_live(key, now)) return false;
  data_[key] = Entry{value, deadline(now, ttl)};
  return true;
}

bool MemoryStore::del_if_equal(const std::string& key, const std::string& value) {
  std::lock_guard lock(mu_);
  Entry* e = find_live(key, Clock::now());
  const auto* held = e ? std::get_if<std::string>(&e->value) : nullptr;
  if (!held || *held != value) return false;
  data_.erase(key);
  return true;
}

bool MemoryStore::expire(const std::string& key, Millis ttl) {
  std::lock_guard lock(mu_);
  auto now = Clock::now();
  Entry* e = find_live(key, now);
  if (!e) return false;
  e->expires_at = deadline(now, ttl);
  return true;
}

std::size_t MemoryStore::del(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  auto now = Clock::now();
  std::size_t n = 0;
  for (const auto& key : keys) {
    if (find_live(key, now)) {
      data_.erase(key);
      ++n;
    }
  }
  return n;
}

int64_t MemoryStore::incr(const std::string& key) {
  std::lock_guard lock(mu_);
  auto now = Clock::now();
  Entry* e = find_live(key, now);
  int64_t v = 0;
  if (e) {
    auto* s = std::get_if<std::string>(&e->value);
    if (!s) wrong_type(key);
    v = std::stoll(*s);
  }
  ++v;
  if (e) {
    e->value = std::to_string(v);
  } else {
    data_[key] = Entry{std::to_string(v), Clock::time_point::max()};
  }
  return v;
}

std::vector<std::string> MemoryStore::keys(const std::string& pattern) {
  std::lock_guard lock(mu_);
  auto now = Clock::now();
  std::string prefix = glob_literal_prefix(pattern);
  std::vector<std::string> out;
  for (auto it = data_.lower_bound(prefix); it != data_.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    if (it->second.expires_at > now && glob_match(pattern, it->first)) out.push_back(it->first);
  }
  return out;
}

std::optional<std::size_t> MemoryStore::list_push(const std::string& key, const std::string& value,
                                                  std::size_t max_len, Millis ttl) {
  std::size_t len;
  {
    std::lock_guard lock(mu_);
    auto now = Clock::now();
    maybe_purge(now);
    Entry* e = find_live(key, now);
    if (!e) e = &(data_[key] = Entry{std::deque<std::string>{}, Clock::time_point::max()});
    auto* list = std::get_if<std::deque<std::string>>(&e->value);
    if (!list) wrong_type(key);
    if (list->size() >= max_len) return std::nullopt;
    list->push_back(value);
    e->expires_at = deadline(now, ttl);
    len = list->size();
    auto w = waiters_.find(key);
    if (w != waiters_.end()) w->second.cv.notify_all();
  }
  return len;
}

std::size_t MemoryStore::list_len(const std::string& key) {
  std::lock_guard lock(mu_);
  Entry* e = find_live(key, Clock::now());
  if (!e) return 0;
  auto* list = std::get_if<std::deque<std::string>>(&e->value);
  if (!list) wrong_type(key);
  return list->size();
}

std::vector<std::string> MemoryStore::list_pop(const std::string& key, std::size_t max, Millis wait) {
  std::unique_lock lock(mu_);
  auto until = Clock::now() + wait;
  std::vector<std::string> out;
  auto try_pop = [&] {
    Entry* e = find_live(key, Clock::now());
    if (!e) return false;
    auto* list = std::get_if<std::deque<std::string>>(&e->value);
    if (!list) wrong_type(key);
    while (!list->empty() && out.size() < max) {
      out.push_back(std::move(list->front()));
      list->pop_front();
    }
    if (list->empty()) data_.erase(key);
    return !out.empty();
  };
  if (try_pop() || wait.count() <= 0 || interrupted_) return out;

  Waiters& w = waiters_[key];
  ++w.count;
  while (!interrupted_ && !try_pop()) {
    if (w.cv.wait_until(lock, until) == std::cv_status::timeout) {
      try_pop();
      break;
    }
  }
  if (--w.count == 0) waiters_.erase(key);
  return out;
}

void MemoryStore::set_add(const std::string& key, const std::string& member) {
  std::lock_guard lock(mu_);
  auto now = Clock::now();
  Entry* e = find_live(key, now);
  if (!e) e = &(data_[key] = Entry{std::set<std::string>{}, Clock::time_point::max()});
  auto* s = std::get_if<std::set<std::string>>(&e->value);
  if (!s) wrong_type(key);
  s->insert(member);
}

std::vector<std::string> MemoryStore::set_members(const std::string& key) {
  std::lock_guard lock(mu_);
  Entry* e = find_live(key, Clock::now());
  if (!e) return {};
  auto* s = std::get_if<std::set<std::string>>(&e->value);
  if (!s) wrong_type(key);
  return {s->begin(), s->end()};
}

void MemoryStore::interrupt() {
  std::lock_guard lock(mu_);
  interrupted_ = true;
  for (auto& [key, w] : waiters_) w.cv.notify_all();
}

}  // namespace dlslime::nanoctrl
