#include "tcp/tcp_endpoint_impl.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <limits>
#include <random>

#include <asio/ip/address.hpp>
#include <asio/post.hpp>
#include <fmt/format.h>

#include "core/log.h"
#include "dlslime/errors.h"
#include "tcp/handshake.h"

namespace dlslime {

using tcp::TcpConnection;

namespace {

uint64_t random_id() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return id;
}

bool is_wildcard(const asio::ip::address& a) { return a.is_unspecified(); }

// The address a peer should dial: the bind address, or for a wildcard bind the
// configured advertise host, else what the host name resolves to.
std::string advertise_host_for(const asio::ip::address& bound, const TcpOptions& o, asio::io_context& io) {
  if (!is_wildcard(bound)) return bound.to_string();
  if (!o.advertise_host.empty()) return o.advertise_host;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0 && name[0] != '\0') {
    std::error_code ec;
    asio::ip::tcp::resolver resolver(io);
    auto results = resolver.resolve(asio::ip::tcp::v4(), name, "", ec);
    if (!ec && !results.empty()) return results.begin()->endpoint().address().to_string();
  }
  return "127.0.0.1";
}

asio::ip::address parse_bind_address(const std::string& ip, asio::io_context& io) {
  std::error_code ec;
  auto addr = asio::ip::make_address(ip.empty() ? "0.0.0.0" : ip, ec);
  if (!ec) return addr;
  asio::ip::tcp::resolver resolver(io);
  auto results = resolver.resolve(ip, "", ec);
  if (ec || results.empty()) {
    throw InvalidArgumentError(fmt::format("cannot bind to '{}': not an IP address or resolvable host name", ip));
  }
  return results.begin()->endpoint().address();
}

}  // namespace

TcpEndpointImpl::TcpEndpointImpl(const std::string& ip, uint16_t port, TcpOptions options,
                                 std::shared_ptr<MemoryRegistry> regions)
    : local_regions(regions ? std::move(regions) : std::make_shared<MemoryRegistry>()),
      options_(std::move(options)),
      runtime_(IoRuntime::shared()),
      io_(runtime_->next_context()),
      endpoint_id_(random_id()),
      inflight_(options_.max_inflight_ops),
      sweep_timer_(io_) {
  options_.validate();
  const auto addr = parse_bind_address(ip, io_);
  listener_ = std::make_shared<tcp::TcpListener>(io_, asio::ip::tcp::endpoint(addr, port), options_, endpoint_id_);
  advertised_host_ = advertise_host_for(addr, options_, io_);
}

TcpEndpointImpl::TcpEndpointImpl(asio::io_context& io, TcpOptions options, std::shared_ptr<MemoryRegistry> regions)
    : local_regions(regions ? std::move(regions) : std::make_shared<MemoryRegistry>()),
      options_(std::move(options)),
      io_(io),
      endpoint_id_(random_id()),
      inflight_(options_.max_inflight_ops),
      sweep_timer_(io_) {
  options_.validate();
  listener_ = std::make_shared<tcp::TcpListener>(
      io_, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0), options_, endpoint_id_);
  advertised_host_ = "127.0.0.1";
}

TcpEndpointImpl::~TcpEndpointImpl() = default;

std::shared_ptr<TcpConnection> TcpEndpointImpl::adopt_dialed_for_test(asio::ip::tcp::socket socket,
                                                                      uint64_t peer_id) {
  pair_with(peer_id);
  auto conn = std::make_shared<TcpConnection>(std::move(socket), this, TcpConnection::Role::kDialed,
                                              static_cast<uint16_t>(dialed_.size()), answer_budget_);
  dialed_.push_back(conn);
  lanes_up_ = static_cast<uint16_t>(dialed_.size());
  connected_ = true;
  conn->start();
  return conn;
}

void TcpEndpointImpl::throw_inherited() const {
  throw ConnectionError(fmt::format("TcpEndpoint {:#x} was created before fork() and cannot be used in the child "
                                    "process; create a new endpoint there",
                                    endpoint_id_),
                        StatusCode::kFailed);
}

void TcpEndpointImpl::run_on_io(std::function<void()> fn) {
  if (inherited()) throw_inherited();
  // No runtime: the caller drives the io_context itself (tests), so this is its thread.
  if (!runtime_ || on_own_thread()) {
    CompletionScope scope;
    return fn();
  }
  // The hop has a deadline (a continuation blocking the I/O thread must not hang the
  // caller for good). fn may refer to the caller's stack, so a hop that times out before
  // it started is abandoned (it never runs); one that started is waited for.
  struct Hop {
    std::mutex mu;
    std::condition_variable cv;
    enum { kQueued, kRunning, kDone, kAbandoned } state = kQueued;
    std::exception_ptr error;
  };
  auto hop = std::make_shared<Hop>();
  asio::post(io_, [hop, &fn] {
    {
      std::lock_guard lock(hop->mu);
      if (hop->state == Hop::kAbandoned) return;
      hop->state = Hop::kRunning;
    }
    try {
      fn();
    } catch (...) {
      hop->error = std::current_exception();
    }
    std::lock_guard lock(hop->mu);
    hop->state = Hop::kDone;
    hop->cv.notify_all();
  });
  std::unique_lock lock(hop->mu);
  if (!hop->cv.wait_for(lock, kIoHopTimeout, [&] { return hop->state == Hop::kDone; })) {
    if (hop->state == Hop::kQueued) {
      hop->state = Hop::kAbandoned;
      throw TimeoutError(fmt::format(
          "the endpoint's I/O thread did not respond within {} s (is a completion callback blocking it?)",
          std::chrono::duration_cast<std::chrono::seconds>(kIoHopTimeout).count()));
    }
    hop->cv.wait(lock, [&] { return hop->state == Hop::kDone; });
  }
  if (hop->error) std::rethrow_exception(hop->error);
}

void TcpEndpointImpl::start() {
  local_regions->watch(std::static_pointer_cast<RegionRevoker>(shared_from_this()));
  std::weak_ptr<TcpEndpointImpl> weak = weak_from_this();
  run_on_io([&] {
    listener_->start(
        [weak](const tcp::Hello& hello) {
          auto self = weak.lock();
          return self ? self->decide_hello(hello) : Status(StatusCode::kFailed, "endpoint is gone");
        },
        [weak](asio::ip::tcp::socket socket, const tcp::Hello& hello) {
          if (auto self = weak.lock()) self->adopt_accepted(std::move(socket), hello);
        });
  });
  DLSLIME_INFO("TcpEndpoint {:#x} listening on {}:{}", endpoint_id_, advertised_host_, port());
}

nlohmann::json TcpEndpointImpl::endpoint_info() const {
  return {{"transport", "tcp"},
          {"host", advertised_host_},
          {"port", listener_->port()},
          {"endpoint_id", endpoint_id_},
          {"protocol_version", tcp::kProtocolVersion},
          {"lanes", options_.lanes},
          {"mr_info", local_regions->mr_info()}};
}

// ---------------------------------------------------------------------------------------
// Connecting

Status TcpEndpointImpl::decide_hello(const tcp::Hello& hello) {
  constexpr size_t kMaxAcceptedLanes = 64;
  if (shut_down_) return Status(StatusCode::kAccessDenied, "the endpoint is shutting down");
  if (hello.target_id != 0 && hello.target_id != endpoint_id_) {
    return Status::protocol_error(fmt::format(
        "this port belongs to endpoint {:#x}, not {:#x} (is the peer_info stale?)", endpoint_id_, hello.target_id));
  }
  if (peer_id_ != 0 && hello.sender_id != peer_id_) {
    return Status(StatusCode::kAccessDenied,
                  fmt::format("the endpoint is already connected to peer {:#x}; a TcpEndpoint serves one peer", peer_id_));
  }
  if (accepted_.size() >= kMaxAcceptedLanes) {
    return Status(StatusCode::kAccessDenied, fmt::format("too many connections (limit {})", kMaxAcceptedLanes));
  }
  return Status::ok();
}

void TcpEndpointImpl::adopt_accepted(asio::ip::tcp::socket socket, const tcp::Hello& hello) {
  if (Status verdict = decide_hello(hello); !verdict) {
    DLSLIME_WARN("dropping a connection accepted before a conflicting one: {}", verdict.message());
    return;
  }
  pair_with(hello.sender_id);
  last_loss_.clear();
  auto conn = std::make_shared<TcpConnection>(std::move(socket), this, TcpConnection::Role::kAccepted, hello.lane_index,
                                              answer_budget_);
  DLSLIME_DEBUG("accepted lane {} from peer {:#x} at {}", hello.lane_index, hello.sender_id, conn->peer_address());
  accepted_.push_back(conn);
  conn->start();
}

void TcpEndpointImpl::pair_with(uint64_t peer_id) {
  // Messages held from an earlier peer stay deliverable after it left (its sends were
  // acknowledged), but not to the recvs of a different peer's conversation.
  if (previous_peer_id_ != 0 && previous_peer_id_ != peer_id) {
    unexpected_.clear();
    unexpected_bytes_ = 0;
  }
  peer_id_ = previous_peer_id_ = peer_id;
}

void TcpEndpointImpl::connect(const nlohmann::json& peer_info) {
  if (shut_down_) throw ConnectionError("connect() on a shut-down endpoint", StatusCode::kCancelled);
  if (inherited()) throw_inherited();
  if (!peer_info.is_object()) throw InvalidArgumentError("peer_info must be a dict (the peer's endpoint_info())");
  if (peer_info.contains("transport") && peer_info["transport"] != "tcp") {
    throw InvalidArgumentError(
        fmt::format("peer_info is for transport {}, not tcp", peer_info["transport"].dump()));
  }
  if (!peer_info.contains("host") || !peer_info["host"].is_string() || peer_info["host"].get<std::string>().empty()) {
    throw InvalidArgumentError("peer_info needs a non-empty string 'host'");
  }
  if (!peer_info.contains("port") || !peer_info["port"].is_number_integer() || peer_info["port"].get<int64_t>() < 1 ||
      peer_info["port"].get<int64_t>() > 65535) {
    throw InvalidArgumentError("peer_info needs an integer 'port' in 1..65535");
  }
  uint64_t target_id = 0;
  if (peer_info.contains("endpoint_id")) {
    if (!peer_info["endpoint_id"].is_number_unsigned()) {
      throw InvalidArgumentError("peer_info 'endpoint_id' must be a non-negative integer");
    }
    target_id = peer_info["endpoint_id"].get<uint64_t>();
  }
  // Validate the peer's regions before touching the network.
  std::vector<std::pair<std::string, nlohmann::json>> regions;
  if (peer_info.contains("mr_info")) {
    const auto& mr = peer_info["mr_info"];
    if (!mr.is_object()) throw InvalidArgumentError("peer_info 'mr_info' must be a dict");
    OwnerRemoteRegions probe;
    for (const auto& [name, entry] : mr.items()) {
      add_owner_resolved(probe, name, entry);
      regions.emplace_back(name, entry);
    }
    std::sort(regions.begin(), regions.end(),
              [](const auto& a, const auto& b) { return a.second["handle"] < b.second["handle"]; });
  }

  const std::string host = peer_info["host"];
  const auto port = static_cast<uint16_t>(peer_info["port"].get<int64_t>());
  tcp::DialRequest request;
  request.peer_label = fmt::format("{}:{}", host, port);
  request.lanes = static_cast<uint16_t>(options_.lanes);
  request.sender_id = endpoint_id_;
  request.target_id = target_id;
  request.timeout = options_.connect_timeout;
  {
    std::error_code ec;
    asio::ip::tcp::resolver resolver(io_);
    auto results = resolver.resolve(host, std::to_string(port), ec);
    if (ec || results.empty()) {
      throw ConnectionError(fmt::format("cannot resolve peer host '{}': {}", host, ec ? ec.message() : "no address"));
    }
    for (const auto& r : results) request.addresses.push_back(r.endpoint());
  }

  auto result = std::make_shared<ConnectWait>();
  auto outcome = result->promise.get_future();
  {
    std::lock_guard lock(connects_mu_);
    std::erase_if(connects_, [](const auto& w) { return w.expired(); });
    connects_.push_back(result);
  }
  if (shut_down_) result->finish(Status::cancelled("the endpoint was shut down"));  // raced with shutdown()
  post([request = std::move(request), result](TcpEndpointImpl& self) mutable {
    if (self.shut_down_) return result->finish(Status::cancelled("the endpoint was shut down"));
    if (!self.dialed_.empty()) {
      if (request.target_id == 0 || request.target_id == self.peer_id_) return result->finish(Status::ok());
      return result->finish(Status(StatusCode::kAccessDenied,
                                      fmt::format("already connected to peer {:#x}; a TcpEndpoint serves one peer",
                                                  self.peer_id_)));
    }
    const std::string label = request.peer_label;
    tcp::dial_lanes(self.io_, std::move(request), self.options_,
                    [weak = self.weak_from_this(), result, label](tcp::DialResult r) {
                      auto self = weak.lock();
                      if (!self) return result->finish(Status::cancelled("the endpoint is gone"));
                      if (!r.status) return result->finish(r.status);
                      Status verdict = Status::ok();
                      if (self->shut_down_) {
                        verdict = Status::cancelled("the endpoint was shut down during connect()");
                      } else if (self->peer_id_ != 0 && self->peer_id_ != r.peer_id) {
                        verdict = Status(StatusCode::kAccessDenied,
                                         fmt::format("{} is endpoint {:#x}, but this endpoint is already paired "
                                                     "with peer {:#x}",
                                                     label, r.peer_id, self->peer_id_));
                      }
                      if (!verdict || !self->dialed_.empty()) {
                        for (auto& s : r.sockets) {
                          std::error_code ignored;
                          s.close(ignored);
                        }
                        return result->finish(verdict);  // a concurrent connect() won
                      }
                      self->pair_with(r.peer_id);
                      self->last_loss_.clear();
                      for (size_t lane = 0; lane < r.sockets.size(); ++lane) {
                        auto conn = std::make_shared<TcpConnection>(std::move(r.sockets[lane]), self.get(),
                                                                    TcpConnection::Role::kDialed,
                                                                    static_cast<uint16_t>(lane), self->answer_budget_);
                        self->dialed_.push_back(conn);
                        conn->start();
                      }
                      self->lanes_up_ = static_cast<uint16_t>(self->dialed_.size());
                      self->connected_ = true;
                      DLSLIME_INFO("connected to {} (peer {:#x}) over {} lane(s)", label, r.peer_id,
                                   self->dialed_.size());
                      result->finish(Status::ok());
                    });
  });
  // The dial has its own deadline; this guard only covers a stalled I/O thread.
  if (outcome.wait_for(options_.connect_timeout + std::chrono::seconds(5)) != std::future_status::ready) {
    throw TimeoutError(fmt::format("connect() to {}:{} did not finish", host, port));
  }
  const Status st = outcome.get();
  if (st.code() == StatusCode::kCancelled) throw ConnectionError("connect(): " + st.message(), StatusCode::kCancelled);
  if (st.code() == StatusCode::kTimeout) throw TimeoutError(st.message());
  if (st.code() == StatusCode::kAuthenticationFailed) throw AuthenticationError(st.message());
  if (!st) throw ConnectionError(st.message(), st.code());
  for (const auto& [name, entry] : regions) add_owner_resolved(remote_regions, name, entry);
}

// ---------------------------------------------------------------------------------------
// I/O thread: starting ops, deadlines, failure

void TcpEndpointImpl::start_op(Submission& sub) {
  auto& state = sub.op.state;
  if (shut_down_) {
    state->complete(Status::cancelled("the endpoint is shut down"));
    return;
  }
  if (dialed_.empty()) {
    state->complete(Status::not_connected(
        last_loss_.empty() ? "the endpoint is not connected; call connect(peer_info) first"
                           : fmt::format("the endpoint is not connected (the connection was lost: {}); call "
                                         "connect() again",
                                         last_loss_)));
    return;
  }
  if (sub.items.empty()) {  // only zero-length items
    state->complete(Status::ok());
    return;
  }
  const bool is_send = state->kind() == OpKind::kSend;
  if (state->kind() == OpKind::kWrite || state->kind() == OpKind::kWriteWithImm) {
    // Each lane's frames end in one acknowledgement, on that lane (on_write_ack).
    for (const auto& [lane, item] : sub.items) {
      const uint64_t bit = uint64_t{1} << dialed_[lane % dialed_.size()]->lane();
      if (sub.op.ack_lanes & bit) {  // fewer lanes than when it was planned: a reconnect in between
        state->complete(Status::not_connected("the connection changed while the op was submitted; submit it again"));
        return;
      }
      sub.op.ack_lanes |= bit;
    }
  }
  pending_.insert(sub.op_id, std::move(sub.op), sub.deadline);
  for (auto& [lane, item] : sub.items) dialed_[lane % dialed_.size()]->send(std::move(item));
  if (is_send) {
    sends_.push_back(sub.op_id);
    // Messages that expired unacknowledged need no acknowledgement any more.
    while (sends_.size() > options_.max_inflight_ops && !pending_.contains(sends_.front())) sends_.pop_front();
  }
  arm_sweeper(sub.deadline);
}

void TcpEndpointImpl::finish_op(uint64_t op_id, Status status, uint64_t nbytes) {
  if (auto op = pending_.take(op_id)) end_op(op_id, std::move(*op), std::move(status), nbytes);
}

void TcpEndpointImpl::end_op(uint64_t op_id, PendingOp op, Status status, uint64_t nbytes) {
  // The op's memory must not be touched once its future completes. Queued frames are
  // dropped and sinks released; bytes already being written or read can only be stopped
  // by closing that connection (which fails the endpoint's other ops the same way).
  std::vector<std::shared_ptr<TcpConnection>> stuck;
  for (auto* lanes : {&dialed_, &accepted_}) {
    for (auto& conn : *lanes) {
      if (!conn->release(op_id) || !conn->abandon(op_id)) stuck.push_back(conn);
    }
  }
  for (auto& conn : stuck) {
    conn->close(Status::peer_closed(fmt::format("lane {} was closed: {} op {} ended ({}) while its bytes were in transit",
                                                conn->lane(), op_kind_name(op.state->kind()), op_id,
                                                status_code_name(status.code()))));
  }
  std::shared_ptr<OpState> state = std::move(op.state);
  op = PendingOp();  // regions and the in-flight slot go before the future completes
  state->complete(std::move(status), nbytes);
}

void TcpEndpointImpl::violation(TcpConnection& conn, std::string what) {
  DLSLIME_WARN("peer {:#x}, lane {}: {}", peer_id_, conn.lane(), what);
  conn.close(Status::protocol_error(std::move(what)));
}

void TcpEndpointImpl::revoke_region(const RegionLifetime& lifetime) {
  run_on_io([&] {
    std::vector<uint64_t> ops;
    pending_.for_each([&](uint64_t id, const PendingOp& op) {
      if (op.uses.holds(&lifetime)) ops.push_back(id);
    });
    for (uint64_t id : ops) {
      finish_op(id, Status(StatusCode::kUnknownHandle,
                           fmt::format("local region '{}' was unregistered while the op was in flight", lifetime.name())));
    }
    std::vector<std::shared_ptr<TcpConnection>> holding;
    for (auto* lanes : {&dialed_, &accepted_}) {
      for (auto& conn : *lanes) {
        if (conn->holds(&lifetime)) holding.push_back(conn);
      }
    }
    for (auto& conn : holding) {
      conn->close(Status::failed(fmt::format(
          "lane {} was closed: region '{}' was unregistered while a transfer of the peer on it was in flight",
          conn->lane(), lifetime.name())));
    }
  });
}

void TcpEndpointImpl::arm_sweeper(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max() || sweep_at_ <= deadline) return;  // due by then already
  // Deadlines closer together than kSweepGranularity share one wake-up.
  sweep_at_ = std::max(deadline, Clock::now() + kSweepGranularity);
  sweep_timer_.expires_at(sweep_at_);  // cancels the wait for a later sweep
  sweep_timer_.async_wait([weak = weak_from_this(), generation = ++sweep_generation_](std::error_code ec) {
    auto self = weak.lock();
    if (!self || generation != self->sweep_generation_) return;  // re-armed since
    self->sweep_at_ = Clock::time_point::max();
    if (ec || self->shut_down_) return;
    self->sweep();
  });
}

void TcpEndpointImpl::sweep() {
  const auto now = Clock::now();
  // Ops by their deadline heap: only those due are touched. Each is out of pending_
  // before it ends, so ending it may end others (a lane it closes) without confusion.
  Clock::time_point next = pending_.expire(now, [&](uint64_t id, PendingOp&& op) {
    const OpKind kind = op.state->kind();
    end_op(id, std::move(op),
           Status::timeout(fmt::format("{} did not complete within {} ms (op_timeout)", op_kind_name(kind),
                                       options_.op_timeout.count())));
  });

  const auto recv_timeout_status = [&] {
    return Status::timeout(fmt::format("recv: no message arrived within {} ms (recv_timeout)",
                                       options_.recv_timeout.count()));
  };
  // Posted recvs expire in posting order (their deadlines are in that order too).
  while (!recvs_.empty() && recvs_.front().deadline <= now) {
    auto state = std::move(recvs_.front().state);
    recvs_.pop_front();
    state->complete(recv_timeout_status());
  }
  if (!recvs_.empty()) next = std::min(next, recvs_.front().deadline);
  if (auto msg = current_msg_; msg && msg->matched && msg->recv.state) {
    if (msg->recv.deadline <= now) {
      auto conn = msg->conn.lock();
      auto state = std::move(msg->recv.state);
      state->complete(recv_timeout_status());
      // Bytes still streaming into the buffer: only closing the connection stops them.
      if (conn && !conn->release(msg->recv.local_id)) {
        conn->close(Status::peer_closed("a recv timed out while its message was arriving"));
      }
    } else {
      next = std::min(next, msg->recv.deadline);
    }
  }
  // Anything ended above may have posted or failed more (fail_all clears the tables).
  next = std::min(next, pending_.next_deadline());
  if (!recvs_.empty()) next = std::min(next, recvs_.front().deadline);
  arm_sweeper(next);
}

void TcpEndpointImpl::on_closed(TcpConnection& conn, const Status& why) {
  if (failing_ || shut_down_) return;
  if (why.code() == StatusCode::kPeerClosed) {
    DLSLIME_INFO("peer {:#x}: {}", peer_id_, why.message());
  } else {
    DLSLIME_WARN("peer {:#x}: lane {} failed: {}", peer_id_, conn.lane(), why.to_string());
  }
  last_loss_ = why.message();
  fail_all(Status(why.code() == StatusCode::kPeerClosed ? StatusCode::kPeerClosed : why.code(),
                  fmt::format("connection to the peer lost: {}", why.message())));
}

void TcpEndpointImpl::fail_all(const Status& why) {
  failing_ = true;
  auto dialed = std::move(dialed_);
  auto accepted = std::move(accepted_);
  dialed_.clear();
  accepted_.clear();
  connected_ = false;
  lanes_up_ = 0;
  peer_id_ = 0;  // a new peer may connect now
  for (auto& c : dialed) c->close_quietly();
  for (auto& c : accepted) c->close_quietly();
  auto pending = std::move(pending_);
  pending_.clear();  // a moved-from table is emptied explicitly
  sends_.clear();
  auto recvs = std::move(recvs_);
  recvs_.clear();
  auto current = std::move(current_msg_);
  current_msg_.reset();
  // Messages that arrived whole were acknowledged to the sender: they stay deliverable
  // to later recvs even though the peer is gone (but not past shutdown()).
  std::erase_if(unexpected_, [&](const auto& m) { return shut_down_ || !m->complete; });
  unexpected_bytes_ = 0;
  for (const auto& m : unexpected_) unexpected_bytes_ += m->buffered.size() + kHeldMessageOverhead;
  inbound_writes_.clear();
  paused_conn_.reset();
  failing_ = false;
  // Complete outside the bookkeeping: continuations may call back into the endpoint.
  // The lanes are closed: nothing touches the ops' memory any more.
  pending.for_each([&](uint64_t, PendingOp& op) {
    op.uses.clear();
    op.state->complete(why);
  });
  for (auto& r : recvs) r.state->complete(why);
  if (current && current->matched && current->recv.state) current->recv.state->complete(why);
}

void TcpEndpointImpl::shutdown() {
  if (shut_down_.exchange(true)) return;
  if (inherited()) {
    // In a fork() child: nothing may run on the parent's I/O thread (it is not here), and
    // closing the sockets would deregister them from the epoll instance the parent still
    // uses. The parent's endpoint is left untouched: this copy is never destroyed.
    static std::mutex kept_mu;
    static auto* kept = new std::vector<std::shared_ptr<TcpEndpointImpl>>();
    std::lock_guard lock(kept_mu);
    kept->push_back(shared_from_this());
    return;
  }
  {
    // A connect() in progress returns now; its dial closes what it opens (shut_down_).
    std::lock_guard lock(connects_mu_);
    for (auto& w : connects_) {
      if (auto wait = w.lock()) wait->finish(Status::cancelled("the endpoint was shut down during connect()"));
    }
    connects_.clear();
  }
  try {
    run_on_io([this] {
      listener_->close();
      sweep_timer_.cancel();
      fail_all(Status::cancelled("the endpoint was shut down"));
    });
  } catch (const std::exception& e) {
    // Called from destructors: report, never throw.
    DLSLIME_ERROR("TcpEndpoint {:#x}: shutdown did not finish: {}", endpoint_id_, e.what());
  }
  DLSLIME_DEBUG("TcpEndpoint {:#x} shut down", endpoint_id_);
}

}  // namespace dlslime
