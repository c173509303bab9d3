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

TEST(Auth, MacBindsRoleTokenNonceAndAcceptor) {
  Hello h;
  h.sender_id = 7;
  h.flags = kHelloFlagAuth;
  h.nonce = random_nonce();
  uint8_t raw[kHelloSize];
  encode_hello(h, raw);
  const Nonce na = random_nonce();
  const Mac base = auth_mac("secret", AuthRole::kAcceptor, raw, kHelloSize, na, 42);
  EXPECT_TRUE(mac_equal(base, auth_mac("secret", AuthRole::kAcceptor, raw, kHelloSize, na, 42)));
  // Each input changes the MAC: the dialer cannot reflect the acceptor's MAC, and a MAC
  // from one connection (nonce) or endpoint does not fit another.
  EXPECT_FALSE(mac_equal(base, auth_mac("secret", AuthRole::kDialer, raw, kHelloSize, na, 42)));
  EXPECT_FALSE(mac_equal(base, auth_mac("secreT", AuthRole::kAcceptor, raw, kHelloSize, na, 42)));
  EXPECT_FALSE(mac_equal(base, auth_mac("secret", AuthRole::kAcceptor, raw, kHelloSize, random_nonce(), 42)));
  EXPECT_FALSE(mac_equal(base, auth_mac("secret", AuthRole::kAcceptor, raw, kHelloSize, na, 43)));
  raw[20] ^= 1;  // the sender id
  EXPECT_FALSE(mac_equal(base, auth_mac("secret", AuthRole::kAcceptor, raw, kHelloSize, na, 42)));
  EXPECT_NE(random_nonce(), random_nonce());
}

TEST(Auth, ChallengeAndProofRoundTripAndRejectWrongMagic) {
  Challenge c;
  c.nonce = random_nonce();
  c.endpoint_id = 0x0102030405060708ULL;
  c.mac.fill(0xAB);
  uint8_t raw[kChallengeSize];
  encode_challenge(c, raw);
  EXPECT_TRUE(is_challenge(raw));
  Challenge back;
  ASSERT_TRUE(parse_challenge(raw, &back).is_ok());
  EXPECT_EQ(back.nonce, c.nonce);
  EXPECT_EQ(back.endpoint_id, c.endpoint_id);
  EXPECT_EQ(back.mac, c.mac);
  Proof p;
  p.mac.fill(0xCD);
  uint8_t praw[kProofSize];
  encode_proof(p, praw);
  Proof pback;
  ASSERT_TRUE(parse_proof(praw, &pback).is_ok());
  EXPECT_EQ(pback.mac, p.mac);
  EXPECT_FALSE(parse_proof(raw, &pback).is_ok());  // a challenge is not a proof
  EXPECT_FALSE(parse_challenge(praw, &back).is_ok());
}

TEST(Handshake, AuthFlagAndNonceSurviveAndOtherFlagsAreRefused) {
  Hello h;
  h.sender_id = 1;
  h.flags = kHelloFlagAuth;
  h.nonce = random_nonce();
  uint8_t raw[kHelloSize];
  encode_hello(h, raw);
  Hello back;
  ASSERT_TRUE(parse_hello(raw, &back).is_ok());
  EXPECT_EQ(back.flags, kHelloFlagAuth);
  EXPECT_EQ(back.nonce, h.nonce);
  h.flags = 2;
  encode_hello(h, raw);
  EXPECT_FALSE(parse_hello(raw, &back).is_ok());
}
