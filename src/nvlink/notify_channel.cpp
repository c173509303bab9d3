#include "nvlink/notify_channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "core/log.h"
#include "dlslime/endpoint.h"
#include "dlslime/errors.h"

namespace dlslime::nvlink {

namespace {

// Every message: this header, then `length` bytes (a notification's, or an ack's error text).
enum MsgType : uint32_t { kNotify = 1, kAck = 2 };
struct Header {
  uint32_t type;
  int32_t status;  // kAck: a StatusCode (0: held)
  uint64_t seq;
  uint32_t length;
  uint32_t reserved;
};
constexpr size_t kMaxAckText = 1024;
constexpr size_t kMaxMessage = sizeof(Header) + OpRequest::kMaxNotificationBytes;
// Acknowledgements waiting for the peer to read them: past this many, its notifications
// are not read either (it floods without reading: only its own sends wait).
constexpr size_t kMaxQueuedAcks = 4096;
// Dials accepted before connect() named the peer, kept for it to claim.
constexpr size_t kMaxUnclaimed = 8;

sockaddr_un abstract_address(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  // Abstract namespace: a leading NUL, no file on disk, gone with the socket.
  std::memcpy(a.sun_path + 1, name.data(), std::min(name.size(), sizeof(a.sun_path) - 2));
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + std::min(name.size(), sizeof(a.sun_path) - 2));
  return a;
}

std::string message(uint32_t type, int32_t status, uint64_t seq, const std::string& payload) {
  const Header h{type, status, seq, static_cast<uint32_t>(payload.size()), 0};
  std::string m(sizeof h + payload.size(), '\0');
  std::memcpy(m.data(), &h, sizeof h);
  std::memcpy(m.data() + sizeof h, payload.data(), payload.size());
  return m;
}

// Writes one whole message (SOCK_SEQPACKET: all or nothing); false if the socket is full.
// Throws nothing: a broken socket shows as EOF on the next read.
bool send_message(int fd, const std::string& m) {
  const ssize_t n = ::send(fd, m.data(), m.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n >= 0) return true;
  return !(errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS);
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

NotifyChannel::NotifyChannel() {
  std::random_device rd;
  address_ = fmt::format("dlslime-nvlink-notify-{}-{:016x}", getpid(), (uint64_t{rd()} << 32) | rd());
  listen_fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  socklen_t len = 0;
  const sockaddr_un a = abstract_address(address_, &len);
  if (listen_fd_ < 0 || wake_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&a), len) != 0 ||
      ::listen(listen_fd_, 16) != 0) {
    const int err = errno;
    close_fd(listen_fd_);
    close_fd(wake_fd_);
    throw ConnectionError(fmt::format("NVLinkEndpoint: cannot open its notification socket: {}", std::strerror(err)));
  }
}

NotifyChannel::~NotifyChannel() {
  close_fds_locked();
  close_fd(listen_fd_);
  close_fd(wake_fd_);
}

void NotifyChannel::start() {
  thread_.start([self = shared_from_this()] { self->run(); });
}

void NotifyChannel::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

void NotifyChannel::close_fds_locked() {
  close_fd(out_fd_);
  close_fd(in_fd_);
  for (int& fd : unclaimed_) close_fd(fd);
  unclaimed_.clear();
}

void NotifyChannel::connect(const std::string& address, int64_t pid) {
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  socklen_t len = 0;
  const sockaddr_un a = abstract_address(address, &len);
  if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw ConnectionError(fmt::format("NVLinkEndpoint: cannot reach the peer's notification socket '{}': {}", address,
                                      std::strerror(err)));
  }
  NotificationInbox::EndedList ended;
  {
    std::lock_guard lock(mu_);
    if (closed_) {
      ::close(fd);
      throw ConnectionError("NVLinkEndpoint is shut down");
    }
    if (peer_pid_ >= 0) lose_peer_locked(Status::peer_closed("NVLinkEndpoint connected to another peer"), ended);
    inbox_.connected(/*drop_held=*/true);
    out_fd_ = fd;
    peer_pid_ = pid;
    accept_locked();  // claims the peer's dial if it came first
  }
  for (auto& e : ended) e.complete();
  wake();
}

Future NotifyChannel::send(std::string bytes, const OpLimit& limit) {
  auto state = std::make_shared<OpState>(OpKind::kSendNotify);
  Future f(state);
  {
    std::lock_guard lock(mu_);
    Status refused;
    if (closed_) {
      refused = Status::cancelled("NVLinkEndpoint is shut down");
    } else if (out_fd_ < 0) {
      refused = peer_pid_ < 0 ? Status::not_connected("NVLinkEndpoint has no notification channel to a peer: it is not "
                                                      "connected, or its peer published no notify_socket (an older "
                                                      "version)")
                              : Status::peer_closed("the peer's notification channel is closed");
    }
    if (!refused.is_ok()) {
      state->complete(std::move(refused));
      return f;
    }
    const uint64_t seq = next_seq_++;
    state->set_canceller(weak_from_this(), seq);
    sending_.emplace(seq, Sending{state, limit, limit.deadline()});
    outbox_.push_back({seq, message(kNotify, 0, seq, bytes)});
    flush_locked();
  }
  wake();  // its deadline, or a full socket to watch
  return f;
}

Future NotifyChannel::receive(const OpLimit& limit) {
  auto state = std::make_shared<OpState>(OpKind::kRecvNotify);
  Future f(state);
  NotificationInbox::EndedList ended;
  {
    std::lock_guard lock(mu_);
    if (closed_) {
      state->complete(Status::cancelled("NVLinkEndpoint is shut down"));
      return f;
    }
    state->set_canceller(weak_from_this(), 0);
    inbox_.post(std::move(state), limit, ended);
  }
  for (auto& e : ended) e.complete();
  wake();  // its deadline
  return f;
}

bool NotifyChannel::cancel_op(OpState& op, uint64_t seq) {
  NotificationInbox::EndedList ended;
  {
    std::lock_guard lock(mu_);
    if (closed_) return false;
    if (op.kind() == OpKind::kRecvNotify) {
      if (!inbox_.withdraw(op, ended)) return false;
    } else {
      auto queued = std::find_if(outbox_.begin(), outbox_.end(), [seq](const Outgoing& o) { return o.seq == seq; });
      auto it = sending_.find(seq);
      if (queued == outbox_.end() || it == sending_.end()) return false;  // written: it may arrive
      outbox_.erase(queued);
      ended.push_back({std::move(it->second.state), OpState::cancelled_by_user()});
      sending_.erase(it);
    }
  }
  CompletionScope scope;
  return ended.front().state->complete(std::move(ended.front().status));
}

void NotifyChannel::shutdown() {
  NotificationInbox::EndedList ended;
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = true;
    const Status why = Status::cancelled("NVLinkEndpoint was shut down");
    for (auto& [seq, s] : sending_) ended.push_back({std::move(s.state), why});
    sending_.clear();
    outbox_.clear();
    acks_.clear();
    inbox_.gone(why, /*drop_held=*/true, ended);
    close_fds_locked();
  }
  for (auto& e : ended) e.complete();
  wake();
}

void NotifyChannel::accept_locked() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) break;
    if (unclaimed_.size() == kMaxUnclaimed) {
      ::close(unclaimed_.front());
      unclaimed_.erase(unclaimed_.begin());
    }
    unclaimed_.push_back(fd);
  }
  if (peer_pid_ < 0) return;  // connect() has not named the peer yet
  // The newest dial of the named peer wins (it may have dialed again). Others stay, a few
  // at most, for a later connect() to another peer that dialed first; none is read.
  for (size_t i = unclaimed_.size(); i-- > 0;) {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(unclaimed_[i], SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) continue;
    const bool from_peer = peer_pid_ > 0 ? cred.pid == peer_pid_ : cred.uid == getuid();
    if (!from_peer) continue;
    close_fd(in_fd_);
    in_fd_ = unclaimed_[i];
    unclaimed_.erase(unclaimed_.begin() + static_cast<ptrdiff_t>(i));
    break;
  }
}

void NotifyChannel::read_notifications_locked(NotificationInbox::EndedList& ended) {
  char buf[kMaxMessage + 1];
  while (in_fd_ >= 0 && acks_.size() < kMaxQueuedAcks) {
    const ssize_t n = ::recv(in_fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) {
      return lose_peer_locked(Status::peer_closed("the peer closed its notification channel"), ended);
    }
    Header h;
    if (static_cast<size_t>(n) < sizeof h) {
      return lose_peer_locked(Status::protocol_error(fmt::format("a {}-byte notification message", n)), ended);
    }
    std::memcpy(&h, buf, sizeof h);
    const size_t payload = static_cast<size_t>(n) - sizeof h;
    if (h.type != kNotify || h.length != payload || payload > OpRequest::kMaxNotificationBytes) {
      return lose_peer_locked(Status::protocol_error(fmt::format("a malformed notification (type {}, {} bytes, header "
                                                                 "says {}; at most {})",
                                                                 h.type, payload, h.length,
                                                                 OpRequest::kMaxNotificationBytes)),
                              ended);
    }
    const Status st = inbox_.deliver(std::string(buf + sizeof h, payload), ended);
    acks_.push_back(message(kAck, st.raw_code(), h.seq, st.message().substr(0, kMaxAckText)));
  }
}

void NotifyChannel::read_acks_locked(NotificationInbox::EndedList& ended) {
  char buf[sizeof(Header) + kMaxAckText + 1];
  while (out_fd_ >= 0) {
    const ssize_t n = ::recv(out_fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) return lose_peer_locked(Status::peer_closed("the peer closed its notification channel"), ended);
    Header h;
    std::memcpy(&h, buf, std::min(sizeof h, static_cast<size_t>(n)));
    const size_t payload = static_cast<size_t>(n) >= sizeof h ? static_cast<size_t>(n) - sizeof h : 0;
    if (static_cast<size_t>(n) < sizeof h || h.type != kAck || h.length != payload || payload > kMaxAckText) {
      return lose_peer_locked(Status::protocol_error("a malformed notification acknowledgement"), ended);
    }
    auto it = sending_.find(h.seq);
    if (it == sending_.end()) continue;  // it already ended (deadline)
    Status st = h.status == 0 ? Status::ok()
                              : Status(static_cast<StatusCode>(h.status), std::string(buf + sizeof h, payload));
    ended.push_back({std::move(it->second.state), std::move(st)});
    sending_.erase(it);
  }
}

void NotifyChannel::flush_locked() {
  while (out_fd_ >= 0 && !outbox_.empty()) {
    if (!send_message(out_fd_, outbox_.front().bytes)) return;  // full: POLLOUT
    outbox_.pop_front();
  }
  while (in_fd_ >= 0 && !acks_.empty()) {
    if (!send_message(in_fd_, acks_.front())) return;
    acks_.pop_front();
  }
}

void NotifyChannel::expire_locked(Clock::time_point now, NotificationInbox::EndedList& ended) {
  for (auto it = sending_.begin(); it != sending_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    const uint64_t seq = it->first;
    std::erase_if(outbox_, [seq](const Outgoing& o) { return o.seq == seq; });  // not sent, then
    ended.push_back({std::move(it->second.state),
                     Status::timeout(fmt::format("send_notify did not complete within {}", it->second.limit.describe()))});
    it = sending_.erase(it);
  }
  inbox_.expire(now, ended);
}

NotifyChannel::Clock::time_point NotifyChannel::next_deadline_locked() const {
  auto next = inbox_.next_deadline();
  for (const auto& [seq, s] : sending_) next = std::min(next, s.deadline);
  return next;
}

void NotifyChannel::lose_peer_locked(const Status& why, NotificationInbox::EndedList& ended) {
  close_fd(out_fd_);
  close_fd(in_fd_);
  for (auto& [seq, s] : sending_) ended.push_back({std::move(s.state), why});
  sending_.clear();
  outbox_.clear();
  acks_.clear();
  // What arrived stays to be received (it was acknowledged); waiting recv_notifys fail.
  inbox_.gone(why, /*drop_held=*/false, ended);
}

void NotifyChannel::run() {
  for (;;) {
    pollfd fds[4];
    nfds_t n = 0;
    int timeout_ms = -1;
    {
      std::lock_guard lock(mu_);
      if (closed_) return;
      fds[n++] = {wake_fd_, POLLIN, 0};
      fds[n++] = {listen_fd_, POLLIN, 0};
      if (in_fd_ >= 0) {
        fds[n++] = {in_fd_, static_cast<short>((acks_.size() < kMaxQueuedAcks ? POLLIN : 0) |
                                               (acks_.empty() ? 0 : POLLOUT)),
                    0};
      }
      if (out_fd_ >= 0) fds[n++] = {out_fd_, static_cast<short>(POLLIN | (outbox_.empty() ? 0 : POLLOUT)), 0};
      const auto next = next_deadline_locked();
      if (next != Clock::time_point::max()) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
        timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
      }
    }
    ::poll(fds, n, timeout_ms);
    uint64_t drained = 0;
    [[maybe_unused]] ssize_t r = ::read(wake_fd_, &drained, sizeof drained);
    NotificationInbox::EndedList ended;
    {
      std::lock_guard lock(mu_);
      if (closed_) return;
      accept_locked();
      read_notifications_locked(ended);
      read_acks_locked(ended);
      flush_locked();
      expire_locked(Clock::now(), ended);
    }
    CompletionScope scope;  // continuations run after this turn, outside the lock
    for (auto& e : ended) e.complete();
  }
}

}  // namespace dlslime::nvlink
