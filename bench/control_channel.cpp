#include "control_channel.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

namespace dlslime::bench {

namespace {

constexpr uint32_t kMaxMessageBytes = 16u << 20;

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1000 ? 1000 : static_cast<int>(left);  // wake up at least once a second
}

std::string errno_text() { return std::strerror(errno); }

std::string address_text(const sockaddr* sa) {
  char host[NI_MAXHOST] = {};
  char port[NI_MAXSERV] = {};
  const socklen_t len = sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (::getnameinfo(sa, len, host, sizeof host, port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV) != 0) return "?";
  return sa->sa_family == AF_INET6 ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

addrinfo* resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) throw ControlError(fmt::format("cannot resolve '{}': {}", host, ::gai_strerror(rc)));
  return res;
}

}  // namespace

std::pair<std::string, uint16_t> split_host_port(const std::string& text, const std::string& default_host) {
  std::string host = default_host;
  std::string port = text;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      throw ControlError(fmt::format("'{}' is not [IPv6]:PORT", text));
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else if (const auto colon = text.rfind(':'); colon != std::string::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  char* end = nullptr;
  const long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p < 0 || p > 65535) {
    throw ControlError(fmt::format("'{}' has no valid port (expected HOST:PORT)", text));
  }
  return {host, static_cast<uint16_t>(p)};
}

ControlChannel::ControlChannel(int fd) : fd_(fd) {}

ControlChannel::~ControlChannel() {
  if (fd_ >= 0) ::close(fd_);
}

ControlChannel::ControlChannel(ControlChannel&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

ControlChannel ControlChannel::accept_one(const std::string& listen, Clock::time_point deadline,
                                          const std::function<void(const std::string&)>& on_listening) {
  const auto [host, port] = split_host_port(listen, "0.0.0.0");
  addrinfo* res = resolve(host, port, true);
  int lfd = -1;
  std::string last_error;
  for (addrinfo* ai = res; ai && lfd < 0; ai = ai->ai_next) {
    lfd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (lfd < 0) continue;
    const int one = 1;
    ::setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(lfd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(lfd, 1) != 0) {
      last_error = errno_text();
      ::close(lfd);
      lfd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (lfd < 0) throw ControlError(fmt::format("cannot listen on {}: {}", listen, last_error));

  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&bound), &len);
  on_listening(address_text(reinterpret_cast<sockaddr*>(&bound)));

  int fd = -1;
  while (fd < 0) {
    pollfd p{lfd, POLLIN, 0};
    const int ms = remaining_ms(deadline);
    if (ms == 0) {
      ::close(lfd);
      throw ControlError(fmt::format("no initiator connected to {} before the deadline (--timeout)", listen));
    }
    if (::poll(&p, 1, ms) <= 0) continue;
    fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
  }
  ::close(lfd);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return ControlChannel(fd);
}

ControlChannel ControlChannel::dial(const std::string& peer, Clock::time_point deadline) {
  const auto [host, port] = split_host_port(peer, "127.0.0.1");
  if (port == 0) throw ControlError(fmt::format("--peer {}: port 0 cannot be dialed", peer));
  std::string last_error = "timed out";
  while (Clock::now() < deadline) {
    addrinfo* res = resolve(host, port, false);
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
      const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
        ::freeaddrinfo(res);
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return ControlChannel(fd);
      }
      last_error = errno_text();
      ::close(fd);
    }
    ::freeaddrinfo(res);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the target may not be up yet
  }
  throw ControlError(fmt::format("cannot reach the target at {}: {} (is `dlslime-bench --role target` running?)",
                                 peer, last_error));
}

void ControlChannel::send(const nlohmann::json& msg) {
  const std::string body = msg.dump();
  const uint32_t n = htonl(static_cast<uint32_t>(body.size()));
  std::string frame(reinterpret_cast<const char*>(&n), sizeof n);
  frame += body;
  size_t done = 0;
  while (done < frame.size()) {
    const ssize_t w = ::send(fd_, frame.data() + done, frame.size() - done, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw ControlError(fmt::format("the control connection to the peer failed: {}", errno_text()));
    }
    done += static_cast<size_t>(w);
  }
}

bool ControlChannel::read_exact(void* out, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<char*>(out);
  size_t done = 0;
  while (done < n) {
    pollfd pfd{fd_, POLLIN, 0};
    const int ms = remaining_ms(deadline);
    if (ms == 0) return false;
    const int ready = ::poll(&pfd, 1, ms);
    if (ready < 0 && errno != EINTR) {
      throw ControlError(fmt::format("poll on the control connection: {}", errno_text()));
    }
    if (ready <= 0) continue;
    const ssize_t r = ::recv(fd_, p + done, n - done, 0);
    if (r == 0) throw ControlError("the peer process closed the control connection (it exited or failed)");
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw ControlError(fmt::format("the control connection to the peer failed: {}", errno_text()));
    }
    done += static_cast<size_t>(r);
  }
  return true;
}

nlohmann::json ControlChannel::receive(Clock::time_point deadline) {
  uint32_t n = 0;
  if (!read_exact(&n, sizeof n, deadline)) {
    throw ControlError("timed out waiting for the peer process (--timeout)");
  }
  n = ntohl(n);
  if (n > kMaxMessageBytes) throw ControlError(fmt::format("control message of {} bytes is too large", n));
  std::string body(n, '\0');
  // Once a header arrived the body follows at once; a stall here is a broken peer.
  if (!read_exact(body.data(), n, Clock::now() + std::chrono::seconds(30))) {
    throw ControlError("the peer sent a truncated control message");
  }
  try {
    return nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    throw ControlError(fmt::format("the peer sent a malformed control message: {}", e.what()));
  }
}

std::optional<nlohmann::json> ControlChannel::poll() {
  pollfd pfd{fd_, POLLIN, 0};
  if (::poll(&pfd, 1, 0) <= 0) return std::nullopt;
  return receive(Clock::now() + std::chrono::seconds(30));
}

std::string ControlChannel::peer_ip() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return {};
  char host[NI_MAXHOST] = {};
  if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) return {};
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) {
    return {};
  }
  return host;
}

}  // namespace dlslime::bench
