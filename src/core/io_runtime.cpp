#include "core/io_runtime.h"

#include <pthread.h>

#include <exception>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include "core/env.h"
#include "core/fork_generation.h"
#include "core/log.h"
#include "core/op_state.h"
#include "dlslime/errors.h"

namespace dlslime {

namespace {

// Guards shared()'s current runtime. Held across fork() (prepare handler) so the child
// never inherits it locked by a thread that does not exist there.
std::mutex g_shared_mu;

void register_fork_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork([] { g_shared_mu.lock(); },  // prepare: no shared() half done at the fork
                   [] { g_shared_mu.unlock(); },  // parent
                   [] { g_shared_mu.unlock(); });  // child
  });
}

}  // namespace

namespace {
thread_local asio::io_context* t_current_context = nullptr;
}  // namespace

asio::io_context* IoRuntime::current_context() noexcept { return t_current_context; }

void IoRuntimeOptions::validate() const {
  if (threads < 1 || threads > kMaxThreads) {
    throw InvalidArgumentError(fmt::format("IoRuntime: {} I/O threads, must be in 1..{}", threads, kMaxThreads));
  }
}

IoRuntimeOptions IoRuntimeOptions::from_env() {
  IoRuntimeOptions o;
  o.threads = static_cast<unsigned>(env_integer("DLSLIME_IO_THREADS", 1, kMaxThreads, o.threads));
  return o;
}

IoRuntime::IoRuntime(const IoRuntimeOptions& options)
    : generation_(fork_generation()) {
  options.validate();
  const unsigned threads = options.threads;
  register_fork_handlers();
  for (unsigned i = 0; i < threads; ++i) {
    auto worker = std::make_unique<Worker>();
    Worker* w = worker.get();
    w->thread = std::thread([w, i] {
      t_current_context = &w->context;
      for (;;) {
        try {
          // One handler at a time, each inside a CompletionScope: the continuations of
          // ops it completes run once it has returned, never inside its bookkeeping.
          for (;;) {
            CompletionScope scope;
            if (w->context.run_one() == 0) return;
          }
        } catch (const std::exception& e) {
          // A handler must never take the process down; log and keep serving.
          DLSLIME_ERROR("I/O thread {}: unhandled exception in a handler: {}", i, e.what());
        }
      }
    });
    contexts_.push_back(std::move(worker));
  }
}

IoRuntime::~IoRuntime() {
  if (!usable()) {
    // A fork() child: the threads were never copied (joining or destroying their
    // std::thread would terminate), and the io_contexts' epoll instances are shared with
    // the parent, so stopping or destroying them could deregister the parent's sockets.
    // Leak all of it; the child's own runtime is a different object.
    for (auto& w : contexts_) (void)w.release();
    return;
  }
  for (auto& w : contexts_) {
    w->guard.reset();
    w->context.stop();
  }
  for (auto& w : contexts_) {
    // The last endpoint may be released by a handler on one of these threads.
    if (w->thread.get_id() == std::this_thread::get_id()) {
      // This thread is still inside context.run(): let it finish, and leak its context
      // rather than destroy it under the running handler.
      w->thread.detach();
      (void)w.release();
    } else if (w->thread.joinable()) {
      w->thread.join();
    }
  }
}

bool IoRuntime::usable() const noexcept {
  return generation_ == fork_generation();
}

namespace {

// shared()'s current runtime; guarded by g_shared_mu.
std::weak_ptr<IoRuntime>& current_runtime() {
  static std::weak_ptr<IoRuntime> current;
  return current;
}

// After a fork() the inherited runtime may still be alive (held by inherited endpoints),
// but its threads are not: a fresh one is made for this process.
std::shared_ptr<IoRuntime> live_runtime() {
  auto rt = current_runtime().lock();
  return rt && rt->usable() ? rt : nullptr;
}

}  // namespace

std::shared_ptr<IoRuntime> IoRuntime::shared() {
  register_fork_handlers();  // before g_shared_mu is first taken
  {
    std::lock_guard lock(g_shared_mu);
    if (auto rt = live_runtime()) return rt;
  }
  // The environment is read only when a runtime is about to be made.
  return shared(IoRuntimeOptions::from_env());
}

std::shared_ptr<IoRuntime> IoRuntime::shared(const IoRuntimeOptions& options) {
  register_fork_handlers();
  std::lock_guard lock(g_shared_mu);
  if (auto rt = live_runtime()) return rt;
  auto rt = std::make_shared<IoRuntime>(options);
  current_runtime() = rt;
  return rt;
}

asio::io_context& IoRuntime::next_context() {
  return contexts_[next_.fetch_add(1, std::memory_order_relaxed) % contexts_.size()]->context;
}

}  // namespace dlslime
