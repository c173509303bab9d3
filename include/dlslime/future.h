#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "dlslime/export.h"
#include "dlslime/status.h"

namespace dlslime {

class OpState;

// A shared handle to one submitted operation (a whole batch for read/write). Copies refer
// to the same operation. It completes exactly once, from a transport I/O thread; the first
// error wins. Waiting never spins.
class DLSLIME_API Future {
 public:
  Future() = default;
  explicit Future(std::shared_ptr<OpState> state) : state_(std::move(state)) {}

  // Blocks until the op completes; returns its status code (0 = success).
  int wait() const;
  // Returns the status code, or nullopt if the op is still running after `timeout`.
  std::optional<int> wait_for(std::chrono::nanoseconds timeout) const;
  template <class Rep, class Period>
  std::optional<int> wait_for(std::chrono::duration<Rep, Period> timeout) const {
    return wait_for(std::chrono::duration_cast<std::chrono::nanoseconds>(timeout));
  }
  bool done() const;
  // The status code and the reason (empty on success) once done(); while the op runs,
  // StatusCode::kPending and "operation still running".
  int status() const;
  std::string message() const;
  Status result() const;
  // Bytes that arrived (recv: the message length, read: bytes placed) or were moved.
  uint64_t nbytes() const;
  // imm_recv: the immediate value of the write_with_imm that completed it (0 otherwise).
  uint32_t imm_data() const;

  bool valid() const noexcept { return state_ != nullptr; }
  const std::shared_ptr<OpState>& state() const noexcept { return state_; }

 private:
  std::shared_ptr<OpState> state_;
};

}  // namespace dlslime
