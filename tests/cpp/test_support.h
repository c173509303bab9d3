// Helpers every C++ test file shares: waiting on a condition with a deadline (never a bare
// sleep in an assertion), a vector's address as a region or chunk address, and a status
// code as the int a Future reports.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <functional>
#include <string>
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

// A check in a death test's child (a process of its own, for what nothing in the parent
// can undo, such as a sticky GPU error): a failure prints what broke and exits 1, which the
// parent's EXPECT_EXIT(..., ExitedWithCode(0), "") reports with the output.
inline void require_in_child(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  std::_Exit(1);
}

inline uintptr_t addr_of(std::vector<uint8_t>& v) { return reinterpret_cast<uintptr_t>(v.data()); }

constexpr int code(StatusCode c) { return static_cast<int>(c); }

}  // namespace dlslime::test_support
