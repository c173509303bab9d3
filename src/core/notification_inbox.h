#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/op_limit.h"
#include "core/op_state.h"
#include "dlslime/status.h"

namespace dlslime {

// The receiving side of notifications, the same on every transport (docs/api.md
// "Notifications"): the peer's notifications in arrival order, each handed to exactly one
// recv_notify, oldest first; those no recv_notify has claimed yet are held within a
// budget, like unmatched messages, and one that would exceed it is refused (the sender's
// op fails), so a flooding peer costs a bounded amount of memory. recv_notify waits at
// most its deadline, and a timed-out one takes nothing: the next notification goes to
// the next recv_notify.
//
// Not thread-safe: it lives in the transport's state, under the transport's lock or on its
// I/O thread. Ops are never completed inside: each call appends what ended to `ended`, for
// the caller to complete (OpState::complete) once its bookkeeping is done.
class NotificationInbox {
 public:
  using Clock = std::chrono::steady_clock;
  struct Ended {
    std::shared_ptr<OpState> state;
    Status status;
    void complete() { state->complete(std::move(status)); }
  };
  using EndedList = std::vector<Ended>;

  // Held notifications cost their bytes plus kOverhead each, at most `budget_bytes` in all
  // (so their count is bounded too). `transport` names the option that sets the budget.
  NotificationInbox(uint64_t budget_bytes, const char* budget_option)
      : budget_(budget_bytes), budget_option_(budget_option) {}

  // A notification from the peer: handed to the oldest waiting recv_notify, or held.
  // Returns the refusal (kBatchOverflow, naming the budget) when holding it would exceed
  // the budget; the transport tells the sender.
  Status deliver(std::string bytes, EndedList& ended);
  // A recv_notify: takes the oldest held notification at once, fails at once if the peer
  // is gone and none is held (gone()), else waits until `limit` passes (set from now).
  // Returns its deadline (max: none, or it has ended), for the transport's timer.
  Clock::time_point post(std::shared_ptr<OpState> state, const OpLimit& limit, EndedList& ended);
  // Future::cancel: takes the recv_notify `state` out if it still waits (nothing was
  // received into it) and ends it with the user's cancellation; false if it does not wait.
  bool withdraw(const OpState& state, EndedList& ended);
  // Fails the recv_notifys past their deadline (kTimeout); returns the next deadline.
  Clock::time_point expire(Clock::time_point now, EndedList& ended);
  Clock::time_point next_deadline() const;

  // The peer is gone: waiting recv_notifys fail with `why`, and so do later ones once
  // nothing held is left, until a peer connects again (connected()). What was delivered
  // stays to be received (it was acknowledged to the sender), unless `drop_held`.
  void gone(const Status& why, bool drop_held, EndedList& ended);
  // A peer connected: recv_notify waits again; `drop_held`: it is another peer than
  // before, whose held notifications are dropped.
  void connected(bool drop_held);

  size_t held() const { return held_.size(); }
  static constexpr uint64_t kOverhead = 256;

 private:
  struct Waiter {
    std::shared_ptr<OpState> state;
    OpLimit limit;
    Clock::time_point deadline;
  };
  const uint64_t budget_;
  const char* const budget_option_;
  std::deque<std::string> held_;
  uint64_t held_bytes_ = 0;  // with kOverhead each
  std::deque<Waiter> waiting_;  // posting order
  Status gone_;                 // set while the peer is gone
};

}  // namespace dlslime
