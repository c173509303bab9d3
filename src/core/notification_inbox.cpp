#include "core/notification_inbox.h"

#include <algorithm>

#include <fmt/format.h>

namespace dlslime {

Status NotificationInbox::deliver(std::string bytes, EndedList& ended) {
  if (!waiting_.empty()) {
    Waiter w = std::move(waiting_.front());
    waiting_.pop_front();
    w.state->set_notification(std::move(bytes));
    ended.push_back({std::move(w.state), Status::ok()});
    return Status::ok();
  }
  const uint64_t cost = bytes.size() + kOverhead;
  if (held_bytes_ + cost > budget_) {
    return Status(StatusCode::kBatchOverflow,
                  fmt::format("the peer refused the notification: {} unclaimed notifications ({} bytes with overhead) "
                              "fill its budget of {} bytes ({}); it takes more once its recv_notify claims them",
                              held_.size(), held_bytes_, budget_, budget_option_));
  }
  held_bytes_ += cost;
  held_.push_back(std::move(bytes));
  return Status::ok();
}

NotificationInbox::Clock::time_point NotificationInbox::post(std::shared_ptr<OpState> state, const OpLimit& limit,
                                                              EndedList& ended) {
  if (!held_.empty()) {
    held_bytes_ -= held_.front().size() + kOverhead;
    state->set_notification(std::move(held_.front()));
    held_.pop_front();
    ended.push_back({std::move(state), Status::ok()});
    return Clock::time_point::max();
  }
  if (!gone_.is_ok()) {
    ended.push_back({std::move(state), gone_});
    return Clock::time_point::max();
  }
  const auto deadline = limit.deadline();
  waiting_.push_back({std::move(state), limit, deadline});
  return deadline;
}

bool NotificationInbox::withdraw(const OpState& state, EndedList& ended) {
  auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const Waiter& w) { return w.state.get() == &state; });
  if (it == waiting_.end()) return false;
  ended.push_back({std::move(it->state), OpState::cancelled_by_user()});
  waiting_.erase(it);
  return true;
}

NotificationInbox::Clock::time_point NotificationInbox::expire(Clock::time_point now, EndedList& ended) {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->deadline > now) {
      ++it;
      continue;
    }
    ended.push_back(
        {std::move(it->state), Status::timeout(fmt::format("recv_notify: no notification arrived within {}",
                                                           it->limit.describe()))});
    it = waiting_.erase(it);
  }
  return next_deadline();
}

NotificationInbox::Clock::time_point NotificationInbox::next_deadline() const {
  auto next = Clock::time_point::max();
  for (const Waiter& w : waiting_) next = std::min(next, w.deadline);
  return next;
}

void NotificationInbox::gone(const Status& why, bool drop_held, EndedList& ended) {
  gone_ = why.is_ok() ? Status::peer_closed("the peer is gone") : why;
  for (Waiter& w : waiting_) ended.push_back({std::move(w.state), gone_});
  waiting_.clear();
  if (drop_held) {
    held_.clear();
    held_bytes_ = 0;
  }
}

void NotificationInbox::connected(bool drop_held) {
  if (drop_held) {
    held_.clear();
    held_bytes_ = 0;
  }
  gone_ = Status::ok();
}

}  // namespace dlslime
