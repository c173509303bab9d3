#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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
  // recv_notify: the notification's bytes (empty otherwise).
  std::string notification() const;

  // Runs `callback` once, when the op ends (success or not), with a handle to this op.
  //   - If the op has not ended yet, the callback runs on a library thread: the I/O thread
  //     that completes the op, after the transport's bookkeeping (never under a transport
  //     lock), or the thread that ends it otherwise (shutdown(), a deadline).
  //   - If it has already ended, the callback runs at once, on the calling thread, before
  //     on_complete() returns.
  // Several callbacks may be registered on one op (copies of a Future included); they run
  // in registration order (one registered while the op is ending runs at once on its
  // caller's thread, possibly while earlier ones still run on the I/O thread). A callback must not block (no wait() on another op, no long
  // work): it holds up the I/O thread and every op it serves. It may submit new ops, and
  // it may shut the endpoint down. An exception it throws is logged and dropped; the
  // other callbacks still run. Throws InvalidArgumentError on an empty Future or callback.
  void on_complete(std::function<void(const Future&)> callback) const;

  // Withdraws the op if its transport still can (docs/api.md "Cancellation" has the table
  // per transport). Returns true only if the op has completed with StatusCode::kCancelled
  // because of this call; from then on the transport no longer touches the op's local
  // memory (the same fence unregister_memory_region gives), so it may be reused or freed.
  // An op still queued is never sent. The peer's side of a cancelled one-sided op may or
  // may not hold its bytes; a cancelled send is either never matched or received whole.
  // Returns false if the op has ended already (its status stays), or if the transport
  // cannot withdraw it now (it then ends as it would have). Any thread may call it, a
  // continuation (on_complete) included; it may wait briefly for the transport's thread,
  // never for the op. Throws InvalidArgumentError on an empty Future.
  bool cancel() const;

  bool valid() const noexcept { return state_ != nullptr; }
  const std::shared_ptr<OpState>& state() const noexcept { return state_; }

 private:
  std::shared_ptr<OpState> state_;
};

// Waiting on several ops at once. Both block the calling thread without spinning (they
// sleep until a completion wakes them) and throw InvalidArgumentError if any Future is
// empty (default-constructed).
//
// wait_any: the index of an op that has ended: the lowest index among those already done
// when called, else the first one to end. nullopt if none ended within `timeout`. Throws
// InvalidArgumentError on an empty vector (there is nothing that could end).
DLSLIME_API std::optional<size_t> wait_any(const std::vector<Future>& futures, std::chrono::nanoseconds timeout);
DLSLIME_API size_t wait_any(const std::vector<Future>& futures);  // no time limit
template <class Rep, class Period>
std::optional<size_t> wait_any(const std::vector<Future>& futures, std::chrono::duration<Rep, Period> timeout) {
  return wait_any(futures, std::chrono::duration_cast<std::chrono::nanoseconds>(timeout));
}

// wait_all: true once every op has ended (whatever its status), false if one is still
// running after `timeout`. An empty vector: true at once.
DLSLIME_API bool wait_all(const std::vector<Future>& futures, std::chrono::nanoseconds timeout);
DLSLIME_API void wait_all(const std::vector<Future>& futures);  // no time limit
template <class Rep, class Period>
bool wait_all(const std::vector<Future>& futures, std::chrono::duration<Rep, Period> timeout) {
  return wait_all(futures, std::chrono::duration_cast<std::chrono::nanoseconds>(timeout));
}

}  // namespace dlslime
