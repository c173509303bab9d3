#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dlslime/endpoint.h"
#include "dlslime/status.h"

namespace dlslime {

class OpState;

// What a transport implements so that its ops can be cancelled (Future::cancel). One
// interface for every transport, not a std::function per op: attaching it costs an op
// no allocation.
class OpCanceller {
 public:
  // Withdraws op `op_id` (`op` is its state) if it still can: completes it with
  // OpState::cancelled_by_user() after dropping every reference to its local memory (the
  // fence unregister_memory_region gives) and returns true, only if that completion was
  // the one that ended the op. False if it has ended already or cannot be withdrawn now.
  // Called from any thread, an I/O thread's continuation included: it must not deadlock
  // there. Possibly several times for one op.
  virtual bool cancel_op(OpState& op, uint64_t op_id) = 0;

 protected:
  ~OpCanceller() = default;
};

// The completion object behind every Future (UCX/MORI pattern): an atomic done flag that
// waiters block on (a futex: no condition variable to build and tear down per op, and no
// wake-up syscall when nobody waits), a sticky first error and its continuations (the
// agent's own and any number of users', each run once, in registration order). An op may
// be split into parts (lanes, chunks); it completes when the last part finishes, with the
// first error any part reported.
//
// Ownership: the Future handles and the transport's pending-op table share it. The
// transport completes it from an I/O thread, never while holding a transport lock.
class OpState : public std::enable_shared_from_this<OpState> {
 public:
  explicit OpState(OpKind kind, uint32_t parts = 1) : kind_(kind), parts_left_(parts) {}

  OpKind kind() const noexcept { return kind_; }

  // Adds parts before the op is handed to the I/O threads.
  void add_parts(uint32_t n) noexcept { parts_left_.fetch_add(n, std::memory_order_relaxed); }
  // Finishes one part. Completes the op when it was the last one. Returns true if this call
  // completed the op.
  bool finish_part(const Status& status, uint64_t nbytes = 0);
  // Completes the op now with `status`, whatever parts are left (errors, deadlines,
  // shutdown). First completion wins; returns true if this call completed it.
  bool complete(Status status, uint64_t nbytes = 0);

  bool done() const noexcept { return done_.load(std::memory_order_acquire) != 0; }
  void wait() const;
  bool wait_for(std::chrono::nanoseconds timeout) const;

  // Valid once done().
  const Status& status() const noexcept { return status_; }
  uint64_t nbytes() const noexcept { return nbytes_.load(std::memory_order_relaxed); }
  // imm_recv: the immediate value that arrived. Set before complete(), which publishes it.
  void set_imm_data(uint32_t imm) noexcept { imm_data_.store(imm, std::memory_order_relaxed); }
  uint32_t imm_data() const noexcept { return imm_data_.load(std::memory_order_relaxed); }
  // recv_notify: the notification that arrived. Set before complete(), which publishes it.
  void set_notification(std::string bytes) { notification_ = std::move(bytes); }
  const std::string& notification() const noexcept { return notification_; }

  using Continuation = std::function<void(const OpState&)>;

  // Runs `fn` once the op completes (at once if it already has), on the completing thread;
  // inside a CompletionScope, when that scope closes. Adds to the continuations registered
  // before: they all run, in registration order. An exception from `fn` is logged and
  // goes no further.
  void on_complete(Continuation fn) { (void)add_continuation(std::move(fn)); }
  // on_complete() that can be taken back: returns a key for remove_continuation(), or 0
  // when the op had already completed (and `fn` has run).
  uint64_t add_continuation(Continuation fn);
  // Drops a continuation that has not started; false if it has (or `key` is unknown).
  // For waits that give up (wait_any's timeout): they must not leave one behind per try.
  bool remove_continuation(uint64_t key);

  // Cancellation (Future::cancel, docs/api.md "Cancellation"). The transport that owns
  // the op attaches itself when it submits the op, before handing it to another thread,
  // with the op's id in its own tables; held weakly: an op must not keep its endpoint alive.
  void set_canceller(std::weak_ptr<OpCanceller> canceller, uint64_t op_id);
  // False at once if the op has completed or has no canceller (its transport cannot
  // withdraw it); else the canceller's answer. True means this op completed with
  // StatusCode::kCancelled because of this call (first completion wins: a race with the
  // real completion has exactly one outcome).
  bool cancel();
  // The status of an op withdrawn by cancel().
  static Status cancelled_by_user();

 private:
  void record_error(const Status& status);
  // Blocks until done or `deadline` (nullptr: none).
  bool block(const std::chrono::steady_clock::time_point* deadline) const;

  const OpKind kind_;
  std::atomic<uint32_t> parts_left_;
  std::atomic<uint32_t> done_{0};             // 0 -> 1 once; the futex word waiters sleep on
  mutable std::atomic<uint32_t> waiters_{0};  // threads in block(): complete() wakes only if > 0
  std::atomic<uint64_t> nbytes_{0};
  std::atomic<uint32_t> imm_data_{0};
  std::string notification_;  // written once before complete(), read once done()
  mutable std::mutex mu_;  // first_error_, status_ and continuations_; never held while waiting
  Status first_error_;  // guarded by mu_
  Status status_;       // written once under mu_ before done_ is released
  // Registration order; taken (emptied) by complete(). Most ops have none or one.
  std::vector<std::pair<uint64_t, Continuation>> continuations_;  // guarded by mu_
  uint64_t next_key_ = 1;                                          // guarded by mu_
  std::weak_ptr<OpCanceller> canceller_;  // guarded by mu_; dropped by complete()
  uint64_t cancel_id_ = 0;                 // guarded by mu_
};

// For an op whose result is another op's (a decorator's or an agent's wrapper): makes
// outer.cancel() cancel `inner` and, if that worked, complete `outer` with inner's status
// at once (inner's continuation, which normally completes `outer`, may be deferred by a
// CompletionScope). Returns the canceller: whoever completes `outer` from `inner` keeps it
// (in inner's continuation), so it lives as long as there is an inner op to cancel. It
// holds `inner` weakly.
std::shared_ptr<OpCanceller> forward_cancel(OpState& outer, const std::shared_ptr<OpState>& inner);

// Continuations of ops completed while a CompletionScope is open on this thread run when
// the outermost scope closes, not inside complete(): after the code that completed them
// has finished its bookkeeping, never inside its loop over a table (a continuation may
// submit, shut the endpoint down or drop the last reference to it). Waiters are still
// woken at once. The I/O threads open one around every handler (IoRuntime), so every
// transport gets this without doing anything; code that completes ops on other threads
// opens its own where it iterates.
class CompletionScope {
 public:
  CompletionScope() noexcept;
  ~CompletionScope();
  CompletionScope(const CompletionScope&) = delete;
  CompletionScope& operator=(const CompletionScope&) = delete;

  // Queues fn(state) if a scope is open on this thread; false (the caller runs it) if not.
  static bool defer(std::shared_ptr<const OpState> state, std::function<void(const OpState&)>& fn);
};

}  // namespace dlslime
