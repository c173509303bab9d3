// The host-local link between simulated devices of different processes (sim_link.h).
#include "rdma/sim_link.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "core/log.h"

namespace dlslime::rdma::sim {
namespace {

constexpr uint32_t kMagic = 0x534c4d32;  // "SLM2": a change of this layout changes it
enum class Kind : uint8_t { kRequest = 1, kAnswer = 2 };

// What every message starts with: the layout's version and which message follows.
struct WireHeader {
  uint32_t magic = kMagic;
  Kind kind = Kind::kRequest;
  uint8_t reserved[3] = {};  // explicit: no byte of a message is left uninitialized
};

// One SEQPACKET message each; the sges and inline bytes follow a request's header.
struct WireRequest {
  WireHeader head{kMagic, Kind::kRequest};
  uint8_t opcode = 0;
  uint8_t inline_data = 0;
  uint8_t reserved[6] = {};
  uint64_t token = 0;
  uint8_t src_gid[16] = {};
  uint32_t src_qpn = 0, dst_qpn = 0, psn = 0, packets = 0, rkey = 0, imm_data = 0;
  uint64_t remote_addr = 0, total = 0;
  uint32_t num_sge = 0, inline_len = 0;
};

struct WireAnswer {
  WireHeader head{kMagic, Kind::kAnswer};
  uint8_t reply = 0;
  uint8_t min_rnr_timer = 0;
  uint8_t reserved[2] = {};
  uint32_t qpn = 0;  // the requester's QP
  uint64_t token = 0;
};

static_assert(sizeof(WireRequest) == 88 && sizeof(WireAnswer) == 24, "no implicit padding on the wire");

constexpr size_t kMaxMessage = sizeof(WireRequest) + kMaxSge * sizeof(Sge) + kMaxInline;

sockaddr_un address_of(pid_t pid, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // Abstract namespace (leading NUL): no file to clean up, gone with the process.
  std::string name = fmt::format("dlslime-{}-{}", kDeviceName, pid);
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

pid_t peer_pid(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return 0;
  return cred.pid;
}

std::vector<iovec> iovecs(const std::vector<Sge>& sges, uint64_t total) {
  std::vector<iovec> out;
  for (const Sge& s : sges) {
    if (total == 0) break;
    const uint64_t n = std::min<uint64_t>(s.length, total);
    out.push_back(iovec{reinterpret_cast<void*>(s.addr), static_cast<size_t>(n)});
    total -= n;
  }
  return out;
}

}  // namespace

int move_bytes(pid_t dst_pid, const std::vector<Sge>& dst, pid_t src_pid, const std::vector<Sge>& src,
               uint64_t total) {
  std::vector<iovec> to = iovecs(dst, total);
  std::vector<iovec> from = iovecs(src, total);
  if (dst_pid == 0 && src_pid == 0) {
    // Within this process: walk both lists (memmove: a QP may write into its own MR).
    size_t i = 0, j = 0, oi = 0, oj = 0;
    while (i < to.size() && j < from.size()) {
      const size_t n = std::min(to[i].iov_len - oi, from[j].iov_len - oj);
      std::memmove(static_cast<uint8_t*>(to[i].iov_base) + oi, static_cast<const uint8_t*>(from[j].iov_base) + oj, n);
      oi += n;
      oj += n;
      if (oi == to[i].iov_len) ++i, oi = 0;
      if (oj == from[j].iov_len) ++j, oj = 0;
    }
    return 0;
  }
  ssize_t n = src_pid != 0 ? ::process_vm_readv(src_pid, to.data(), to.size(), from.data(), from.size(), 0)
                           : ::process_vm_writev(dst_pid, from.data(), from.size(), to.data(), to.size(), 0);
  if (n < 0) return errno;
  return static_cast<uint64_t>(n) == total ? 0 : EFAULT;  // partial: an address was not mapped
}

std::string ptrace_scope_note() {
  std::ifstream in("/proc/sys/kernel/yama/ptrace_scope");
  int scope = -1;
  if (!(in >> scope)) return "";
  return fmt::format("kernel.yama.ptrace_scope is {} ({})", scope,
                     scope <= 1 ? "0 and 1 permit it: the device allows any same-uid process to attach"
                                : "2 needs CAP_SYS_PTRACE, 3 forbids it: set it to 1 or 0 (sysctl)");
}

void report_copy_error(pid_t pid, int err) {
  static std::mutex mu;
  static std::set<std::pair<pid_t, int>> logged;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!logged.insert({pid, err}).second) return;
  }
  if (err == EPERM) {
    const std::string note = ptrace_scope_note();
    logger().error(
        "{}: process_vm_readv/process_vm_writev to pid {} was refused (EPERM): the simulated device copies between "
        "processes with them, which needs the same uid and ptrace permission over the peer{}{}; in a container it "
        "also needs a seccomp profile that allows process_vm_*. The WR failed with REM_OP_ERR.",
        kDeviceName, pid, note.empty() ? "" : ": ", note);
  } else {
    logger().error("{}: copying to or from pid {} failed: {} ({}). The WR failed with REM_OP_ERR.", kDeviceName, pid,
                   std::strerror(err), err);
  }
}

Link::Link(Fabric& fabric) : fabric_(fabric) {
  // The responder copies from and into the requester's memory, so every process must
  // let its peers (same uid) attach. Only Yama's scope 1 needs this; without Yama the
  // call fails with EINVAL, which is fine. It is done only when the simulated device is
  // in use (DLSLIME_RDMA_SIM=1), never for the real one.
  ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  listen_fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (wake_fd_ < 0 || listen_fd_ < 0) {
    int err = errno;
    if (wake_fd_ >= 0) ::close(wake_fd_);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    throw VerbsError(err, fmt::format("{}: cannot create the cross-process link: {}", kDeviceName, std::strerror(err)));
  }
  socklen_t len = 0;
  sockaddr_un addr = address_of(::getpid(), &len);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(listen_fd_, 64) != 0) {
    int err = errno;
    ::close(listen_fd_);
    ::close(wake_fd_);
    throw VerbsError(err, fmt::format("{}: cannot listen on @dlslime-{}-{} for other processes: {}", kDeviceName,
                                      kDeviceName, ::getpid(), std::strerror(err)));
  }
  io_ = std::thread([this] { run(); });
}

Link::~Link() {
  {
    std::lock_guard<std::mutex> lock(fabric_.mu);
    stop_ = true;
  }
  wake();
  io_.join();
  for (auto& [id, c] : conns_) ::close(c.fd);
  ::close(listen_fd_);
  ::close(wake_fd_);
}

void Link::wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

uint64_t Link::add_conn(int fd) {
  const uint64_t id = next_id_++;
  const pid_t pid = peer_pid(fd);
  conns_[id] = Conn{fd, pid};
  by_pid_.emplace(pid, id);  // keeps an existing one: either direction serves requests
  return id;
}

void Link::close_conn(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  const pid_t pid = it->second.pid;
  ::close(it->second.fd);
  conns_.erase(it);
  auto p = by_pid_.find(pid);
  if (p != by_pid_.end() && p->second == id) {
    by_pid_.erase(p);
    for (const auto& [other, c] : conns_) {
      if (c.pid == pid) {
        by_pid_[pid] = other;
        break;
      }
    }
  }
  fabric_.on_link_lost(id);
}

int Link::send_request(pid_t pid, const Request& rq, uint64_t* link) {
  uint64_t id = 0;
  auto it = by_pid_.find(pid);
  if (it != by_pid_.end()) {
    id = it->second;
  } else {
    int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return errno;
    socklen_t len = 0;
    sockaddr_un addr = address_of(pid, &len);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
      int err = errno;
      ::close(fd);
      return err;
    }
    id = add_conn(fd);
    wake();  // the I/O thread starts watching it
  }
  WireRequest w;
  w.opcode = static_cast<uint8_t>(rq.h.opcode);
  w.inline_data = rq.h.inline_data ? 1 : 0;
  w.token = rq.h.token;
  std::memcpy(w.src_gid, rq.h.src_gid.data(), 16);
  w.src_qpn = rq.h.src_qpn;
  w.dst_qpn = rq.h.dst_qpn;
  w.psn = rq.h.psn;
  w.packets = rq.h.packets;
  w.rkey = rq.h.rkey;
  w.imm_data = rq.h.imm_data;
  w.remote_addr = rq.h.remote_addr;
  w.total = rq.h.total;
  w.num_sge = static_cast<uint32_t>(rq.sges.size());
  w.inline_len = static_cast<uint32_t>(rq.inline_bytes.size());
  iovec iov[3] = {{&w, sizeof(w)},
                  {const_cast<Sge*>(rq.sges.data()), rq.sges.size() * sizeof(Sge)},
                  {const_cast<uint8_t*>(rq.inline_bytes.data()), rq.inline_bytes.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 3;
  if (::sendmsg(conns_[id].fd, &msg, MSG_NOSIGNAL) < 0) return errno;  // the I/O thread sees the close
  *link = id;
  return 0;
}

bool Link::handle_message(uint64_t id, const uint8_t* data, size_t size) {
  WireHeader head;
  if (size < sizeof(head)) return false;
  std::memcpy(&head, data, sizeof(head));
  if (head.magic != kMagic) return false;
  if (head.kind == Kind::kAnswer) {
    WireAnswer a;
    if (size != sizeof(a)) return false;
    std::memcpy(&a, data, sizeof(a));
    if (a.reply > static_cast<uint8_t>(Reply::kRemOpErr)) return false;
    fabric_.on_answer(a.qpn, a.token, Answer{static_cast<Reply>(a.reply), a.min_rnr_timer});
    return true;
  }
  if (head.kind != Kind::kRequest || size < sizeof(WireRequest)) return false;
  WireRequest w;
  std::memcpy(&w, data, sizeof(w));
  if (w.num_sge > kMaxSge || w.inline_len > kMaxInline ||
      w.opcode > static_cast<uint8_t>(WrOpcode::kSendWithImm) ||
      size != sizeof(w) + w.num_sge * sizeof(Sge) + w.inline_len) {
    return false;
  }
  Request rq;
  rq.h.token = w.token;
  std::memcpy(rq.h.src_gid.data(), w.src_gid, 16);
  rq.h.src_qpn = w.src_qpn;
  rq.h.dst_qpn = w.dst_qpn;
  rq.h.psn = w.psn;
  rq.h.packets = w.packets;
  rq.h.opcode = static_cast<WrOpcode>(w.opcode);
  rq.h.rkey = w.rkey;
  rq.h.remote_addr = w.remote_addr;
  rq.h.imm_data = w.imm_data;
  rq.h.total = w.total;
  rq.h.inline_data = w.inline_data != 0;
  rq.sges.resize(w.num_sge);
  // A zero-SGE request (a zero-length send or write) has no list: sges.data() is null then.
  if (w.num_sge > 0) std::memcpy(rq.sges.data(), data + sizeof(w), w.num_sge * sizeof(Sge));
  rq.inline_bytes.assign(data + sizeof(w) + w.num_sge * sizeof(Sge), data + size);
  const Conn& c = conns_[id];
  // The requester's GID must name the process at the other end of the socket: the
  // responder's "connected back" check relies on it, so no process can pose as another.
  if (gid_pid(rq.h.src_gid) != c.pid) return false;
  const Answer answer = fabric_.respond(rq, c.pid);
  WireAnswer a;
  a.reply = static_cast<uint8_t>(answer.reply);
  a.min_rnr_timer = answer.min_rnr_timer;
  a.qpn = w.src_qpn;
  a.token = w.token;
  // A requester that is gone does not need its answer: the close is seen on the next poll.
  [[maybe_unused]] ssize_t n = ::send(c.fd, &a, sizeof(a), MSG_NOSIGNAL);
  return true;
}

void Link::run() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  std::vector<uint8_t> buf(kMaxMessage + 1);
  std::unique_lock<std::mutex> lock(fabric_.mu);
  while (!stop_) {
    fds.assign({pollfd{wake_fd_, POLLIN, 0}, pollfd{listen_fd_, POLLIN, 0}});
    ids.assign({0, 0});
    for (const auto& [id, c] : conns_) {
      fds.push_back(pollfd{c.fd, POLLIN, 0});
      ids.push_back(id);
    }
    // Only this thread closes connections, so the fds stay valid while it polls unlocked.
    lock.unlock();
    ::poll(fds.data(), fds.size(), -1);
    lock.lock();
    if (stop_) break;
    if (fds[0].revents) {
      uint64_t count = 0;
      [[maybe_unused]] ssize_t n = ::read(wake_fd_, &count, sizeof(count));
    }
    if (fds[1].revents & POLLIN) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) add_conn(fd);
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      // Drain what is there; EOF, an error or a malformed message closes the connection.
      while (conns_.count(ids[i])) {
        ssize_t n = ::recv(fds[i].fd, buf.data(), buf.size(), MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
        if (n <= 0 || static_cast<size_t>(n) > kMaxMessage ||
            !handle_message(ids[i], buf.data(), static_cast<size_t>(n))) {
          close_conn(ids[i]);
          break;
        }
      }
    }
  }
}

}  // namespace dlslime::rdma::sim
