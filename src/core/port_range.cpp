#include "core/port_range.h"

#include <charconv>

#include <fmt/format.h>

#include "dlslime/errors.h"

namespace dlslime {

std::string PortRange::to_string() const {
  if (empty()) return "";
  return first == last ? std::to_string(first) : fmt::format("{}-{}", first, last);
}

PortRange PortRange::parse(std::string_view text, std::string_view what) {
  if (text.empty()) return {};
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError(fmt::format("{} '{}' {}: write FIRST-LAST (e.g. 20000-20100) or one port, with "
                                            "1 <= FIRST <= LAST <= 65535",
                                            what, text, why));
  };
  auto number = [&](std::string_view part) -> uint16_t {
    unsigned value = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size()) throw bad("is not a port range");
    if (value == 0 || value > 65535) throw bad("has a port outside 1..65535");
    return static_cast<uint16_t>(value);
  };
  const size_t dash = text.find('-');
  PortRange r;
  r.first = number(text.substr(0, dash));
  r.last = dash == std::string_view::npos ? r.first : number(text.substr(dash + 1));
  if (r.last < r.first) throw bad("ends before it starts");
  return r;
}

}  // namespace dlslime
