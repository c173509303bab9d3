#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/memory_registry.h"
#include "tcp/frame_codec.h"

namespace dlslime::tcp {

// One queued unit of output: frames of one op (or one response), in wire order. Headers
// and small payloads are copied into `bytes`; large payloads are referenced in place
// (registered memory) and gathered by writev, never copied. An item of copied bytes only
// (acknowledgements, small messages: most items) is bytes_ alone, with no segment list;
// the list is spelled out at the first payload referenced in place.
class WriteItem {
 public:
  // Payloads up to this size are copied into the item: one iovec instead of two. Larger
  // ones are gathered in place; copying them costs more than the extra iovec (2 KiB x 256:
  // 2048 here gave 1.87 GB/s write / 1.70 read, 256 gives 2.27 / 2.10; docs/performance.md).
  static constexpr size_t kInlinePayloadMax = 256;

  explicit WriteItem(uint64_t op_id = 0) : op_id_(op_id) {}
  WriteItem(WriteItem&& o) noexcept;
  WriteItem& operator=(WriteItem&& o) noexcept;
  ~WriteItem();

  // Room for `frames` frames carrying `payload` bytes in all, so that building a batch
  // allocates once instead of regrowing (and re-copying) its buffers.
  void reserve(size_t frames, uint64_t payload);
  void add_header(const FrameHeader& h);
  // Overwrites the header added last with `h`, if nothing was added after it and
  // `replaceable(old header)` holds (a cumulative acknowledgement superseding the previous
  // one). Returns false, changing nothing, otherwise.
  template <class Pred>
  bool replace_tail_header(const FrameHeader& h, Pred&& replaceable);
  void add_payload(const void* data, size_t n);  // inline or by reference, by size
  void add_copy(const void* data, size_t n);
  uint64_t op_id() const { return op_id_; }
  void append_buffers(std::vector<iovec>& out) const;
  // Memory the item holds (copied bytes and its segment list), not what it references.
  size_t memory() const { return bytes_.capacity() + segments_.capacity() * sizeof(Segment); }
  // Keeps the regions its referenced payloads point into registered until the item is
  // written or dropped (read answers; an op's own frames are covered by the op).
  void hold(RegionUses&& uses) { uses_.take(std::move(uses)); }
  const RegionUses& uses() const { return uses_; }
  // Counts memory() into *meter while the item lives (the answer budget of a peer).
  void meter(size_t* meter);
  // Keeps `k` until the item is written or dropped: a GPU staging buffer its payload is
  // gathered from (tcp_gpu_staging.h) returns to its pool then.
  void keep(std::shared_ptr<void> k) { keep_ = std::move(k); }
  // Whether a payload it gathers lies in its op's memory (not copied in, not a kept buffer):
  // its bytes must not be sent once that op has ended.
  bool borrows_op_memory() const {
    return op_id_ != 0 && !keep_ &&
           std::any_of(segments_.begin(), segments_.end(), [](const Segment& s) { return s.external != nullptr; });
  }

 private:
  void remeter();

  struct Segment {
    const uint8_t* external;  // nullptr: the bytes are bytes_[offset, offset+size)
    size_t offset;
    size_t size;
  };
  static constexpr size_t kNoTail = SIZE_MAX;
  uint64_t op_id_;  // the op whose memory external segments point into (0 = none)
  size_t tail_header_ = kNoTail;  // offset in bytes_ of the last header, if nothing followed it
  std::vector<uint8_t> bytes_;
  std::vector<Segment> segments_;
  RegionUses uses_;
  std::shared_ptr<void> keep_;  // see keep(); null on the host path
  size_t* meter_ = nullptr;  // where memory() is counted (nullptr: nowhere)
  size_t metered_ = 0;       // what is counted there now
};

template <class Pred>
bool WriteItem::replace_tail_header(const FrameHeader& h, Pred&& replaceable) {
  if (tail_header_ == kNoTail) return false;
  FrameHeader old;
  if (!parse_frame_header(bytes_.data() + tail_header_, &old) || !replaceable(old)) return false;
  encode_frame_header(h, bytes_.data() + tail_header_);
  return true;
}

}  // namespace dlslime::tcp
