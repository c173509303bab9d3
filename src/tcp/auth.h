#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "dlslime/status.h"

// Shared-secret authentication of a TCP connection: mutual challenge and response with
// HMAC-SHA256, run inside the handshake when the endpoints have a token. The token itself
// never crosses the wire.
//
//   dialer   -> Hello     (flag kHelloFlagAuth, dialer nonce Nd)
//   acceptor -> Challenge (acceptor nonce Na, acceptor id, MAC_a)
//   dialer   -> Proof     (MAC_d)
//   acceptor -> HelloReply
//
// MAC_x = HMAC-SHA256(token, role label | hello bytes | Na | acceptor id). The hello bytes
// carry Nd and both endpoint ids, so each MAC binds the whole exchange; the acceptor's
// fresh Na makes a recorded Proof useless on a later connection, and the distinct role
// labels keep a MAC from being reflected back to the side that produced it.
namespace dlslime::tcp {

inline constexpr size_t kNonceSize = 16;
inline constexpr size_t kMacSize = 32;
inline constexpr size_t kChallengeSize = 64;
inline constexpr size_t kProofSize = 64;

using Nonce = std::array<uint8_t, kNonceSize>;
using Mac = std::array<uint8_t, kMacSize>;

struct Challenge {
  Nonce nonce{};
  uint64_t endpoint_id = 0;  // the acceptor's id
  Mac mac{};                 // MAC_a
};

struct Proof {
  Mac mac{};  // MAC_d
};

enum class AuthRole : uint8_t { kAcceptor, kDialer };

// A nonce from the OS's cryptographic generator.
Nonce random_nonce();

// MAC_a or MAC_d over the exchange (see above). `hello` is the raw hello as sent.
Mac auth_mac(const std::string& token, AuthRole role, const uint8_t* hello, size_t hello_size, const Nonce& nonce,
             uint64_t acceptor_id);

// Constant-time comparison (no early exit that would time the first differing byte).
bool mac_equal(const Mac& a, const Mac& b) noexcept;

void encode_challenge(const Challenge& c, uint8_t* out) noexcept;
Status parse_challenge(const uint8_t* in, Challenge* out) noexcept;
void encode_proof(const Proof& p, uint8_t* out) noexcept;
Status parse_proof(const uint8_t* in, Proof* out) noexcept;

// True when the first bytes of a message from the acceptor start a Challenge (rather
// than a HelloReply); both start with an 8-byte magic.
bool is_challenge(const uint8_t* in) noexcept;

}  // namespace dlslime::tcp
