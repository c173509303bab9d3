// Host names and IP addresses as users and peers hand them to us (a bind address, an
// advertised host, a peer's endpoint_info): checked as text before any resolver sees them.
#pragma once

#include <string_view>

namespace dlslime {

// Throws InvalidArgumentError naming `what` unless `host` could be a host name or an IP
// address: 1..253 bytes of printable ASCII, no space. The resolvers read a C string, so
// "127.0.0.1\0x" would otherwise dial 127.0.0.1 (hostile review 16i), and a control byte
// would end up in log lines and in the records we publish.
void check_host_text(std::string_view host, std::string_view what);

}  // namespace dlslime
