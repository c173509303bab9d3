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
// A notification's payload (OpRequest::kMaxNotificationBytes).
inline constexpr uint64_t kMaxNotification = 4096;

// One-sided frames name up to kMaxPieces pieces of the target's regions: a write frame
// carries their list and then all their bytes, a read request their list, and its answer all
// their bytes (at most kMaxDataPayload in all). A batch of small items costs one header
// each way instead of one per item. On the wire a piece is 24 bytes: handle i32, reserved
// u32 (0), offset u64, length u64.
inline constexpr size_t kPieceSize = 24;
inline constexpr size_t kMaxPieces = 1024;

struct Piece {
  int32_t handle = -1;
  uint64_t offset = 0;
  uint64_t length = 0;
};

void encode_piece(const Piece& p, uint8_t* out) noexcept;
Piece parse_piece(const uint8_t* in) noexcept;

enum class FrameType : uint8_t {
  kWriteData = 1,    // ->target: payload = a list of pieces (Piece layout), then their bytes
  kWriteAck = 2,     // ->initiator: status of op_id's write frames on this lane; payload = error text
  kReadRequest = 3,  // ->target: payload = a list of pieces to return (Piece); `index` tags the first
  kReadData = 4,     // ->initiator: the answer to one request: the pieces' bytes (status 0) or error text
  kSendData = 5,     // ->receiver: message bytes [offset, offset+length) of message op_id
  kSendAck = 6,      // ->sender: the message was matched (status 0) or refused; payload = error text
  kGoodbye = 7,      // orderly shutdown: the sender will send nothing more
  kNotify = 8,       // ->receiver: one notification (lane 0, after the writes before it completed); payload = its bytes
  kNotifyAck = 9,    // ->sender: notification op_id is held or received (status 0), or refused; payload = error text
  // The same-host path (docs/tcp.md "Same-host path"), on dialed lane 0 and its answers:
  kSameHost = 10,    // negotiation; `index` = the stage (SameHostStage), payload by stage
  kPullWrite = 11,   // ->target: `offset` pieces (Piece layout), then each piece's source address (u64) in the
                     // initiator's memory; the target copies them itself (process_vm_readv)
  kPullDone = 12,    // ->initiator: the pull of op_id's request `index` finished (status 0) or failed; payload = error text
  kPullRead = 13,    // ->target: `offset` pieces (Piece layout) the initiator will copy out of the target itself
  kReadGrant = 14,   // ->initiator: the pieces' addresses (u64 each, 0 for an empty piece), held until released
                     // (status 0), or error text
  kReadRelease = 15, // ->target: the initiator has copied (status: how it went) request `index`; answered by kPullDone
  kPullSend = 16,    // ->receiver: message op_id of `offset` bytes, which the receiver copies out of the sender itself;
                     // payload = PulledMessage
  kSendCopied = 17,  // ->sender: the receiver copied message op_id (status 0) or refused it; payload = error text
};
inline constexpr uint8_t kLastFrameType = static_cast<uint8_t>(FrameType::kSendCopied);

// kSameHost stages, in order: the initiator offers (payload: SameHostOffer), the target
// challenges (payload: kSameHostNonce bytes), the initiator is ready (the nonce is in its
// probe buffer), the target decides (status; payload = the reason when refused).
enum class SameHostStage : uint32_t { kOffer = 1, kChallenge = 2, kReady = 3, kVerdict = 4 };
inline constexpr size_t kSameHostNonce = 16;
// The offer: pid u32, uid u32, pid namespace u64, boot id (16 bytes), probe address u64.
inline constexpr size_t kSameHostOfferSize = 40;
// A pulled message's payload: its address in the sender's memory, then the sender's lease
// on it (core/buffer_lease.h): the word's address and the value that means "still lent".
inline constexpr size_t kPulledMessageSize = 24;
// A pull request's bytes per piece: its Piece, then its source address.
inline constexpr size_t kPullPieceSize = kPieceSize + 8;

// Flag bits.
inline constexpr uint8_t kFlagLast = 0x1;  // last frame of this op on this lane (write), of this message (send)

struct FrameHeader {
  FrameType type = FrameType::kWriteData;
  uint8_t flags = 0;
  int32_t status = 0;
  uint64_t op_id = 0;
  int32_t handle = -1;
  uint32_t index = 0;   // one-sided frames: the number of the first piece
  uint64_t offset = 0;  // message frames: offset in the message; WRITE_DATA, READ_DATA: pieces
  uint64_t length = 0;  // payload bytes

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
