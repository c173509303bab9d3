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

using tcp::FrameHeader;
using tcp::FrameType;
using tcp::PayloadSink;
using tcp::RxAction;
using tcp::TcpConnection;
using tcp::WriteItem;

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

Status remote_status(const FrameHeader& h, std::string_view text) {
  return Status(static_cast<StatusCode>(h.status), fmt::format("the peer reported: {}", text));
}

std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) return std::chrono::steady_clock::time_point::max();
  return std::chrono::steady_clock::now() + timeout;
}

}  // namespace

TcpEndpointImpl::TcpEndpointImpl(const std::string& ip, uint16_t port, TcpOptions options,
                                 std::shared_ptr<LocalRegionTable> regions)
    : local_regions(regions ? std::move(regions) : std::make_shared<LocalRegionTable>()),
      options_(std::move(options)),
      runtime_(tcp::IoRuntime::shared()),
      io_(runtime_->next_context()),
      endpoint_id_(random_id()),
      sweep_timer_(io_) {
  options_.validate();
  const auto addr = parse_bind_address(ip, io_);
  listener_ = std::make_shared<tcp::TcpListener>(io_, asio::ip::tcp::endpoint(addr, port), options_, endpoint_id_);
  advertised_host_ = advertise_host_for(addr, options_, io_);
}

TcpEndpointImpl::~TcpEndpointImpl() = default;

void TcpEndpointImpl::run_on_io(std::function<void()> fn) {
  if (io_.get_executor().running_in_this_thread()) return fn();
  std::packaged_task<void()> task(std::move(fn));
  auto done = task.get_future();
  asio::post(io_, [&task] { task(); });
  done.get();
}

template <class F>
void TcpEndpointImpl::post(F&& fn) {
  asio::post(io_, [self = shared_from_this(), fn = std::forward<F>(fn)]() mutable { fn(*self); });
}

void TcpEndpointImpl::start() {
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
  auto conn = std::make_shared<TcpConnection>(std::move(socket), this, TcpConnection::Role::kAccepted, hello.lane_index);
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
    RemoteRegionTable probe;
    for (const auto& [name, entry] : mr.items()) {
      probe.add(name, entry);
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

  auto result = std::make_shared<std::promise<Status>>();
  auto outcome = result->get_future();
  post([request = std::move(request), result](TcpEndpointImpl& self) mutable {
    if (self.shut_down_) return result->set_value(Status::cancelled("the endpoint was shut down"));
    if (!self.dialed_.empty()) {
      if (request.target_id == 0 || request.target_id == self.peer_id_) return result->set_value(Status::ok());
      return result->set_value(Status(StatusCode::kAccessDenied,
                                      fmt::format("already connected to peer {:#x}; a TcpEndpoint serves one peer",
                                                  self.peer_id_)));
    }
    const std::string label = request.peer_label;
    tcp::dial_lanes(self.io_, std::move(request), self.options_,
                    [weak = self.weak_from_this(), result, label](tcp::DialResult r) {
                      auto self = weak.lock();
                      if (!self) return result->set_value(Status::cancelled("the endpoint is gone"));
                      if (!r.status) return result->set_value(r.status);
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
                        return result->set_value(verdict);  // a concurrent connect() won
                      }
                      self->pair_with(r.peer_id);
                      self->last_loss_.clear();
                      for (size_t lane = 0; lane < r.sockets.size(); ++lane) {
                        auto conn = std::make_shared<TcpConnection>(std::move(r.sockets[lane]), self.get(),
                                                                    TcpConnection::Role::kDialed,
                                                                    static_cast<uint16_t>(lane));
                        self->dialed_.push_back(conn);
                        conn->start();
                      }
                      self->lanes_up_ = static_cast<uint16_t>(self->dialed_.size());
                      self->connected_ = true;
                      DLSLIME_INFO("connected to {} (peer {:#x}) over {} lane(s)", label, r.peer_id,
                                   self->dialed_.size());
                      result->set_value(Status::ok());
                    });
  });
  // The dial has its own deadline; this guard only covers a stalled I/O thread.
  if (outcome.wait_for(options_.connect_timeout + std::chrono::seconds(5)) != std::future_status::ready) {
    throw TimeoutError(fmt::format("connect() to {}:{} did not finish", host, port));
  }
  const Status st = outcome.get();
  if (st.code() == StatusCode::kTimeout) throw TimeoutError(st.message());
  if (!st) throw ConnectionError(st.message(), st.code());
  for (const auto& [name, entry] : regions) remote_regions.add(name, entry);
}

// ---------------------------------------------------------------------------------------
// Submitting operations (caller's thread)

Future TcpEndpointImpl::fail_now(OpKind kind, Status status) const {
  auto state = std::make_shared<OpState>(kind);
  state->complete(std::move(status));
  return Future(std::move(state));
}

Future TcpEndpointImpl::submit(OpRequest req) {
  if (shut_down_) return fail_now(req.kind, Status::cancelled("the endpoint is shut down"));
  const uint64_t op_id = next_op_id_.fetch_add(1, std::memory_order_relaxed);
  if (req.kind == OpKind::kRecv || req.kind == OpKind::kSend) {
    const Chunk& c = req.chunk;
    if (c.offset > std::numeric_limits<uintptr_t>::max() - c.addr ||
        c.length > std::numeric_limits<uintptr_t>::max() - c.addr - c.offset) {
      throw InvalidArgumentError(fmt::format("{}: addr + offset + length overflows", op_kind_name(req.kind)));
    }
  }
  if (req.kind == OpKind::kRecv) {
    PostedRecv recv;
    recv.state = std::make_shared<OpState>(OpKind::kRecv);
    recv.addr = reinterpret_cast<uint8_t*>(req.chunk.addr + req.chunk.offset);
    recv.length = req.chunk.length;
    recv.local_id = op_id;
    recv.deadline = deadline_after(options_.recv_timeout);
    Future f(recv.state);
    hand_off({nullptr, std::move(recv)});
    return f;
  }
  std::shared_ptr<Submission> sub;
  if (req.kind == OpKind::kSend) {
    sub = prepare_send(req, op_id);
  } else {
    Status error;
    sub = prepare_one_sided(req, op_id, &error);
    if (!sub) return fail_now(req.kind, std::move(error));
  }
  Future f(sub->op.state);
  hand_off({std::move(sub), {}});
  return f;
}

void TcpEndpointImpl::hand_off(Handoff h) {
  bool first = false;
  {
    std::lock_guard lock(handoff_mu_);
    first = handoffs_.empty();
    handoffs_.push_back(std::move(h));
  }
  if (first) post([](TcpEndpointImpl& self) { self.drain_handoffs(); });
}

void TcpEndpointImpl::drain_handoffs() {
  {
    std::lock_guard lock(handoff_mu_);
    draining_.swap(handoffs_);
  }
  // In submission order. A continuation run from here may submit again: that lands in
  // handoffs_ and posts its own drain.
  for (Handoff& h : draining_) {
    if (h.op) {
      start_op(std::move(h.op));
    } else {
      post_recv(std::move(h.recv));
    }
  }
  draining_.clear();
}

std::shared_ptr<TcpEndpointImpl::Submission> TcpEndpointImpl::prepare_one_sided(const OpRequest& req, uint64_t op_id,
                                                                                Status* error) {
  const auto& items = req.assignments;
  if (items.size() > options_.max_batch_items) {
    *error = Status(StatusCode::kBatchOverflow, fmt::format("batch of {} items exceeds max_batch_items ({})",
                                                            items.size(), options_.max_batch_items));
    return nullptr;
  }
  const bool is_read = req.kind == OpKind::kRead;
  struct Piece {
    uint8_t* local;
    int32_t peer_handle;
    uint64_t remote_offset;
    uint64_t length;
    uint16_t lane;
  };
  std::vector<Piece> pieces;
  pieces.reserve(items.size());
  uint64_t total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Assignment& a = items[i];
    uintptr_t local = 0;
    RemoteRegion remote;
    Status st = local_regions->resolve(a.local_handle, a.source_offset, a.length, &local);
    if (st) st = remote_regions.resolve(a.remote_handle, a.target_offset, a.length, &remote);
    if (!st) {
      *error = Status(st.code(), fmt::format("{} item {}: {}", op_kind_name(req.kind), i, st.message()));
      return nullptr;
    }
    for (uint64_t done = 0; done < a.length; done += options_.chunk_size) {
      const uint64_t n = std::min(options_.chunk_size, a.length - done);
      pieces.push_back({reinterpret_cast<uint8_t*>(local) + done, remote.peer_handle, a.target_offset + done, n, 0});
    }
    total += a.length;
  }

  // Small batches stay on one lane (one acknowledgement); large ones are striped, each
  // piece going to the lane with the fewest bytes so far.
  const uint16_t lanes = std::max<uint16_t>(1, lanes_up_.load(std::memory_order_relaxed));
  const auto first_lane = static_cast<uint16_t>(op_id % lanes);
  std::vector<uint64_t> load(lanes, 0);
  std::vector<uint32_t> frames_on(lanes, 0);
  for (Piece& p : pieces) {
    uint16_t lane = first_lane;
    if (total >= options_.chunk_size) {
      for (uint16_t k = 0; k < lanes; ++k) {
        const auto cand = static_cast<uint16_t>((first_lane + k) % lanes);
        if (load[cand] < load[lane]) lane = cand;
      }
    }
    p.lane = lane;
    load[lane] += p.length + tcp::kFrameHeaderSize;
    ++frames_on[lane];
  }

  auto sub = std::make_shared<Submission>();
  sub->op_id = op_id;
  sub->op.deadline = deadline_after(options_.op_timeout);
  std::vector<int> item_of_lane(lanes, -1);
  uint32_t lanes_used = 0;
  for (uint16_t lane = 0; lane < lanes; ++lane) {
    if (frames_on[lane] == 0) continue;
    item_of_lane[lane] = static_cast<int>(sub->items.size());
    sub->items.emplace_back(lane, WriteItem(op_id));
    sub->items.back().second.reserve(frames_on[lane], is_read ? 0 : load[lane] - frames_on[lane] * tcp::kFrameHeaderSize);
    ++lanes_used;
  }
  if (is_read) sub->op.reads.reserve(pieces.size());
  for (size_t idx = 0; idx < pieces.size(); ++idx) {
    const Piece& p = pieces[idx];
    FrameHeader h;
    h.type = is_read ? FrameType::kReadRequest : FrameType::kWriteData;
    h.op_id = op_id;
    h.handle = p.peer_handle;
    h.index = static_cast<uint32_t>(idx);
    h.offset = p.remote_offset;
    h.length = p.length;
    if (--frames_on[p.lane] == 0) h.flags |= tcp::kFlagLast;
    WriteItem& item = sub->items[item_of_lane[p.lane]].second;
    item.add_header(h);
    if (is_read) {
      sub->op.reads.push_back({p.local, p.length});
    } else {
      item.add_payload(p.local, p.length);
    }
  }
  // Parts: one acknowledgement per lane for a write. A read completes once, when the
  // I/O thread has counted a response for every piece (reads_left).
  sub->op.reads_left = is_read ? static_cast<uint32_t>(pieces.size()) : 0;
  sub->op.state = std::make_shared<OpState>(req.kind, is_read ? 1 : lanes_used);
  return sub;
}

std::shared_ptr<TcpEndpointImpl::Submission> TcpEndpointImpl::prepare_send(const OpRequest& req, uint64_t op_id) {
  auto sub = std::make_shared<Submission>();
  sub->op_id = op_id;
  sub->op.deadline = deadline_after(options_.op_timeout);
  sub->op.state = std::make_shared<OpState>(OpKind::kSend);
  WriteItem item(op_id);
  const auto* data = reinterpret_cast<const uint8_t*>(req.chunk.addr + req.chunk.offset);
  const uint64_t length = req.chunk.length;
  uint64_t pos = 0;
  do {
    const uint64_t n = std::min(options_.chunk_size, length - pos);
    FrameHeader h;
    h.type = FrameType::kSendData;
    h.op_id = op_id;
    h.offset = pos;
    h.length = n;
    if (pos + n == length) h.flags |= tcp::kFlagLast;
    item.add_header(h);
    item.add_payload(data + pos, n);
    pos += n;
  } while (pos < length);
  // Messages always travel on lane 0, so they arrive in the order they were sent.
  sub->items.emplace_back(0, std::move(item));
  return sub;
}

// ---------------------------------------------------------------------------------------
// I/O thread: starting ops, deadlines, failure

void TcpEndpointImpl::start_op(std::shared_ptr<Submission> sub) {
  auto& state = sub->op.state;
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
  if (pending_.size() >= options_.max_inflight_ops) {
    state->complete(Status(StatusCode::kBatchOverflow,
                           fmt::format("{} ops already in flight (max_inflight_ops)", pending_.size())));
    return;
  }
  if (sub->items.empty()) {  // only zero-length items
    state->complete(Status::ok());
    return;
  }
  const bool has_deadline = sub->op.deadline != Clock::time_point::max();
  pending_.emplace(sub->op_id, std::move(sub->op));
  for (auto& [lane, item] : sub->items) dialed_[lane % dialed_.size()]->send(std::move(item));
  if (has_deadline) arm_sweeper();
}

void TcpEndpointImpl::complete_op(uint64_t op_id, const Status& status, uint64_t nbytes, bool whole) {
  auto it = pending_.find(op_id);
  if (it == pending_.end()) return;  // it already expired; the late answer is dropped
  std::shared_ptr<OpState> state = it->second.state;
  if (whole) {
    pending_.erase(it);
    state->complete(status, nbytes);
    return;
  }
  // Erase before the continuation can run: it may submit or shut down.
  if (state->finish_part(status, nbytes) || state->done()) pending_.erase(op_id);
}

void TcpEndpointImpl::arm_sweeper() {
  if (sweeper_armed_) return;
  sweeper_armed_ = true;
  auto shortest = std::chrono::milliseconds::max();
  for (auto t : {options_.op_timeout, options_.recv_timeout}) {
    if (t.count() > 0) shortest = std::min(shortest, t);
  }
  const auto tick = std::clamp(shortest / 4, std::chrono::milliseconds(5), std::chrono::milliseconds(100));
  sweep_timer_.expires_after(tick);
  sweep_timer_.async_wait([weak = weak_from_this()](std::error_code ec) {
    auto self = weak.lock();
    if (!self) return;
    self->sweeper_armed_ = false;
    if (ec || self->shut_down_) return;
    self->sweep();
  });
}

void TcpEndpointImpl::sweep() {
  const auto now = Clock::now();
  std::vector<uint64_t> expired;
  bool waiting = false;
  for (const auto& [id, op] : pending_) {
    if (op.deadline <= now) {
      expired.push_back(id);
    } else if (op.deadline != Clock::time_point::max()) {
      waiting = true;
    }
  }
  for (uint64_t id : expired) expire_op(id);

  const auto recv_timeout_status = [&] {
    return Status::timeout(fmt::format("recv: no message arrived within {} ms (recv_timeout)",
                                       options_.recv_timeout.count()));
  };
  for (auto it = recvs_.begin(); it != recvs_.end();) {
    if (it->deadline <= now) {
      auto state = std::move(it->state);
      it = recvs_.erase(it);
      state->complete(recv_timeout_status());
    } else {
      waiting |= it->deadline != Clock::time_point::max();
      ++it;
    }
  }
  if (auto msg = current_msg_; msg && msg->matched && msg->recv.state) {
    if (msg->recv.deadline <= now) {
      auto conn = msg->conn.lock();
      auto state = std::move(msg->recv.state);
      state->complete(recv_timeout_status());
      // Bytes still streaming into the buffer: only closing the connection stops them.
      if (conn && conn->placing_into(msg->recv.local_id)) {
        conn->close(Status::peer_closed("a recv timed out while its message was arriving"));
      }
    } else {
      waiting |= msg->recv.deadline != Clock::time_point::max();
    }
  }
  if (waiting) arm_sweeper();
}

void TcpEndpointImpl::expire_op(uint64_t op_id) {
  auto it = pending_.find(op_id);
  if (it == pending_.end()) return;
  std::shared_ptr<OpState> state = std::move(it->second.state);
  pending_.erase(it);
  // The op's memory must not be touched once its future completes. Queued frames are
  // dropped; bytes already being written or read can only be stopped by closing.
  std::vector<std::shared_ptr<TcpConnection>> stuck;
  for (auto& conn : dialed_) {
    if (conn->placing_into(op_id) || !conn->abandon(op_id)) stuck.push_back(conn);
  }
  state->complete(Status::timeout(fmt::format("{} did not complete within {} ms (op_timeout)",
                                              op_kind_name(state->kind()), options_.op_timeout.count())));
  for (auto& conn : stuck) {
    conn->close(Status::peer_closed(
        fmt::format("lane {} was closed: an op timed out while its bytes were in transit", conn->lane())));
  }
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
  pending_.clear();
  auto recvs = std::move(recvs_);
  recvs_.clear();
  auto current = std::move(current_msg_);
  current_msg_.reset();
  // Messages that arrived whole were acknowledged to the sender: they stay deliverable
  // to later recvs even though the peer is gone (but not past shutdown()).
  std::erase_if(unexpected_, [&](const auto& m) { return shut_down_ || !m->complete; });
  unexpected_bytes_ = 0;
  for (const auto& m : unexpected_) unexpected_bytes_ += m->buffered.size();
  inbound_writes_.clear();
  paused_conn_.reset();
  failing_ = false;
  // Complete outside the bookkeeping: continuations may call back into the endpoint.
  for (auto& [id, op] : pending) op.state->complete(why);
  for (auto& r : recvs) r.state->complete(why);
  if (current && current->matched && current->recv.state) current->recv.state->complete(why);
}

void TcpEndpointImpl::shutdown() {
  if (shut_down_.exchange(true)) return;
  run_on_io([this] {
    listener_->close();
    sweep_timer_.cancel();
    fail_all(Status::cancelled("the endpoint was shut down"));
  });
  DLSLIME_DEBUG("TcpEndpoint {:#x} shut down", endpoint_id_);
}

// ---------------------------------------------------------------------------------------
// I/O thread: frames from the peer

void TcpEndpointImpl::ack(TcpConnection& conn, FrameType type, uint64_t op_id, const Status& status) {
  FrameHeader h;
  h.type = type;
  h.op_id = op_id;
  h.status = status.raw_code();
  const std::string_view text = std::string_view(status.message()).substr(0, tcp::kMaxErrorText);
  h.length = text.size();
  WriteItem& item = conn.control();
  item.add_header(h);
  item.add_copy(text.data(), text.size());
}

RxAction TcpEndpointImpl::on_header(TcpConnection& conn, const FrameHeader& h, PayloadSink& sink) {
  switch (h.type) {
    case FrameType::kWriteData: {
      InboundWrite& acc = inbound_writes_[&conn];
      if (acc.op_id != h.op_id) acc = {h.op_id, Status::ok()};
      uintptr_t addr = 0;
      if (Status st = local_regions->resolve(h.handle, h.offset, h.length, &addr); st) {
        sink.dst = reinterpret_cast<uint8_t*>(addr);
      } else if (acc.status.is_ok()) {
        acc.status = std::move(st);  // the payload is drained; the ack reports the first error
      }
      return RxAction::kContinue;
    }
    case FrameType::kWriteAck:
    case FrameType::kSendAck: sink.text = true; return RxAction::kContinue;
    case FrameType::kReadData: {
      if (h.status != 0) {
        sink.text = true;
        return RxAction::kContinue;
      }
      auto it = pending_.find(h.op_id);
      if (it == pending_.end()) return RxAction::kContinue;  // expired: drain
      const auto& reads = it->second.reads;
      if (h.index >= reads.size() || reads[h.index].length != h.length) {
        conn.close(Status::protocol_error(
            fmt::format("read response {} of op {} does not match any requested piece", h.index, h.op_id)));
        return RxAction::kContinue;
      }
      sink.dst = reads[h.index].addr;
      sink.op_id = h.op_id;
      return RxAction::kContinue;
    }
    case FrameType::kSendData: return on_message_header(conn, h, sink);
    case FrameType::kReadRequest:
    case FrameType::kGoodbye: return RxAction::kContinue;
  }
  return RxAction::kContinue;
}

void TcpEndpointImpl::on_frame(TcpConnection& conn, const FrameHeader& h, const PayloadSink& sink,
                               std::string_view text) {
  switch (h.type) {
    case FrameType::kWriteData: {
      if (!h.last()) return;
      auto it = inbound_writes_.find(&conn);
      Status st = (it != inbound_writes_.end() && it->second.op_id == h.op_id) ? it->second.status : Status::ok();
      if (it != inbound_writes_.end()) it->second = {};
      ack(conn, FrameType::kWriteAck, h.op_id, st);
      return;
    }
    case FrameType::kReadRequest: {
      uintptr_t addr = 0;
      const Status st = local_regions->resolve(h.handle, h.offset, h.length, &addr);
      FrameHeader r;
      r.type = FrameType::kReadData;
      r.op_id = h.op_id;
      r.index = h.index;
      r.status = st.raw_code();
      // All answers to the requests in one read from the socket share one item.
      WriteItem& item = conn.control();
      if (st) {
        r.length = h.length;
        item.add_header(r);
        item.add_payload(reinterpret_cast<const void*>(addr), h.length);
      } else {
        const std::string_view reason = std::string_view(st.message()).substr(0, tcp::kMaxErrorText);
        r.length = reason.size();
        item.add_header(r);
        item.add_copy(reason.data(), reason.size());
      }
      return;
    }
    case FrameType::kWriteAck:
      complete_op(h.op_id, h.status == 0 ? Status::ok() : remote_status(h, text), 0, false);
      return;
    case FrameType::kReadData: {
      // Counted here, on the I/O thread, and completed once: no atomic per piece.
      auto it = pending_.find(h.op_id);
      if (it == pending_.end()) return;  // it expired; the bytes were drained
      PendingOp& op = it->second;
      if (h.status != 0) {
        if (op.error.is_ok()) op.error = remote_status(h, text);
      } else {
        op.nbytes += h.length;
      }
      if (--op.reads_left > 0) return;
      const Status st = std::move(op.error);  // complete_op erases `op`
      const uint64_t nbytes = st.is_ok() ? op.nbytes : 0;
      complete_op(h.op_id, st, nbytes, true);
      return;
    }
    case FrameType::kSendAck:
      complete_op(h.op_id, h.status == 0 ? Status::ok() : remote_status(h, text), 0, true);
      return;
    case FrameType::kSendData: {
      auto msg = current_msg_;
      if (!msg) return;
      msg->received = h.offset + h.length;
      if (!h.last()) return;
      current_msg_.reset();
      msg->complete = true;
      if (!msg->matched && !recvs_.empty() && !unexpected_.empty() && unexpected_.front() == msg) {
        unexpected_.pop_front();
        unexpected_bytes_ -= msg->buffered.size();
        PostedRecv recv = std::move(recvs_.front());
        recvs_.pop_front();
        attach(*msg, std::move(recv));
      }
      if (msg->matched) {
        finish_message(*msg);
      } else {
        // Eager completion: the whole message is held here, so the sender's buffer is
        // free again (the seed contract: a send completes without a posted recv).
        ack(conn, FrameType::kSendAck, msg->op_id, Status::ok());
        msg->acked = true;
      }
      return;
    }
    case FrameType::kGoodbye: {
      // The peer sends nothing more on this connection, but what it sent earlier on its
      // other connections (the acknowledgement of a message, say) may still be unread
      // there. Its ops fail only once every connection has said goodbye or closed.
      const auto closing = conn.shared_from_this();
      std::erase(dialed_, closing);
      std::erase(accepted_, closing);
      conn.close_quietly();
      if (dialed_.empty() && accepted_.empty()) on_closed(conn, Status::peer_closed("the peer endpoint shut down"));
      return;
    }
  }
}

// ---------------------------------------------------------------------------------------
// I/O thread: two-sided messages. The sender's lane 0 carries them in order; each is
// matched FIFO to a posted recv, or held (bounded) until one is posted. The sender's
// future completes once the whole message is here: placed, refused (too large), or held.

RxAction TcpEndpointImpl::on_message_header(TcpConnection& conn, const FrameHeader& h, PayloadSink& sink) {
  if (current_msg_ && current_msg_->op_id != h.op_id) {
    // The sender gave up on the previous message half-way (its send timed out).
    auto old = std::move(current_msg_);
    if (old->matched && old->recv.state) {
      old->recv.state->complete(Status::failed(
          fmt::format("the sender abandoned the message after {} bytes", old->received)));
    } else if (!old->matched) {
      unexpected_bytes_ -= old->buffered.size();
      unexpected_.erase(std::remove(unexpected_.begin(), unexpected_.end(), old), unexpected_.end());
    }
  }
  if (!current_msg_) {
    if (h.offset != 0) {
      conn.close(Status::protocol_error(fmt::format("message frame at offset {} without its start", h.offset)));
      return RxAction::kContinue;
    }
    auto msg = std::make_shared<InboundMessage>();
    msg->op_id = h.op_id;
    msg->conn = conn.shared_from_this();
    if (!recvs_.empty()) {
      msg->matched = true;
      msg->recv = std::move(recvs_.front());
      recvs_.pop_front();
    } else {
      unexpected_.push_back(msg);
    }
    current_msg_ = std::move(msg);
  }
  InboundMessage& m = *current_msg_;
  if (h.offset != m.received) {
    conn.close(Status::protocol_error(
        fmt::format("message frame at offset {}, expected {}", h.offset, m.received)));
    return RxAction::kContinue;
  }
  if (!m.matched && !recvs_.empty() && !unexpected_.empty() && unexpected_.front() == current_msg_) {
    // A recv was posted while this held message was arriving: the rest goes straight in.
    unexpected_.pop_front();
    unexpected_bytes_ -= m.buffered.size();
    PostedRecv recv = std::move(recvs_.front());
    recvs_.pop_front();
    attach(m, std::move(recv));
  }
  if (m.matched) {
    if (!m.recv.state || m.too_large) return RxAction::kContinue;  // drain
    if (!range_within(m.recv.length, h.offset, h.length)) {
      m.too_large = true;  // nothing is written past the posted buffer
      return RxAction::kContinue;
    }
    sink.dst = m.recv.addr + h.offset;
    sink.op_id = m.recv.local_id;
    return RxAction::kContinue;
  }
  // A hard bound: even a single frame larger than the whole budget waits for a recv.
  if (unexpected_bytes_ + h.length > options_.unexpected_buffer_bytes) {
    paused_conn_ = conn.shared_from_this();  // flow control: wait for a recv
    return RxAction::kPause;
  }
  m.buffered.resize(h.offset + h.length);
  unexpected_bytes_ += h.length;
  sink.dst = m.buffered.data() + h.offset;
  return RxAction::kContinue;
}

void TcpEndpointImpl::finish_message(InboundMessage& m) {
  Status st = Status::ok();
  if (m.too_large) {
    st = Status(StatusCode::kMessageTooLarge,
                fmt::format("a message of {} bytes does not fit the posted receive buffer of {} bytes", m.received,
                            m.recv.length));
  } else if (!m.recv.state) {
    st = Status::timeout("the receiver's recv timed out before the message arrived");
  }
  if (m.recv.state) m.recv.state->complete(st, st.is_ok() ? m.received : 0);
  m.recv.state.reset();
  if (m.acked) return;
  m.acked = true;
  if (auto conn = m.conn.lock()) ack(*conn, FrameType::kSendAck, m.op_id, st);
}

void TcpEndpointImpl::resume_paused() {
  if (auto conn = paused_conn_.lock()) conn->resume_reading();
  paused_conn_.reset();
}

void TcpEndpointImpl::attach(InboundMessage& m, PostedRecv recv) {
  // Only at a frame boundary of m's connection (or once m is complete): no payload of m
  // is in flight into `buffered` then, and it holds exactly m.received bytes.
  m.matched = true;
  m.recv = std::move(recv);
  if (m.received > m.recv.length) {
    m.too_large = true;
  } else if (m.received > 0) {
    std::memcpy(m.recv.addr, m.buffered.data(), m.received);
  }
  std::vector<uint8_t>().swap(m.buffered);
}

void TcpEndpointImpl::post_recv(PostedRecv recv) {
  if (shut_down_) {
    recv.state->complete(Status::cancelled("the endpoint is shut down"));
    return;
  }
  if (!unexpected_.empty() && unexpected_.front()->complete) {
    auto msg = std::move(unexpected_.front());
    unexpected_.pop_front();
    unexpected_bytes_ -= msg->buffered.size();
    attach(*msg, std::move(recv));
    finish_message(*msg);
    resume_paused();
    return;
  }
  if (unexpected_.empty() && dialed_.empty() && accepted_.empty() && !last_loss_.empty()) {
    // The peer is gone and nothing will ever arrive; a recv posted before any peer
    // connected, by contrast, waits for one.
    recv.state->complete(Status::peer_closed(fmt::format("the connection to the peer was lost: {}", last_loss_)));
    return;
  }
  // Either nothing is here yet, or the oldest held message is still arriving: it takes
  // this recv at its next frame boundary (on_message_header) or when it completes.
  const bool has_deadline = recv.deadline != Clock::time_point::max();
  recvs_.push_back(std::move(recv));
  if (has_deadline) arm_sweeper();
  resume_paused();
}

}  // namespace dlslime
