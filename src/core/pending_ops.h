#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dlslime {

// Ops in flight by id, each with an optional deadline, for the one thread that owns them
// (an endpoint's I/O thread; no locks). Deadlines are kept in a binary min-heap beside
// the map, so expiring costs O(log n) per op that has a deadline, never a scan of every
// op per tick. An op that ends early (take) leaves its heap entry behind: expire() skips
// such stale entries when they reach the top, and the heap is compacted whenever stale
// entries outnumber live ones, so it stays within about twice the ops that have a
// deadline however many ops come and go.
//
// Every way out of the table takes the op out first (take, expire, moving the table),
// so the callback of expire() may insert, take or clear freely.
//
// An op is moved once on its way in and never on its way out: take() hands back the
// table's own node. Ops can be large (a TCP op's state is about 200 bytes), and a burst of
// small messages pays for every move twice over (move, then destroy the moved-from).
template <class Op, class Clock = std::chrono::steady_clock>
class PendingOps {
  struct Entry {
    Entry(Op&& o, typename Clock::time_point d) : op(std::move(o)), deadline(d) {}
    Op op;
    typename Clock::time_point deadline;
    uint64_t seq = 0;  // matches the op's heap entry (an id may come back after take())
  };
  using Map = std::unordered_map<uint64_t, Entry>;

 public:
  using TimePoint = typename Clock::time_point;
  static constexpr TimePoint kNever = TimePoint::max();

  // An op taken out of the table, still in the node it had there: it ends with this.
  class Taken {
   public:
    Taken() = default;
    explicit operator bool() const { return !node_.empty(); }
    Op& operator*() { return node_.mapped().op; }
    Op* operator->() { return &node_.mapped().op; }

   private:
    friend class PendingOps;
    explicit Taken(typename Map::node_type node) : node_(std::move(node)) {}
    typename Map::node_type node_;
  };

  PendingOps() = default;
  PendingOps(PendingOps&&) noexcept = default;
  PendingOps& operator=(PendingOps&&) noexcept = default;

  // Adds op `id`, ending at `deadline` (kNever: no deadline). Returns nullptr, changing
  // nothing, if `id` is already in the table.
  Op* insert(uint64_t id, Op&& op, TimePoint deadline = kNever) {
    auto [it, inserted] = ops_.try_emplace(id, std::move(op), deadline);
    if (!inserted) return nullptr;
    if (deadline != kNever) {
      it->second.seq = ++seq_;
      heap_.push_back({deadline, it->second.seq, id});
      std::push_heap(heap_.begin(), heap_.end(), Later{});
      ++timed_;
      if (heap_.size() > 2 * timed_ + kCompactSlack) compact();
    }
    return &it->second.op;
  }

  Op* find(uint64_t id) {
    auto it = ops_.find(id);
    return it == ops_.end() ? nullptr : &it->second.op;
  }
  bool contains(uint64_t id) const { return ops_.contains(id); }

  // Removes op `id` (the finish path); an empty Taken if it is not here (it already ended).
  Taken take(uint64_t id) {
    auto it = ops_.find(id);
    if (it == ops_.end()) return Taken();
    if (it->second.deadline != kNever) --timed_;
    return Taken(ops_.extract(it));
  }

  // Removes every op whose deadline is <= now, earliest first, and calls fn(id, Op&&) for
  // each once it is out of the table. Returns the earliest deadline still in the table
  // (kNever if none).
  template <class Fn>
  TimePoint expire(TimePoint now, Fn&& fn) {
    while (!heap_.empty()) {
      const HeapEntry top = heap_.front();
      auto it = live(top);
      if (it != ops_.end() && top.deadline > now) return top.deadline;
      std::pop_heap(heap_.begin(), heap_.end(), Later{});
      heap_.pop_back();
      if (it == ops_.end()) continue;  // stale: that op ended before its deadline
      Op op = std::move(it->second.op);
      --timed_;
      ops_.erase(it);
      fn(top.id, std::move(op));  // may change the table: nothing of it is held here
    }
    return kNever;
  }

  // The earliest deadline in the table (kNever if none); drops stale entries on the way.
  TimePoint next_deadline() {
    while (!heap_.empty()) {
      if (live(heap_.front()) != ops_.end()) return heap_.front().deadline;
      std::pop_heap(heap_.begin(), heap_.end(), Later{});
      heap_.pop_back();
    }
    return kNever;
  }

  // fn(id, const Op&) for every op, in no particular order. fn must not change the table.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (const auto& [id, e] : ops_) fn(id, e.op);
  }
  template <class Fn>
  void for_each(Fn&& fn) {
    for (auto& [id, e] : ops_) fn(id, e.op);
  }

  void clear() {
    ops_.clear();
    heap_.clear();
    timed_ = 0;
  }
  size_t size() const { return ops_.size(); }
  bool empty() const { return ops_.empty(); }
  // Heap entries, live and stale (tests: the heap stays bounded under churn).
  size_t heap_size() const { return heap_.size(); }

 private:
  // Compacting a heap this small is not worth its pass.
  static constexpr size_t kCompactSlack = 64;

  struct HeapEntry {
    TimePoint deadline;
    uint64_t seq;
    uint64_t id;
  };
  struct Later {  // std heaps are max-heaps: the latest deadline sinks
    bool operator()(const HeapEntry& a, const HeapEntry& b) const { return a.deadline > b.deadline; }
  };
  typename Map::iterator live(const HeapEntry& h) {
    auto it = ops_.find(h.id);
    return it != ops_.end() && it->second.seq == h.seq && it->second.deadline != kNever ? it : ops_.end();
  }
  // Drops the stale entries in place (no allocation) and restores the heap: O(heap),
  // run once stale entries outnumber live ones, so O(1) amortized per op.
  void compact() {
    std::erase_if(heap_, [this](const HeapEntry& h) { return live(h) == ops_.end(); });
    std::make_heap(heap_.begin(), heap_.end(), Later{});
  }

  Map ops_;
  std::vector<HeapEntry> heap_;
  size_t timed_ = 0;  // ops in ops_ with a deadline (= live heap entries)
  uint64_t seq_ = 0;
};

}  // namespace dlslime
