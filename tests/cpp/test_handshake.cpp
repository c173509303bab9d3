#include <gtest/gtest.h>

#include <array>

#include "tcp/handshake.h"

using namespace dlslime;
using namespace dlslime::tcp;

TEST(Handshake, HelloRoundTrip) {
  Hello h;
  h.lane_index = 3;
  h.lane_count = 4;
  h.sender_id = 0x1122334455667788ull;
  h.target_id = 0x99;
  std::array<uint8_t, kHelloSize> raw{};
  encode_hello(h, raw.data());
  Hello out;
  ASSERT_TRUE(parse_hello(raw.data(), &out).is_ok());
  EXPECT_EQ(out.version, kProtocolVersion);
  EXPECT_EQ(out.lane_index, 3);
  EXPECT_EQ(out.lane_count, 4);
  EXPECT_EQ(out.sender_id, h.sender_id);
  EXPECT_EQ(out.target_id, h.target_id);
}

TEST(Handshake, RejectsWrongVersionWithAClearReason) {
  Hello h;
  h.sender_id = 1;
  h.version = kProtocolVersion + 1;
  std::array<uint8_t, kHelloSize> raw{};
  encode_hello(h, raw.data());
  Hello out;
  Status st = parse_hello(raw.data(), &out);
  EXPECT_EQ(st.code(), StatusCode::kProtocolError);
  EXPECT_NE(st.message().find("version"), std::string::npos) << st.message();
}

TEST(Handshake, RejectsGarbageAndBadLanes) {
  std::array<uint8_t, kHelloSize> raw{};
  raw.fill(0xab);
  Hello out;
  EXPECT_FALSE(parse_hello(raw.data(), &out).is_ok());

  Hello h;
  h.sender_id = 1;
  h.lane_index = 2;
  h.lane_count = 2;  // index out of range
  encode_hello(h, raw.data());
  EXPECT_FALSE(parse_hello(raw.data(), &out).is_ok());
  h.lane_index = 0;
  h.lane_count = 0;
  encode_hello(h, raw.data());
  EXPECT_FALSE(parse_hello(raw.data(), &out).is_ok());
  h.lane_count = 1;
  h.sender_id = 0;  // anonymous
  encode_hello(h, raw.data());
  EXPECT_FALSE(parse_hello(raw.data(), &out).is_ok());
}

TEST(Handshake, ReplyRoundTripAndReasonLimit) {
  HelloReply r;
  r.status = StatusCode::kAccessDenied;
  r.reason_len = 12;
  r.endpoint_id = 77;
  std::array<uint8_t, kHelloReplySize> raw{};
  encode_hello_reply(r, raw.data());
  HelloReply out;
  ASSERT_TRUE(parse_hello_reply(raw.data(), &out).is_ok());
  EXPECT_EQ(out.status, StatusCode::kAccessDenied);
  EXPECT_EQ(out.reason_len, 12u);
  EXPECT_EQ(out.endpoint_id, 77u);

  r.reason_len = kMaxReasonText + 1;
  encode_hello_reply(r, raw.data());
  EXPECT_EQ(parse_hello_reply(raw.data(), &out).code(), StatusCode::kProtocolError);
  raw[0] = 'X';
  EXPECT_EQ(parse_hello_reply(raw.data(), &out).code(), StatusCode::kProtocolError);
}
