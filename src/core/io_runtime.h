#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>

namespace dlslime {

// The I/O runtime's configuration, parsed once when a runtime is made.
struct IoRuntimeOptions {
  static constexpr unsigned kMaxThreads = 256;
  // I/O threads (each its own io_context), 1..kMaxThreads. One thread is enough for a
  // few endpoints on loopback; more spread many endpoints over cores.
  unsigned threads = 1;

  // Throws InvalidArgumentError unless 1 <= threads <= kMaxThreads.
  void validate() const;
  // The defaults overridden by DLSLIME_IO_THREADS (InvalidArgumentError when it is not
  // an integer in 1..kMaxThreads).
  static IoRuntimeOptions from_env();
};

// The I/O threads, shared by every transport of a process. Each thread runs its own
// io_context; an endpoint is pinned to one of them, so all of that endpoint's sockets,
// timers and pending-op state live on a single thread and need no locks. User threads
// reach it with asio::post. Each handler runs inside a CompletionScope, so the
// continuations of the futures it completes run after it returns, outside its
// bookkeeping.
//
// The runtime is owned by the endpoints that use it: shared() returns the live instance
// or makes one, and it stops with its last user.
//
// fork(): the child inherits the runtime's memory but none of its threads, and its epoll
// instances are shared with the parent (closing or re-registering descriptors in them
// would change the parent's). A runtime therefore belongs to the process that made it:
// in any other process usable() is false, nothing may be posted to it, and its
// destructor leaks it instead of stopping, joining or destroying anything. shared() in a
// forked child makes a fresh runtime of its own.
class IoRuntime {
 public:
  static constexpr unsigned kMaxThreads = IoRuntimeOptions::kMaxThreads;

  // Throws InvalidArgumentError for options that do not validate().
  explicit IoRuntime(const IoRuntimeOptions& options);
  ~IoRuntime();
  IoRuntime(const IoRuntime&) = delete;
  IoRuntime& operator=(const IoRuntime&) = delete;

  // The live runtime of this process, or a new one made with `options` (by default
  // IoRuntimeOptions::from_env(), read only when a runtime is made). While one is live,
  // later callers share it whatever options they pass.
  static std::shared_ptr<IoRuntime> shared();
  static std::shared_ptr<IoRuntime> shared(const IoRuntimeOptions& options);

  // False in a process other than the one that created this runtime (a fork() child):
  // its threads do not run there, so work posted to it would never execute.
  bool usable() const noexcept;
  // The io_context this thread runs, if it is an I/O thread (nullptr otherwise). True
  // also while the continuations deferred after a handler run, where asio's
  // running_in_this_thread() is not.
  static asio::io_context* current_context() noexcept;

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
  // The process's fork generation when this runtime was made (core/fork_generation.h).
  const unsigned long generation_;
};

}  // namespace dlslime
