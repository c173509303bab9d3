#include "core/advertise_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <atomic>
#include <climits>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "core/log.h"
#include "dlslime/errors.h"

namespace dlslime {

namespace {

std::string describe(const HostInterfaces& host) {
  std::string out;
  for (const auto& a : host.addresses) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {}{}", a.interface, a.address, a.up ? "" : " (down)");
  }
  return out.empty() ? "none with an IPv4 address" : out;
}

const InterfaceAddress* first_up(const HostInterfaces& host, std::string_view name) {
  for (const auto& a : host.addresses) {
    if (a.up && a.interface == name) return &a;
  }
  return nullptr;
}

// /proc/net/route lists "Iface Destination Gateway Flags RefCnt Use Metric Mask ..." with
// addresses in hex; a default route has destination and mask 0 and is RTF_UP.
std::string read_default_route() {
  std::ifstream in("/proc/net/route");
  std::string line, best;
  long best_metric = LONG_MAX;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string iface, dest, gateway, mask;
    unsigned flags = 0;
    long refcnt = 0, use = 0, metric = 0;
    if (!(fields >> iface >> dest >> gateway >> std::hex >> flags >> std::dec >> refcnt >> use >> metric >> mask)) continue;
    constexpr unsigned kRouteUp = 0x1;  // RTF_UP
    if (dest == "00000000" && mask == "00000000" && (flags & kRouteUp) && metric < best_metric) {
      best = iface;
      best_metric = metric;
    }
  }
  return best;
}

}  // namespace

bool is_wildcard_address(std::string_view a) { return a.empty() || a == "0.0.0.0" || a == "::" || a == "[::]"; }

HostInterfaces HostInterfaces::read() {
  HostInterfaces host;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (const ifaddrs* i = list; i; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
      char text[INET_ADDRSTRLEN] = {};
      const auto* sin = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      if (!::inet_ntop(AF_INET, &sin->sin_addr, text, sizeof text)) continue;
      host.addresses.push_back(
          {i->ifa_name, text, (i->ifa_flags & IFF_UP) != 0 && (i->ifa_flags & IFF_RUNNING) != 0,
           (i->ifa_flags & IFF_LOOPBACK) != 0});
    }
    ::freeifaddrs(list);
  }
  host.default_route = read_default_route();
  return host;
}

void check_interface_name(std::string_view name, std::string_view what) {
  constexpr size_t kMaxName = IFNAMSIZ - 1;
  if (name.empty() || name.size() > kMaxName) {
    throw InvalidArgumentError(
        fmt::format("{} must be an interface name of 1..{} bytes, not {} bytes", what, kMaxName, name.size()));
  }
  for (const char ch : name) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c >= 0x7f || c == '/') {
      throw InvalidArgumentError(fmt::format("{} has byte 0x{:02x}: an interface name is printable ASCII without "
                                             "spaces or '/'",
                                             what, c));
    }
  }
}

AdvertiseChoice choose_advertise_address(std::string_view bound, const std::string& advertise_host,
                                         const std::string& advertise_interface, std::string_view what,
                                         const HostInterfaces& host) {
  if (!is_wildcard_address(bound)) return {std::string(bound), fmt::format("bound to {}", bound), false};
  if (!advertise_host.empty()) return {advertise_host, "advertise_host", false};
  if (!advertise_interface.empty()) {
    if (const auto* a = first_up(host, advertise_interface)) {
      return {a->address, fmt::format("{} (advertise_interface)", a->interface), false};
    }
    bool exists = false;
    for (const auto& a : host.addresses) exists = exists || a.interface == advertise_interface;
    throw InvalidArgumentError(fmt::format("{} '{}' {}; interfaces here: {}", what, advertise_interface,
                                           exists ? "is down" : "does not exist or has no IPv4 address",
                                           describe(host)));
  }
  if (!host.default_route.empty()) {
    if (const auto* a = first_up(host, host.default_route); a && !a->loopback) {
      return {a->address, fmt::format("{} (default route)", a->interface), false};
    }
  }
  for (const auto& a : host.addresses) {
    if (a.up && !a.loopback) return {a.address, fmt::format("{} (first interface up)", a.interface), false};
  }
  return {"127.0.0.1", "no interface other than loopback is up", true};
}

AdvertiseChoice choose_advertise_address(std::string_view bound, const std::string& advertise_host,
                                         const std::string& advertise_interface, std::string_view what) {
  if (!is_wildcard_address(bound) || !advertise_host.empty()) {
    return choose_advertise_address(bound, advertise_host, advertise_interface, what, HostInterfaces{});
  }
  AdvertiseChoice c = choose_advertise_address(bound, advertise_host, advertise_interface, what, HostInterfaces::read());
  static std::atomic<bool> warned{false};
  if (c.loopback_fallback && !warned.exchange(true)) {
    DLSLIME_WARN("a listener bound to a wildcard address advertises 127.0.0.1: no network interface other than "
                 "loopback is up, and peers on other hosts cannot dial it (set advertise_host or advertise_interface)");
  }
  return c;
}

}  // namespace dlslime
