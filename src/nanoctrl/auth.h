#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

// NanoCtrl's optional bearer token (docs/control-plane.md, "Authentication"): when a server
// has a token, every request but GET /healthz must carry `Authorization: Bearer <token>`.
// The token is a shared secret: nothing here logs or echoes it.
namespace dlslime::nanoctrl {

// Throws InvalidArgumentError (naming `what`, never the value) unless `token` is 1-4096
// visible ASCII characters without spaces: what an HTTP header carries unchanged.
void validate_token(const std::string& token, const std::string& what);

class BearerAuth {
 public:
  enum class Result { kOk, kMissing, kWrong };

  // An empty token disables the check: every request passes.
  explicit BearerAuth(const std::string& token);

  bool enabled() const noexcept { return enabled_; }
  // `authorization` is the request's Authorization header ("" when absent). kMissing: no
  // header, another scheme or no credentials; kWrong: a bearer token that is not ours. The
  // comparison takes the same time whatever the presented value has in common with ours
  // (both are hashed, the digests compared with CRYPTO_memcmp), so timing reveals nothing.
  Result check(std::string_view authorization) const;

 private:
  bool enabled_;
  std::array<unsigned char, 32> digest_{};
};

}  // namespace dlslime::nanoctrl
