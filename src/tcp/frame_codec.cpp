#include "tcp/frame_codec.h"

#include <fmt/format.h>

#include "tcp/wire.h"

namespace dlslime::tcp {

uint64_t payload_size(const FrameHeader& h) noexcept {
  switch (h.type) {
    case FrameType::kWriteData:
    case FrameType::kSendData:
    case FrameType::kWriteAck:
    case FrameType::kSendAck:
    case FrameType::kReadData:
    case FrameType::kReadRequest:
    case FrameType::kNotify:
    case FrameType::kNotifyAck:
    case FrameType::kSameHost:
    case FrameType::kPullWrite:
    case FrameType::kPullDone:
    case FrameType::kPullRead:
    case FrameType::kReadGrant:
    case FrameType::kReadRelease:
    case FrameType::kPullSend:
    case FrameType::kSendCopied: return h.length;
    case FrameType::kGoodbye: return 0;
  }
  return 0;
}

void encode_frame_header(const FrameHeader& h, uint8_t* out) noexcept {
  WireWriter w(out);
  w.u16(kFrameMagic);
  w.u8(static_cast<uint8_t>(h.type));
  w.u8(h.flags);
  w.i32(h.status);
  w.u64(h.op_id);
  w.i32(h.handle);
  w.u32(h.index);
  w.u64(h.offset);
  w.u64(h.length);
}

void encode_piece(const Piece& p, uint8_t* out) noexcept {
  WireWriter w(out);
  w.i32(p.handle);
  w.u32(0);
  w.u64(p.offset);
  w.u64(p.length);
}

Piece parse_piece(const uint8_t* in) noexcept {
  WireReader r(in);
  Piece p;
  p.handle = r.i32();
  (void)r.u32();  // reserved
  p.offset = r.u64();
  p.length = r.u64();
  return p;
}

Status parse_frame_header(const uint8_t* in, FrameHeader* out) noexcept {
  WireReader r(in);
  const uint16_t magic = r.u16();
  if (magic != kFrameMagic) {
    return Status::protocol_error(fmt::format("bad frame magic {:#06x} (expected {:#06x})", magic, kFrameMagic));
  }
  const uint8_t type = r.u8();
  if (type < static_cast<uint8_t>(FrameType::kWriteData) || type > kLastFrameType) {
    return Status(StatusCode::kUnknownOpcode, fmt::format("unknown frame type {}", type));
  }
  FrameHeader h;
  h.type = static_cast<FrameType>(type);
  h.flags = r.u8();
  h.status = r.i32();
  h.op_id = r.u64();
  h.handle = r.i32();
  h.index = r.u32();
  h.offset = r.u64();
  h.length = r.u64();
  if ((h.flags & ~kFlagLast) != 0) return Status::protocol_error(fmt::format("unknown frame flags {:#x}", h.flags));

  const bool lists_pieces = h.type == FrameType::kWriteData || h.type == FrameType::kReadData ||
                            h.type == FrameType::kPullWrite || h.type == FrameType::kPullRead ||
                            h.type == FrameType::kReadGrant || h.type == FrameType::kReadRelease;
  if (lists_pieces && (h.offset == 0 || h.offset > kMaxPieces)) {
    return Status::protocol_error(fmt::format("one-sided frame for {} pieces (1..{})", h.offset, kMaxPieces));
  }
  if (h.type == FrameType::kReadRequest) {
    if (h.length == 0 || h.length % kPieceSize != 0 || h.length > kMaxPieces * kPieceSize) {
      return Status::protocol_error(fmt::format("read request of {} bytes is not a list of 1..{} pieces of {} bytes",
                                                h.length, kMaxPieces, kPieceSize));
    }
  } else if (h.type == FrameType::kPullRead || h.type == FrameType::kReadRelease ||
             (h.type == FrameType::kReadGrant && h.status == 0)) {
    const uint64_t expected = h.type == FrameType::kPullRead    ? h.offset * kPieceSize
                              : h.type == FrameType::kReadGrant ? h.offset * 8
                                                                : 0;
    if (h.length != expected) {
      return Status::protocol_error(fmt::format("same-host read frame (type {}) of {} bytes for {} pieces (expected {})",
                                                static_cast<int>(type), h.length, h.offset, expected));
    }
  } else if (h.type == FrameType::kPullWrite) {
    if (h.length != h.offset * kPullPieceSize) {
      return Status::protocol_error(
          fmt::format("pull request of {} bytes for {} pieces (expected {})", h.length, h.offset, h.offset * kPullPieceSize));
    }
  } else if (h.type == FrameType::kPullSend) {
    if (h.length != kPulledMessageSize) {
      return Status::protocol_error(
          fmt::format("pulled message frame of {} bytes (expected {})", h.length, kPulledMessageSize));
    }
  } else if (h.type == FrameType::kWriteData) {
    const uint64_t list = h.offset * kPieceSize;
    if (h.length < list || h.length - list > kMaxDataPayload) {
      return Status::protocol_error(fmt::format("write frame of {} bytes for {} pieces (list {} + data up to {})",
                                                h.length, h.offset, list, kMaxDataPayload));
    }
  } else {
    const bool carries_text = h.type == FrameType::kWriteAck || h.type == FrameType::kSendAck ||
                              h.type == FrameType::kNotifyAck || h.type == FrameType::kSameHost ||
                              h.type == FrameType::kPullDone || h.type == FrameType::kReadGrant ||
                              h.type == FrameType::kSendCopied || (h.type == FrameType::kReadData && h.status != 0);
    const uint64_t limit = carries_text                      ? kMaxErrorText
                           : h.type == FrameType::kNotify ? kMaxNotification
                                                            : kMaxDataPayload;
    if (payload_size(h) > limit) {
      return Status::protocol_error(
          fmt::format("frame length {} exceeds the limit {} (type {})", h.length, limit, static_cast<int>(type)));
    }
  }
  *out = h;
  return Status::ok();
}

}  // namespace dlslime::tcp
