#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace dlslime::nanoctrl {

// Request and error counters of one NanoCtrl process, rendered in Prometheus text format
// together with gauges the caller samples at scrape time.
class Metrics {
 public:
  void count_request(const std::string& route, int status);
  std::string render_counters() const;

  std::atomic<int64_t> waiters{0};            // mailbox receives blocked right now
  std::atomic<uint64_t> waiters_rejected{0};  // receives refused with 429 (max_waiters)
  std::atomic<uint64_t> auth_failures_missing{0};  // 401: no bearer token (token configured)
  std::atomic<uint64_t> auth_failures_wrong{0};    // 401: a bearer token that is not ours

 private:
  static const char* error_kind(int status);

  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> errors_;
};

// Escapes a Prometheus label value.
std::string prom_label(const std::string& v);

}  // namespace dlslime::nanoctrl
