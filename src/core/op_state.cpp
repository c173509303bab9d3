#include "core/op_state.h"

#include <utility>

namespace dlslime {

void OpState::record_error(const Status& status) {
  std::lock_guard lock(mu_);
  if (first_error_.is_ok()) first_error_ = status;
}

bool OpState::finish_part(const Status& status, uint64_t nbytes) {
  if (!status.is_ok()) record_error(status);
  nbytes_.fetch_add(nbytes, std::memory_order_relaxed);
  if (parts_left_.fetch_sub(1, std::memory_order_acq_rel) != 1) return false;
  Status final_status;
  {
    std::lock_guard lock(mu_);
    final_status = first_error_;
  }
  return complete(std::move(final_status));
}

bool OpState::complete(Status status, uint64_t nbytes) {
  std::function<void(const OpState&)> continuation;
  {
    std::lock_guard lock(mu_);
    if (done_.load(std::memory_order_relaxed)) return false;
    status_ = std::move(status);
    nbytes_.fetch_add(nbytes, std::memory_order_relaxed);
    done_.store(true, std::memory_order_release);
    continuation = std::move(continuation_);
  }
  cv_.notify_all();
  if (continuation) continuation(*this);
  return true;
}

void OpState::wait() const {
  if (done()) return;
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_.load(std::memory_order_relaxed); });
}

bool OpState::wait_for(std::chrono::nanoseconds timeout) const {
  if (done()) return true;
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return done_.load(std::memory_order_relaxed); });
}

void OpState::on_complete(std::function<void(const OpState&)> fn) {
  {
    std::lock_guard lock(mu_);
    if (!done_.load(std::memory_order_relaxed)) {
      continuation_ = std::move(fn);
      return;
    }
  }
  fn(*this);
}

}  // namespace dlslime
