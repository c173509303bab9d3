// The thread a transport completes its ops on (RDMA's CQ poller, NVLink's event waiter).
//
// It holds its endpoint alive while it runs: a continuation it runs may drop the last
// other reference, so the endpoint may be destroyed on this very thread, which then cannot
// join itself and detaches instead. Everywhere else the endpoint's owner joins it when the
// endpoint goes (the public endpoint's destructor): a thread still finishing after its
// endpoint is gone would tear down verbs or GPU objects while the process exits (static
// destructors, the sanitizers' exit-time leak check, which crashes on a thread that exits
// while it stops the world).
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace dlslime {

class CompletionThread {
 public:
  CompletionThread() = default;
  CompletionThread(const CompletionThread&) = delete;
  CompletionThread& operator=(const CompletionThread&) = delete;
  ~CompletionThread() { join(); }

  void start(std::function<void()> body) {
    std::lock_guard lock(mu_);
    // The thread records its own id before its body runs: the body asks is_current() at
    // once, possibly before std::thread's constructor has returned here.
    thread_ = std::thread([this, body = std::move(body)] {
      id_.store(std::this_thread::get_id());
      body();
    });
    id_.store(thread_.get_id());
  }

  bool is_current() const noexcept { return id_.load() == std::this_thread::get_id(); }

  // Waits for the thread to end (its body must be told to return first). On the thread
  // itself it detaches instead. Idempotent.
  void join() {
    std::lock_guard lock(mu_);
    if (!thread_.joinable()) return;
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }

 private:
  std::mutex mu_;
  std::thread thread_;
  std::atomic<std::thread::id> id_{};
};

}  // namespace dlslime
