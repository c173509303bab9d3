// Helpers every C++ test file shares: waiting on a condition with a deadline (never a bare
// sleep in an assertion), a vector's address as a region or chunk address, and a status
// code as the int a Future reports.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "dlslime/status.h"

namespace dlslime::test_support {

// Polls `pred` until it holds (true) or `timeout` passes (false).
inline bool wait_until(const std::function<bool()>& pred,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

inline uintptr_t addr_of(std::vector<uint8_t>& v) { return reinterpret_cast<uintptr_t>(v.data()); }

constexpr int code(StatusCode c) { return static_cast<int>(c); }

}  // namespace dlslime::test_support
