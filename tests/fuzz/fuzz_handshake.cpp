// libFuzzer target: the hello and hello-reply parsers (src/tcp/handshake.h) and the auth
// challenge and proof parsers (src/tcp/auth.h).
//
// The first byte picks the parser; the rest is the fixed-size message (zero-padded, on the
// heap with its exact size so ASan catches an over-read). Accepted messages must obey the
// documented rules and round-trip through their encoder.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_common.h"
#include "tcp/handshake.h"

using namespace dlslime;
using namespace dlslime::tcp;

namespace {

void check_hello(const uint8_t* raw) {
  Hello h;
  h.sender_id = 0x5a5a;
  const Status st = parse_hello(raw, &h);
  if (!st) {
    FUZZ_CHECK(st.code() == StatusCode::kProtocolError);
    FUZZ_CHECK(!st.message().empty());
    FUZZ_CHECK(h.sender_id == 0x5a5a);  // untouched on failure
    return;
  }
  FUZZ_CHECK(std::memcmp(raw, "DLSLIMEH", 8) == 0);
  FUZZ_CHECK(h.version == kProtocolVersion);
  FUZZ_CHECK((h.flags & ~kHelloFlagAuth) == 0);
  FUZZ_CHECK(h.lane_count >= 1 && h.lane_count <= 64 && h.lane_index < h.lane_count);
  FUZZ_CHECK(h.sender_id != 0);
  // Round trip. The padding after the nonce is ignored by the parser, so compare fields.
  std::vector<uint8_t> again(kHelloSize);
  encode_hello(h, again.data());
  FUZZ_CHECK(std::memcmp(again.data(), raw, 32 + kNonceSize) == 0);
  Hello h2;
  FUZZ_CHECK(parse_hello(again.data(), &h2).is_ok());
  FUZZ_CHECK(h2.version == h.version && h2.flags == h.flags && h2.lane_index == h.lane_index &&
             h2.lane_count == h.lane_count && h2.sender_id == h.sender_id && h2.target_id == h.target_id);
}

void check_reply(const uint8_t* raw) {
  HelloReply r;
  r.endpoint_id = 0x5a5a;
  const Status st = parse_hello_reply(raw, &r);
  if (!st) {
    FUZZ_CHECK(st.code() == StatusCode::kProtocolError);
    FUZZ_CHECK(r.endpoint_id == 0x5a5a);
    return;
  }
  FUZZ_CHECK(std::memcmp(raw, "DLSLIMER", 8) == 0);
  FUZZ_CHECK(r.reason_len <= kMaxReasonText);  // the dialer allocates reason_len bytes
  std::vector<uint8_t> again(kHelloReplySize);
  encode_hello_reply(r, again.data());
  FUZZ_CHECK(std::memcmp(again.data(), raw, 24) == 0);
  HelloReply r2;
  FUZZ_CHECK(parse_hello_reply(again.data(), &r2).is_ok());
  FUZZ_CHECK(r2.version == r.version && r2.status == r.status && r2.reason_len == r.reason_len &&
             r2.endpoint_id == r.endpoint_id);
}

// Challenges and proofs: fixed-size, accepted only with their magic, and the fields
// round-trip through the encoder.
void check_challenge(const uint8_t* raw) {
  Challenge c;
  if (!parse_challenge(raw, &c).is_ok()) {
    FUZZ_CHECK(!is_challenge(raw));
    return;
  }
  std::vector<uint8_t> again(kChallengeSize);
  encode_challenge(c, again.data());
  FUZZ_CHECK(std::memcmp(again.data(), raw, kChallengeSize) == 0);
}

void check_proof(const uint8_t* raw) {
  Proof p;
  if (!parse_proof(raw, &p).is_ok()) return;
  std::vector<uint8_t> again(kProofSize);
  encode_proof(p, again.data());
  FUZZ_CHECK(std::memcmp(again.data(), raw, 8 + kMacSize) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int which = data[0] & 3;  // 0 hello, 1 reply, 2 challenge, 3 proof
  const size_t sizes[] = {kHelloSize, kHelloReplySize, kChallengeSize, kProofSize};
  const size_t n = sizes[which];
  std::vector<uint8_t> raw(n, 0);  // exactly n bytes: an over-read is a heap overflow
  std::memcpy(raw.data(), data + 1, std::min(size - 1, n));
  switch (which) {
    case 0: check_hello(raw.data()); break;
    case 1: check_reply(raw.data()); break;
    case 2: check_challenge(raw.data()); break;
    default: check_proof(raw.data()); break;
  }
  return 0;
}
