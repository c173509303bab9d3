#pragma once

#include <cstdint>
#include <string>

namespace dlslime::bench {

// Where the items of one message size live in the registered buffer, and what they hold.
//
// The buffer is cut into slots of `stride` bytes; an item of `size` bytes sits at the start
// of its slot. Strided (default): stride = size rounded up to 64 plus a 64-byte guard gap, so
// no two items touch and a transport cannot merge them into one range. Contiguous: stride =
// size, items back to back.
//
// Verification without refilling buffers every iteration: the source side holds
// batch + rotations - 1 slots, slot j carrying pattern P(j mod batch). In iteration k the
// item i moves source slot i + r (r = k mod rotations) to destination slot i, so after it
// destination slot i must hold P((i + r) mod batch): consecutive iterations leave different
// bytes, and a lost, misplaced, stale or partial transfer is caught. The destination is
// filled with a poison byte before each size, and the checker also requires the guard gaps
// and the unused tail to keep it (nothing was written out of range).
struct SlotLayout {
  uint64_t size = 0;
  uint32_t batch = 0;
  uint32_t rotations = 0;  // min(batch, 16)
  uint64_t stride = 0;

  static SlotLayout make(uint64_t size, uint32_t batch, bool contiguous);
  uint64_t slots() const { return uint64_t{batch} + rotations - 1; }
  uint64_t bytes() const { return slots() * stride; }
  uint64_t offset(uint64_t slot) const { return slot * stride; }
  // The source slot of item `item` in iteration `iter`.
  uint64_t source_slot(uint32_t item, uint64_t iter) const { return item + iter % rotations; }
};

// Page-aligned memory that the transport registers. Pages are touched at allocation so the
// first timed iteration does not pay for page faults.
class BenchBuffer {
 public:
  explicit BenchBuffer(uint64_t bytes);
  ~BenchBuffer();
  BenchBuffer(const BenchBuffer&) = delete;
  BenchBuffer& operator=(const BenchBuffer&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(data_); }

 private:
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

struct VerifyResult {
  bool ok = true;
  uint64_t bad_items = 0;  // destination slots whose payload differs
  std::string first_error;
};

// Per size and run: what seeds the pattern, and the poison byte of the destination.
uint64_t pattern_seed(uint64_t run_seed, uint64_t size_index);
uint8_t poison_byte(uint64_t size_index);

void fill_source(const BenchBuffer& buf, const SlotLayout& layout, uint64_t seed);
void fill_poison(const BenchBuffer& buf, uint8_t poison);
// Checks the destination after iteration `last_iter`; the whole buffer is examined.
VerifyResult verify_destination(const BenchBuffer& buf, const SlotLayout& layout, uint64_t seed, uint8_t poison,
                                uint64_t last_iter);

}  // namespace dlslime::bench
