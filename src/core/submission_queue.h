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
// endpoint's state. push() from any thread; only the push that finds the queue empty is
// told to wake the consumer (post one drain()), so a burst of submissions costs one post
// and one wake-up, and what is drained in one turn can leave in one write. Items are
// built in place in the queue: no allocation per item once the vectors have grown, and
// one move of the caller's state (an op's state is large; the small-message path moves
// it as few times as it can).
template <class Item>
class SubmissionQueue {
 public:
  // Queues an Item made from `args`. True if the queue was empty: the caller must then
  // arrange one drain() on the consumer thread (later pushes ride on that one).
  template <class... Args>
  [[nodiscard]] bool push(Args&&... args) {
    std::lock_guard lock(mu_);
    const bool first = items_.empty();
    items_.emplace_back(std::forward<Args>(args)...);
    return first;
  }

  // Consumer thread only: fn(Item&) for everything queued so far, in push order. Pushes
  // made from inside fn (a continuation submitting again) wait for the next drain(), which
  // their push has asked for. If fn throws, the other items still get their turn (each is
  // handled exactly once) and the first exception is rethrown at the end.
  template <class Fn>
  void drain(Fn&& fn) {
    {
      std::lock_guard lock(mu_);
      draining_.swap(items_);
    }
    std::exception_ptr first_error;
    for (Item& item : draining_) {
      try {
        fn(item);
      } catch (...) {
        if (!first_error) first_error = std::current_exception();
      }
    }
    draining_.clear();  // keeps its capacity for the next burst
    if (first_error) std::rethrow_exception(first_error);
  }

 private:
  std::mutex mu_;
  std::vector<Item> items_;     // guarded by mu_
  std::vector<Item> draining_;  // consumer thread only: the batch being handled
};

}  // namespace dlslime
