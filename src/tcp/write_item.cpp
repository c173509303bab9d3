#include "tcp/write_item.h"

#include <algorithm>
#include <utility>

namespace dlslime::tcp {

WriteItem::WriteItem(WriteItem&& o) noexcept
    : op_id_(o.op_id_),
      tail_header_(o.tail_header_),
      bytes_(std::move(o.bytes_)),
      segments_(std::move(o.segments_)),
      uses_(std::move(o.uses_)),
      keep_(std::move(o.keep_)),
      meter_(std::exchange(o.meter_, nullptr)),
      metered_(std::exchange(o.metered_, 0)) {}

WriteItem& WriteItem::operator=(WriteItem&& o) noexcept {
  if (this == &o) return *this;
  if (meter_) *meter_ -= metered_;
  op_id_ = o.op_id_;
  tail_header_ = o.tail_header_;
  bytes_ = std::move(o.bytes_);
  segments_ = std::move(o.segments_);
  uses_ = std::move(o.uses_);
  keep_ = std::move(o.keep_);
  meter_ = std::exchange(o.meter_, nullptr);
  metered_ = std::exchange(o.metered_, 0);
  return *this;
}

WriteItem::~WriteItem() {
  if (meter_) *meter_ -= metered_;
}

void WriteItem::meter(size_t* meter) {
  if (meter_) *meter_ -= metered_;
  meter_ = meter;
  metered_ = 0;
  remeter();
}

void WriteItem::remeter() {
  if (!meter_) return;
  const size_t now = memory();
  *meter_ += now - metered_;  // capacities only grow while an item is built
  metered_ = now;
}

void WriteItem::add_header(const FrameHeader& h) {
  uint8_t raw[kFrameHeaderSize];
  encode_frame_header(h, raw);
  const size_t at = bytes_.size();
  add_copy(raw, sizeof raw);
  tail_header_ = at;
}

void WriteItem::reserve(size_t frames, uint64_t payload) {
  const uint64_t inline_bytes = std::min<uint64_t>(payload, frames * kInlinePayloadMax);
  bytes_.reserve(bytes_.size() + frames * kFrameHeaderSize + inline_bytes);
  // A payload this small is copied whatever the split: no segment list will be needed.
  if (payload > kInlinePayloadMax) segments_.reserve(segments_.size() + 2 * frames + 1);
  remeter();
}

void WriteItem::add_copy(const void* data, size_t n) {
  if (n == 0) return;
  tail_header_ = kNoTail;
  const size_t offset = bytes_.size();
  bytes_.insert(bytes_.end(), static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + n);
  if (segments_.empty()) {
    // still all owned bytes: the one implied segment grows with bytes_
  } else if (segments_.back().external == nullptr) {
    segments_.back().size += n;  // contiguous with the previous owned segment
  } else {
    segments_.push_back({nullptr, offset, n});
  }
  remeter();
}

void WriteItem::add_payload(const void* data, size_t n) {
  if (n <= kInlinePayloadMax) {
    add_copy(data, n);
  } else {
    tail_header_ = kNoTail;
    if (segments_.empty() && !bytes_.empty()) segments_.push_back({nullptr, 0, bytes_.size()});  // spell it out
    segments_.push_back({static_cast<const uint8_t*>(data), 0, n});
    remeter();
  }
}

void WriteItem::append_buffers(std::vector<iovec>& out) const {
  if (segments_.empty()) {
    if (!bytes_.empty()) out.push_back({const_cast<uint8_t*>(bytes_.data()), bytes_.size()});
    return;
  }
  for (const Segment& s : segments_) {
    const uint8_t* base = s.external ? s.external : bytes_.data() + s.offset;
    out.push_back({const_cast<uint8_t*>(base), s.size});
  }
}

}  // namespace dlslime::tcp
