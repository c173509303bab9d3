#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include "core/op_state.h"
#include "dlslime/endpoint.h"

namespace dlslime {

// What a transport passes to Endpoint::order_notifications: its state's submit(), through
// a weak pointer, so that a notification released after the endpoint is gone (its writes
// completed by shutdown) ends CANCELLED instead of reaching freed state.
template <class Impl>
std::function<Future(OpRequest)> submit_while_alive(const std::shared_ptr<Impl>& impl) {
  return [weak = std::weak_ptr<Impl>(impl)](OpRequest request) {
    if (auto alive = weak.lock()) return alive->submit(std::move(request));
    auto state = std::make_shared<OpState>(request.kind);
    state->complete(Status::cancelled("the endpoint is gone"));
    return Future(std::move(state));
  };
}

// Orders an endpoint's notifications after its writes (docs/api.md "Notifications"): a
// notification goes to the transport only once every write submitted before it (and the
// write that carries it) has completed, and notifications go in the order they were
// submitted. A write completes at the initiator only after the target acknowledged its
// bytes in place (TCP's ack after placement and device copies, RDMA's RC acknowledgement,
// NVLink's stream event), so a notification the transport then sends on its in-order
// channel cannot overtake the data. One mechanism for every transport: a transport only
// provides the channel (Endpoint::order_notifications).
//
// Bookkeeping: writes are counted per epoch, an epoch being the writes submitted between
// two notifications; notification n waits for epochs <= n. O(log e) per write, e the
// epochs with a write still in flight (a handful).
//
// Threads: any. submit_notify is called without the lock held, by one thread at a time
// (the pump), so the transport sees notifications in order.
//
// Future::cancel on what it returns: a notification still queued here is withdrawn (never
// sent); a write carrying one is cancelled through to the transport's write, and if that
// is withdrawn, its notification is never sent either. One already handed to the
// transport is not withdrawn (it may arrive, whole).
class NotifyFence final : public OpCanceller, public std::enable_shared_from_this<NotifyFence> {
 public:
  explicit NotifyFence(std::function<Future(OpRequest)> submit_notify) : submit_notify_(std::move(submit_notify)) {}

  // A write (or write_with_imm) without a notification: submitted through `submit` and
  // counted in the current epoch until it completes (not at all if `submit` throws).
  Future submit_write(OpRequest request, const std::function<Future(OpRequest)>& submit);

  // A write carrying `notification` (request.notification set): submits the write through
  // `submit_write`, then queues the notification behind it. The returned future completes
  // with the write's error if it fails (the notification is then not sent), else with the
  // notification's status, with the write's byte count.
  Future write_then_notify(OpRequest request, const std::function<Future(OpRequest)>& submit);
  // send_notify: queued behind every write submitted before it.
  Future send_notify(OpRequest request);

  bool cancel_op(OpState& user, uint64_t id) override;

 private:
  struct Queued {
    uint64_t id = 0;  // for cancel_op
    uint64_t epoch = 0;
    OpRequest request;             // kSendNotify
    std::shared_ptr<OpState> user;  // what the user holds
    Future write;                  // the carrying write (write_then_notify), else invalid
  };
  // The epoch a write submitted now joins, counted in it at once (before it could complete).
  uint64_t current_epoch();
  void write_done(uint64_t epoch);
  void enqueue(Queued q);
  // Hands every ready notification to the transport, in order; one thread at a time.
  void pump();
  bool front_ready_locked() const;

  const std::function<Future(OpRequest)> submit_notify_;
  std::mutex mu_;
  uint64_t epoch_ = 0;                       // the epoch new writes join
  uint64_t next_id_ = 1;
  std::map<uint64_t, uint64_t> in_flight_;  // epoch -> writes of it still running
  std::deque<Queued> queued_;               // submission order
  bool pumping_ = false;
  bool repump_ = false;
};

}  // namespace dlslime
