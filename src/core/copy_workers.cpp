#include "core/copy_workers.h"

#include <pthread.h>

#include <algorithm>
#include <exception>

#include "core/env.h"
#include "core/fork_generation.h"
#include "core/log.h"

namespace dlslime {

CopyWorkers::CopyWorkers(unsigned threads) {
  threads_.reserve(threads);
  for (unsigned i = 0; i < threads; ++i) {
    threads_.emplace_back([this] { run(); });
    threads_.back().detach();  // never joined: the pool lives as long as the process
  }
}

namespace {
// Guards the pool's making. Held across fork() (prepare handler), so that a child never
// inherits it locked by a thread that does not exist there.
std::mutex g_pool_mu;
}  // namespace

CopyWorkers& CopyWorkers::shared() {
  static CopyWorkers* pool = nullptr;
  static unsigned long generation = 0;
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork([] { g_pool_mu.lock(); }, [] { g_pool_mu.unlock(); }, [] { g_pool_mu.unlock(); });
  });
  std::lock_guard lock(g_pool_mu);
  if (!pool || generation != fork_generation()) {
    // First use, or a fork() child: the inherited pool's threads are the parent's (it is
    // leaked, as it always is).
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const auto threads = static_cast<unsigned>(env_integer("DLSLIME_COPY_THREADS", 1, 64, std::min(4u, cores)));
    pool = new CopyWorkers(threads);
    generation = fork_generation();
  }
  return *pool;
}

void CopyWorkers::submit(std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void CopyWorkers::run() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return !jobs_.empty(); });
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    try {
      job();
    } catch (const std::exception& e) {
      DLSLIME_ERROR("a copy job failed: {}", e.what());
    }
  }
}

}  // namespace dlslime
