#include "core/host_name.h"

#include <fmt/format.h>

#include "dlslime/errors.h"

namespace dlslime {

void check_host_text(std::string_view host, std::string_view what) {
  // RFC 1035's limit on a name's text form; an IPv6 literal with a zone id fits well within.
  constexpr size_t kMaxHostBytes = 253;
  if (host.empty()) throw InvalidArgumentError(fmt::format("{} must be a non-empty host name or IP address", what));
  if (host.size() > kMaxHostBytes) {
    throw InvalidArgumentError(
        fmt::format("{} is {} bytes long; a host name or IP address has at most {}", what, host.size(), kMaxHostBytes));
  }
  for (size_t i = 0; i < host.size(); ++i) {
    const auto c = static_cast<unsigned char>(host[i]);
    if (c <= 0x20 || c >= 0x7f) {
      throw InvalidArgumentError(fmt::format("{} has byte 0x{:02x} at position {} ({}): a host name or IP address "
                                             "is printable ASCII without spaces",
                                             what, c, i, c == 0 ? "a NUL" : c == 0x20 ? "a space" : "not printable"));
    }
  }
}

}  // namespace dlslime
