// A range of ports that listening sockets may use, so a firewall can be opened for a known
// range (docs/deploy.md "Ports"): "20000-20100", or one port "20000".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dlslime {

struct PortRange {
  uint16_t first = 0;  // 0: no range (the OS chooses)
  uint16_t last = 0;

  bool empty() const { return first == 0; }
  bool contains(uint16_t port) const { return port >= first && port <= last; }
  uint32_t size() const { return empty() ? 0 : uint32_t(last) - first + 1; }
  std::string to_string() const;

  // "" is the empty range; otherwise "FIRST-LAST" or "PORT" with 1 <= FIRST <= LAST <= 65535.
  // Throws InvalidArgumentError naming `what`.
  static PortRange parse(std::string_view text, std::string_view what);
};

}  // namespace dlslime
