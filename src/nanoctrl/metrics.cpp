#include "nanoctrl/metrics.h"

#include <fmt/format.h>

namespace dlslime::nanoctrl {

std::string prom_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

const char* Metrics::error_kind(int status) {
  switch (status) {
    case 400: return "bad_request";
    case 401: return "unauthorized";
    case 404: return "not_found";
    case 405: return "method_not_allowed";
    case 409: return "conflict";
    case 413: return "payload_too_large";
    case 429: return "too_many_requests";
    case 503: return "store_unavailable";
    default: return status >= 500 ? "internal" : "client_error";
  }
}

void Metrics::count_request(const std::string& route, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{route, status}];
  if (status >= 400) ++errors_[error_kind(status)];
}

std::string Metrics::render_counters() const {
  std::lock_guard lock(mu_);
  std::string out;
  out += "# HELP nanoctrl_requests_total HTTP requests served by this process, by route and status code.\n";
  out += "# TYPE nanoctrl_requests_total counter\n";
  for (const auto& [key, n] : requests_) {
    out += fmt::format("nanoctrl_requests_total{{route=\"{}\",code=\"{}\"}} {}\n", prom_label(key.first),
                       key.second, n);
  }
  out += "# HELP nanoctrl_errors_total Error replies of this process, by kind.\n";
  out += "# TYPE nanoctrl_errors_total counter\n";
  for (const char* kind : {"bad_request", "unauthorized", "not_found", "method_not_allowed", "conflict",
                           "payload_too_large", "too_many_requests", "store_unavailable", "internal", "client_error"}) {
    auto it = errors_.find(kind);
    out += fmt::format("nanoctrl_errors_total{{kind=\"{}\"}} {}\n", kind, it == errors_.end() ? 0 : it->second);
  }
  out += "# HELP nanoctrl_mailbox_waiters Mailbox receives blocked in this process now.\n";
  out += "# TYPE nanoctrl_mailbox_waiters gauge\n";
  out += fmt::format("nanoctrl_mailbox_waiters {}\n", waiters.load());
  out += "# HELP nanoctrl_mailbox_waiters_rejected_total Receives refused because max_waiters were blocked.\n";
  out += "# TYPE nanoctrl_mailbox_waiters_rejected_total counter\n";
  out += fmt::format("nanoctrl_mailbox_waiters_rejected_total {}\n", waiters_rejected.load());
  out += "# HELP nanoctrl_auth_failures_total Requests refused with 401: no bearer token (missing) or a wrong one.\n";
  out += "# TYPE nanoctrl_auth_failures_total counter\n";
  out += fmt::format("nanoctrl_auth_failures_total{{reason=\"missing\"}} {}\n", auth_failures_missing.load());
  out += fmt::format("nanoctrl_auth_failures_total{{reason=\"wrong\"}} {}\n", auth_failures_wrong.load());
  return out;
}

}  // namespace dlslime::nanoctrl
