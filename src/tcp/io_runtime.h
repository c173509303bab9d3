#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>

namespace dlslime::tcp {

// The I/O threads. Each thread runs its own io_context; an endpoint is pinned to one of
// them, so all of that endpoint's sockets, timers and pending-op state live on a single
// thread and need no locks. User threads reach it with asio::post.
//
// The runtime is owned by the endpoints that use it: shared() returns the live instance
// or makes one (sized by DLSLIME_IO_THREADS, default 1), and it stops with its last user.
class IoRuntime {
 public:
  explicit IoRuntime(unsigned threads);
  ~IoRuntime();
  IoRuntime(const IoRuntime&) = delete;
  IoRuntime& operator=(const IoRuntime&) = delete;

  static std::shared_ptr<IoRuntime> shared();

  // Round-robin choice of an io_context for a new endpoint.
  asio::io_context& next_context();
  unsigned size() const { return static_cast<unsigned>(contexts_.size()); }

 private:
  struct Worker {
    asio::io_context context{1};
    asio::executor_work_guard<asio::io_context::executor_type> guard{context.get_executor()};
    std::thread thread;
  };
  std::vector<std::unique_ptr<Worker>> contexts_;
  std::atomic<unsigned> next_{0};
};

}  // namespace dlslime::tcp
