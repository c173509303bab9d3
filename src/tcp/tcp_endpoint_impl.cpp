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

#include "core/advertise_address.h"
#include "core/env.h"
#include "core/fork_generation.h"
#include "core/host_name.h"
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

// How long shutdown waits for the peer's pull requests being copied: at most 64 of them,
// of one chunk each (64 MiB at the default), so well under this even on a loaded host.
constexpr auto kSettlePulls = std::chrono::seconds(2);

static_assert(tcp::GpuStaging::kMaxSlots == 64, "TcpOptions::gpu_staging_chunks allows 1..64 (tcp_options.cpp)");

// The address a peer should dial (core/advertise_address.h: one rule for every listener).
std::string advertise_host_for(const asio::ip::address& bound, const TcpOptions& o) {
  return choose_advertise_address(bound.to_string(), o.advertise_host, o.advertise_interface,
                                  "TcpEndpoint option advertise_interface")
      .host;
}

asio::ip::address parse_bind_address(const std::string& ip, asio::io_context& io) {
  if (!ip.empty()) check_host_text(ip, "the bind address");
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
      pairing_(io_, options_, endpoint_id_, shut_down_, *this, matcher_, remote_regions),
      initiator_(options_, pairing_, gpu_),
      matcher_(options_, pairing_, gpu_),
      target_(*local_regions, gpu_),
      sweep_timer_(io_) {
  options_.validate();
  const auto addr = parse_bind_address(ip, io_);
  listener_ = std::make_shared<tcp::TcpListener>(io_, asio::ip::tcp::endpoint(addr, port), options_, endpoint_id_);
  advertised_host_ = advertise_host_for(addr, options_);
}

TcpEndpointImpl::TcpEndpointImpl(asio::io_context& io, TcpOptions options, std::shared_ptr<MemoryRegistry> regions)
    : local_regions(regions ? std::move(regions) : std::make_shared<MemoryRegistry>()),
      options_(std::move(options)),
      io_(io),
      endpoint_id_(random_id()),
      inflight_(options_.max_inflight_ops),
      pairing_(io_, options_, endpoint_id_, shut_down_, *this, matcher_, remote_regions),
      initiator_(options_, pairing_, gpu_),
      matcher_(options_, pairing_, gpu_),
      target_(*local_regions, gpu_),
      sweep_timer_(io_) {
  options_.validate();
  listener_ = std::make_shared<tcp::TcpListener>(
      io_, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0), options_, endpoint_id_);
  advertised_host_ = "127.0.0.1";
}

TcpEndpointImpl::~TcpEndpointImpl() = default;

std::shared_ptr<TcpConnection> TcpEndpointImpl::adopt_dialed_for_test(asio::ip::tcp::socket socket,
                                                                      uint64_t peer_id) {
  return pairing_.adopt_dialed_for_test(std::move(socket), peer_id);
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
  local_regions->attach(std::static_pointer_cast<MemoryDomain>(shared_from_this()));
  canceller_ = std::static_pointer_cast<OpCanceller>(shared_from_this());
  std::weak_ptr<TcpEndpointImpl> weak = weak_from_this();
  pairing_.on_dialed([this] {
    if (!pairing_.dialed().empty()) same_host_.start(*pairing_.dialed().front());
  });
  if (options_.same_host) {
    // Same-host copies (the peer's pulled writes, our pulled reads) run on the shared copy
    // workers; each reports back on this endpoint's I/O thread, if the endpoint still lives.
    const auto post_back = [weak](std::function<void()> fn) {
      if (auto self = weak.lock()) self->post([fn = std::move(fn)](TcpEndpointImpl&) { fn(); });
    };
    SameHostPath::CopiedBytes& copied = same_host_.copied_bytes();
    target_.set_pull_runner({&CopyWorkers::shared(), post_back, &copied.writes});
    initiator_.set_pull_runner(
        {&CopyWorkers::shared(), post_back, [this] { return same_host_.proven_peer_pid(); }, &copied.reads});
    matcher_.set_pull_runner({&CopyWorkers::shared(), post_back, &copied.messages});
  }
  run_on_io([&] {
    listener_->start(
        [weak](const tcp::Hello& hello) {
          auto self = weak.lock();
          return self ? self->pairing_.decide_hello(hello) : Status(StatusCode::kFailed, "endpoint is gone");
        },
        [weak](asio::ip::tcp::socket socket, const tcp::Hello& hello) {
          if (auto self = weak.lock()) self->pairing_.adopt_accepted(std::move(socket), hello);
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
          {"same_host", same_host()},
          {"mr_info", local_regions->mr_info()}};
}

// ---------------------------------------------------------------------------------------
// Regions

void TcpEndpointImpl::region_added(int32_t handle, const LocalRegion& region) {
  // Which ops and frames need staging is decided per region, never per byte; host
  // regions cost nothing here.
  if (region.kind != MemoryKind::kDevice) return;
  make_staging(region.device);
  gpu_.regions.add(handle, region.device);
}

tcp::GpuStaging& TcpEndpointImpl::make_staging(int device) {
  std::weak_ptr<TcpEndpointImpl> weak = weak_from_this();
  return gpu_.make_staging(io_, gpu::runtime(), device, options_.gpu_staging_chunks, weak,
                           [this] {
                             target_.serve_deferred();  // answers to the peer first (tcp_target_server.h)
                             initiator_.pump_gpu();
                           });
}

int TcpEndpointImpl::message_device(const Chunk& c, OpKind kind) {
  if (c.length == 0) return -1;
  uint8_t known = gpu_runtime_.load(std::memory_order_relaxed);
  if (known == 0) {
    known = gpu::unavailable_reason().empty() ? 1 : 2;
    gpu_runtime_.store(known, std::memory_order_relaxed);
  }
  if (known != 1) return -1;
  const MemoryPlace where = memory_place_of(op_kind_name(kind), c.addr + c.offset, c.length);
  if (where.kind != MemoryKind::kDevice) return -1;
  make_staging(where.device);
  return where.device;
}

void TcpEndpointImpl::region_removed(int32_t handle, const LocalRegion& region) {
  if (region.kind == MemoryKind::kDevice) gpu_.regions.remove(handle);
}

int32_t TcpEndpointImpl::add_remote_region(const std::string& name, const nlohmann::json& entry) {
  const int32_t handle = add_owner_resolved(remote_regions, name, entry);
  const bool host = !entry.contains("memory") || entry["memory"] == "host";
  std::lock_guard lock(remote_device_mu_);
  if (host) {
    remote_device_.erase(handle);  // registered again, now as host memory
  } else {
    remote_device_.insert(handle);
    any_remote_device_.store(true, std::memory_order_release);
  }
  return handle;
}

tcp::GpuStaging::Stats TcpEndpointImpl::gpu_staging_stats() const {
  const tcp::GpuStaging* staging = gpu_.staging();
  return staging ? staging->stats() : tcp::GpuStaging::Stats{};
}

// ---------------------------------------------------------------------------------------
// Connecting

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
  check_host_text(peer_info["host"].get_ref<const std::string&>(), "peer_info 'host'");
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

  auto wait = pairing_.add_connect_wait();
  auto outcome = wait->promise.get_future();
  if (shut_down_) wait->finish(Status::cancelled("the endpoint was shut down"));  // raced with shutdown()
  post([request = std::move(request), wait](TcpEndpointImpl& self) mutable {
    if (self.shut_down_) return wait->finish(Status::cancelled("the endpoint was shut down"));
    self.pairing_.dial(std::move(request), std::move(wait), self.weak_from_this());
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
  // The same-host offer went out with the lanes: its verdict takes two round trips on
  // this host, and connect() returns once it is in (or, from a peer that does not answer,
  // after a second), so that the first writes already take the path it chose.
  if (!same_host_.wait_settled(std::chrono::steady_clock::now() +
                               std::min<std::chrono::milliseconds>(options_.connect_timeout, std::chrono::seconds(1)))) {
    DLSLIME_WARN("TcpEndpoint {:#x}: no same-host verdict from {}:{} yet; writes use TCP until it comes", endpoint_id_,
                 host, port);
  }
  for (const auto& [name, entry] : regions) add_remote_region(name, entry);
}

// ---------------------------------------------------------------------------------------
// I/O thread: deadlines, failure

void TcpEndpointImpl::revoke_region(const RegionLifetime& lifetime) {
  run_on_io([&] {
    initiator_.revoke(lifetime);
    std::vector<std::shared_ptr<TcpConnection>> holding;
    pairing_.for_each_connection([&](const std::shared_ptr<TcpConnection>& conn) {
      if (conn->holds(&lifetime) || target_.grants_hold(conn.get(), &lifetime)) holding.push_back(conn);
    });
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
  initiator_.expire(now);
  matcher_.expire(now);
  // Anything ended above may have posted or failed more (fail_all clears the tables).
  arm_sweeper(std::min(initiator_.next_deadline(), matcher_.next_deadline()));
}

void TcpEndpointImpl::on_closed(TcpConnection& conn, const Status& why) {
  if (failing_ || shut_down_) return;
  if (why.code() == StatusCode::kPeerClosed) {
    DLSLIME_INFO("peer {:#x}: {}", pairing_.peer_id(), why.message());
  } else {
    DLSLIME_WARN("peer {:#x}: lane {} failed: {}", pairing_.peer_id(), conn.lane(), why.to_string());
  }
  pairing_.lost(why);
  fail_all(Status(why.code() == StatusCode::kPeerClosed ? StatusCode::kPeerClosed : why.code(),
                  fmt::format("connection to the peer lost: {}", why.message())));
}

void TcpEndpointImpl::fail_all(const Status& why) {
  // The lanes close first (quietly: no on_closed), so nothing touches the ops' memory.
  failing_ = true;
  pairing_.drop_lanes();
  same_host_.reset(shut_down_ ? "the endpoint is shut down" : "not connected (the connection was lost)");
  auto ops = initiator_.drop_all();
  auto recvs = matcher_.drop_all(shut_down_);
  target_.clear();
  failing_ = false;
  // Complete outside the bookkeeping: continuations may call back into the endpoint.
  ops.fail(why);
  recvs.fail(why);
}

void TcpEndpointImpl::shutdown() {
  if (shut_down_.exchange(true)) return;
  if (inherited()) {
    // In a fork() child: nothing may run on the parent's I/O thread (it is not here), and
    // closing the sockets would deregister them from the epoll instance the parent still
    // uses. The parent's endpoint is left untouched: this copy is never destroyed.
    keep_inherited(shared_from_this());
    return;
  }
  // A connect() in progress returns now; its dial closes what it opens (shut_down_).
  pairing_.finish_connect_waits(Status::cancelled("the endpoint was shut down during connect()"));
  try {
    run_on_io([this] {
      listener_->close();
      sweep_timer_.cancel();
      // Pulls being copied are answered first: their bytes may be in place already.
      target_.settle_pulls(std::chrono::steady_clock::now() + kSettlePulls);
      fail_all(Status::cancelled("the endpoint was shut down"));
    });
  } catch (const std::exception& e) {
    // Called from destructors: report, never throw.
    DLSLIME_ERROR("TcpEndpoint {:#x}: shutdown did not finish: {}", endpoint_id_, e.what());
  }
  gpu_.shutdown();  // its queued copies have finished (fail_all drained them)
  DLSLIME_DEBUG("TcpEndpoint {:#x} shut down", endpoint_id_);
}

}  // namespace dlslime
