#include "tcp/handshake.h"

#include <cstring>

#include <fmt/format.h>

#include "tcp/wire.h"

namespace dlslime::tcp {

namespace {
constexpr char kHelloMagic[8] = {'D', 'L', 'S', 'L', 'I', 'M', 'E', 'H'};
constexpr char kReplyMagic[8] = {'D', 'L', 'S', 'L', 'I', 'M', 'E', 'R'};
constexpr uint16_t kMaxLanes = 64;
}  // namespace

void encode_hello(const Hello& h, uint8_t* out) noexcept {
  std::memset(out, 0, kHelloSize);
  WireWriter w(out);
  w.bytes(kHelloMagic, sizeof kHelloMagic);
  w.u16(h.version);
  w.u16(h.flags);
  w.u16(h.lane_index);
  w.u16(h.lane_count);
  w.u64(h.sender_id);
  w.u64(h.target_id);
  w.bytes(h.nonce.data(), h.nonce.size());
}

Status parse_hello(const uint8_t* in, Hello* out) noexcept {
  if (std::memcmp(in, kHelloMagic, sizeof kHelloMagic) != 0) {
    return Status::protocol_error("not a DLSlime TCP hello (bad magic)");
  }
  WireReader r(in + sizeof kHelloMagic);
  Hello h;
  h.version = r.u16();
  h.flags = r.u16();
  h.lane_index = r.u16();
  h.lane_count = r.u16();
  h.sender_id = r.u64();
  h.target_id = r.u64();
  r.bytes(h.nonce.data(), h.nonce.size());
  if (h.version != kProtocolVersion) {
    return Status::protocol_error(fmt::format("protocol version {} is not supported (this endpoint speaks version {})",
                                              h.version, kProtocolVersion));
  }
  if ((h.flags & ~kHelloFlagAuth) != 0) {
    return Status::protocol_error(fmt::format("unsupported hello flags {:#x}", h.flags));
  }
  if (h.lane_count == 0 || h.lane_count > kMaxLanes || h.lane_index >= h.lane_count) {
    return Status::protocol_error(fmt::format("bad lane {} of {}", h.lane_index, h.lane_count));
  }
  if (h.sender_id == 0) return Status::protocol_error("hello without a sender id");
  *out = h;
  return Status::ok();
}

void encode_hello_reply(const HelloReply& r, uint8_t* out) noexcept {
  std::memset(out, 0, kHelloReplySize);
  WireWriter w(out);
  w.bytes(kReplyMagic, sizeof kReplyMagic);
  w.u16(r.version);
  w.u16(static_cast<uint16_t>(r.status));
  w.u32(r.reason_len);
  w.u64(r.endpoint_id);
}

Status parse_hello_reply(const uint8_t* in, HelloReply* out) noexcept {
  if (std::memcmp(in, kReplyMagic, sizeof kReplyMagic) != 0) {
    return Status::protocol_error("the peer did not answer with a DLSlime TCP hello reply (bad magic)");
  }
  WireReader r(in + sizeof kReplyMagic);
  HelloReply reply;
  reply.version = r.u16();
  reply.status = static_cast<StatusCode>(r.u16());
  reply.reason_len = r.u32();
  reply.endpoint_id = r.u64();
  if (reply.reason_len > kMaxReasonText) {
    return Status::protocol_error(fmt::format("hello reply reason of {} bytes exceeds {}", reply.reason_len,
                                              kMaxReasonText));
  }
  *out = reply;
  return Status::ok();
}

}  // namespace dlslime::tcp
