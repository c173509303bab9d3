#include "tcp/io_runtime.h"

#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>

#include "core/log.h"
#include "core/op_state.h"

namespace dlslime::tcp {

IoRuntime::IoRuntime(unsigned threads) {
  if (threads == 0) threads = 1;
  for (unsigned i = 0; i < threads; ++i) {
    auto worker = std::make_unique<Worker>();
    Worker* w = worker.get();
    w->thread = std::thread([w, i] {
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

std::shared_ptr<IoRuntime> IoRuntime::shared() {
  static std::mutex mu;
  static std::weak_ptr<IoRuntime> current;
  std::lock_guard lock(mu);
  if (auto rt = current.lock()) return rt;
  unsigned threads = 1;
  if (const char* env = std::getenv("DLSLIME_IO_THREADS"); env && *env) {
    try {
      threads = static_cast<unsigned>(std::stoul(env));
    } catch (const std::exception&) {
      DLSLIME_WARN("ignoring DLSLIME_IO_THREADS='{}': not a number", env);
    }
  }
  auto rt = std::make_shared<IoRuntime>(threads);
  current = rt;
  return rt;
}

asio::io_context& IoRuntime::next_context() {
  return contexts_[next_.fetch_add(1, std::memory_order_relaxed) % contexts_.size()]->context;
}

}  // namespace dlslime::tcp
