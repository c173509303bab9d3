#include "core/buffer_lease.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "core/same_host.h"

namespace dlslime {

namespace {

// The table: slabs of words, allocated as loans need them and never freed (a borrower may
// read a word long after its loan ended), and the words free for a new loan.
class LeaseTable {
 public:
  static LeaseTable& instance() {
    static auto* table = new LeaseTable;  // leaked: words must outlive every reader
    return *table;
  }

  uint64_t* take() {
    std::lock_guard lock(mu_);
    if (free_.empty()) {
      auto* slab = new std::atomic<uint64_t>[kSlabWords]();  // leaked, as the table
      for (size_t i = 0; i < kSlabWords; ++i) free_.push_back(reinterpret_cast<uint64_t*>(&slab[i]));
    }
    uint64_t* word = free_.back();
    free_.pop_back();
    return word;
  }

  void give_back(uint64_t* word) {
    std::lock_guard lock(mu_);
    free_.push_back(word);
  }

 private:
  static constexpr size_t kSlabWords = 4096;
  std::mutex mu_;
  std::vector<uint64_t*> free_;
};

std::atomic<uint64_t>& as_atomic(uint64_t* word) { return *reinterpret_cast<std::atomic<uint64_t>*>(word); }

}  // namespace

BufferLease BufferLease::take() {
  BufferLease lease;
  lease.word_ = LeaseTable::instance().take();
  lease.value_ = as_atomic(lease.word_).load(std::memory_order_acquire);
  return lease;
}

BufferLease& BufferLease::operator=(BufferLease&& other) noexcept {
  if (this != &other) {
    end();
    word_ = other.word_;
    value_ = other.value_;
    other.word_ = nullptr;
  }
  return *this;
}

void BufferLease::end() {
  if (!word_) return;
  // Sequentially consistent, and before the op completes: the owner can touch the buffer
  // only after this store, so a borrower whose read (after its copy) still sees the old
  // value copied bytes the owner had not touched yet.
  as_atomic(word_).fetch_add(1, std::memory_order_seq_cst);
  LeaseTable::instance().give_back(word_);
  word_ = nullptr;
}

Status check_lease(int pid, uint64_t address, uint64_t value) {
  // The copy's reads come before this one (a full fence, on top of the system calls').
  std::atomic_thread_fence(std::memory_order_seq_cst);
  uint64_t now = 0;
  const CrossCopy piece{reinterpret_cast<uint8_t*>(&now), address, sizeof now};
  if (Status st = cross_copy(pid, {&piece, 1}, true); !st) return st;
  if (now != value) {
    return Status::cancelled("the sender's op ended (its deadline, a cancel or a lost connection) while its "
                             "bytes were being copied");
  }
  return Status::ok();
}

}  // namespace dlslime
