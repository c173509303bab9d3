#include "bench_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <stdexcept>

#include <fmt/format.h>

namespace dlslime::bench {

namespace {

constexpr uint64_t kGuardBytes = 64;
constexpr uint32_t kMaxRotations = 16;

uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The pattern of one item: a stream of 64-bit words, distinct per seed, item and word.
class ItemPattern {
 public:
  ItemPattern(uint64_t seed, uint64_t item) : base_(mix64(seed ^ mix64(item + 1))) {}
  uint64_t word(uint64_t w) const { return mix64(base_ + w * 0xD1B54A32D192ED03ull); }

  void fill(uint8_t* out, uint64_t size) const {
    uint64_t w = 0;
    for (; (w + 1) * 8 <= size; ++w) {
      const uint64_t v = word(w);
      std::memcpy(out + w * 8, &v, 8);
    }
    if (const uint64_t tail = size - w * 8; tail != 0) {
      const uint64_t v = word(w);
      std::memcpy(out + w * 8, &v, tail);
    }
  }

  // Offset of the first byte that differs, or `size` if all match.
  uint64_t first_mismatch(const uint8_t* in, uint64_t size) const {
    uint64_t w = 0;
    for (; (w + 1) * 8 <= size; ++w) {
      const uint64_t v = word(w);
      if (std::memcmp(in + w * 8, &v, 8) != 0) break;
    }
    uint8_t expect[8];
    const uint64_t v = word(w);
    std::memcpy(expect, &v, 8);
    for (uint64_t b = w * 8; b < size && b < w * 8 + 8; ++b) {
      if (in[b] != expect[b - w * 8]) return b;
    }
    return size;
  }

  uint8_t byte_at(uint64_t b) const {
    const uint64_t v = word(b / 8);
    uint8_t bytes[8];
    std::memcpy(bytes, &v, 8);
    return bytes[b % 8];
  }

 private:
  uint64_t base_;
};

// Offset of the first byte in [from, to) that is not `poison`, or `to`.
uint64_t first_not_poison(const uint8_t* p, uint64_t from, uint64_t to, uint8_t poison) {
  uint64_t wide = 0;
  std::memset(&wide, poison, sizeof wide);
  uint64_t i = from;
  for (; i < to && i % 8 != 0; ++i) {
    if (p[i] != poison) return i;
  }
  for (; i + 8 <= to; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    if (v != wide) break;
  }
  for (; i < to; ++i) {
    if (p[i] != poison) return i;
  }
  return to;
}

}  // namespace

SlotLayout SlotLayout::make(uint64_t size, uint32_t batch, bool contiguous) {
  SlotLayout l;
  l.size = size;
  l.batch = batch;
  l.rotations = std::min(batch, kMaxRotations);
  l.stride = contiguous ? size : (size + 63) / 64 * 64 + kGuardBytes;
  return l;
}

std::unique_ptr<BenchBuffer> BenchBuffer::host(uint64_t bytes) {
  void* p = ::mmap(nullptr, std::max<uint64_t>(bytes, 1), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) {
    throw std::runtime_error(fmt::format("cannot allocate a {:.1f} MiB benchmark buffer (lower --batch or the "
                                         "largest size)",
                                         static_cast<double>(bytes) / (1 << 20)));
  }
  std::unique_ptr<BenchBuffer> b(new BenchBuffer());
  b->memory_ = static_cast<uint8_t*>(p);
  b->size_ = bytes;
  return b;
}

std::unique_ptr<BenchBuffer> BenchBuffer::device(uint64_t bytes, int device) {
  gpu::Runtime& rt = gpu::runtime();  // GpuUnavailableError without one
  std::unique_ptr<BenchBuffer> b(new BenchBuffer());
  b->size_ = bytes;
  b->device_ = device;
  const size_t n = std::max<uint64_t>(bytes, 1);
  // Each step is undone by the destructor, which frees what runtime_ says was allocated.
  b->memory_ = static_cast<uint8_t*>(rt.device_alloc(device, n));
  b->runtime_ = &rt;
  b->mirror_ = static_cast<uint8_t*>(rt.pinned_alloc(n));
  b->stream_ = rt.stream_create(device);
  b->event_ = rt.event_create(device);
  return b;
}

BenchBuffer::~BenchBuffer() {
  if (!runtime_) {
    if (memory_) ::munmap(memory_, std::max<uint64_t>(size_, 1));
    return;
  }
  // Teardown must not throw; a runtime that fails here can only leak.
  try {
    if (event_) runtime_->event_destroy(event_);
    if (stream_) runtime_->stream_destroy(stream_);  // waits for its queued copies
    if (mirror_) runtime_->pinned_free(mirror_);
    runtime_->device_free(memory_);
  } catch (const std::exception&) {
  }
}

std::string BenchBuffer::runtime_name() const { return runtime_ ? runtime_->name() : ""; }

void BenchBuffer::copy_and_wait(void* dst, const void* src, uint64_t n) {
  if (n == 0) return;
  runtime_->memcpy_async(dst, src, n, stream_);
  runtime_->event_record(event_, stream_);
  runtime_->event_synchronize(event_);
}

void BenchBuffer::upload(uint64_t n) {
  if (on_device()) copy_and_wait(memory_, mirror_, std::min(n, size_));
}

void BenchBuffer::download() {
  if (on_device()) copy_and_wait(mirror_, memory_, size_);
}

uint64_t pattern_seed(uint64_t run_seed, uint64_t size_index) { return mix64(run_seed ^ mix64(size_index + 0x51)); }

uint8_t poison_byte(uint64_t size_index) { return static_cast<uint8_t>(0xA5 ^ (size_index * 0x3B)); }

void fill_source(BenchBuffer& buf, const SlotLayout& layout, uint64_t seed) {
  uint8_t* p = buf.host_view();
  for (uint64_t j = 0; j < layout.slots(); ++j) {
    ItemPattern(seed, j % layout.batch).fill(p + layout.offset(j), layout.size);
  }
  buf.upload(layout.bytes());
}

void fill_poison(BenchBuffer& buf, uint8_t poison) {
  std::memset(buf.host_view(), poison, buf.size());
  buf.upload(buf.size());
}

VerifyResult verify_destination(BenchBuffer& buf, const SlotLayout& layout, uint64_t seed, uint8_t poison,
                                uint64_t last_iter, bool corrupt) {
  VerifyResult r;
  auto fail = [&](std::string what) {
    if (r.ok) r.first_error = std::move(what);
    r.ok = false;
  };
  buf.download();
  if (corrupt) buf.host_view()[layout.offset(layout.batch / 2) + layout.size / 2] ^= 0x01;
  const uint8_t* p = buf.host_view();
  for (uint32_t i = 0; i < layout.batch; ++i) {
    const uint64_t expected_item = layout.source_slot(i, last_iter) % layout.batch;
    const ItemPattern pattern(seed, expected_item);
    const uint64_t at = layout.offset(i);
    if (const uint64_t bad = pattern.first_mismatch(p + at, layout.size); bad != layout.size) {
      ++r.bad_items;
      const char* hint = p[at + bad] == poison ? " (never written)" : "";
      fail(fmt::format("item {} of {}: byte {} of {} is {:#04x}, expected {:#04x}{}", i, layout.batch, bad,
                       layout.size, p[at + bad], pattern.byte_at(bad), hint));
    }
    if (const uint64_t gap = first_not_poison(p, at + layout.size, at + layout.stride, poison);
        gap != at + layout.stride) {
      fail(fmt::format("the guard gap after item {} was written at byte {} (out of range)", i, gap - at));
    }
  }
  const uint64_t used = uint64_t{layout.batch} * layout.stride;
  if (const uint64_t stray = first_not_poison(p, used, buf.size(), poison); stray != buf.size()) {
    fail(fmt::format("a byte past the last item was written at buffer offset {} (out of range)", stray));
  }
  return r;
}

}  // namespace dlslime::bench
