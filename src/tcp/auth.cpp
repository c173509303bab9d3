#include "tcp/auth.h"

#include <cstring>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "dlslime/errors.h"
#include "tcp/wire.h"

namespace dlslime::tcp {

namespace {
constexpr char kChallengeMagic[8] = {'D', 'L', 'S', 'L', 'I', 'M', 'E', 'C'};
constexpr char kProofMagic[8] = {'D', 'L', 'S', 'L', 'I', 'M', 'E', 'P'};
constexpr char kAcceptorLabel[] = "dlslime-tcp-auth-v1 acceptor";
constexpr char kDialerLabel[] = "dlslime-tcp-auth-v1 dialer";
}  // namespace

Nonce random_nonce() {
  Nonce n;
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    throw Error(StatusCode::kFailed, "the OS random generator failed (OpenSSL RAND_bytes)");
  }
  return n;
}

Mac auth_mac(const std::string& token, AuthRole role, const uint8_t* hello, size_t hello_size, const Nonce& nonce,
             uint64_t acceptor_id) {
  const char* label = role == AuthRole::kAcceptor ? kAcceptorLabel : kDialerLabel;
  // label (with its NUL, so no label is a prefix of the other) | hello | nonce | id (LE).
  uint8_t message[sizeof kAcceptorLabel + 64 + kNonceSize + 8];
  size_t label_size = std::strlen(label) + 1;
  if (hello_size > 64) throw Error(StatusCode::kFailed, "auth_mac: hello larger than 64 bytes");
  WireWriter w(message);
  w.bytes(label, label_size);
  w.bytes(hello, hello_size);
  w.bytes(nonce.data(), nonce.size());
  w.u64(acceptor_id);
  Mac mac;
  unsigned int mac_size = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), message,
           static_cast<size_t>(w.pos() - message), mac.data(), &mac_size) == nullptr ||
      mac_size != mac.size()) {
    throw Error(StatusCode::kFailed, "HMAC-SHA256 failed (OpenSSL)");
  }
  return mac;
}

bool mac_equal(const Mac& a, const Mac& b) noexcept { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

bool is_challenge(const uint8_t* in) noexcept { return std::memcmp(in, kChallengeMagic, sizeof kChallengeMagic) == 0; }

void encode_challenge(const Challenge& c, uint8_t* out) noexcept {
  std::memset(out, 0, kChallengeSize);
  WireWriter w(out);
  w.bytes(kChallengeMagic, sizeof kChallengeMagic);
  w.bytes(c.nonce.data(), c.nonce.size());
  w.u64(c.endpoint_id);
  w.bytes(c.mac.data(), c.mac.size());
}

Status parse_challenge(const uint8_t* in, Challenge* out) noexcept {
  if (!is_challenge(in)) return Status::protocol_error("not a DLSlime TCP auth challenge (bad magic)");
  WireReader r(in + sizeof kChallengeMagic);
  Challenge c;
  r.bytes(c.nonce.data(), c.nonce.size());
  c.endpoint_id = r.u64();
  r.bytes(c.mac.data(), c.mac.size());
  *out = c;
  return Status::ok();
}

void encode_proof(const Proof& p, uint8_t* out) noexcept {
  std::memset(out, 0, kProofSize);
  WireWriter w(out);
  w.bytes(kProofMagic, sizeof kProofMagic);
  w.bytes(p.mac.data(), p.mac.size());
}

Status parse_proof(const uint8_t* in, Proof* out) noexcept {
  if (std::memcmp(in, kProofMagic, sizeof kProofMagic) != 0) {
    return Status::protocol_error("not a DLSlime TCP auth proof (bad magic)");
  }
  WireReader r(in + sizeof kProofMagic);
  Proof p;
  r.bytes(p.mac.data(), p.mac.size());
  *out = p;
  return Status::ok();
}

}  // namespace dlslime::tcp
