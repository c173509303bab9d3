#include "nanoctrl/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <cctype>

#include "dlslime/errors.h"

namespace dlslime::nanoctrl {

namespace {

constexpr std::size_t kMaxTokenLength = 4096;

std::array<unsigned char, 32> sha256(std::string_view s) {
  std::array<unsigned char, 32> out{};
  unsigned int len = 0;
  if (EVP_Digest(s.data(), s.size(), out.data(), &len, EVP_sha256(), nullptr) != 1 || len != out.size()) {
    throw Error(StatusCode::kFailed, "NanoCtrl: SHA-256 from OpenSSL failed");
  }
  return out;
}

bool is_space(char c) { return c == ' ' || c == '\t'; }

}  // namespace

void validate_token(const std::string& token, const std::string& what) {
  if (token.empty()) throw InvalidArgumentError(what + " is empty");
  if (token.size() > kMaxTokenLength) {
    throw InvalidArgumentError(what + " is longer than " + std::to_string(kMaxTokenLength) + " characters");
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      throw InvalidArgumentError(what +
                                 " must be visible ASCII characters without spaces or control characters "
                                 "(for example the output of `openssl rand -hex 32`)");
    }
  }
}

BearerAuth::BearerAuth(const std::string& token) : enabled_(!token.empty()) {
  if (enabled_) {
    validate_token(token, "the NanoCtrl token");
    digest_ = sha256(token);
  }
}

BearerAuth::Result BearerAuth::check(std::string_view header) const {
  if (!enabled_) return Result::kOk;
  while (!header.empty() && is_space(header.front())) header.remove_prefix(1);
  while (!header.empty() && is_space(header.back())) header.remove_suffix(1);
  // The scheme is case-insensitive (RFC 7235), then at least one space, then the token.
  constexpr std::string_view kScheme = "bearer";
  if (header.size() <= kScheme.size() || !is_space(header[kScheme.size()])) return Result::kMissing;
  for (std::size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(header[i])) != kScheme[i]) return Result::kMissing;
  }
  std::string_view presented = header.substr(kScheme.size());
  while (!presented.empty() && is_space(presented.front())) presented.remove_prefix(1);
  if (presented.empty()) return Result::kMissing;
  auto digest = sha256(presented);
  return CRYPTO_memcmp(digest.data(), digest_.data(), digest_.size()) == 0 ? Result::kOk : Result::kWrong;
}

}  // namespace dlslime::nanoctrl
