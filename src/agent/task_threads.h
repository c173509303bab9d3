#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace dlslime {

// Threads for the agent's blocking side jobs (handshake dials, re-resolving a named op):
// one thread per job, so a dial that waits out its connect timeout holds up nothing else.
// Finished threads are joined on the next spawn; close() joins the rest and refuses new jobs.
// Shared with op continuations, which may outlive the agent.
class TaskThreads {
 public:
  ~TaskThreads() { close(); }

  // False (and `fn` not run) once closed.
  bool spawn(std::function<void()> fn) {
    std::lock_guard lock(mu_);
    if (closed_) return false;
    reap_locked();
    const uint64_t id = next_id_++;
    // The thread reports itself finished under mu_, which is held until it is in threads_.
    threads_.emplace(id, std::thread([this, id, fn = std::move(fn)] {
      fn();
      std::lock_guard done(mu_);
      finished_.push_back(id);
    }));
    return true;
  }

  void close() {
    std::map<uint64_t, std::thread> running;
    {
      std::lock_guard lock(mu_);
      closed_ = true;
      running.swap(threads_);
      finished_.clear();
    }
    for (auto& [id, t] : running) {
      if (t.get_id() == std::this_thread::get_id()) {
        t.detach();  // a job that ends the agent: it cannot join itself
      } else {
        t.join();
      }
    }
  }

 private:
  void reap_locked() {
    for (uint64_t id : finished_) {
      auto it = threads_.find(id);
      if (it == threads_.end()) continue;
      it->second.join();
      threads_.erase(it);
    }
    finished_.clear();
  }

  std::mutex mu_;
  bool closed_ = false;
  uint64_t next_id_ = 0;
  std::map<uint64_t, std::thread> threads_;
  std::vector<uint64_t> finished_;
};

}  // namespace dlslime
