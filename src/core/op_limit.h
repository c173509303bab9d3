#pragma once

#include <chrono>
#include <string>

#include <fmt/format.h>

namespace dlslime {

// How long one op or wait may take, and where that figure came from: the op's own timeout
// (OpRequest::timeout) when it set one, else the endpoint's default for its kind
// (op_timeout, recv_timeout). Every transport keeps one with each op so that the TIMEOUT
// it ends with names the limit that applied; a user who set neither learns which option
// to raise.
struct OpLimit {
  using Clock = std::chrono::steady_clock;

  std::chrono::milliseconds limit{0};  // zero: no deadline
  const char* source = "";             // "its timeout", or the option's name (a literal)

  // `requested` > 0 wins; else `endpoint_default`, named `option` in messages.
  static OpLimit of(std::chrono::milliseconds requested, std::chrono::milliseconds endpoint_default,
                    const char* option) {
    if (requested.count() > 0) return {requested, "its timeout"};
    return {endpoint_default, option};
  }

  bool none() const { return limit.count() <= 0; }
  // `now` + limit, or time_point::max() when there is none.
  Clock::time_point deadline_from(Clock::time_point now) const { return none() ? Clock::time_point::max() : now + limit; }
  Clock::time_point deadline() const { return deadline_from(none() ? Clock::time_point() : Clock::now()); }
  // "250 ms (its timeout)", for a TIMEOUT's message.
  std::string describe() const { return fmt::format("{} ms ({})", limit.count(), source); }
};

}  // namespace dlslime
