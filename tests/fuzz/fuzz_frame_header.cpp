// libFuzzer target: dlslime::tcp::parse_frame_header (src/tcp/frame_codec.h).
//
// Every input is read as one 40-byte header (shorter inputs are zero-padded, as a real
// receiver never parses fewer than kFrameHeaderSize bytes). The parser must never read past
// the header, and whatever it accepts must obey the documented limits and survive an
// encode/parse round trip unchanged.
#include <cstdint>
#include <cstring>

#include "fuzz_common.h"
#include "tcp/frame_codec.h"

using namespace dlslime;
using namespace dlslime::tcp;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Exactly kFrameHeaderSize bytes on the heap: ASan flags any read beyond the header.
  auto* raw = new uint8_t[kFrameHeaderSize];
  std::memset(raw, 0, kFrameHeaderSize);
  std::memcpy(raw, data, size < kFrameHeaderSize ? size : kFrameHeaderSize);

  FrameHeader h;
  h.op_id = 0xdeadbeef;  // must be untouched on failure
  const Status st = parse_frame_header(raw, &h);
  if (!st) {
    FUZZ_CHECK(st.code() == StatusCode::kProtocolError || st.code() == StatusCode::kUnknownOpcode);
    FUZZ_CHECK(!st.message().empty());
    FUZZ_CHECK(h.op_id == 0xdeadbeef);
    delete[] raw;
    return 0;
  }

  // Accepted: the documented limits hold.
  const auto type = static_cast<uint8_t>(h.type);
  FUZZ_CHECK(type >= 1 && type <= kLastFrameType);
  FUZZ_CHECK((h.flags & ~kFlagLast) == 0);
  const uint64_t payload = payload_size(h);
  // A write frame's piece list comes on top of its data.
  FUZZ_CHECK(payload <= kMaxDataPayload + (h.type == FrameType::kWriteData ? kMaxPieces * kPieceSize : 0));
  const bool text = h.type == FrameType::kWriteAck || h.type == FrameType::kSendAck ||
                    h.type == FrameType::kNotifyAck || h.type == FrameType::kSendCopied ||
                    (h.type == FrameType::kReadData && h.status != 0);
  if (text) FUZZ_CHECK(payload <= kMaxErrorText);
  if (h.type == FrameType::kPullSend) FUZZ_CHECK(payload == kPulledMessageSize);
  if (h.type == FrameType::kNotify) FUZZ_CHECK(payload <= kMaxNotification);
  if (h.type == FrameType::kReadRequest) {
    FUZZ_CHECK(payload == h.length && payload > 0 && payload % kPieceSize == 0 &&
               payload <= kMaxPieces * kPieceSize);
  }
  if (h.type == FrameType::kReadData || h.type == FrameType::kWriteData) {
    FUZZ_CHECK(h.offset >= 1 && h.offset <= kMaxPieces);
  }
  if (h.type == FrameType::kWriteData) {
    FUZZ_CHECK(payload >= h.offset * kPieceSize && payload - h.offset * kPieceSize <= kMaxDataPayload);
  }
  if (h.type == FrameType::kGoodbye) FUZZ_CHECK(payload == 0);

  // Round trip: encoding the parsed header gives back the same 40 bytes.
  uint8_t again[kFrameHeaderSize];
  encode_frame_header(h, again);
  FUZZ_CHECK(std::memcmp(again, raw, kFrameHeaderSize) == 0);
  FrameHeader h2;
  FUZZ_CHECK(parse_frame_header(again, &h2).is_ok());
  FUZZ_CHECK(h2.type == h.type && h2.flags == h.flags && h2.status == h.status && h2.op_id == h.op_id &&
             h2.handle == h.handle && h2.index == h.index && h2.offset == h.offset && h2.length == h.length);
  delete[] raw;
  return 0;
}
