// The strict simulated HIXL engine (sim_hixl.h).
//
// Threads: one I/O thread per engine polls the listening socket, the connections it
// accepted (peers: it is their responder), the links it made (it reads their answers) and
// an eventfd that wakes it. Everything is guarded by the engine's mutex; the I/O thread
// drops it only to poll. Callers send their requests without the mutex (a socket may be
// full) and wait for answers on a condition variable with a deadline; Finalize fails what
// is pending and shuts every socket down, which wakes them all.
//
// Sockets are shared_ptr-owned and closed by their last owner: Disconnect only shuts a
// socket down, so a caller still sending on it, or the I/O thread polling it, never sees
// its descriptor reused.
#include "ascend/sim_hixl.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "ascend/sim_hixl_wire.h"
#include "ascend/sim_npu_memory.h"
#include "core/log.h"
#include "dlslime/errors.h"

namespace dlslime::ascend {
namespace {

using Clock = std::chrono::steady_clock;
using simwire::Kind;
using simwire::Message;

// How long an async request or a notify may wait for room in a full socket before the call
// gives up (a peer that has stopped reading: a stopped process). Sync calls use their own
// timeout instead.
constexpr auto kSendBound = std::chrono::seconds(5);
// Answers a responder queues for a requester that does not read them before it drops it.
constexpr size_t kMaxQueuedAnswers = 1 << 16;
constexpr int kMaxDelayMs = 60000;

struct Socket {
  explicit Socket(int f) : fd(f) {}
  ~Socket() { ::close(fd); }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  const int fd;
};
using SocketPtr = std::shared_ptr<Socket>;

// "ip" or "ip:port" (port 1..65535); "[v6]:port" for IPv6. Returns false when malformed.
bool parse_engine_name(const std::string& name, std::string* host, int* port) {
  std::string h = name, p;
  if (!name.empty() && name[0] == '[') {
    const size_t close = name.find(']');
    if (close == std::string::npos) return false;
    h = name.substr(1, close - 1);
    const std::string rest = name.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return false;
      p = rest.substr(1);
      if (p.empty()) return false;
    }
  } else if (const size_t colon = name.find(':'); colon != std::string::npos) {
    h = name.substr(0, colon);
    p = name.substr(colon + 1);
    if (p.empty() || p.find(':') != std::string::npos) return false;
  }
  // The name becomes a socket address (108 bytes at most): keep it short and printable.
  if (h.empty() || h.size() > 64) return false;
  for (char c : h) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_' && c != ':') return false;
  }
  *port = 0;
  if (!p.empty()) {
    if (p.size() > 5) return false;
    for (char c : p) {
      if (c < '0' || c > '9') return false;
    }
    *port = std::atoi(p.c_str());
    if (*port < 1 || *port > 65535) return false;
  }
  *host = h;
  return true;
}

sockaddr_un socket_address(const std::string& name, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // Abstract namespace (leading NUL): no file to clean up, gone with the listener.
  const std::string path = "dlslime-sim-hixl-" + name;
  std::memcpy(addr.sun_path + 1, path.data(), path.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + path.size());
  return addr;
}

pid_t peer_pid(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return 0;
  return cred.pid;
}

// Sends one message, waiting for room until `deadline`. 0, ETIMEDOUT or the send's errno.
int send_until(int fd, const std::vector<uint8_t>& bytes, Clock::time_point deadline) {
  for (;;) {
    if (::send(fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) return 0;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return ETIMEDOUT;
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left + 1, 1000)));
  }
}

// Logs why a copy into or out of process `pid` failed; once per pid and errno, so a flood
// of failing requests cannot flood stderr.
void report_copy_error(pid_t pid, int err) {
  static std::mutex mu;
  static std::set<std::pair<pid_t, int>> logged;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!logged.insert({pid, err}).second) return;
  }
  if (err == EPERM) {
    DLSLIME_ERROR(
        "simulated HIXL: process_vm_readv/process_vm_writev to pid {} was refused (EPERM): the simulation copies "
        "between processes with them, which needs the same uid and ptrace permission over the peer "
        "(kernel.yama.ptrace_scope 0 or 1) and, in a container, a seccomp profile that allows process_vm_*. The "
        "transfer failed (FAILED).",
        pid);
  } else {
    DLSLIME_ERROR("simulated HIXL: copying to or from pid {} failed: {} ({}). The transfer failed (FAILED).", pid,
                  std::strerror(err), err);
  }
}

std::map<std::string, std::string> parse_spec(const std::string& spec, const char* what) {
  std::map<std::string, std::string> out;
  size_t at = 0;
  while (at < spec.size()) {
    size_t comma = spec.find(',', at);
    if (comma == std::string::npos) comma = spec.size();
    const std::string item = spec.substr(at, comma - at);
    at = comma + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
      throw InvalidArgumentError(fmt::format("{}: '{}' is not key=value", what, item));
    }
    out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return out;
}

int64_t parse_int(const std::string& value, int64_t lo, int64_t hi, const std::string& what) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) {
    throw InvalidArgumentError(fmt::format("{}='{}' is not an integer from {} to {}", what, value, lo, hi));
  }
  return v;
}

struct Region {
  uintptr_t addr = 0;
  size_t len = 0;
  MemType type = MemType::kHost;
  bool contains(uint64_t a, uint64_t n) const { return a >= addr && a - addr <= len && n <= len - (a - addr); }
};

class SimHixlEngine final : public HixlEngine {
 public:
  SimHixlEngine() {
    // Read when the engine is made; a bad value is reported by Initialize (calls never throw).
    try {
      if (const char* caps = std::getenv("DLSLIME_ASCEND_SIM_CAPS")) caps_ = parse_sim_caps(caps);
      if (const char* fault = std::getenv("DLSLIME_ASCEND_SIM_FAULT")) fault_ = parse_sim_fault(fault);
    } catch (const InvalidArgumentError& e) {
      env_error_ = e.what();
    }
  }
  ~SimHixlEngine() override { Finalize(); }

  uint32_t Initialize(const std::string& local_engine, const EngineOptions& options) override;
  void Finalize() override;
  uint32_t RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle) override;
  uint32_t DeregisterMem(MemHandle handle) override;
  uint32_t Connect(const std::string& remote_engine, int32_t timeout_ms) override;
  uint32_t Disconnect(const std::string& remote_engine, int32_t timeout_ms) override;
  uint32_t TransferSync(const std::string& remote_engine, TransferOp op, const std::vector<TransferOpDesc>& descs,
                        int32_t timeout_ms) override;
  uint32_t TransferAsync(const std::string& remote_engine, TransferOp op, const std::vector<TransferOpDesc>& descs,
                         TransferReq& req) override;
  uint32_t GetTransferStatus(TransferReq req, TransferStatus& status) override;
  uint32_t SendNotify(const std::string& remote_engine, const NotifyDesc& notify, int32_t timeout_ms) override;
  uint32_t GetNotifies(std::vector<NotifyDesc>& notifies) override;
  Capability GetCapability() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return caps_;
  }

  void set_fault(const SimFault& f) {
    std::lock_guard<std::mutex> lock(mu_);
    fault_ = f;
  }
  void set_caps(const Capability& c) {
    std::lock_guard<std::mutex> lock(mu_);
    caps_ = c;
  }

 private:
  enum class State { kNew, kRunning, kFinalized };

  // A link this engine made (it is the requester).
  struct Link {
    uint64_t id = 0;
    SocketPtr sock;
    std::vector<Region> visible;  // the responder's snapshot
    bool broken = false;          // a TransferSync timed out: unusable until Disconnect
    bool dead = false;            // the responder closed it
  };
  // A connection this engine accepted (it is the responder).
  struct Peer {
    SocketPtr sock;
    pid_t pid = 0;  // SO_PEERCRED: whose memory the requester's addresses are
    bool hello = false;
    std::string name;              // the requester's engine name, for its notifies
    std::vector<uint64_t> visible;  // handles registered at HELLO: all this link may reach
    size_t unread = 0;             // its notifies not yet taken by GetNotifies
    std::deque<std::vector<uint8_t>> outq;  // answers waiting for room in the socket
  };
  struct Pending {
    uint64_t link = 0;
    bool async = false;
    size_t parts_left = 0;
    TransferStatus state = TransferStatus::kWaiting;
    uint32_t answer = kHixlSuccess;  // a notify's answer
  };
  struct Deferred {
    Clock::time_point due;
    uint64_t peer = 0;
    Message msg;
  };

  uint32_t submit(const std::string& remote, TransferOp op, const std::vector<TransferOpDesc>& descs, bool async,
                  int32_t timeout_ms, uint64_t* id_out);
  uint32_t handshake(const std::string& remote, Clock::time_point deadline, Link* link);
  uint32_t invalid(const std::string& why);  // mu_ held
  Link* find_link(const std::string& remote, uint32_t* rc);  // mu_ held

  // I/O thread; mu_ held unless said otherwise.
  void run();
  void wake();
  void accept_peers();
  void read_peer(uint64_t id);
  void read_link(const std::string& name, uint64_t id);
  void on_peer_message(uint64_t id, Peer& p, Message& m);
  void serve_transfer(uint64_t id, const Message& m);
  uint32_t move_bytes(const Peer& p, const Message& m, const std::vector<uint8_t*>& mine);
  void queue_answer(Peer& p, std::vector<uint8_t> bytes, uint64_t id);
  void flush(Peer& p, uint64_t id);
  void drop_peer(uint64_t id);
  void link_lost(Link& link);
  void fail_pending(uint64_t link);

  mutable std::mutex mu_;
  std::condition_variable cv_;  // a pending request changed state, or stop_
  State state_ = State::kNew;
  bool stop_ = false;
  std::string name_;
  std::string env_error_;
  Capability caps_;
  SimFault fault_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::thread io_;
  uint64_t next_id_ = 1;  // handles, links, peers and requests
  int64_t served_ = 0;    // transfer requests arrived, for die_after
  std::map<uint64_t, Region> regs_;      // by handle
  std::map<std::string, Link> links_;    // by remote name
  std::set<std::string> connecting_;     // Connect in progress
  std::set<SocketPtr> handshaking_;      // their sockets, for Finalize to shut down
  std::map<uint64_t, Peer> peers_;
  std::map<uint64_t, Pending> pending_;  // by request id
  std::deque<NotifyDesc> notifies_;
  std::deque<Deferred> deferred_;        // delayed transfers, served in arrival order
  LogLimiter invalid_log_{std::chrono::seconds(1)};
  LogLimiter refused_log_{std::chrono::seconds(1)};
  LogLimiter malformed_log_{std::chrono::seconds(1)};
};

uint32_t SimHixlEngine::invalid(const std::string& why) {
  if (uint64_t n = invalid_log_.tick()) {
    DLSLIME_WARN("simulated HIXL engine {}: PARAM_INVALID (103900): {}{}", name_, why,
                 n > 1 ? fmt::format(" ({} such calls)", n) : "");
  }
  return kHixlParamInvalid;
}

uint32_t SimHixlEngine::Initialize(const std::string& local_engine, const EngineOptions& /*options: checked by
                                                                                           ascend_options.cpp*/) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kNew) {
    DLSLIME_WARN("simulated HIXL engine {}: Initialize called again (FAILED): an engine is initialized once", name_);
    return kHixlFailed;
  }
  if (!env_error_.empty()) {
    DLSLIME_ERROR("simulated HIXL: {}", env_error_);
    return kHixlParamInvalid;
  }
  std::string host;
  int port = 0;
  if (!parse_engine_name(local_engine, &host, &port)) {
    DLSLIME_WARN("simulated HIXL: '{}' is not an engine name (\"ip\" or \"ip:port\", port 1..65535)", local_engine);
    return kHixlParamInvalid;
  }
  // The responder copies into and out of its requesters, and they into it: every process
  // lets same-uid peers attach (only Yama's scope 1 needs this; without Yama it is EINVAL).
  ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    DLSLIME_ERROR("simulated HIXL engine {}: eventfd: {}", local_engine, std::strerror(errno));
    return kHixlFailed;
  }
  if (port > 0) {
    listen_fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    socklen_t len = 0;
    sockaddr_un addr = socket_address(local_engine, &len);
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::listen(listen_fd_, 128) != 0) {
      const int err = errno;
      DLSLIME_ERROR("simulated HIXL engine {}: cannot serve the name on @dlslime-sim-hixl-{}: {}{}", local_engine,
                    local_engine, std::strerror(err),
                    err == EADDRINUSE ? " (another engine on this host already serves it)" : "");
      if (listen_fd_ >= 0) ::close(listen_fd_);
      ::close(wake_fd_);
      listen_fd_ = wake_fd_ = -1;
      return kHixlFailed;
    }
  }
  name_ = local_engine;
  state_ = State::kRunning;
  io_ = std::thread([this] { run(); });
  return kHixlSuccess;
}

void SimHixlEngine::Finalize() {
  std::unique_lock<std::mutex> lock(mu_);
  if (state_ != State::kRunning) {
    state_ = State::kFinalized;
    return;
  }
  state_ = State::kFinalized;
  stop_ = true;
  for (const SocketPtr& s : handshaking_) ::shutdown(s->fd, SHUT_RDWR);
  lock.unlock();
  wake();
  io_.join();
  lock.lock();
  for (auto& [name, link] : links_) ::shutdown(link.sock->fd, SHUT_RDWR);
  links_.clear();
  for (auto& [id, p] : peers_) ::shutdown(p.sock->fd, SHUT_RDWR);
  peers_.clear();
  deferred_.clear();
  regs_.clear();
  // Requests are kept, failed: an async one still reads FAILED once.
  for (auto& [id, p] : pending_) {
    if (p.state == TransferStatus::kWaiting) p.state = TransferStatus::kFailed, p.answer = kHixlFailed;
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  ::close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
  cv_.notify_all();
}

uint32_t SimHixlEngine::RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kRunning) return kHixlFailed;
  if (mem.addr == 0 || mem.len == 0 || mem.addr + mem.len < mem.addr) {
    return invalid(fmt::format("RegisterMem of [{:#x}, +{}): an empty or wrapping range", mem.addr, mem.len));
  }
  MemType actual;
  try {
    actual = sim_npu_memory().classify(mem.addr, mem.len);
  } catch (const InvalidArgumentError& e) {
    return invalid(fmt::format("RegisterMem: {}", e.what()));
  }
  if (actual != type) {
    return invalid(fmt::format("RegisterMem of [{:#x}, +{}) as {} but it is {}", mem.addr, mem.len,
                               type == MemType::kDevice ? "MEM_DEVICE" : "MEM_HOST",
                               actual == MemType::kDevice ? "NPU memory" : "host memory"));
  }
  const uint64_t id = next_id_++;
  regs_[id] = Region{mem.addr, mem.len, type};
  handle = reinterpret_cast<MemHandle>(id);
  return kHixlSuccess;
}

uint32_t SimHixlEngine::DeregisterMem(MemHandle handle) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kRunning) return kHixlFailed;
  // Responders check what is registered when they serve a request, so erasing is enough.
  if (regs_.erase(reinterpret_cast<uint64_t>(handle)) == 0) {
    return invalid(fmt::format("DeregisterMem of {}: not a handle this engine registered", handle));
  }
  return kHixlSuccess;
}

uint32_t SimHixlEngine::Connect(const std::string& remote_engine, int32_t timeout_ms) {
  std::string host;
  int port = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kRunning) return kHixlFailed;
    if (timeout_ms < 0) return invalid(fmt::format("Connect with timeout_ms {}", timeout_ms));
    if (!parse_engine_name(remote_engine, &host, &port) || port == 0) {
      return invalid(fmt::format("Connect to '{}': not an engine name that can be served (\"ip:port\")",
                                 remote_engine));
    }
    if (links_.count(remote_engine) || !connecting_.insert(remote_engine).second) return kHixlAlreadyConnected;
  }
  Link link;
  const uint32_t rc = handshake(remote_engine, Clock::now() + std::chrono::milliseconds(timeout_ms), &link);
  std::lock_guard<std::mutex> lock(mu_);
  connecting_.erase(remote_engine);
  if (rc != kHixlSuccess) return rc;
  if (stop_) return kHixlFailed;
  link.id = next_id_++;
  links_[remote_engine] = std::move(link);
  wake();  // the I/O thread starts reading its answers
  return kHixlSuccess;
}

uint32_t SimHixlEngine::handshake(const std::string& remote, Clock::time_point deadline, Link* link) {
  auto backoff = std::chrono::milliseconds(1);
  SocketPtr sock;
  // The handshake socket is registered so that Finalize can shut it down (and wake us).
  auto track = [&](const SocketPtr& s, bool add) {
    std::lock_guard<std::mutex> lock(mu_);
    if (add) handshaking_.insert(s); else handshaking_.erase(s);
    return !stop_;
  };
  for (;;) {
    const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      DLSLIME_ERROR("simulated HIXL engine {}: socket: {}", name_, std::strerror(errno));
      return kHixlFailed;
    }
    sock = std::make_shared<Socket>(fd);
    socklen_t len = 0;
    sockaddr_un addr = socket_address(remote, &len);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0) break;
    const int err = errno;
    // Nobody serves the name (yet), or its backlog is full: try again until the deadline.
    if (err != ECONNREFUSED && err != ENOENT && err != EAGAIN) {
      DLSLIME_ERROR("simulated HIXL engine {}: connecting to {}: {}", name_, remote, std::strerror(err));
      return kHixlFailed;
    }
    sock.reset();
    std::unique_lock<std::mutex> lock(mu_);
    if (Clock::now() >= deadline) return kHixlTimeout;
    cv_.wait_until(lock, std::min(deadline, Clock::now() + backoff), [&] { return stop_; });
    if (stop_) return kHixlFailed;
    backoff = std::min(backoff * 2, std::chrono::milliseconds(20));
  }
  if (!track(sock, true)) return kHixlFailed;
  uint32_t rc = kHixlSuccess;
  Message hello;
  hello.kind = Kind::kHello;
  hello.text = name_;
  if (int err = send_until(sock->fd, simwire::encode(hello), deadline); err != 0) {
    rc = err == ETIMEDOUT ? kHixlTimeout : kHixlFailed;
  }
  // The snapshot: parts until the last; it is all this link will ever reach.
  std::vector<uint8_t> buf(simwire::kMaxMessage + 1);
  while (rc == kHixlSuccess) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      rc = kHixlTimeout;
      break;
    }
    pollfd p{sock->fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000))) <= 0) continue;
    const ssize_t n = ::recv(sock->fd, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    Message m;
    if (n <= 0 || !simwire::parse(buf.data(), static_cast<size_t>(n), &m) || m.kind != Kind::kSnapshot) {
      DLSLIME_WARN("simulated HIXL engine {}: {} closed the connection or sent no memory snapshot", name_, remote);
      rc = kHixlFailed;
      break;
    }
    for (const simwire::Region& r : m.regions) {
      link->visible.push_back(Region{r.addr, r.len, r.type == 0 ? MemType::kDevice : MemType::kHost});
    }
    if (m.flag == 1) break;
  }
  if (!track(sock, false) && rc == kHixlSuccess) rc = kHixlFailed;
  if (rc == kHixlSuccess) link->sock = std::move(sock);
  return rc;
}

SimHixlEngine::Link* SimHixlEngine::find_link(const std::string& remote, uint32_t* rc) {
  if (state_ != State::kRunning) {
    *rc = kHixlFailed;
    return nullptr;
  }
  auto it = links_.find(remote);
  if (it == links_.end()) {
    *rc = kHixlNotConnected;
    return nullptr;
  }
  return &it->second;
}

uint32_t SimHixlEngine::Disconnect(const std::string& remote_engine, int32_t /*timeout_ms: nothing to wait for*/) {
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t rc = kHixlSuccess;
  Link* link = find_link(remote_engine, &rc);
  if (link == nullptr) return rc;
  ::shutdown(link->sock->fd, SHUT_RDWR);  // the responder sees it close; the I/O thread lets go
  fail_pending(link->id);
  links_.erase(remote_engine);
  return kHixlSuccess;
}

uint32_t SimHixlEngine::submit(const std::string& remote, TransferOp op, const std::vector<TransferOpDesc>& descs,
                               bool async, int32_t timeout_ms, uint64_t* id_out) {
  const auto start = Clock::now();
  std::vector<std::vector<uint8_t>> parts;
  SocketPtr sock;
  uint64_t id = 0, link_id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (async && !caps_.transfer_async) return kHixlUnsupported;
    uint32_t rc = kHixlSuccess;
    Link* link = find_link(remote, &rc);
    if (link == nullptr) return rc;
    if (!async && timeout_ms < 0) return invalid(fmt::format("TransferSync with timeout_ms {}", timeout_ms));
    if (descs.empty()) return invalid("a transfer with no descriptors");
    if (link->dead || link->broken) return kHixlFailed;
    id = next_id_++;  // every part carries it; the request completes when each is answered
    Message m;
    m.kind = Kind::kTransfer;
    m.flag = op == TransferOp::kWrite ? 1 : 0;
    m.req = id;
    for (size_t i = 0; i < descs.size(); ++i) {
      const TransferOpDesc& d = descs[i];
      if (d.len == 0) return invalid(fmt::format("descriptor {} of the batch has length 0", i));
      const bool remote_ok = std::any_of(link->visible.begin(), link->visible.end(),
                                         [&](const Region& r) { return r.contains(d.remote_addr, d.len); });
      if (!remote_ok) {
        return invalid(fmt::format("descriptor {}: remote [{:#x}, +{}) is not inside memory {} had registered when "
                                   "this link was made",
                                   i, d.remote_addr, d.len, remote));
      }
      std::string why;
      uint8_t* view = sim_host_view(d.local_addr, d.len, &why);
      if (!why.empty()) return invalid(fmt::format("descriptor {}: {}", i, why));
      // Of the type it was registered as: NPU memory freed under its registration is no
      // longer NPU memory, and moving bytes there would touch whatever is mapped now.
      const MemType now = view != nullptr ? MemType::kDevice : MemType::kHost;
      const bool local_ok = std::any_of(regs_.begin(), regs_.end(), [&](const auto& r) {
        return r.second.type == now && r.second.contains(d.local_addr, d.len);
      });
      if (!local_ok) {
        return invalid(fmt::format("descriptor {}: local [{:#x}, +{}) is not inside memory this engine registered{}",
                                   i, d.local_addr, d.len,
                                   now == MemType::kHost ? " (or it was NPU memory, freed while registered)" : ""));
      }
      const uint64_t local = view != nullptr ? reinterpret_cast<uint64_t>(view) : d.local_addr;
      m.descs.push_back(simwire::Desc{local, d.remote_addr, d.len});
      if (m.descs.size() == simwire::kMaxEntries || i + 1 == descs.size()) {
        parts.push_back(simwire::encode(m));
        m.descs.clear();
      }
    }
    link_id = link->id;
    pending_[id] = Pending{link_id, async, parts.size()};
    sock = link->sock;
  }
  const auto deadline = async ? start + kSendBound : start + std::chrono::milliseconds(timeout_ms);
  int err = 0;
  size_t sent = 0;
  while (sent < parts.size() && (err = send_until(sock->fd, parts[sent], deadline)) == 0) ++sent;
  std::unique_lock<std::mutex> lock(mu_);
  auto mark_broken = [&] {
    auto it = links_.find(remote);
    if (it != links_.end() && it->second.id == link_id) it->second.broken = true;
  };
  if (err != 0) {
    pending_.erase(id);
    if (err != ETIMEDOUT) return kHixlFailed;  // the peer is gone; the I/O thread marks the link dead
    if (async && sent == 0) return kHixlResourceExhausted;  // nothing went out: the link is fine
    mark_broken();  // part of a batch may be served: the link's state is unknown
    return async ? kHixlFailed : kHixlTimeout;
  }
  if (async) {
    *id_out = id;
    return kHixlSuccess;
  }
  cv_.wait_until(lock, deadline, [&] {
    auto it = pending_.find(id);
    return it == pending_.end() || it->second.state != TransferStatus::kWaiting;
  });
  auto it = pending_.find(id);
  const TransferStatus state = it == pending_.end() ? TransferStatus::kFailed : it->second.state;
  if (it != pending_.end()) pending_.erase(it);
  if (state == TransferStatus::kWaiting) {
    // The library's rule: after a timeout the link must be disconnected before it is used.
    mark_broken();
    return kHixlTimeout;
  }
  return state == TransferStatus::kCompleted ? kHixlSuccess : kHixlFailed;
}

uint32_t SimHixlEngine::TransferSync(const std::string& remote_engine, TransferOp op,
                                     const std::vector<TransferOpDesc>& descs, int32_t timeout_ms) {
  return submit(remote_engine, op, descs, false, timeout_ms, nullptr);
}

uint32_t SimHixlEngine::TransferAsync(const std::string& remote_engine, TransferOp op,
                                      const std::vector<TransferOpDesc>& descs, TransferReq& req) {
  uint64_t id = 0;
  const uint32_t rc = submit(remote_engine, op, descs, true, 0, &id);
  if (rc == kHixlSuccess) req = reinterpret_cast<TransferReq>(id);
  return rc;
}

uint32_t SimHixlEngine::GetTransferStatus(TransferReq req, TransferStatus& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!caps_.transfer_async) return kHixlUnsupported;
  auto it = pending_.find(reinterpret_cast<uint64_t>(req));
  if (it == pending_.end() || !it->second.async) {
    return invalid(fmt::format("GetTransferStatus of {}: unknown, or its final state was already read", req));
  }
  status = it->second.state;
  if (status != TransferStatus::kWaiting) pending_.erase(it);  // consumed
  return kHixlSuccess;
}

uint32_t SimHixlEngine::SendNotify(const std::string& remote_engine, const NotifyDesc& notify, int32_t timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  SocketPtr sock;
  uint64_t id = 0;
  std::vector<uint8_t> bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!caps_.notify) return kHixlUnsupported;
    uint32_t rc = kHixlSuccess;
    Link* link = find_link(remote_engine, &rc);
    if (link == nullptr) return rc;
    if (timeout_ms < 0) return invalid(fmt::format("SendNotify with timeout_ms {}", timeout_ms));
    if (notify.name.size() > kMaxNotifyField || notify.notify_msg.size() > kMaxNotifyField) {
      return invalid(fmt::format("a notify field of {} characters (at most {})",
                                 std::max(notify.name.size(), notify.notify_msg.size()), kMaxNotifyField));
    }
    if (link->dead || link->broken) return kHixlNotifyFailed;
    id = next_id_++;
    Message m;
    m.kind = Kind::kNotify;
    m.req = id;
    m.text = notify.notify_msg;  // the receiver names the sender itself
    bytes = simwire::encode(m);
    pending_[id] = Pending{link->id, false, 1};
    sock = link->sock;
  }
  const int err = send_until(sock->fd, bytes, std::min(deadline, Clock::now() + kSendBound));
  std::unique_lock<std::mutex> lock(mu_);
  if (err == 0) {
    cv_.wait_until(lock, deadline, [&] {
      auto it = pending_.find(id);
      return it == pending_.end() || it->second.state != TransferStatus::kWaiting;
    });
  }
  auto it = pending_.find(id);
  const Pending p = it == pending_.end() ? Pending{0, false, 0, TransferStatus::kFailed, kHixlFailed} : it->second;
  if (it != pending_.end()) pending_.erase(it);
  if (err == ETIMEDOUT || (err == 0 && p.state == TransferStatus::kWaiting)) return kHixlTimeout;
  if (err != 0) return kHixlNotifyFailed;
  if (p.answer == kHixlSuccess || p.answer == kHixlResourceExhausted) return p.answer;
  return kHixlNotifyFailed;
}

uint32_t SimHixlEngine::GetNotifies(std::vector<NotifyDesc>& notifies) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!caps_.notify) return kHixlUnsupported;
  if (state_ != State::kRunning) return kHixlFailed;
  notifies.assign(std::make_move_iterator(notifies_.begin()), std::make_move_iterator(notifies_.end()));
  notifies_.clear();
  for (auto& [id, p] : peers_) p.unread = 0;
  return kHixlSuccess;
}

// ---- the I/O thread ----

void SimHixlEngine::wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

void SimHixlEngine::fail_pending(uint64_t link) {
  for (auto& [id, p] : pending_) {
    if (p.link == link && p.state == TransferStatus::kWaiting) {
      p.state = TransferStatus::kFailed;
      p.answer = kHixlFailed;
    }
  }
  cv_.notify_all();
}

void SimHixlEngine::link_lost(Link& link) {
  if (link.dead) return;
  // The link stays until Disconnect (the library's rule); what is in flight on it fails.
  link.dead = true;
  ::shutdown(link.sock->fd, SHUT_RDWR);
  fail_pending(link.id);
}

void SimHixlEngine::drop_peer(uint64_t id) {
  auto it = peers_.find(id);
  if (it == peers_.end()) return;
  ::shutdown(it->second.sock->fd, SHUT_RDWR);
  peers_.erase(it);
}

void SimHixlEngine::accept_peers() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    Peer p;
    p.sock = std::make_shared<Socket>(fd);
    p.pid = peer_pid(fd);
    peers_[next_id_++] = std::move(p);
  }
}

void SimHixlEngine::queue_answer(Peer& p, std::vector<uint8_t> bytes, uint64_t id) {
  if (p.outq.size() >= kMaxQueuedAnswers) {
    DLSLIME_WARN("simulated HIXL engine {}: {} reads none of its answers; dropping its link", name_, p.name);
    drop_peer(id);
    return;
  }
  p.outq.push_back(std::move(bytes));
  flush(p, id);
}

void SimHixlEngine::flush(Peer& p, uint64_t id) {
  while (!p.outq.empty()) {
    const auto& b = p.outq.front();
    if (::send(p.sock->fd, b.data(), b.size(), MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;  // POLLOUT resumes
      drop_peer(id);  // a requester that is gone does not need its answers
      return;
    }
    p.outq.pop_front();
  }
}

uint32_t SimHixlEngine::move_bytes(const Peer& p, const Message& m, const std::vector<uint8_t*>& mine) {
  const bool write = m.flag == 1;  // WRITE: requester -> responder
  const bool same_process = p.pid == ::getpid();
  const std::unique_lock<std::mutex> dma = sim_npu_dma_lock();
  for (size_t i = 0; i < m.descs.size(); ++i) {
    const simwire::Desc& d = m.descs[i];
    void* theirs = reinterpret_cast<void*>(d.local);
    if (same_process) {
      if (write) std::memmove(mine[i], theirs, d.len); else std::memmove(theirs, mine[i], d.len);
      continue;
    }
    iovec local{mine[i], d.len}, remote{theirs, d.len};
    const ssize_t n = write ? ::process_vm_readv(p.pid, &local, 1, &remote, 1, 0)
                            : ::process_vm_writev(p.pid, &local, 1, &remote, 1, 0);
    const int err = n < 0 ? errno : (static_cast<size_t>(n) == d.len ? 0 : EFAULT);
    if (err != 0) {
      report_copy_error(p.pid, err);
      return kHixlFailed;
    }
  }
  return kHixlSuccess;
}

void SimHixlEngine::serve_transfer(uint64_t id, const Message& m) {
  auto it = peers_.find(id);
  if (it == peers_.end()) return;  // gone while the request was delayed
  Peer& p = it->second;
  uint32_t status = kHixlSuccess;
  // A responder never touches memory it no longer has registered (nor NPU memory freed
  // under its registration), nor memory the link's snapshot did not show.
  std::vector<uint8_t*> mine;
  for (const simwire::Desc& d : m.descs) {
    std::string why;
    uint8_t* view = sim_host_view(d.remote, d.len, &why);
    const MemType now = view != nullptr ? MemType::kDevice : MemType::kHost;
    const bool ok = why.empty() && std::any_of(p.visible.begin(), p.visible.end(), [&](uint64_t h) {
      auto r = regs_.find(h);
      return r != regs_.end() && r->second.type == now && r->second.contains(d.remote, d.len);
    });
    if (!ok) {
      if (uint64_t n = refused_log_.tick()) {
        DLSLIME_WARN("simulated HIXL engine {}: refused a transfer from {} (pid {}): [{:#x}, +{}) is not memory this "
                     "link may reach now (deregistered, or NPU memory freed while registered?){}",
                     name_, p.name, p.pid, d.remote, d.len, n > 1 ? fmt::format(" ({} such)", n) : "");
      }
      status = kHixlParamInvalid;
      break;
    }
    mine.push_back(view != nullptr ? view : reinterpret_cast<uint8_t*>(d.remote));
  }
  if (status == kHixlSuccess) status = move_bytes(p, m, mine);
  Message a;
  a.kind = Kind::kAnswer;
  a.req = m.req;
  a.status = status;
  queue_answer(p, simwire::encode(a), id);
}

void SimHixlEngine::on_peer_message(uint64_t id, Peer& p, Message& m) {
  if (m.kind == Kind::kHello) {
    p.hello = true;
    p.name = m.text;
    for (const auto& [h, r] : regs_) p.visible.push_back(h);
    // The snapshot, in parts; an empty one is a single last part.
    Message s;
    s.kind = Kind::kSnapshot;
    auto it = regs_.begin();
    do {
      s.regions.clear();
      for (; it != regs_.end() && s.regions.size() < simwire::kMaxEntries; ++it) {
        s.regions.push_back(simwire::Region{it->second.addr, it->second.len,
                                            it->second.type == MemType::kDevice ? 0u : 1u, 0});
      }
      s.flag = it == regs_.end() ? 1 : 0;
      queue_answer(p, simwire::encode(s), id);
      if (!peers_.count(id)) return;
    } while (s.flag == 0);
    return;
  }
  if (m.kind == Kind::kNotify) {
    Message a;
    a.kind = Kind::kAnswer;
    a.req = m.req;
    if (!caps_.notify) {
      a.status = kHixlUnsupported;
    } else if (p.unread >= kMaxUnreadNotifies) {
      a.status = kHixlResourceExhausted;
    } else {
      notifies_.push_back(NotifyDesc{p.name, std::move(m.text)});
      ++p.unread;
      a.status = kHixlSuccess;
    }
    queue_answer(p, simwire::encode(a), id);
    return;
  }
  // A transfer.
  if (fault_.die_after >= 0 && served_ >= fault_.die_after) {
    DLSLIME_WARN("simulated HIXL engine {}: fault die_after={}: the process exits now", name_, fault_.die_after);
    logger().flush();
    ::_exit(1);
  }
  ++served_;
  if (fault_.hang) return;  // read, never served
  if (fault_.delay_ms > 0) {
    deferred_.push_back(Deferred{Clock::now() + std::chrono::milliseconds(fault_.delay_ms), id, std::move(m)});
    return;
  }
  serve_transfer(id, m);
}

void SimHixlEngine::read_peer(uint64_t id) {
  std::vector<uint8_t> buf(simwire::kMaxMessage + 1);
  for (;;) {
    auto it = peers_.find(id);
    if (it == peers_.end()) return;
    Peer& p = it->second;
    const ssize_t n = ::recv(p.sock->fd, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    Message m;
    // EOF, an error or a malformed message closes the connection; nothing else is touched.
    bool ok = n > 0 && simwire::parse(buf.data(), static_cast<size_t>(n), &m);
    if (ok) {
      // HELLO first and once, naming a well-formed engine (the name its notifies carry).
      const bool is_hello = m.kind == Kind::kHello;
      std::string host;
      int port = 0;
      ok = is_hello != p.hello && (is_hello || m.kind == Kind::kTransfer || m.kind == Kind::kNotify) &&
           (!is_hello || parse_engine_name(m.text, &host, &port));
    }
    if (!ok) {
      if (n > 0) {
        if (uint64_t count = malformed_log_.tick()) {
          DLSLIME_WARN("simulated HIXL engine {}: a malformed message from pid {}; dropping its link{}", name_, p.pid,
                       count > 1 ? fmt::format(" ({} such)", count) : "");
        }
      }
      drop_peer(id);
      return;
    }
    on_peer_message(id, p, m);
  }
}

void SimHixlEngine::read_link(const std::string& name, uint64_t id) {
  std::vector<uint8_t> buf(simwire::kHeaderSize + 1);  // a link only ever carries answers
  for (;;) {
    auto it = links_.find(name);
    if (it == links_.end() || it->second.id != id || it->second.dead) return;
    Link& link = it->second;
    const ssize_t n = ::recv(link.sock->fd, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    Message m;
    if (n <= 0 || !simwire::parse(buf.data(), static_cast<size_t>(n), &m) || m.kind != Kind::kAnswer) {
      if (n > 0) DLSLIME_WARN("simulated HIXL engine {}: a malformed message from {}; the link is lost", name_, name);
      link_lost(link);
      return;
    }
    auto p = pending_.find(m.req);
    // Unknown: late (its caller timed out) or already failed. Either way nobody waits for it.
    if (p == pending_.end() || p->second.link != id || p->second.state != TransferStatus::kWaiting) continue;
    p->second.answer = m.status;
    if (m.status != kHixlSuccess && m.status != kHixlResourceExhausted) {
      p->second.state = TransferStatus::kFailed;
    } else if (--p->second.parts_left == 0) {
      p->second.state = TransferStatus::kCompleted;
    } else {
      continue;
    }
    cv_.notify_all();
  }
}

void SimHixlEngine::run() {
  struct Watched {
    SocketPtr sock;  // held: the descriptor stays valid while polled unlocked
    bool peer = false;
    uint64_t id = 0;
    std::string link;
  };
  std::vector<pollfd> fds;
  std::vector<Watched> watched;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    fds.assign({pollfd{wake_fd_, POLLIN, 0}, pollfd{listen_fd_, POLLIN, 0}});  // -1: ignored by poll
    watched.assign(2, Watched{});
    for (const auto& [id, p] : peers_) {
      fds.push_back(pollfd{p.sock->fd, static_cast<short>(POLLIN | (p.outq.empty() ? 0 : POLLOUT)), 0});
      watched.push_back(Watched{p.sock, true, id, {}});
    }
    for (const auto& [name, l] : links_) {
      if (l.dead) continue;
      fds.push_back(pollfd{l.sock->fd, POLLIN, 0});
      watched.push_back(Watched{l.sock, false, l.id, name});
    }
    int timeout = -1;
    if (!deferred_.empty()) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deferred_.front().due - Clock::now());
      timeout = static_cast<int>(std::clamp<int64_t>(ms.count() + 1, 0, kMaxDelayMs));
    }
    lock.unlock();
    ::poll(fds.data(), fds.size(), timeout);
    lock.lock();
    if (stop_) break;
    if (fds[0].revents) {
      uint64_t count = 0;
      [[maybe_unused]] ssize_t n = ::read(wake_fd_, &count, sizeof(count));
    }
    if (listen_fd_ >= 0 && (fds[1].revents & POLLIN)) accept_peers();
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      const Watched& w = watched[i];
      if (!w.peer) {
        read_link(w.link, w.id);
        continue;
      }
      auto it = peers_.find(w.id);
      if (it != peers_.end() && (fds[i].revents & POLLOUT)) flush(it->second, w.id);
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_peer(w.id);
    }
    while (!deferred_.empty() && deferred_.front().due <= Clock::now()) {
      Deferred d = std::move(deferred_.front());
      deferred_.pop_front();
      serve_transfer(d.peer, d.msg);
    }
  }
}

SimHixlEngine& sim_engine(HixlEngine& engine) {
  auto* sim = dynamic_cast<SimHixlEngine*>(&engine);
  if (sim == nullptr) throw InvalidArgumentError("not a simulated HIXL engine (DLSLIME_ASCEND_SIM=1 makes them)");
  return *sim;
}

}  // namespace

SimFault parse_sim_fault(const std::string& spec) {
  SimFault f;
  for (const auto& [key, value] : parse_spec(spec, "DLSLIME_ASCEND_SIM_FAULT")) {
    if (key == "delay_ms") {
      f.delay_ms = static_cast<int>(parse_int(value, 0, kMaxDelayMs, "DLSLIME_ASCEND_SIM_FAULT delay_ms"));
    } else if (key == "hang") {
      f.hang = parse_int(value, 0, 1, "DLSLIME_ASCEND_SIM_FAULT hang") == 1;
    } else if (key == "die_after") {
      f.die_after = parse_int(value, -1, INT64_MAX, "DLSLIME_ASCEND_SIM_FAULT die_after");
    } else {
      throw InvalidArgumentError(fmt::format(
          "DLSLIME_ASCEND_SIM_FAULT: unknown fault '{}' (delay_ms=N, hang=0|1, die_after=N)", key));
    }
  }
  return f;
}

HixlEngine::Capability parse_sim_caps(const std::string& spec) {
  HixlEngine::Capability c;
  for (const auto& [key, value] : parse_spec(spec, "DLSLIME_ASCEND_SIM_CAPS")) {
    const bool on = parse_int(value, 0, 1, "DLSLIME_ASCEND_SIM_CAPS " + key) == 1;
    if (key == "async") {
      c.transfer_async = on;
    } else if (key == "notify") {
      c.notify = on;
    } else {
      throw InvalidArgumentError(
          fmt::format("DLSLIME_ASCEND_SIM_CAPS: unknown capability '{}' (async=0|1, notify=0|1)", key));
    }
  }
  return c;
}

void set_sim_fault(HixlEngine& engine, const SimFault& fault) {
  if (fault.delay_ms < 0 || fault.delay_ms > kMaxDelayMs || fault.die_after < -1) {
    throw InvalidArgumentError("SimFault: delay_ms must be 0..60000 and die_after >= -1");
  }
  sim_engine(engine).set_fault(fault);
}

void set_sim_capability(HixlEngine& engine, const HixlEngine::Capability& caps) { sim_engine(engine).set_caps(caps); }

std::unique_ptr<HixlEngine> make_sim_engine() { return std::make_unique<SimHixlEngine>(); }

}  // namespace dlslime::ascend
