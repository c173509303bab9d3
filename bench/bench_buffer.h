#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "gpu/device_runtime.h"

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

// The memory the transport registers: host memory, or GPU memory allocated through the
// device runtime (--device-memory). Host code never touches GPU memory (on the simulated GPU
// it would fault): the pattern and poison bytes are written into a pinned host copy and
// copied up, and the checks read a copy brought down, both with memcpy_async and an event.
class BenchBuffer {
 public:
  // Page-aligned host memory, touched at allocation so the first timed iteration does not pay
  // for page faults.
  static std::unique_ptr<BenchBuffer> host(uint64_t bytes);
  // GPU memory of `device` and its pinned host copy. Throws gpu::GpuUnavailableError without a
  // GPU runtime, InvalidArgumentError for a device the runtime does not have.
  static std::unique_ptr<BenchBuffer> device(uint64_t bytes, int device);
  ~BenchBuffer();
  BenchBuffer(const BenchBuffer&) = delete;
  BenchBuffer& operator=(const BenchBuffer&) = delete;

  uint64_t size() const { return size_; }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(memory_); }  // what is registered
  bool on_device() const { return runtime_ != nullptr; }
  int device() const { return device_; }
  // "cuda" or "sim" for GPU memory, "" for host memory.
  std::string runtime_name() const;

  // The bytes host code fills and checks: the memory itself, or the host copy of GPU memory.
  uint8_t* host_view() const { return on_device() ? mirror_ : memory_; }
  // GPU memory: copies [0, n) of the host copy to the device / all of the device to the host
  // copy, and waits for the copy. Nothing to do for host memory.
  void upload(uint64_t n);
  void download();

 private:
  BenchBuffer() = default;
  void copy_and_wait(void* dst, const void* src, uint64_t n);

  uint8_t* memory_ = nullptr;
  uint64_t size_ = 0;
  gpu::Runtime* runtime_ = nullptr;  // GPU memory: the runtime that allocated it
  int device_ = -1;
  uint8_t* mirror_ = nullptr;  // pinned
  gpu::Stream stream_ = nullptr;
  gpu::Event event_ = nullptr;
};

struct VerifyResult {
  bool ok = true;
  uint64_t bad_items = 0;  // destination slots whose payload differs
  std::string first_error;
};

// Per size and run: what seeds the pattern, and the poison byte of the destination.
uint64_t pattern_seed(uint64_t run_seed, uint64_t size_index);
uint8_t poison_byte(uint64_t size_index);

// Before the batches of one size (outside the timed region).
void fill_source(BenchBuffer& buf, const SlotLayout& layout, uint64_t seed);
void fill_poison(BenchBuffer& buf, uint8_t poison);
// Checks the destination after iteration `last_iter`; the whole buffer is examined.
// `corrupt` (--inject-corruption) flips one byte of an item first, to prove the check fails.
VerifyResult verify_destination(BenchBuffer& buf, const SlotLayout& layout, uint64_t seed, uint8_t poison,
                                uint64_t last_iter, bool corrupt);

}  // namespace dlslime::bench
