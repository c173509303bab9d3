#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "dlslime/status.h"

// The TCP data-path wire format. Every frame is a fixed 40-byte little-endian header,
// optionally followed by a payload on the same connection. Frames describe themselves:
// the receiver can place a payload from the header alone. docs/tcp.md has the full table.
namespace dlslime::tcp {

inline constexpr uint16_t kFrameMagic = 0x5D1E;
inline constexpr size_t kFrameHeaderSize = 40;
// The stream sanity limit: no data frame carries more (senders split items into chunks of
// at most TcpOptions::chunk_size, which is capped at this).
inline constexpr uint64_t kMaxDataPayload = 64ull << 20;
// Error text carried by acknowledgement frames.
inline constexpr uint64_t kMaxErrorText = 1024;

enum class FrameType : uint8_t {
  kWriteData = 1,    // ->target: place `length` payload bytes at (handle, offset)
  kWriteAck = 2,     // ->initiator: status of op_id's write frames on this lane; payload = error text
  kReadRequest = 3,  // ->target: return `length` bytes of (handle, offset); `index` tags the item
  kReadData = 4,     // ->initiator: payload = the bytes (status 0) or error text (status != 0)
  kSendData = 5,     // ->receiver: message bytes [offset, offset+length) of message op_id
  kSendAck = 6,      // ->sender: the message was matched (status 0) or refused; payload = error text
  kGoodbye = 7,      // orderly shutdown: the sender will send nothing more
};

// Flag bits.
inline constexpr uint8_t kFlagLast = 0x1;  // last frame of this op on this lane (write), of this message (send)

struct FrameHeader {
  FrameType type = FrameType::kWriteData;
  uint8_t flags = 0;
  int32_t status = 0;
  uint64_t op_id = 0;
  int32_t handle = -1;
  uint32_t index = 0;
  uint64_t offset = 0;
  uint64_t length = 0;

  bool last() const noexcept { return (flags & kFlagLast) != 0; }
};

// Bytes of payload that follow the header on the wire.
uint64_t payload_size(const FrameHeader& h) noexcept;

void encode_frame_header(const FrameHeader& h, uint8_t* out) noexcept;

// Parses and validates one header from exactly kFrameHeaderSize bytes: magic, known type,
// flags, and payload sizes against the limits above. A failure means the stream is
// corrupt (kProtocolError) or speaks an unknown frame kind (kUnknownOpcode); either way the
// connection cannot be resynchronised and must be closed.
Status parse_frame_header(const uint8_t* in, FrameHeader* out) noexcept;

}  // namespace dlslime::tcp
