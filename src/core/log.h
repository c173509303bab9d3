#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>

#include <spdlog/spdlog.h>

namespace dlslime {

// The library's own logger (not in spdlog's global registry, so an application's spdlog
// setup is untouched). Created on first use; its level comes from DLSLIME_LOG_LEVEL then.
spdlog::logger& logger();

// For a log line that a peer or the OS can make repeat fast (one per refused connection):
// at most one line per interval, which reports how many events it stands for, so a flood
// cannot fill stderr (an undrained stderr blocks every thread that logs). Not thread-
// safe: one owner, on one thread.
class LogLimiter {
 public:
  explicit LogLimiter(std::chrono::steady_clock::duration interval) : interval_(interval) {}
  // Counts one event. Returns the number of events since the last line (this one
  // included) when a line is due now, else 0.
  uint64_t tick() {
    ++events_;
    const auto now = std::chrono::steady_clock::now();
    if (logged_ && now - last_ < interval_) return 0;
    logged_ = true;
    last_ = now;
    return std::exchange(events_, 0);
  }

 private:
  std::chrono::steady_clock::duration interval_;
  std::chrono::steady_clock::time_point last_{};
  bool logged_ = false;
  uint64_t events_ = 0;
};

}  // namespace dlslime

#define DLSLIME_TRACE(...) SPDLOG_LOGGER_TRACE(&::dlslime::logger(), __VA_ARGS__)
#define DLSLIME_DEBUG(...) SPDLOG_LOGGER_DEBUG(&::dlslime::logger(), __VA_ARGS__)
#define DLSLIME_INFO(...) SPDLOG_LOGGER_INFO(&::dlslime::logger(), __VA_ARGS__)
#define DLSLIME_WARN(...) SPDLOG_LOGGER_WARN(&::dlslime::logger(), __VA_ARGS__)
#define DLSLIME_ERROR(...) SPDLOG_LOGGER_ERROR(&::dlslime::logger(), __VA_ARGS__)
