#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <httplib.h>

namespace dlslime::nanoctrl {

// The workers that serve NanoCtrl's HTTP requests: the ConnectionGate hands each complete
// request to this pool, and a mailbox receive blocks its worker for its wait. The pool starts
// empty and adds a thread whenever a task arrives and no thread is idle, up to
// `max_threads`; past that, tasks queue until a thread frees up. Threads are kept once
// started (an idle thread costs only its stack). Which requests may block is bounded
// separately (NanoCtrlConfig::max_waiters), so ordinary requests always find a thread.
class GrowingThreadPool final : public httplib::TaskQueue {
 public:
  explicit GrowingThreadPool(std::size_t max_threads) : max_threads_(max_threads) {}
  ~GrowingThreadPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override;
  void shutdown() override;

  std::size_t threads() const;
  std::size_t busy() const;

 private:
  void worker();

  const std::size_t max_threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  std::size_t idle_ = 0;
  bool shutdown_ = false;
};

}  // namespace dlslime::nanoctrl
