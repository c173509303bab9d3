// libFuzzer target: the hello and hello-reply parsers (src/tcp/handshake.h).
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
  FUZZ_CHECK(h.flags == 0);
  FUZZ_CHECK(h.lane_count >= 1 && h.lane_count <= 64 && h.lane_index < h.lane_count);
  FUZZ_CHECK(h.sender_id != 0);
  // Round trip. The padding after byte 32 is ignored by the parser, so compare fields.
  std::vector<uint8_t> again(kHelloSize);
  encode_hello(h, again.data());
  FUZZ_CHECK(std::memcmp(again.data(), raw, 32) == 0);
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool reply = (data[0] & 1) != 0;
  const size_t n = reply ? kHelloReplySize : kHelloSize;
  std::vector<uint8_t> raw(n, 0);  // exactly n bytes: an over-read is a heap overflow
  std::memcpy(raw.data(), data + 1, std::min(size - 1, n));
  if (reply) {
    check_reply(raw.data());
  } else {
    check_hello(raw.data());
  }
  return 0;
}
