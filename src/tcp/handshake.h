#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "dlslime/status.h"
#include "tcp/auth.h"

// The connection handshake. The dialing side sends a fixed-size Hello on every lane it
// opens; the accepting side answers with a HelloReply (plus a reason text when it refuses)
// and, if it accepted, the connection carries data frames from then on.
namespace dlslime::tcp {

// 2: read requests carry a list of pieces; 3: the same-host path (kSameHost, kPullWrite, kPullDone)
inline constexpr uint16_t kProtocolVersion = 3;
inline constexpr size_t kHelloSize = 64;
inline constexpr size_t kHelloReplySize = 32;
inline constexpr uint32_t kMaxReasonText = 512;
// Hello flag: the dialer has a token and expects the challenge of tcp/auth.h.
inline constexpr uint16_t kHelloFlagAuth = 1;

struct Hello {
  uint16_t version = kProtocolVersion;
  uint16_t flags = 0;  // kHelloFlagAuth or 0
  uint16_t lane_index = 0;
  uint16_t lane_count = 1;
  uint64_t sender_id = 0;  // the dialing endpoint's id
  uint64_t target_id = 0;  // the id the dialer expects to reach (from endpoint_info); 0 = any
  Nonce nonce{};           // the dialer's nonce when kHelloFlagAuth is set
};

struct HelloReply {
  uint16_t version = kProtocolVersion;
  StatusCode status = StatusCode::kSuccess;  // kSuccess, kAccessDenied, kAuthenticationFailed, kProtocolError
  uint32_t reason_len = 0;                   // bytes of reason text that follow
  uint64_t endpoint_id = 0;                  // the accepting endpoint's id
};

void encode_hello(const Hello& h, uint8_t* out) noexcept;
// Validates magic, version and lane fields; the Status says why a hello is refused.
Status parse_hello(const uint8_t* in, Hello* out) noexcept;

void encode_hello_reply(const HelloReply& r, uint8_t* out) noexcept;
Status parse_hello_reply(const uint8_t* in, HelloReply* out) noexcept;

}  // namespace dlslime::tcp
