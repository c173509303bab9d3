#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <utility>
#include <vector>

namespace dlslime {

// Bounds the ops in flight on one endpoint: acquire() takes a slot or refuses (the caller
// fails the op with a resource status: backpressure is a value, not a wait), and the slot
// is given back when the Slot holding it is destroyed, wherever the op ends.
class InflightLimiter {
 public:
  // One op counted against the limit until it is finished (RAII, movable).
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& o) noexcept : count_(std::exchange(o.count_, nullptr)) {}
    Slot& operator=(Slot&& o) noexcept {
      std::swap(count_, o.count_);
      return *this;
    }
    ~Slot() {
      if (count_) count_->fetch_sub(1, std::memory_order_relaxed);
    }
    explicit operator bool() const { return count_ != nullptr; }

   private:
    friend class InflightLimiter;
    explicit Slot(std::atomic<uint32_t>* count) : count_(count) {}
    std::atomic<uint32_t>* count_ = nullptr;
  };

  explicit InflightLimiter(uint32_t limit) : limit_(limit) {}
  InflightLimiter(const InflightLimiter&) = delete;
  InflightLimiter& operator=(const InflightLimiter&) = delete;

  // A held slot, or an empty one when `limit` ops are in flight already. Must outlive
  // every Slot it hands out.
  Slot acquire() {
    if (count_.fetch_add(1, std::memory_order_relaxed) >= limit_) {
      count_.fetch_sub(1, std::memory_order_relaxed);
      return Slot();
    }
    return Slot(&count_);
  }
  uint32_t limit() const { return limit_; }
  uint32_t in_flight() const { return count_.load(std::memory_order_relaxed); }

 private:
  const uint32_t limit_;
  std::atomic<uint32_t> count_{0};
};

// The hand-off of submitted work from any thread to the one thread that owns an
// endpoint's state. push() from any thread; only a push that finds no drain scheduled is
// told to wake the consumer (post one drain()). A drain keeps taking what was pushed while
// it ran, for a few rounds, before it lets the consumer sleep: a burst of submissions
// that the consumer keeps up with one at a time still costs one wake-up, not one each
// (on a 2-core host each wake-up is a context switch; it was most of the small-message
// send cost, docs/performance.md). Items are built in place in the queue: no allocation
// per item once the vectors have grown, and one move of the caller's state (an op's
// state is large; the small-message path moves it as few times as it can).
template <class Item>
class SubmissionQueue {
 public:
  // Rounds one drain() takes before it yields the consumer thread to its other work (a
  // continuation that always submits again must not starve the sockets).
  static constexpr int kMaxRounds = 8;

  // Queues an Item made from `args`. True if no drain was scheduled: the caller must then
  // arrange one drain() on the consumer thread (later pushes ride on that one).
  template <class... Args>
  [[nodiscard]] bool push(Args&&... args) {
    std::lock_guard lock(mu_);
    items_.emplace_back(std::forward<Args>(args)...);
    return !std::exchange(scheduled_, true);
  }

  // Consumer thread only, once per push that returned true (and per repost): fn(Item&)
  // for everything queued, in push order, round after round until the queue is empty or
  // kMaxRounds have run; then, if items are left, repost() must arrange another drain()
  // (the queue stays scheduled, so no push does). Pushes made from inside fn (a
  // continuation submitting again) are taken by a later round. If fn throws, the other
  // items still get their turn (each is handled exactly once), the queue is settled
  // (repost() called if needed) and the first exception is rethrown at the end.
  template <class Fn, class Repost>
  void drain(Fn&& fn, Repost&& repost) {
    std::exception_ptr first_error;
    bool more = false;
    for (int round = 0;; ++round) {
      {
        std::lock_guard lock(mu_);
        if (items_.empty()) {
          scheduled_ = false;
          break;
        }
        if (round == kMaxRounds) {
          more = true;
          break;
        }
        draining_.swap(items_);
      }
      for (Item& item : draining_) {
        try {
          fn(item);
        } catch (...) {
          if (!first_error) first_error = std::current_exception();
        }
      }
      draining_.clear();  // keeps its capacity for the next burst
    }
    if (more) repost();
    if (first_error) std::rethrow_exception(first_error);
  }

 private:
  std::mutex mu_;
  std::vector<Item> items_;     // guarded by mu_
  bool scheduled_ = false;      // guarded by mu_: a drain() is posted or running
  std::vector<Item> draining_;  // consumer thread only: the batch being handled
};

}  // namespace dlslime
