#include "nanoctrl/connection_gate.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "core/log.h"
#include "dlslime/errors.h"

namespace dlslime::nanoctrl {

namespace {

using std::chrono::milliseconds;

thread_local GateConnection* t_serving = nullptr;

int poll_ms(GateClock::duration d) {
  auto ms = std::chrono::duration_cast<milliseconds>(d).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// The value of header `name` (lower case, with the ':') in a lower-cased request head.
std::optional<std::string_view> header_value(std::string_view head, std::string_view name) {
  std::string needle = "\r\n" + std::string(name);
  auto at = head.find(needle);
  if (at == std::string_view::npos) return std::nullopt;
  auto begin = at + needle.size();
  auto end = head.find("\r\n", begin);
  std::string_view v = head.substr(begin, end - begin);
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return v;
}

void address_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                : ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  if (rc != 0) return;
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
    port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf);
    port = ntohs(in6->sin6_port);
  }
  ip = buf;
}

}  // namespace

// ------------------------------------------------------------------------------- stream

bool GateStream::wait(short events, bool reading) const {
  auto limit = GateClock::now() + io_timeout_;
  if (reading) limit = std::min(limit, deadline_);
  for (;;) {
    auto left = limit - GateClock::now();
    if (left <= GateClock::duration::zero()) return false;
    pollfd p{conn_.fd, events, 0};
    int n = ::poll(&p, 1, poll_ms(left));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

bool GateStream::is_readable() const {
  return conn_.consumed < conn_.buffered.size() || wait(POLLIN, true);
}

bool GateStream::is_writable() const { return wait(POLLOUT, false); }

ssize_t GateStream::read(char* ptr, std::size_t size) {
  if (conn_.consumed < conn_.buffered.size()) {
    std::size_t n = std::min(size, conn_.buffered.size() - conn_.consumed);
    std::memcpy(ptr, conn_.buffered.data() + conn_.consumed, n);
    conn_.consumed += n;
    return static_cast<ssize_t>(n);
  }
  // The request's deadline bounds the body too: a body trickled in holds its worker for
  // request_read_timeout at most.
  if (!wait(POLLIN, true)) return -1;
  for (;;) {
    ssize_t n = ::recv(conn_.fd, ptr, size, 0);
    if (n < 0 && errno == EINTR) continue;
    return n;
  }
}

ssize_t GateStream::write(const char* ptr, std::size_t size) {
  if (!wait(POLLOUT, false)) return -1;
  for (;;) {
    ssize_t n = ::send(conn_.fd, ptr, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    return n;
  }
}

void GateStream::get_remote_ip_and_port(std::string& ip, int& port) const { address_of(conn_.fd, true, ip, port); }

void GateStream::get_local_ip_and_port(std::string& ip, int& port) const { address_of(conn_.fd, false, ip, port); }

// httplib answers 500 to a stream whose socket() is FD_SETSIZE or more, because its own
// stream select()s on it. This one polls, so it reports a select-able value only for the
// descriptors select could take, and no socket (-1) otherwise; httplib uses socket() for
// nothing else on the server side.
socket_t GateStream::socket() const { return conn_.fd < FD_SETSIZE ? conn_.fd : INVALID_SOCKET; }

// --------------------------------------------------------------------------------- gate

ConnectionGate::ConnectionGate(GateLimits limits, Serve serve)
    : limits_(limits), serve_(std::move(serve)), pool_(limits.max_threads) {}

ConnectionGate::~ConnectionGate() { stop(); }

void ConnectionGate::start() {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    throw ConnectionError(fmt::format("NanoCtrl cannot create its connection poller: {}", std::strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  reactor_ = std::thread([this] { run(); });
}

void ConnectionGate::add(int fd) {
  auto c = std::make_shared<GateConnection>();
  c->fd = fd;
  c->idle_since = GateClock::now();
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    incoming_.push_back(std::move(c));
  }
  wake();
}

void ConnectionGate::wake() {
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
}

void ConnectionGate::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_.exchange(true)) return;
    // Requests being served end now: their reads and writes fail, their workers return.
    for (int fd : serving_) ::shutdown(fd, SHUT_RDWR);
  }
  if (reactor_.joinable()) {
    wake();
    reactor_.join();
  }
  pool_.shutdown();
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  epoll_fd_ = wake_fd_ = -1;
}

void ConnectionGate::close_after_response() {
  if (t_serving) t_serving->close_after_response = true;
}

bool ConnectionGate::closing_after_response() { return t_serving && t_serving->close_after_response; }

std::size_t ConnectionGate::waiting() const { return waiting_count_.load(); }

void ConnectionGate::close_conn(GateConnection& c) {
  if (c.fd >= 0) ::close(c.fd);
  c.fd = -1;
}

void ConnectionGate::forget(int fd) {
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  if (waiting_.erase(fd)) waiting_count_.fetch_sub(1);
}

void ConnectionGate::refuse(GateConnection& c, int status, const std::string& message) {
  std::string body = fmt::format(R"({{"status":"error","message":"{}"}})", message);
  std::string reply = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}", status,
      status == 408 ? "Request Timeout" : "Request Header Fields Too Large", body.size(), body);
  [[maybe_unused]] auto n = ::send(c.fd, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  close_conn(c);
}

ConnectionGate::ReadResult ConnectionGate::read_available(GateConnection& c) {
  char buf[16384];
  const std::size_t cap = limits_.max_head_bytes + limits_.prebuffer_body_bytes;
  for (;;) {
    ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      auto now = GateClock::now();
      if (c.draining) {
        c.drained += static_cast<std::size_t>(n);
        c.last_data = now;
        if (c.drained > limits_.max_drain_bytes) return ReadResult::kEof;
        continue;
      }
      if (c.first_byte == GateClock::time_point{}) c.first_byte = now;
      c.buffered.append(buf, static_cast<std::size_t>(n));
      // Level-triggered: the rest stays in the socket until the worker reads it.
      if (c.buffered.size() - c.consumed >= cap) return ReadResult::kOpen;
      continue;
    }
    if (n == 0) return ReadResult::kEof;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? ReadResult::kOpen : ReadResult::kError;
  }
}

bool ConnectionGate::request_ready(const GateConnection& c) const {
  std::string_view data(c.buffered);
  data.remove_prefix(c.consumed);
  auto end = data.find("\r\n\r\n");
  if (end == std::string_view::npos) return false;
  const std::size_t head_len = end + 4;
  const std::string head = lower(data.substr(0, head_len));
  if (header_value(head, "transfer-encoding:")) return true;  // streamed by the worker
  auto cl = header_value(head, "content-length:");
  if (!cl) return true;
  std::size_t len = 0;
  for (char ch : *cl) {
    if (ch < '0' || ch > '9' || len > limits_.prebuffer_body_bytes) return true;  // httplib judges it
    len = len * 10 + static_cast<std::size_t>(ch - '0');
  }
  return len > limits_.prebuffer_body_bytes || data.size() >= head_len + len;
}

bool ConnectionGate::on_readable(const ConnPtr& c) {
  ReadResult r = read_available(*c);
  if (c->draining) return r == ReadResult::kOpen;
  if (request_ready(*c)) {
    dispatch(c);
    return true;
  }
  if (r != ReadResult::kOpen) return false;
  if (c->buffered.size() - c->consumed > limits_.max_head_bytes) {
    dropped_head_too_large_.fetch_add(1);
    forget(c->fd);
    refuse(*c, 431, fmt::format("the request line and headers are longer than {} bytes", limits_.max_head_bytes));
  }
  return true;
}

void ConnectionGate::dispatch(const ConnPtr& c) {
  forget(c->fd);
  {
    std::lock_guard lock(mu_);
    serving_.insert(c->fd);
  }
  pool_.enqueue([this, c] { serve_on_worker(c); });
}

void ConnectionGate::serve_on_worker(const ConnPtr& c) {
  c->close_after_response = false;
  bool keep = false;
  t_serving = c.get();
  try {
    GateStream strm(*c, c->first_byte + limits_.request_read_timeout, limits_.io_timeout);
    keep = serve_(strm);
  } catch (const std::exception& e) {
    DLSLIME_WARN("nanoctrl: closing a connection after an error serving it: {}", e.what());
  }
  t_serving = nullptr;
  c->buffered.erase(0, c->consumed);
  c->consumed = 0;
  const auto now = GateClock::now();
  if (c->close_after_response) {
    // The answer is out; stop sending and let the gate drain what the client still sends.
    ::shutdown(c->fd, SHUT_WR);
    c->draining = true;
    c->buffered.clear();
    c->drain_until = now + limits_.drain_time;
    c->last_data = now;
    keep = true;
  }
  c->idle_since = now;
  c->first_byte = c->buffered.empty() ? GateClock::time_point{} : now;
  std::lock_guard lock(mu_);
  serving_.erase(c->fd);
  if (!keep || stopping_) {
    close_conn(*c);
    return;
  }
  incoming_.push_back(c);
  wake();
}

void ConnectionGate::sweep(GateClock::time_point now) {
  std::vector<ConnPtr> expired;
  for (const auto& [fd, c] : waiting_) {
    bool late = c->draining ? now >= c->drain_until || now - c->last_data >= limits_.drain_quiet
                            : c->first_byte != GateClock::time_point{}
                                  ? now - c->first_byte >= limits_.request_read_timeout
                                  : now - c->idle_since >= limits_.keep_alive_timeout;
    if (late) expired.push_back(c);
  }
  for (const auto& c : expired) {
    forget(c->fd);
    if (!c->draining && c->first_byte != GateClock::time_point{}) {
      dropped_read_timeout_.fetch_add(1);
      refuse(*c, 408, fmt::format("the request did not arrive completely within {} ms of its first byte",
                                  limits_.request_read_timeout.count()));
    } else {
      close_conn(*c);
    }
  }
}

void ConnectionGate::run() {
  epoll_event events[256];
  auto next_sweep = GateClock::now();
  const auto tick = std::min<milliseconds>({milliseconds(100), limits_.request_read_timeout / 4,
                                            limits_.drain_quiet});
  while (!stopping_) {
    int n = ::epoll_wait(epoll_fd_, events, 256, poll_ms(tick));
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == wake_fd_) {
        uint64_t v;
        [[maybe_unused]] auto r = ::read(wake_fd_, &v, sizeof v);
        continue;
      }
      auto it = waiting_.find(fd);
      if (it == waiting_.end()) continue;
      ConnPtr c = it->second;
      if (!on_readable(c)) {
        forget(fd);
        close_conn(*c);
      }
    }
    std::vector<ConnPtr> incoming;
    {
      std::lock_guard lock(mu_);
      incoming.swap(incoming_);
    }
    for (auto& c : incoming) {
      // A pipelined request that is already buffered goes straight back to a worker.
      if (!c->draining && request_ready(*c)) {
        dispatch(c);
        continue;
      }
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.fd = c->fd;
      if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c->fd, &ev) != 0) {
        DLSLIME_WARN("nanoctrl: cannot watch a connection: {}", std::strerror(errno));
        close_conn(*c);
        continue;
      }
      waiting_.emplace(c->fd, std::move(c));
      waiting_count_.fetch_add(1);
    }
    auto now = GateClock::now();
    if (now >= next_sweep) {
      sweep(now);
      next_sweep = now + tick;
    }
  }
  for (auto& [fd, c] : waiting_) close_conn(*c);
  waiting_.clear();
  waiting_count_ = 0;
  std::lock_guard lock(mu_);
  for (auto& c : incoming_) close_conn(*c);
  incoming_.clear();
}

}  // namespace dlslime::nanoctrl
