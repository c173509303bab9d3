#include "core/fork_generation.h"

#include <pthread.h>

#include <atomic>
#include <mutex>
#include <vector>

namespace dlslime {

namespace {
std::atomic<unsigned long> g_generation{0};
}  // namespace

unsigned long fork_generation() noexcept {
  // Registered before the first object records a generation, so any fork after it counts.
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, [] { g_generation.fetch_add(1, std::memory_order_relaxed); });
    return true;
  }();
  (void)registered;
  return g_generation.load(std::memory_order_relaxed);
}

void keep_inherited(std::shared_ptr<const void> object) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::shared_ptr<const void>>();  // never destroyed
  std::lock_guard lock(mu);
  kept->push_back(std::move(object));
}

}  // namespace dlslime
