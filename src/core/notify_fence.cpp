#include "core/notify_fence.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "core/op_state.h"

namespace dlslime {

uint64_t NotifyFence::current_epoch() {
  std::lock_guard lock(mu_);
  ++in_flight_[epoch_];  // counted before the write can complete (track_write may come late)
  return epoch_;
}

Future NotifyFence::submit_write(OpRequest request, const std::function<Future(OpRequest)>& submit) {
  const uint64_t epoch = current_epoch();
  Future write;
  try {
    write = submit(std::move(request));
  } catch (...) {
    write_done(epoch);  // never submitted
    throw;
  }
  // Weak: an endpoint gone with writes still pending leaves nothing to release.
  write.state()->on_complete([weak = weak_from_this(), epoch](const OpState&) {
    if (auto self = weak.lock()) self->write_done(epoch);
  });
  return write;
}

void NotifyFence::write_done(uint64_t epoch) {
  {
    std::lock_guard lock(mu_);
    auto it = in_flight_.find(epoch);
    if (it == in_flight_.end()) return;
    if (--it->second == 0) in_flight_.erase(it);
    if (queued_.empty() || !front_ready_locked()) return;
  }
  pump();
}

bool NotifyFence::front_ready_locked() const {
  return in_flight_.empty() || in_flight_.begin()->first > queued_.front().epoch;
}

Future NotifyFence::write_then_notify(OpRequest request, const std::function<Future(OpRequest)>& submit) {
  Queued q;
  q.request.kind = OpKind::kSendNotify;
  q.request.notification = std::move(request.notification);
  q.request.timeout = request.timeout;
  request.notification.reset();
  q.write = submit_write(std::move(request), submit);
  q.user = std::make_shared<OpState>(OpKind::kWrite);
  Future user(q.user);
  enqueue(std::move(q));
  return user;
}

Future NotifyFence::send_notify(OpRequest request) {
  Queued q;
  q.user = std::make_shared<OpState>(OpKind::kSendNotify);
  q.request = std::move(request);
  Future user(q.user);
  enqueue(std::move(q));
  return user;
}

void NotifyFence::enqueue(Queued q) {
  {
    std::lock_guard lock(mu_);
    q.id = next_id_++;
    q.user->set_canceller(weak_from_this(), q.id);
    q.epoch = epoch_++;  // later writes join the next epoch: this one waits only for earlier
    queued_.push_back(std::move(q));
    if (!front_ready_locked()) return;
  }
  pump();
}

bool NotifyFence::cancel_op(OpState& user, uint64_t id) {
  Future write;
  {
    std::lock_guard lock(mu_);
    auto it = std::find_if(queued_.begin(), queued_.end(), [id](const Queued& q) { return q.id == id; });
    if (it == queued_.end()) return false;  // handed to the transport: it may arrive
    if (it->write.valid()) {
      write = it->write;  // cancelled below, outside the lock (its end pumps)
    } else {
      queued_.erase(it);  // never sent; those behind it may be ready now
    }
  }
  if (write.valid()) {
    if (!write.state()->cancel()) return false;  // the write goes on, and so will its notification
    std::lock_guard lock(mu_);
    std::erase_if(queued_, [id](const Queued& q) { return q.id == id; });
  }
  user.complete(OpState::cancelled_by_user());
  pump();
  return user.done() && user.status().code() == StatusCode::kCancelled;
}

void NotifyFence::pump() {
  std::unique_lock lock(mu_);
  if (pumping_) {
    repump_ = true;  // the pumping thread looks again before it stops
    return;
  }
  pumping_ = true;
  do {
    repump_ = false;
    while (!queued_.empty() && front_ready_locked()) {
      Queued q = std::move(queued_.front());
      queued_.pop_front();
      lock.unlock();
      if (q.write.valid() && !q.write.result().is_ok()) {
        // The carrying write failed (it has completed: its epoch is over): its
        // notification is not sent, and the user's future reports the write's error.
        q.user->complete(q.write.result());
      } else {
        const uint64_t nbytes = q.write.valid() ? q.write.nbytes() : 0;
        Future sent;
        try {
          sent = submit_notify_(std::move(q.request));
        } catch (const std::exception& e) {
          q.user->complete(Status::failed(fmt::format("the notification could not be sent: {}", e.what())));
        }
        if (sent.valid()) {
          sent.state()->on_complete([user = std::move(q.user), nbytes, carried = q.write.valid()](const OpState& s) {
            Status st = s.status();
            if (!st.is_ok() && carried) {
              st = Status(st.code(), fmt::format("the write completed, but its notification failed: {}", st.message()));
            }
            user->complete(std::move(st), st.is_ok() ? nbytes : 0);
          });
        }
      }
      lock.lock();
    }
  } while (repump_);
  pumping_ = false;
}

}  // namespace dlslime
