#include <gtest/gtest.h>

#include <array>
#include <cstring>

#include "tcp/frame_codec.h"
#include "tcp/tcp_connection.h"
#include "tcp/wire.h"

using namespace dlslime;
using namespace dlslime::tcp;

namespace {

std::array<uint8_t, kFrameHeaderSize> encode(const FrameHeader& h) {
  std::array<uint8_t, kFrameHeaderSize> raw{};
  encode_frame_header(h, raw.data());
  return raw;
}

FrameHeader sample(FrameType type) {
  FrameHeader h;
  h.type = type;
  h.flags = kFlagLast;
  h.status = 0;
  h.op_id = 0x0123456789abcdefull;
  h.handle = 7;
  h.index = 42;
  h.offset = 0xfedcba9876543210ull;
  h.length = 4096;
  return h;
}

}  // namespace

TEST(Frame, RoundTripsEveryType) {
  for (auto type : {FrameType::kWriteData, FrameType::kWriteAck, FrameType::kReadRequest, FrameType::kReadData,
                    FrameType::kSendData, FrameType::kSendAck, FrameType::kGoodbye}) {
    FrameHeader h = sample(type);
    if (type == FrameType::kWriteAck || type == FrameType::kSendAck) h.length = 100;  // error text
    if (type == FrameType::kGoodbye) h.length = 0;
    if (type == FrameType::kReadRequest) h.length = 3 * kPieceSize;  // a list of 3 pieces
    if (type == FrameType::kReadData) h.offset = 3;                      // answers 3 pieces
    if (type == FrameType::kWriteData) {                                 // 3 pieces, then 100 bytes
      h.offset = 3;
      h.length = 3 * kPieceSize + 100;
    }
    auto raw = encode(h);
    FrameHeader out;
    ASSERT_TRUE(parse_frame_header(raw.data(), &out).is_ok()) << static_cast<int>(type);
    EXPECT_EQ(out.type, h.type);
    EXPECT_EQ(out.flags, h.flags);
    EXPECT_EQ(out.status, h.status);
    EXPECT_EQ(out.op_id, h.op_id);
    EXPECT_EQ(out.handle, h.handle);
    EXPECT_EQ(out.index, h.index);
    EXPECT_EQ(out.offset, h.offset);
    EXPECT_EQ(out.length, h.length);
  }
}

TEST(Frame, EncodingIsLittleEndianAndFixedSize) {
  FrameHeader h = sample(FrameType::kWriteData);
  auto raw = encode(h);
  EXPECT_EQ(raw[0], 0x1E);  // magic 0x5D1E, low byte first
  EXPECT_EQ(raw[1], 0x5D);
  EXPECT_EQ(raw[2], static_cast<uint8_t>(FrameType::kWriteData));
  EXPECT_EQ(raw[8], 0xef);  // op_id low byte
  EXPECT_EQ(kFrameHeaderSize, 40u);
}

TEST(Frame, NegativeStatusAndHandleSurvive) {
  FrameHeader h = sample(FrameType::kReadData);
  h.status = 404;
  h.handle = -1;
  h.offset = 1;
  h.length = 10;
  auto raw = encode(h);
  FrameHeader out;
  ASSERT_TRUE(parse_frame_header(raw.data(), &out).is_ok());
  EXPECT_EQ(out.status, 404);
  EXPECT_EQ(out.handle, -1);
}

TEST(Frame, RejectsWrongMagic) {
  auto raw = encode(sample(FrameType::kWriteData));
  raw[0] ^= 0xff;
  FrameHeader out;
  Status st = parse_frame_header(raw.data(), &out);
  EXPECT_EQ(st.code(), StatusCode::kProtocolError);
  EXPECT_NE(st.message().find("magic"), std::string::npos);
}

TEST(Frame, RejectsUnknownType) {
  for (uint8_t type : {uint8_t{0}, static_cast<uint8_t>(kLastFrameType + 1), uint8_t{200}}) {
    auto raw = encode(sample(FrameType::kWriteData));
    raw[2] = type;
    FrameHeader out;
    EXPECT_EQ(parse_frame_header(raw.data(), &out).code(), StatusCode::kUnknownOpcode) << int(type);
  }
}

// A notification carries at most 4 KiB (OpRequest::kMaxNotificationBytes); its ack, error
// text at most.
TEST(Frame, BoundsNotificationsAndTheirAcks) {
  auto h = sample(FrameType::kNotify);
  h.length = 4096;
  FrameHeader out;
  EXPECT_TRUE(parse_frame_header(encode(h).data(), &out).is_ok());
  h.length = 4097;
  EXPECT_EQ(parse_frame_header(encode(h).data(), &out).code(), StatusCode::kProtocolError);
  auto ack = sample(FrameType::kNotifyAck);
  ack.length = tcp::kMaxErrorText + 1;
  EXPECT_EQ(parse_frame_header(encode(ack).data(), &out).code(), StatusCode::kProtocolError);
}

// The same-host path's frames: a pull request is exactly its pieces and their source
// addresses (no payload bytes), and negotiation frames and pull answers carry at most an
// error text.
TEST(Frame, BoundsSameHostFrames) {
  FrameHeader out;
  auto pull = sample(FrameType::kPullWrite);
  pull.offset = 3;
  pull.length = 3 * tcp::kPullPieceSize;
  EXPECT_TRUE(parse_frame_header(encode(pull).data(), &out).is_ok());
  for (uint64_t length : {uint64_t{0}, 3 * tcp::kPullPieceSize - 1, 3 * tcp::kPullPieceSize + 8, uint64_t{1} << 40}) {
    pull.length = length;
    EXPECT_EQ(parse_frame_header(encode(pull).data(), &out).code(), StatusCode::kProtocolError) << length;
  }
  pull.offset = 0;
  pull.length = 0;
  EXPECT_EQ(parse_frame_header(encode(pull).data(), &out).code(), StatusCode::kProtocolError);
  pull.offset = tcp::kMaxPieces + 1;
  pull.length = pull.offset * tcp::kPullPieceSize;
  EXPECT_EQ(parse_frame_header(encode(pull).data(), &out).code(), StatusCode::kProtocolError);
  for (FrameType type : {FrameType::kSameHost, FrameType::kPullDone}) {
    auto h = sample(type);
    h.length = tcp::kMaxErrorText;
    EXPECT_TRUE(parse_frame_header(encode(h).data(), &out).is_ok());
    h.length = tcp::kMaxErrorText + 1;
    EXPECT_EQ(parse_frame_header(encode(h).data(), &out).code(), StatusCode::kProtocolError);
  }
}

TEST(Frame, RejectsUnknownFlags) {
  auto raw = encode(sample(FrameType::kWriteData));
  raw[3] = 0x80;
  FrameHeader out;
  EXPECT_EQ(parse_frame_header(raw.data(), &out).code(), StatusCode::kProtocolError);
}

TEST(Frame, RejectsOversizedPayloadBeforeReadingIt) {
  FrameHeader out;
  // A write frame: the list of 1..kMaxPieces pieces, then at most kMaxDataPayload bytes.
  FrameHeader h = sample(FrameType::kWriteData);
  h.offset = 2;
  h.length = 2 * kPieceSize + kMaxDataPayload;
  EXPECT_TRUE(parse_frame_header(encode(h).data(), &out).is_ok());
  h.length = 2 * kPieceSize;  // pieces of 0 bytes
  EXPECT_TRUE(parse_frame_header(encode(h).data(), &out).is_ok());
  for (uint64_t bad : {2 * kPieceSize + kMaxDataPayload + 1, 2 * kPieceSize - 1, uint64_t{0}, UINT64_MAX}) {
    h.length = bad;
    EXPECT_EQ(parse_frame_header(encode(h).data(), &out).code(), StatusCode::kProtocolError) << bad;
  }
  h.length = 4096;
  for (uint64_t bad : {uint64_t{0}, uint64_t{kMaxPieces + 1}, UINT64_MAX}) {
    h.offset = bad;
    EXPECT_EQ(parse_frame_header(encode(h).data(), &out).code(), StatusCode::kProtocolError) << bad;
  }
  // A read request is a list of 1..kMaxPieces whole pieces.
  h = sample(FrameType::kReadRequest);
  for (uint64_t ok : {kPieceSize, kMaxPieces * kPieceSize}) {
    h.length = ok;
    EXPECT_TRUE(parse_frame_header(encode(h).data(), &out).is_ok()) << ok;
  }
  for (uint64_t bad : {uint64_t{0}, uint64_t{kPieceSize - 1}, uint64_t{kPieceSize + 1},
                       uint64_t{(kMaxPieces + 1) * kPieceSize}, kMaxDataPayload + 1, UINT64_MAX}) {
    h.length = bad;
    EXPECT_EQ(parse_frame_header(encode(h).data(), &out).code(), StatusCode::kProtocolError) << bad;
  }
  // A read answer covers 1..kMaxPieces pieces, and carries at most kMaxDataPayload.
  h = sample(FrameType::kReadData);
  h.offset = 1;
  h.length = kMaxDataPayload;
  EXPECT_TRUE(parse_frame_header(encode(h).data(), &out).is_ok());
  h.length = kMaxDataPayload + 1;
  EXPECT_EQ(parse_frame_header(encode(h).data(), &out).code(), StatusCode::kProtocolError);
  h.length = 8;
  for (uint64_t bad : {uint64_t{0}, uint64_t{kMaxPieces + 1}, UINT64_MAX}) {
    h.offset = bad;
    EXPECT_EQ(parse_frame_header(encode(h).data(), &out).code(), StatusCode::kProtocolError) << bad;
  }
  // Error texts are small.
  h = sample(FrameType::kWriteAck);
  h.length = kMaxErrorText + 1;
  EXPECT_EQ(parse_frame_header(encode(h).data(), &out).code(), StatusCode::kProtocolError);
  h = sample(FrameType::kReadData);
  h.status = 404;
  h.offset = 1;
  h.length = kMaxErrorText + 1;
  EXPECT_EQ(parse_frame_header(encode(h).data(), &out).code(), StatusCode::kProtocolError);
}

TEST(Frame, PayloadSizeByType) {
  FrameHeader h = sample(FrameType::kReadRequest);
  EXPECT_EQ(payload_size(h), h.length);  // the piece list follows the header
  h.type = FrameType::kWriteData;
  EXPECT_EQ(payload_size(h), h.length);
  h.type = FrameType::kGoodbye;
  EXPECT_EQ(payload_size(h), 0u);
}

TEST(Frame, PieceRoundTripsLittleEndian) {
  const Piece p{-3, 0x0102030405060708ull, 0x1122334455667788ull};
  uint8_t raw[kPieceSize];
  std::memset(raw, 0xAA, sizeof raw);
  encode_piece(p, raw);
  EXPECT_EQ(raw[0], 0xFD);  // -3, low byte first
  EXPECT_EQ(raw[4], 0);     // reserved
  EXPECT_EQ(raw[8], 0x08);  // offset low byte
  EXPECT_EQ(raw[16], 0x88);  // length low byte
  const Piece q = parse_piece(raw);
  EXPECT_EQ(q.handle, p.handle);
  EXPECT_EQ(q.offset, p.offset);
  EXPECT_EQ(q.length, p.length);
}

TEST(PayloadSink, AdvanceWalksSegmentsAndStopsAtTheEnd) {
  uint8_t a[4], b[1], c[8];
  const PayloadSegment segs[] = {{a, sizeof a}, {b, sizeof b}, {c, sizeof c}};
  PayloadSink sink;
  sink.scatter(segs, 3);
  sink.advance(2);  // inside the first segment
  EXPECT_EQ(sink.dst, a + 2);
  EXPECT_EQ(sink.dst_left, 2u);
  sink.advance(5);  // the rest of a, all of b, 2 bytes of c: one direct read spans them
  EXPECT_EQ(sink.dst, c + 2);
  EXPECT_EQ(sink.dst_left, 6u);
  EXPECT_EQ(sink.more_count, 0u);
  sink.advance(6);  // exactly the end: nothing more is placed
  EXPECT_EQ(sink.dst, nullptr);
}

TEST(WriteItem, ReplacesOnlyAHeaderThatNothingFollows) {
  const auto ok_ack = [](const FrameHeader& old) { return old.type == FrameType::kSendAck && old.status == 0; };
  const auto bytes_of = [](const WriteItem& item) {
    std::vector<iovec> iov;
    item.append_buffers(iov);
    std::vector<uint8_t> out;
    for (const iovec& v : iov) out.insert(out.end(), static_cast<uint8_t*>(v.iov_base), static_cast<uint8_t*>(v.iov_base) + v.iov_len);
    return out;
  };
  FrameHeader a;
  a.type = FrameType::kSendAck;
  a.op_id = 1;
  a.length = 0;
  FrameHeader b = a;
  b.op_id = 2;
  WriteItem item;
  EXPECT_FALSE(item.replace_tail_header(b, ok_ack));  // empty
  item.add_header(a);
  ASSERT_TRUE(item.replace_tail_header(b, ok_ack));
  auto raw = bytes_of(item);
  ASSERT_EQ(raw.size(), kFrameHeaderSize);  // one header: b replaced a
  FrameHeader out;
  ASSERT_TRUE(parse_frame_header(raw.data(), &out).is_ok());
  EXPECT_EQ(out.op_id, 2u);
  // Not when the predicate refuses (an error acknowledgement stays).
  FrameHeader err = a;
  err.op_id = 3;
  err.status = 404;
  err.length = 0;
  item.add_header(err);
  EXPECT_FALSE(item.replace_tail_header(b, ok_ack));
  // Not when something followed the header (its payload).
  item.add_header(a);
  const uint8_t text[2] = {'h', 'i'};
  item.add_copy(text, sizeof text);
  EXPECT_FALSE(item.replace_tail_header(b, ok_ack));
  EXPECT_EQ(bytes_of(item).size(), 3 * kFrameHeaderSize + 2);
}
