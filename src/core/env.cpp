#include "core/env.h"

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "dlslime/errors.h"

namespace dlslime {

int64_t env_integer(const char* name, int64_t min, int64_t max, int64_t fallback) {
  const char* raw = std::getenv(name);
  if (!raw || !*raw) return fallback;
  const char* end = raw + std::strlen(raw);
  int64_t value = 0;
  const auto [ptr, ec] = std::from_chars(raw, end, value);
  if (ec == std::errc::result_out_of_range || (ec == std::errc() && ptr == end && (value < min || value > max))) {
    throw InvalidArgumentError(
        fmt::format("environment variable {}='{}' is out of range (allowed: {}..{})", name, raw, min, max));
  }
  if (ec != std::errc() || ptr != end) {
    throw InvalidArgumentError(
        fmt::format("environment variable {}='{}' is not an integer (allowed: {}..{})", name, raw, min, max));
  }
  return value;
}

bool env_flag(const char* name) {
  const char* raw = std::getenv(name);
  const std::string_view v = raw ? raw : "";
  if (v.empty() || v == "0") return false;
  if (v == "1") return true;
  throw InvalidArgumentError(fmt::format("environment variable {}='{}' must be 1 or 0 (or unset)", name, v));
}

}  // namespace dlslime
