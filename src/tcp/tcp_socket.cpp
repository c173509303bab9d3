#include "tcp/tcp_socket.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>

#include <asio/connect.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>
#include <fmt/format.h>

#include "core/log.h"
#include "core/port_range.h"
#include "dlslime/errors.h"

namespace dlslime::tcp {

Status apply_socket_options(asio::ip::tcp::socket& socket, const TcpOptions& o) {
  const int fd = socket.native_handle();
  auto set = [fd](int level, int name, const char* label, int value) -> Status {
    if (::setsockopt(fd, level, name, &value, sizeof value) == 0) return Status::ok();
    return Status::failed(fmt::format("setsockopt({}={}) failed: {}", label, value, std::strerror(errno)));
  };
  // Unacknowledged data fails the connection within the same bound as an idle peer. In
  // 64 bits: at the kernel's maxima the sum is 4.2e9 ms, past an int.
  const int64_t user_timeout_ms =
      (static_cast<int64_t>(o.keepalive_idle_s) + int64_t{o.keepalive_interval_s} * o.keepalive_count) * 1000;
  Status st = set(IPPROTO_TCP, TCP_NODELAY, "TCP_NODELAY", 1);
  if (st) st = set(SOL_SOCKET, SO_KEEPALIVE, "SO_KEEPALIVE", 1);
  if (st) st = set(IPPROTO_TCP, TCP_KEEPIDLE, "TCP_KEEPIDLE", o.keepalive_idle_s);
  if (st) st = set(IPPROTO_TCP, TCP_KEEPINTVL, "TCP_KEEPINTVL", o.keepalive_interval_s);
  if (st) st = set(IPPROTO_TCP, TCP_KEEPCNT, "TCP_KEEPCNT", o.keepalive_count);
  if (st) {
    st = set(IPPROTO_TCP, TCP_USER_TIMEOUT, "TCP_USER_TIMEOUT",
             static_cast<int>(std::min<int64_t>(user_timeout_ms, std::numeric_limits<int>::max())));
  }
  if (st && o.sndbuf > 0) st = set(SOL_SOCKET, SO_SNDBUF, "SO_SNDBUF", o.sndbuf);
  if (st && o.rcvbuf > 0) st = set(SOL_SOCKET, SO_RCVBUF, "SO_RCVBUF", o.rcvbuf);
  return st;
}

namespace {

// One connect() call: all lanes, one deadline, one result.
struct Dial : std::enable_shared_from_this<Dial> {
  Dial(asio::io_context& ctx, DialRequest req, const TcpOptions& opts, std::function<void(DialResult)> cb)
      : request(std::move(req)), options(opts), timer(ctx), done(std::move(cb)) {
    for (uint16_t i = 0; i < request.lanes; ++i) sockets.emplace_back(ctx);
    hellos.resize(request.lanes);
    replies.resize(request.lanes);
    reasons.resize(request.lanes);
    auth.resize(request.lanes);
    outstanding = request.lanes;
  }

  void start() {
    timer.expires_after(request.timeout);
    timer.async_wait([self = shared_from_this()](std::error_code ec) {
      if (ec) return;
      self->fail(Status::timeout(fmt::format("connecting to {} timed out after {} ms", self->request.peer_label,
                                             self->request.timeout.count())));
    });
    for (uint16_t lane = 0; lane < request.lanes; ++lane) connect_lane(lane);
  }

  void connect_lane(uint16_t lane) {
    asio::async_connect(sockets[lane], request.addresses,
                        [self = shared_from_this(), lane](std::error_code ec, const asio::ip::tcp::endpoint&) {
                          if (self->finished) return;
                          if (ec) {
                            return self->lane_done(Status(StatusCode::kFailed,
                                                          fmt::format("connect to {} failed: {} (is the peer endpoint "
                                                                      "alive and listening there?)",
                                                                      self->request.peer_label, ec.message())));
                          }
                          if (Status st = apply_socket_options(self->sockets[lane], self->options); !st) {
                            return self->lane_done(Status(st.code(), fmt::format("connecting to {}: {}",
                                                                                 self->request.peer_label,
                                                                                 st.message())));
                          }
                          self->send_hello(lane);
                        });
  }

  void send_hello(uint16_t lane) {
    Hello h;
    h.lane_index = lane;
    h.lane_count = request.lanes;
    h.sender_id = request.sender_id;
    h.target_id = request.target_id;
    if (!options.token.empty()) {
      h.flags |= kHelloFlagAuth;
      h.nonce = random_nonce();
    }
    encode_hello(h, hellos[lane].data());
    asio::async_write(sockets[lane], asio::buffer(hellos[lane]),
                      [self = shared_from_this(), lane](std::error_code ec, size_t) {
                        if (self->finished) return;
                        if (ec) return self->lane_done(self->io_failure("sending the hello", ec));
                        self->read_reply(lane);
                      });
  }

  void read_reply(uint16_t lane) {
    asio::async_read(sockets[lane], asio::buffer(replies[lane]),
                     [self = shared_from_this(), lane](std::error_code ec, size_t) {
                       if (self->finished) return;
                       if (ec) return self->lane_done(self->reply_lost(ec));
                       if (is_challenge(self->replies[lane].data())) return self->read_challenge(lane);
                       HelloReply reply;
                       if (Status st = parse_hello_reply(self->replies[lane].data(), &reply); !st) {
                         return self->lane_done(st);
                       }
                       if (reply.status != StatusCode::kSuccess) return self->read_reason(lane, reply);
                       if (!self->options.token.empty() && !self->auth[lane].proven) {
                         return self->lane_done(Status(
                             StatusCode::kAuthenticationFailed,
                             fmt::format("{} accepted the connection without authenticating itself; this endpoint "
                                         "has a token and only talks to peers that hold it",
                                         self->request.peer_label)));
                       }
                       self->accepted(lane, reply);
                     });
  }

  // The acceptor's challenge: its first 32 bytes are already in replies[lane].
  void read_challenge(uint16_t lane) {
    if (options.token.empty() || auth[lane].proven) {
      return lane_done(Status::protocol_error(fmt::format("{} sent an auth challenge this side did not ask for",
                                                          request.peer_label)));
    }
    std::memcpy(auth[lane].challenge.data(), replies[lane].data(), kHelloReplySize);
    asio::async_read(sockets[lane], asio::buffer(auth[lane].challenge.data() + kHelloReplySize,
                                                 kChallengeSize - kHelloReplySize),
                     [self = shared_from_this(), lane](std::error_code ec, size_t) {
                       if (self->finished) return;
                       if (ec) return self->lane_done(self->io_failure("reading the auth challenge", ec));
                       self->answer_challenge(lane);
                     });
  }

  void answer_challenge(uint16_t lane) {
    try {
      prove(lane);
    } catch (const std::exception& e) {  // the OS random generator or OpenSSL failed
      lane_done(Status(StatusCode::kFailed, fmt::format("authenticating to {}: {}", request.peer_label, e.what())));
    }
  }

  void prove(uint16_t lane) {
    LaneAuth& a = auth[lane];
    Challenge challenge;
    if (Status st = parse_challenge(a.challenge.data(), &challenge); !st) return lane_done(st);
    const Mac expected = auth_mac(options.token, AuthRole::kAcceptor, hellos[lane].data(), kHelloSize,
                                  challenge.nonce, challenge.endpoint_id);
    if (!mac_equal(expected, challenge.mac)) {
      return lane_done(Status(StatusCode::kAuthenticationFailed,
                              fmt::format("{} could not prove it holds this endpoint's token (the tokens differ)",
                                          request.peer_label)));
    }
    // The MAC proves the token and binds the id the acceptor claims. That id must be the
    // one we dialed: otherwise another holder of the token, reached through whatever now
    // answers at this address (a relay, a reused port), would be taken for our peer.
    if (request.target_id != 0 && challenge.endpoint_id != request.target_id) {
      return lane_done(Status(StatusCode::kAuthenticationFailed,
                              fmt::format("{} holds the token but is endpoint {:#x}, not {:#x} from peer_info",
                                          request.peer_label, challenge.endpoint_id, request.target_id)));
    }
    a.proven = true;
    a.endpoint_id = challenge.endpoint_id;
    Proof proof;
    proof.mac = auth_mac(options.token, AuthRole::kDialer, hellos[lane].data(), kHelloSize, challenge.nonce,
                         challenge.endpoint_id);
    encode_proof(proof, a.proof.data());
    asio::async_write(sockets[lane], asio::buffer(a.proof), [self = shared_from_this(), lane](std::error_code ec, size_t) {
      if (self->finished) return;
      if (ec) return self->lane_done(self->io_failure("sending the auth proof", ec));
      self->read_reply(lane);
    });
  }

  void read_reason(uint16_t lane, HelloReply reply) {
    reasons[lane].resize(reply.reason_len);
    asio::async_read(sockets[lane], asio::buffer(reasons[lane]),
                     [self = shared_from_this(), lane, reply](std::error_code ec, size_t) {
                       if (self->finished) return;
                       std::string reason = ec ? std::string("(no reason given)") : self->reasons[lane];
                       // Refusals keep their code; kTimeout: this dialer ran past the acceptor's
                       // handshake deadline.
                       const bool refusal = reply.status == StatusCode::kAccessDenied ||
                                            reply.status == StatusCode::kAuthenticationFailed ||
                                            reply.status == StatusCode::kTimeout;
                       self->lane_done(Status(refusal ? reply.status : StatusCode::kProtocolError,
                                              fmt::format("{} refused the connection: {}",
                                                          self->request.peer_label, reason)));
                     });
  }

  void accepted(uint16_t lane, const HelloReply& reply) {
    if (auth[lane].proven && reply.endpoint_id != auth[lane].endpoint_id) {
      return lane_done(Status(StatusCode::kAuthenticationFailed,
                              fmt::format("{} accepted as endpoint {:#x} after proving it is {:#x}",
                                          request.peer_label, reply.endpoint_id, auth[lane].endpoint_id)));
    }
    if (request.target_id != 0 && reply.endpoint_id != request.target_id) {
      return lane_done(Status::protocol_error(fmt::format(
          "{} is a different endpoint than the one in peer_info (id {:#x}, expected {:#x})", request.peer_label,
          reply.endpoint_id, request.target_id)));
    }
    if (peer_id != 0 && reply.endpoint_id != peer_id) {
      return lane_done(Status::protocol_error("lanes of one connect() reached different endpoints"));
    }
    peer_id = reply.endpoint_id;
    lane_done(Status::ok());
  }

  // The acceptor closed before answering: it names its reason in a reply when it can, so
  // a bare close means it could not even write that (or is not a DLSlime endpoint).
  Status reply_lost(const std::error_code& ec) const {
    if (ec != asio::error::eof && ec != asio::error::connection_reset) {
      return io_failure("waiting for the hello reply", ec);
    }
    return Status(StatusCode::kFailed,
                  fmt::format("{} closed the connection without answering the hello ({}): it may be overloaded "
                              "with incomplete handshakes (a handshake flood), have run out of file descriptors, "
                              "or not be a DLSlime endpoint",
                              request.peer_label, ec.message()));
  }

  Status io_failure(const char* what, const std::error_code& ec) const {
    return Status(StatusCode::kFailed, fmt::format("{}: connection lost while {}: {}", request.peer_label, what,
                                                   ec.message()));
  }

  void lane_done(const Status& st) {
    if (!st.is_ok()) return fail(st);
    if (--outstanding == 0) finish(Status::ok());
  }

  void fail(const Status& st) {
    if (finished) return;
    for (auto& s : sockets) {
      std::error_code ignored;
      s.close(ignored);
    }
    finish(st);
  }

  void finish(const Status& st) {
    if (finished) return;
    finished = true;
    timer.cancel();
    DialResult result;
    result.status = st;
    result.peer_id = peer_id;
    if (st.is_ok()) result.sockets = std::move(sockets);
    done(std::move(result));
  }

  DialRequest request;
  TcpOptions options;
  asio::steady_timer timer;
  std::function<void(DialResult)> done;
  std::vector<asio::ip::tcp::socket> sockets;
  std::vector<std::array<uint8_t, kHelloSize>> hellos;
  std::vector<std::array<uint8_t, kHelloReplySize>> replies;
  std::vector<std::string> reasons;
  struct LaneAuth {
    std::array<uint8_t, kChallengeSize> challenge{};
    std::array<uint8_t, kProofSize> proof{};
    bool proven = false;       // the acceptor's MAC checked out
    uint64_t endpoint_id = 0;  // the id that MAC bound
  };
  std::vector<LaneAuth> auth;
  size_t outstanding = 0;
  uint64_t peer_id = 0;
  bool finished = false;
};

}  // namespace

void dial_lanes(asio::io_context& ctx, DialRequest request, const TcpOptions& options,
                std::function<void(DialResult)> done) {
  std::make_shared<Dial>(ctx, std::move(request), options, std::move(done))->start();
}

struct TcpListener::Pending {
  explicit Pending(asio::ip::tcp::socket s) : socket(std::move(s)), timer(socket.get_executor()) {}
  asio::ip::tcp::socket socket;
  asio::steady_timer timer;
  PendingList::iterator where;
  bool listed = false;    // in pending_ (not yet retired)
  bool replying = false;  // the handshake is decided and its reply is being written
  bool writing = false;   // the auth challenge is being written
  std::array<uint8_t, kHelloSize> hello_raw{};
  Hello hello;
  Nonce nonce{};  // this side's challenge nonce
  std::array<uint8_t, kChallengeSize> challenge_raw{};
  std::array<uint8_t, kProofSize> proof_raw{};
  std::array<uint8_t, kHelloReplySize> reply_raw{};
  std::string reason;
};

TcpListener::TcpListener(asio::io_context& ctx, const asio::ip::tcp::endpoint& bind, const TcpOptions& options,
                         uint64_t endpoint_id)
    : acceptor_(ctx), backoff_timer_(ctx), options_(options), endpoint_id_(endpoint_id) {
  const PortRange range = PortRange::parse(options.port_range, "TcpEndpoint option port_range");
  const std::string where = bind.address().to_string();
  if (range.empty() || bind.port() != 0) {
    if (!range.empty() && !range.contains(bind.port())) {
      throw InvalidArgumentError(
          fmt::format("port {} is outside the TcpEndpoint option port_range {}", bind.port(), range.to_string()));
    }
    if (const auto ec = try_listen(bind)) {
      throw ConnectionError(fmt::format("cannot listen on {}:{}: {}", where, bind.port(), ec.message()));
    }
  } else {
    // The first free port of the range, in order: predictable for whoever reads a firewall
    // log. Only "in use" moves on; any other failure is the same for every port.
    std::error_code ec;
    for (uint32_t p = range.first; p <= range.last; ++p) {
      ec = try_listen(asio::ip::tcp::endpoint(bind.address(), static_cast<uint16_t>(p)));
      if (!ec) break;
      if (ec != asio::error::address_in_use) {
        throw ConnectionError(fmt::format("cannot listen on {}:{}: {}", where, p, ec.message()));
      }
    }
    if (ec) {
      throw ConnectionError(fmt::format("no free port in the TcpEndpoint option port_range {} on {} (every one of "
                                        "its {} ports is in use): widen the range (DLSLIME_TCP_PORT_RANGE) or shut "
                                        "endpoints down",
                                        range.to_string(), where, range.size()));
    }
  }
  port_ = acceptor_.local_endpoint().port();
}

std::error_code TcpListener::try_listen(const asio::ip::tcp::endpoint& at) {
  std::error_code ec, ignored;
  acceptor_.open(at.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(at, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) acceptor_.close(ignored);
  return ec;
}

void TcpListener::start(Decide decide, Accepted accepted) {
  decide_ = std::move(decide);
  accepted_ = std::move(accepted);
  accept_next();
}

void TcpListener::close() {
  closed_ = true;
  std::error_code ignored;
  acceptor_.close(ignored);
  backoff_timer_.cancel();
  // Their handlers see closed_ and abandon (retire is idempotent).
  for (auto& p : pending_) {
    p->listed = false;
    p->timer.cancel();
    p->socket.close(ignored);
  }
  pending_.clear();
}

TcpListener::Stats TcpListener::stats() const {
  Stats s;
  s.accepted = counters_.accepted.load(std::memory_order_relaxed);
  s.accept_failures = counters_.accept_failures.load(std::memory_order_relaxed);
  s.handshakes_completed = counters_.completed.load(std::memory_order_relaxed);
  s.handshakes_refused = counters_.refused.load(std::memory_order_relaxed);
  s.handshakes_timed_out = counters_.timed_out.load(std::memory_order_relaxed);
  s.handshakes_evicted = counters_.evicted.load(std::memory_order_relaxed);
  return s;
}

void TcpListener::accept_next() {
  if (closed_) return;
  acceptor_.async_accept([self = shared_from_this()](std::error_code ec, asio::ip::tcp::socket socket) {
    if (self->closed_) return;
    if (ec) return self->accept_failed(ec);
    self->backoff_ = std::chrono::milliseconds(0);
    self->counters_.accepted.fetch_add(1, std::memory_order_relaxed);
    if (Status st = apply_socket_options(socket, self->options_); !st) {
      self->counters_.refused.fetch_add(1, std::memory_order_relaxed);
      if (const uint64_t n = self->accept_log_.tick()) {
        DLSLIME_WARN("closing {} accepted connection(s): {}", n, st.message());
      }
      std::error_code ignored;
      socket.close(ignored);
    } else {
      if (self->pending_.size() >= kMaxPendingHandshakes) self->evict_oldest();
      self->handshake(std::make_shared<Pending>(std::move(socket)));
    }
    self->accept_next();
  });
}

// accept() fails again at once while the cause lasts (EMFILE: the connection stays in the
// backlog), so retrying immediately would spin a core and log at disk speed. Back off,
// doubling, and log one line per interval with the count.
void TcpListener::accept_failed(const std::error_code& ec) {
  counters_.accept_failures.fetch_add(1, std::memory_order_relaxed);
  backoff_ = backoff_.count() == 0 ? kMinAcceptBackoff : std::min(backoff_ * 2, kMaxAcceptBackoff);
  if (const uint64_t n = accept_log_.tick()) {
    DLSLIME_WARN("accept on port {} failed {} time(s) since the last report: {}; retrying in {} ms", port_, n,
                 ec.message(), backoff_.count());
  }
  backoff_timer_.expires_after(backoff_);
  backoff_timer_.async_wait([self = shared_from_this()](std::error_code wait_ec) {
    if (wait_ec || self->closed_) return;
    self->accept_next();
  });
}

void TcpListener::handshake(std::shared_ptr<Pending> p) {
  p->where = pending_.insert(pending_.end(), p);
  p->listed = true;
  // One deadline for the whole handshake, not per byte: trickling cannot extend it.
  p->timer.expires_after(options_.connect_timeout);
  p->timer.async_wait([weak = weak_from_this(), p](std::error_code ec) {
    auto self = weak.lock();
    if (ec || !self || !p->listed) return;
    self->counters_.timed_out.fetch_add(1, std::memory_order_relaxed);
    if (p->replying) return self->abandon(p);  // its reply is already (partly) on the wire
    self->drop(p, Status::timeout(fmt::format("the handshake was not completed within {} ms (connect_timeout)",
                                              self->options_.connect_timeout.count())));
  });
  asio::async_read(p->socket, asio::buffer(p->hello_raw), [self = shared_from_this(), p](std::error_code ec, size_t) {
    if (ec || self->closed_ || !p->listed) return self->abandon(p);
    Status verdict = parse_hello(p->hello_raw.data(), &p->hello);
    if (verdict) verdict = self->check_auth_flag(p->hello);
    if (verdict && !self->options_.token.empty()) {
      try {
        return self->challenge(p);
      } catch (const std::exception& e) {  // the OS random generator or OpenSSL failed
        verdict = Status(StatusCode::kFailed, fmt::format("authentication failed on this side: {}", e.what()));
      }
    }
    if (verdict) verdict = self->decide_(p->hello);
    self->reply(p, verdict);
  });
}

Status TcpListener::check_auth_flag(const Hello& hello) const {
  const bool peer_has_token = (hello.flags & kHelloFlagAuth) != 0;
  if (!options_.token.empty() && !peer_has_token) {
    return Status(StatusCode::kAuthenticationFailed,
                  "this endpoint requires a token; connect with the same TcpEndpoint(token=...) or DLSLIME_TCP_TOKEN");
  }
  if (options_.token.empty() && peer_has_token) {
    return Status(StatusCode::kAuthenticationFailed,
                  "this endpoint has no token, but the peer asked to authenticate with one; set the same token on "
                  "both sides (TcpEndpoint(token=...) or DLSLIME_TCP_TOKEN)");
  }
  return Status::ok();
}

// Authentication runs before decide_(), so a peer without the token learns nothing about
// this endpoint (not even whether its target id matches) beyond the fact that it wants one.
void TcpListener::challenge(std::shared_ptr<Pending> p) {
  Challenge c;
  c.nonce = p->nonce = random_nonce();
  c.endpoint_id = endpoint_id_;
  c.mac = auth_mac(options_.token, AuthRole::kAcceptor, p->hello_raw.data(), kHelloSize, c.nonce, endpoint_id_);
  encode_challenge(c, p->challenge_raw.data());
  p->writing = true;
  asio::async_write(p->socket, asio::buffer(p->challenge_raw), [self = shared_from_this(), p](std::error_code ec,
                                                                                              size_t) {
    p->writing = false;
    if (ec || self->closed_ || !p->listed) return self->abandon(p);
    asio::async_read(p->socket, asio::buffer(p->proof_raw), [self, p](std::error_code ec, size_t) {
      if (ec || self->closed_ || !p->listed) return self->abandon(p);
      Proof proof;
      Status verdict = parse_proof(p->proof_raw.data(), &proof);
      if (verdict) {
        try {
          const Mac expected = auth_mac(self->options_.token, AuthRole::kDialer, p->hello_raw.data(), kHelloSize,
                                        p->nonce, self->endpoint_id_);
          if (!mac_equal(expected, proof.mac)) {
            verdict = Status(StatusCode::kAuthenticationFailed,
                             "wrong token: the peer's proof does not match this endpoint's");
          }
        } catch (const std::exception& e) {
          verdict = Status(StatusCode::kFailed, fmt::format("authentication failed on this side: {}", e.what()));
        }
      }
      if (verdict) verdict = self->decide_(p->hello);
      self->reply(p, verdict);
    });
  });
}

// The oldest incomplete handshake has been slow the longest: a legitimate dialer finishes
// in a round trip, so under a flood of slow connections the oldest is the attacker's.
void TcpListener::evict_oldest() {
  for (auto& p : pending_) {
    if (p->replying) continue;  // decided: its reply is on its way
    counters_.evicted.fetch_add(1, std::memory_order_relaxed);
    if (const uint64_t n = evict_log_.tick()) {
      DLSLIME_WARN("port {}: {} incomplete handshake(s) dropped since the last report to admit new connections "
                   "(more than {} at once: a slow or flooding dialer?)",
                   port_, n, kMaxPendingHandshakes);
    }
    drop(p, Status(StatusCode::kAccessDenied,
                   fmt::format("dropped: the handshake was still incomplete when {} newer connections arrived (this "
                               "endpoint keeps at most {} incomplete handshakes)",
                               kMaxPendingHandshakes, kMaxPendingHandshakes)));
    return;
  }
}

void TcpListener::drop(std::shared_ptr<Pending> p, const Status& why) {  // by value: retire() erases the list's copy
  retire(p);
  HelloReply r;
  r.endpoint_id = endpoint_id_;
  r.status = why.code();
  p->reason = why.message().substr(0, kMaxReasonText);
  r.reason_len = static_cast<uint32_t>(p->reason.size());
  encode_hello_reply(r, p->reply_raw.data());
  std::array<asio::const_buffer, 2> bufs{asio::buffer(p->reply_raw), asio::buffer(p->reason)};
  std::error_code ignored;
  // A fresh socket's send buffer takes these few bytes at once; a non-blocking send never
  // waits for a peer that does not read. Not while the challenge is still being written:
  // the two would interleave.
  if (!p->writing) {
    p->socket.non_blocking(true, ignored);
    p->socket.send(bufs, 0, ignored);
  }
  p->socket.shutdown(asio::socket_base::shutdown_both, ignored);
  p->socket.close(ignored);
}

void TcpListener::abandon(const std::shared_ptr<Pending>& p) {
  retire(p);
  std::error_code ignored;
  p->socket.close(ignored);
}

void TcpListener::retire(const std::shared_ptr<Pending>& p) {
  p->timer.cancel();
  if (!p->listed) return;
  p->listed = false;
  pending_.erase(p->where);
}

void TcpListener::reply(std::shared_ptr<Pending> p, const Status& verdict) {
  p->replying = true;
  if (!verdict.is_ok()) counters_.refused.fetch_add(1, std::memory_order_relaxed);
  HelloReply r;
  r.endpoint_id = endpoint_id_;
  r.status = verdict.code();
  if (!verdict.is_ok()) {
    p->reason = verdict.message().substr(0, kMaxReasonText);
    r.reason_len = static_cast<uint32_t>(p->reason.size());
  }
  encode_hello_reply(r, p->reply_raw.data());
  std::array<asio::const_buffer, 2> bufs{asio::buffer(p->reply_raw), asio::buffer(p->reason)};
  // The deadline still runs: a dialer that does not read its reply is dropped with it.
  asio::async_write(p->socket, bufs, [self = shared_from_this(), p, ok = verdict.is_ok()](std::error_code ec, size_t) {
    const bool live = p->listed;
    self->retire(p);
    std::error_code ignored;
    if (ec || !ok || !live || self->closed_) {
      p->socket.close(ignored);
      return;
    }
    self->counters_.completed.fetch_add(1, std::memory_order_relaxed);
    self->accepted_(std::move(p->socket), p->hello);
  });
}

}  // namespace dlslime::tcp
