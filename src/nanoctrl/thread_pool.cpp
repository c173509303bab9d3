#include "nanoctrl/thread_pool.h"

#include "core/log.h"

namespace dlslime::nanoctrl {

void GrowingThreadPool::enqueue(std::function<void()> fn) {
  std::lock_guard lock(mu_);
  jobs_.push_back(std::move(fn));
  if (idle_ < jobs_.size() && threads_.size() < max_threads_ && !shutdown_) {
    try {
      threads_.emplace_back([this] { worker(); });
    } catch (const std::system_error& e) {
      // Out of threads (ulimit): the task waits for a running thread instead.
      DLSLIME_WARN("nanoctrl: cannot start another HTTP thread ({} running): {}", threads_.size(), e.what());
    }
  }
  cv_.notify_one();
}

void GrowingThreadPool::worker() {
  std::unique_lock lock(mu_);
  for (;;) {
    ++idle_;
    cv_.wait(lock, [this] { return !jobs_.empty() || shutdown_; });
    --idle_;
    if (jobs_.empty()) return;  // shutdown with nothing left to do
    auto fn = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    fn();
    lock.lock();
  }
}

void GrowingThreadPool::shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mu_);
    shutdown_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (auto& t : threads) t.join();
}

std::size_t GrowingThreadPool::threads() const {
  std::lock_guard lock(mu_);
  return threads_.size();
}

std::size_t GrowingThreadPool::busy() const {
  std::lock_guard lock(mu_);
  return threads_.size() - idle_;
}

}  // namespace dlslime::nanoctrl
