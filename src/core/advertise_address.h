// The address a listening socket tells its peers to dial when it is bound to a wildcard
// address (docs/deploy.md "Advertise address"). One rule for every listener DLSlime makes:
// TCP endpoints, the address a PeerAgent publishes, NanoCtrl's URL for other hosts.
//
// The host name is not consulted: stock Debian and Ubuntu map it to 127.0.1.1, which a
// remote peer would then dial (issue 27). Like NCCL's socket interface selection, the
// choice is an interface's address: the one named by the user, else the interface that
// holds the default route, else the first non-loopback interface that is up.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dlslime {

// One IPv4 address of a network interface, as getifaddrs(3) lists it.
struct InterfaceAddress {
  std::string interface;
  std::string address;
  bool up = false;
  bool loopback = false;
};

// What the rule looks at: this host's interfaces and which one holds the default route.
struct HostInterfaces {
  std::vector<InterfaceAddress> addresses;  // getifaddrs order
  std::string default_route;                // interface name; empty when there is no default route
  // Read now from getifaddrs(3) and /proc/net/route (the lowest-metric IPv4 default route).
  static HostInterfaces read();
};

struct AdvertiseChoice {
  std::string host;
  std::string reason;  // for logs and docs: "bound to 10.0.0.5", "eth0 (default route)", ...
  bool loopback_fallback = false;  // no other interface is up: peers on other hosts cannot dial it
};

// Whether `address` (text) is a wildcard bind address: "", "0.0.0.0", "::" or "[::]".
bool is_wildcard_address(std::string_view address);

// The address to advertise for a listener bound to `bound` (an IP address as text):
// - a specific address: that address (the options below apply to wildcard binds only);
// - else `advertise_host` when set;
// - else the IPv4 address of `advertise_interface` when set: InvalidArgumentError naming
//   `what` (e.g. "TcpEndpoint option advertise_interface") when it does not exist, is down
//   or has no IPv4 address, listing the interfaces there are;
// - else the default route's interface, else the first up non-loopback interface;
// - else 127.0.0.1, with loopback_fallback set.
AdvertiseChoice choose_advertise_address(std::string_view bound, const std::string& advertise_host,
                                         const std::string& advertise_interface, std::string_view what,
                                         const HostInterfaces& host);
// The same over HostInterfaces::read(); logs a warning (once per process) for a loopback fallback.
AdvertiseChoice choose_advertise_address(std::string_view bound, const std::string& advertise_host,
                                         const std::string& advertise_interface, std::string_view what);

// Throws InvalidArgumentError naming `what` unless `name` could be an interface name:
// 1..15 bytes (IFNAMSIZ - 1), printable ASCII, no space or '/'.
void check_interface_name(std::string_view name, std::string_view what);

}  // namespace dlslime
