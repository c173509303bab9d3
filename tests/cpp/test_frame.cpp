#include <gtest/gtest.h>

#include <array>
#include <cstring>

#include "tcp/frame.h"
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
  for (uint8_t type : {uint8_t{0}, uint8_t{8}, uint8_t{200}}) {
    auto raw = encode(sample(FrameType::kWriteData));
    raw[2] = type;
    FrameHeader out;
    EXPECT_EQ(parse_frame_header(raw.data(), &out).code(), StatusCode::kUnknownOpcode) << int(type);
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
  FrameHeader h = sample(FrameType::kWriteData);
  h.length = kMaxDataPayload;
  EXPECT_TRUE(parse_frame_header(encode(h).data(), &out).is_ok());
  h.length = kMaxDataPayload + 1;
  EXPECT_EQ(parse_frame_header(encode(h).data(), &out).code(), StatusCode::kProtocolError);
  h.length = UINT64_MAX;
  EXPECT_EQ(parse_frame_header(encode(h).data(), &out).code(), StatusCode::kProtocolError);
  // Read requests carry no payload, but what they ask for is bounded the same way.
  h = sample(FrameType::kReadRequest);
  h.length = kMaxDataPayload + 1;
  EXPECT_EQ(parse_frame_header(encode(h).data(), &out).code(), StatusCode::kProtocolError);
  // Error texts are small.
  h = sample(FrameType::kWriteAck);
  h.length = kMaxErrorText + 1;
  EXPECT_EQ(parse_frame_header(encode(h).data(), &out).code(), StatusCode::kProtocolError);
  h = sample(FrameType::kReadData);
  h.status = 404;
  h.length = kMaxErrorText + 1;
  EXPECT_EQ(parse_frame_header(encode(h).data(), &out).code(), StatusCode::kProtocolError);
}

TEST(Frame, PayloadSizeByType) {
  FrameHeader h = sample(FrameType::kReadRequest);
  EXPECT_EQ(payload_size(h), 0u);  // the length is what is asked for, not what follows
  h.type = FrameType::kWriteData;
  EXPECT_EQ(payload_size(h), h.length);
  h.type = FrameType::kGoodbye;
  EXPECT_EQ(payload_size(h), 0u);
}
