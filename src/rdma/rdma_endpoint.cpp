// RDMAEndpoint over the verbs seam (rdma_endpoint.h, docs/rdma.md).
#include "rdma/rdma_endpoint.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "core/notify_fence.h"
#include "core/log.h"
#include "dlslime/errors.h"

namespace dlslime {

using namespace rdma;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kShutdownDrain = std::chrono::seconds(2);

uint32_t random_psn() {
  static thread_local std::mt19937 gen(std::random_device{}());
  return gen() & 0xffffff;
}

GidBytes parse_gid(const std::string& text) {
  GidBytes out{};
  std::string hex;
  for (char c : text) {
    if (c != ':') hex += c;
  }
  if (hex.size() != 32) throw ConnectionError(fmt::format("peer endpoint_info: malformed gid '{}'", text));
  for (size_t i = 0; i < 16; ++i) {
    unsigned v = 0;
    if (std::sscanf(hex.c_str() + 2 * i, "%2x", &v) != 1) {
      throw ConnectionError(fmt::format("peer endpoint_info: malformed gid '{}'", text));
    }
    out[i] = static_cast<uint8_t>(v);
  }
  return out;
}

// An integer in 0..max (JSON made from a signed int holds a signed number).
bool nonnegative_at_most(const nlohmann::json& v, uint64_t max) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= max;
  return v.is_number_integer() && v.get<int64_t>() >= 0 && static_cast<uint64_t>(v.get<int64_t>()) <= max;
}

const nlohmann::json& field(const nlohmann::json& j, const char* key, const char* what) {
  if (!j.is_object() || !j.contains(key)) {
    throw ConnectionError(fmt::format("peer endpoint_info: {} lacks '{}' (is it an rdma endpoint's info?)", what, key));
  }
  return j[key];
}

uint64_t unsigned_field(const nlohmann::json& j, const char* key, const char* what, uint64_t max) {
  const nlohmann::json& v = field(j, key, what);
  if (!nonnegative_at_most(v, max)) {
    throw ConnectionError(fmt::format("peer endpoint_info: {} '{}' must be an integer in 0..{}, not {}", what, key,
                                      max, v.dump()));
  }
  return v.get<uint64_t>();
}

Mtu mtu_of_bytes(uint64_t bytes) {
  for (Mtu m : {Mtu::k4096, Mtu::k2048, Mtu::k1024, Mtu::k512, Mtu::k256}) {
    if (static_cast<uint64_t>(mtu_bytes(m)) <= bytes) return m;
  }
  return Mtu::k256;
}

}  // namespace

RdmaEndpointImpl::RdmaEndpointImpl(RdmaOptions opts, std::shared_ptr<MemoryRegistry> regs)
    : options(std::move(opts)),
      regions(std::move(regs)),
      notes_(uint64_t{std::max<uint32_t>(1, options.max_recv_wr / 4)} * kEagerBuffer,
             "RdmaOptions::max_recv_wr: a quarter of it times 8 KiB") {
  options.validate();
  device_ = open_device(options);
  domain_ = std::make_shared<RdmaMemoryDomain>(device_);
  // Enough CQEs for every send and receive WR that can be outstanding: no overrun. Only
  // lane 0 has receives (below). The device's own limits are checked here, so a NIC with
  // smaller ones gives an error naming the option instead of a bare EINVAL from verbs.
  const uint64_t depth = uint64_t{options.num_qp} * options.max_send_wr + options.max_recv_wr;
  const DeviceCaps& caps = device_->caps;
  if (depth > static_cast<uint64_t>(std::max(caps.max_cqe, 0))) {
    throw InvalidArgumentError(fmt::format(
        "RDMA device {}: num_qp {} x max_send_wr {} + max_recv_wr {} = {} completion entries, more than its max_cqe {}",
        device_->ctx->device_name(), options.num_qp, options.max_send_wr, options.max_recv_wr, depth, caps.max_cqe));
  }
  for (const auto& [name, value] : {std::pair{"max_send_wr", options.max_send_wr}, {"max_recv_wr", options.max_recv_wr}}) {
    if (value > caps.max_qp_wr) {
      throw InvalidArgumentError(fmt::format("RDMA device {}: {} {} is more than its max_qp_wr {}",
                                             device_->ctx->device_name(), name, value, caps.max_qp_wr));
    }
  }
  cq_ = device_->ctx->create_cq(static_cast<int>(depth));
  lanes_.resize(options.num_qp);
  for (size_t i = 0; i < lanes_.size(); ++i) {
    lanes_[i].qp = new_qp(i);
    lanes_[i].psn = random_psn();  // the peer checks it: never a guessable 0 (review F12)
  }
  max_inline_ = lanes_[0].qp->caps().max_inline_data;
  // Lane 0 carries write_with_imm (its order with the batch's writes is the QP's) and the
  // two-sided messages, so only it has receives: the eager buffers.
  setup_messages();
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw Error(StatusCode::kFailed, fmt::format("eventfd failed: {}", std::strerror(errno)));
}

std::unique_ptr<QueuePair> RdmaEndpointImpl::new_qp(size_t index) {
  QpCaps caps;
  caps.max_send_wr = options.max_send_wr;
  caps.max_recv_wr = index == 0 ? options.max_recv_wr : 0;  // only lane 0 receives messages
  caps.max_send_sge = 1;
  caps.max_recv_sge = 1;
  caps.max_inline_data = options.max_inline_data;
  auto qp = device_->pd->create_rc_qp(*cq_, *cq_, caps);
  RcInitAttr init;
  init.port = device_->port;
  if (int rc = qp->modify_to_init(init); rc != 0) {
    throw ConnectionError(
        fmt::format("RDMA QP {} (lane {}): RESET->INIT failed: {}", qp->qp_num(), index, std::strerror(rc)));
  }
  return qp;
}

void RdmaEndpointImpl::start() {
  canceller_ = std::static_pointer_cast<OpCanceller>(shared_from_this());
  domain_->before_deregister = [weak = weak_from_this()](uint32_t rkey) {
    if (auto self = weak.lock()) self->revoke_remote_access(rkey);
  };
  regions->attach(domain_);
  regions->watch(std::static_pointer_cast<RegionRevoker>(shared_from_this()));
  // The thread holds the endpoint alive: if a continuation drops the last reference on it,
  // the destructor detaches instead of joining itself.
  thread_.start([self = shared_from_this()] { self->run(); });
}

RdmaEndpointImpl::~RdmaEndpointImpl() {
  stop_ = true;
  wake();
  thread_.join();
  // Children before their parents, as verbs requires (a PD or CQ with live children is
  // EBUSY and leaks; a child destroyed after its context is a call through freed memory):
  // the QPs, then the message pools' MRs (declared before device_, which holds the PD and
  // the context, so by declaration order they would go last), then the CQ.
  lanes_.clear();
  recv_mr_.reset();
  send_mr_.reset();
  cq_.reset();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

std::vector<uint32_t> RdmaEndpointImpl::qp_nums() const {
  std::lock_guard lock(mu_);  // reopen() replaces the QPs
  std::vector<uint32_t> out;
  for (const Lane& lane : lanes_) out.push_back(lane.qp->qp_num());
  return out;
}

nlohmann::json RdmaEndpointImpl::endpoint_info() {
  std::unique_lock lock(mu_);
  // A failed connection's QPs can never connect again: the info names fresh ones.
  if (!closed_) reopen_if_failed(lock);
  nlohmann::json qps = nlohmann::json::array();
  const int mtu = mtu_bytes(device_->port_attr.active_mtu);
  for (const Lane& lane : lanes_) {
    qps.push_back({{"gid", gid_to_string(device_->gid.gid)},
                   {"lid", device_->port_attr.lid},
                   {"qpn", lane.qp->qp_num()},
                   {"psn", lane.psn},
                   {"mtu", mtu}});
  }
  lock.unlock();  // mr_info() needs no mu_: the registry has its own lock
  return {{"transport", "rdma"},
          {"device", device_->ctx->device_name()},
          {"ib_port", device_->port},
          {"gid_index", device_->gid_index},
          {"link_layer", link_layer_name(device_->port_attr.link_layer)},
          {"num_qp", lanes_.size()},
          {"max_recv_wr", options.max_recv_wr},  // the receives each side has for the other's messages
          {"qp_info", qps},
          {"mr_info", mr_info()}};
}

nlohmann::json RdmaEndpointImpl::mr_info() const { return regions->mr_info(*domain_); }
nlohmann::json RdmaEndpointImpl::mr_info_of(const std::string& name) const { return regions->mr_info_of(name, *domain_); }

void RdmaEndpointImpl::connect(const nlohmann::json& peer) {
  std::unique_lock lock(mu_);
  if (closed_) throw ConnectionError("RDMAEndpoint is shut down");
  reopen_if_failed(lock);
  if (closed_) throw ConnectionError("RDMAEndpoint is shut down");
  if (connected_) {
    throw ConnectionError(
        "RDMAEndpoint is already connected (connect() again only once that connection has failed: "
        "is_connected() false)");
  }
  if (peer.contains("transport") && peer["transport"] != "rdma") {
    throw ConnectionError(fmt::format("peer endpoint_info is of transport {}, not rdma", peer["transport"].dump()));
  }
  const nlohmann::json& layer = field(peer, "link_layer", "endpoint_info");
  const std::string own_layer = link_layer_name(device_->port_attr.link_layer);
  if (!layer.is_string() || layer.get<std::string>() != own_layer) {
    throw ConnectionError(
        fmt::format("link layer mismatch: this endpoint's port is {}, the peer's {}", own_layer, layer.dump()));
  }
  const uint64_t peer_qps = unsigned_field(peer, "num_qp", "endpoint_info", 1 << 16);
  const nlohmann::json& qp_info = field(peer, "qp_info", "endpoint_info");
  if (peer_qps != lanes_.size() || !qp_info.is_array() || qp_info.size() != lanes_.size()) {
    throw ConnectionError(fmt::format("num_qp mismatch: this endpoint has {} QPs, the peer {} (both sides must use the "
                                      "same num_qp)",
                                      lanes_.size(), qp_info.is_array() ? qp_info.size() : peer_qps));
  }
  // The credit is the connection's, the same on both sides: a quarter of the smaller receive
  // queue, so that neither sends more than the other has receives for (our messages plus
  // our DONEs for its messages, and BYE). A peer that publishes none has our size.
  const uint64_t peer_recv_wr =
      peer.contains("max_recv_wr") ? unsigned_field(peer, "max_recv_wr", "endpoint_info", UINT32_MAX) : options.max_recv_wr;
  if (peer_recv_wr == 0) throw ConnectionError("peer endpoint_info: max_recv_wr must be positive");
  const uint32_t credit =
      std::max<uint32_t>(1, static_cast<uint32_t>(std::min<uint64_t>(options.max_recv_wr, peer_recv_wr) / 4));
  for (size_t i = 0; i < lanes_.size(); ++i) {
    const nlohmann::json& q = qp_info[i];
    const nlohmann::json& gid = field(q, "gid", "qp_info entry");
    if (!gid.is_string()) throw ConnectionError("peer endpoint_info: qp_info gid must be a string");
    RcRtrAttr rtr;
    rtr.remote_qpn = static_cast<uint32_t>(unsigned_field(q, "qpn", "qp_info entry", 0xffffff));
    rtr.rq_psn = static_cast<uint32_t>(unsigned_field(q, "psn", "qp_info entry", 0xffffff));
    rtr.remote_lid = static_cast<uint16_t>(unsigned_field(q, "lid", "qp_info entry", 0xffff));
    const uint64_t peer_mtu = unsigned_field(q, "mtu", "qp_info entry", 1 << 20);
    rtr.path_mtu = std::min(device_->port_attr.active_mtu, mtu_of_bytes(peer_mtu));
    rtr.remote_gid = parse_gid(gid.get<std::string>());
    rtr.use_gid = true;
    rtr.sgid_index = static_cast<uint8_t>(device_->gid_index);
    Lane& lane = lanes_[i];
    if (int rc = lane.qp->modify_to_rtr(rtr); rc != 0) {
      abandon_connect(lock, fmt::format("RDMA QP {} (lane {}): INIT->RTR to peer QP {} failed: {} (state {})",
                                        lane.qp->qp_num(), i, rtr.remote_qpn, std::strerror(rc),
                                        qp_state_name(lane.qp->state())));
    }
    RcRtsAttr rts;
    rts.sq_psn = lane.psn;
    rts.timeout = static_cast<uint8_t>(options.ack_timeout);
    rts.retry_cnt = static_cast<uint8_t>(options.retry_cnt);
    rts.rnr_retry = static_cast<uint8_t>(options.rnr_retry);
    if (int rc = lane.qp->modify_to_rts(rts); rc != 0) {
      abandon_connect(lock, fmt::format("RDMA QP {} (lane {}): RTR->RTS failed: {} (state {})", lane.qp->qp_num(), i,
                                        std::strerror(rc), qp_state_name(lane.qp->state())));
    }
  }
  credit_ = credit;
  peer_answered_ = false;
  connected_ = true;
}

void RdmaEndpointImpl::abandon_connect(std::unique_lock<std::mutex>& lock, const std::string& why) {
  // Some QPs may be in RTR or RTS already: fail them all, so that the next connect()
  // reopens fresh ones instead of meeting QPs half-way through their transitions.
  std::vector<Done> done;
  for (size_t i = 0; i < lanes_.size(); ++i) fail_lane(lanes_[i], i, Status::failed(why), done);
  lock.unlock();
  {
    CompletionScope scope;
    complete_all(done);
  }
  throw ConnectionError(why);
}

bool RdmaEndpointImpl::failed_work_drained() const {
  return ops_.empty() && recvs_posted_ == 0 &&
         std::all_of(lanes_.begin(), lanes_.end(), [](const Lane& l) { return l.posted.empty() && l.waiting.empty(); });
}

std::chrono::milliseconds RdmaEndpointImpl::drain_bound() const {
  // The retry bound (docs/rdma.md): a WR awaiting an answer may come back only once it ran
  // out. ack_timeout 0 retries forever on the device; cap the wait at a minute.
  const double us = options.ack_timeout == 0 ? 60e6 : 4.096 * std::ldexp(1.0, int(options.ack_timeout)) *
                                                          (options.retry_cnt + 1);
  return std::chrono::milliseconds(int64_t(std::min(us, 60e6) / 1000)) + kShutdownDrain;
}

void RdmaEndpointImpl::reopen_if_failed(std::unique_lock<std::mutex>& lock) {
  auto failed = [&] { return std::any_of(lanes_.begin(), lanes_.end(), [](const Lane& l) { return l.failed; }); };
  if (!failed()) return;
  const auto first = std::find_if(lanes_.begin(), lanes_.end(), [](const Lane& l) { return l.failed; });
  const Status cause = first->cause;
  const size_t first_index = static_cast<size_t>(first - lanes_.begin());
  // The connection is one unit: a QP that is still healthy goes to ERR too, so that nothing
  // of the old peer's is in flight when its QPs are destroyed.
  std::vector<Done> done;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    if (lanes_[i].failed) continue;
    fail_lane(lanes_[i], i,
              Status(cause.code(), fmt::format("QP {} (lane {}) of the connection failed: {}",
                                               first->qp->qp_num(), first_index, cause.message())),
              done);
  }
  if (!done.empty()) {
    lock.unlock();
    {
      CompletionScope scope;
      complete_all(done);
    }
    lock.lock();
  }
  // Every WR of the old QPs must have come back (flushed) before they are destroyed: until
  // then the device may still touch an op's memory, and a late completion would be taken
  // for one of the new QPs'. The completion thread sees them; this waits for it.
  if (!failed_work_drained()) {
    if (on_own_thread()) {
      throw ConnectionError(
          "RDMAEndpoint: cannot reconnect from a completion callback while the failed connection's work requests "
          "are still coming back");
    }
    const auto bound = drain_bound();
    if (!progress_cv_.wait_for(lock, bound, [&] { return closed_ || !failed() || failed_work_drained(); })) {
      throw ConnectionError(fmt::format(
          "RDMAEndpoint: the failed connection's work requests did not all come back within {} ms; try again later",
          bound.count()));
    }
  }
  if (closed_ || !failed()) return;  // shut down, or another thread reopened it meanwhile
  // New QPs first: if the device refuses one, the endpoint stays as it was (failed).
  std::vector<std::unique_ptr<QueuePair>> fresh;
  for (size_t i = 0; i < lanes_.size(); ++i) fresh.push_back(new_qp(i));
  previous_failure_ = cause;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = lanes_[i];
    lane.qp = std::move(fresh[i]);  // destroys the old QP: nothing of it is outstanding
    lane.psn = random_psn();
    lane.since_signal = 0;
    lane.failed = false;
    lane.cause = Status::ok();
  }
  connected_ = false;
  peer_closed_ = false;
  // The old peer's regions, revocations and immediates mean nothing to the next peer, which
  // may be another process: the same rkey and address there (a restarted process often gets
  // both) would be memory nobody published for us (review F4). Regions keep their handles
  // and names; registering a name again makes it usable.
  remote_.drop_all(fmt::format("was dropped: the connection that published it failed ({}); register the peer's "
                               "region again after connecting",
                               cause.message()));
  revoked_rkeys_.clear();
  owed_revokes_.clear();
  imm_events_.clear();
  notes_.connected(/*drop_held=*/true);  // the next peer may be another process
  arm_messages();
}

bool RdmaEndpointImpl::is_connected() const {
  std::lock_guard lock(mu_);
  if (!connected_ || closed_) return false;
  return std::none_of(lanes_.begin(), lanes_.end(), [](const Lane& l) { return l.failed; });
}

int32_t RdmaEndpointImpl::register_remote(const std::string& name, const nlohmann::json& entry) {
  auto get = [&](const char* key, uint64_t max, bool required) -> uint64_t {
    if (!entry.is_object() || !entry.contains(key)) {
      if (!required) return 0;
      throw InvalidArgumentError(fmt::format("remote memory region '{}': mr_info entry needs an integer '{}' (got {}){}",
                                             name, key, entry.dump(),
                                             std::strcmp(key, "rkey") == 0
                                                 ? "; the peer did not register it with RDMA (device memory?)"
                                                 : ""));
    }
    const nlohmann::json& v = entry[key];
    if (!nonnegative_at_most(v, max)) {
      throw InvalidArgumentError(
          fmt::format("remote memory region '{}': '{}' must be an integer in 0..{}, not {}", name, key, max, v.dump()));
    }
    return v.get<uint64_t>();
  };
  const uint64_t length = get("length", UINT64_MAX, true);
  const uint64_t addr = get("addr", UINT64_MAX, true);
  const uint64_t rkey = get("rkey", UINT32_MAX, length > 0);
  if (length > UINT64_MAX - addr) {
    throw InvalidArgumentError(fmt::format("remote memory region '{}': addr + length overflows", name));
  }
  bool writable = true;
  if (entry.contains("access")) {
    const nlohmann::json& access = entry["access"];
    if (!access.is_string() || (access != "read" && access != "read_write")) {
      throw InvalidArgumentError(fmt::format("remote memory region '{}': 'access' must be \"read\" or \"read_write\", "
                                             "not {}",
                                             name, access.dump()));
    }
    writable = access == "read_write";
  }
  {
    std::lock_guard lock(mu_);
    revoked_rkeys_.erase(static_cast<uint32_t>(rkey));  // a device may reuse a key for a new MR
  }
  return remote_.add(name, length, RdmaRemoteKey{addr, static_cast<uint32_t>(rkey), writable});
}

// What a new op gets once a lane has failed: the endpoint is no longer connected.
Status RdmaEndpointImpl::lane_failed_status(const Lane& lane, size_t index) const {
  return Status::not_connected(fmt::format("RDMA QP {} (lane {}) is in the error state ({}); the endpoint is no "
                                           "longer connected",
                                           lane.qp->qp_num(), index, lane.cause.message()));
}

Future RdmaEndpointImpl::submit(OpRequest request) {
  auto state = std::make_shared<OpState>(request.kind);
  Future future(state);
  std::vector<Done> done;
  auto fail = [&](Status status) {
    state->complete(std::move(status));
    return future;
  };
  std::unique_lock lock(mu_);
  if (closed_) return lock.unlock(), fail(Status::cancelled("RDMAEndpoint is shut down"));
  if (request.kind == OpKind::kImmRecv) {
    if (!imm_events_.empty()) {
      const ImmEvent ev = imm_events_.front();
      imm_events_.pop_front();
      lock.unlock();
      state->set_imm_data(ev.imm);
      state->complete(Status::ok(), ev.byte_len);
      return future;
    }
    // As recv: one is waited for before the first connect, but a failed connection will
    // never deliver another immediate (imm_events_ kept what it had delivered).
    if (lanes_[0].failed) return lock.unlock(), fail(lane_failed_status(lanes_[0], 0));
    const MessageWait wait = start_wait(request);
    state->set_canceller(canceller_, 0);  // found by its state (cancel_op)
    imm_waiters_.push_back({state, wait});
    lock.unlock();
    wake_for_deadline(wait.deadline);
    return future;
  }
  if (request.kind == OpKind::kRecv && !lanes_[0].failed) return submit_recv(request, state, lock);
  if (request.kind == OpKind::kRecvNotify) return submit_recv_notify(request, state, lock);
  if (!connected_) {
    return lock.unlock(), fail(Status::not_connected(
                              previous_failure_.is_ok()
                                  ? std::string("RDMAEndpoint is not connected")
                                  : fmt::format("RDMAEndpoint is not connected (its previous connection failed: {})",
                                                previous_failure_.message())));
  }
  for (size_t i = 0; i < lanes_.size(); ++i) {
    if (!lanes_[i].failed) continue;
    if (peer_closed_) return lock.unlock(), fail(Status::peer_closed("the peer shut its endpoint down"));
    return lock.unlock(), fail(lane_failed_status(lanes_[i], i));
  }
  if (request.kind == OpKind::kSend || request.kind == OpKind::kSendNotify) return submit_send(request, state, lock);

  // Resolve every item first: a bad one fails the whole op before anything is posted.
  const auto& items = request.assignments;
  struct Resolved {
    uint64_t local = 0, remote = 0;
    uint32_t lkey = 0, rkey = 0;
    bool device = false;
  };
  std::vector<Resolved> resolved(items.size());
  Op op;
  op.state = state;
  op.one_sided = true;
  ResolveCache cache;
  RemoteRegions<RdmaRemoteKey>::Cache remote_cache;
  int32_t lkey_handle = -1;
  LocalKey lkey;
  for (size_t i = 0; i < items.size(); ++i) {
    const Assignment& a = items[i];
    uintptr_t local = 0;
    if (Status st = regions->resolve(a.local_handle, a.source_offset, a.length, &local, cache); !st) {
      return lock.unlock(), fail(std::move(st));
    }
    op.uses.hold(cache);
    if (a.local_handle != lkey_handle) {
      auto key = domain_->lkey(a.local_handle);
      if (!key) {
        return lock.unlock(),
               fail(Status::invalid_argument(fmt::format(
                   "local region {} has no RDMA memory registration (it has zero length)", a.local_handle)));
      }
      lkey_handle = a.local_handle;
      lkey = *key;
    }
    RdmaRemoteKey rk;
    if (Status st = remote_.resolve(a.remote_handle, a.target_offset, a.length, &rk, remote_cache); !st) {
      return lock.unlock(), fail(std::move(st));
    }
    if (!revoked_rkeys_.empty() && revoked_rkeys_.count(rk.rkey) != 0) {
      return lock.unlock(), fail(Status::unknown_handle(fmt::format(
                                "remote memory region {} was unregistered by the peer", a.remote_handle)));
    }
    // Read-only memory on either side: the NIC would answer with an access error that
    // kills the connection, so the op fails alone here.
    if (request.kind != OpKind::kRead && !rk.writable) {
      return lock.unlock(), fail(Status(StatusCode::kAccessDenied,
                                        fmt::format("remote memory region {} is read-only memory of the peer's: it may "
                                                    "be read, not written",
                                                    a.remote_handle)));
    }
    if (request.kind == OpKind::kRead && !lkey.writable) {
      return lock.unlock(), fail(Status(StatusCode::kAccessDenied,
                                        fmt::format("local region {} is read-only memory: a read cannot land in it",
                                                    a.local_handle)));
    }
    resolved[i] = {local, rk.addr + a.target_offset, lkey.lkey, rk.rkey, lkey.device};
  }

  // write_with_imm stays on lane 0: the immediate must arrive after every byte of the batch,
  // which only one QP's order guarantees.
  const bool imm = request.kind == OpKind::kWriteWithImm;
  BatchPlanConfig config;
  config.chunk_size = options.chunk_size;
  config.lanes = imm ? 1 : static_cast<uint16_t>(lanes_.size());
  config.piece_overhead = 4096;  // a WR costs about what a few KiB of wire time does
  config.stripe_min_bytes = 64 << 10;
  plan_batch(items, config, plan_);
  const uint64_t op_id = next_op_id_++;
  const auto deadline = start_deadline(request, op);
  const WrOpcode opcode = request.kind == OpKind::kRead ? WrOpcode::kRdmaRead : WrOpcode::kRdmaWrite;
  std::vector<size_t> touched;
  for (uint16_t l = 0; l < plan_.lanes.size(); ++l) {
    auto pieces = plan_.lane(l);
    if (pieces.empty()) continue;
    Lane& lane = lanes_[l];
    for (size_t k = 0; k < pieces.size(); ++k) {
      const PlannedPiece& p = pieces[k];
      const Resolved& r = resolved[p.item];
      lane.waiting.push_back({op_id, opcode, r.local + p.offset, static_cast<uint32_t>(p.length), r.lkey,
                              r.remote + p.offset, r.rkey, 0, k + 1 == pieces.size()});
      lane.waiting.back().device = r.device;
    }
    op.wrs_left += pieces.size();
    op.lanes |= uint64_t(1) << l;
    touched.push_back(l);
  }
  if (imm) {
    if (op.wrs_left == 0) {
      // Nothing to write: the immediate alone, a zero-byte write. It names the batch's
      // first region (a valid key and address on every NIC, though C9-88 needs none).
      const Resolved first = resolved.empty() ? Resolved{} : resolved[0];
      lanes_[0].waiting.push_back(
          {op_id, WrOpcode::kRdmaWriteWithImm, 0, 0, 0, first.remote, first.rkey, request.imm_data, true});
      op.wrs_left = 1;
      op.lanes = 1;
      touched.push_back(0);
    } else {
      lanes_[0].waiting.back().opcode = WrOpcode::kRdmaWriteWithImm;
      lanes_[0].waiting.back().imm = request.imm_data;
    }
  }
  if (op.wrs_left == 0) return lock.unlock(), fail(Status::ok());  // only zero-length items
  state->set_canceller(canceller_, op_id);
  ops_.insert(op_id, std::move(op), deadline);
  for (size_t l : touched) pump(lanes_[l], l, done);
  plan_.trim(1 << 16);
  lock.unlock();
  wake_for_deadline(deadline);
  complete_all(done);
  return future;
}

void RdmaEndpointImpl::pump(Lane& lane, size_t index, std::vector<Done>& done) {
  if (lane.failed) return;
  const uint32_t depth = options.max_send_wr;
  // Signal at least every half queue, so that a queue of unsignaled WRs never fills up
  // without a completion that frees it (and the op's last WR, so the op learns its end).
  const uint32_t interval = std::max<uint32_t>(1, depth / 2);
  std::vector<SendWr> wrs;
  std::vector<Sge> sges;
  const size_t room = depth - lane.posted.size();
  const size_t n = std::min(room, lane.waiting.size());
  if (n == 0) return;
  wrs.resize(n);
  sges.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const QueuedWr& q = lane.waiting[i];
    SendWr& wr = wrs[i];
    sges[i] = {q.local_addr, q.length, q.lkey};
    wr.wr_id = lane.next_seq + i;
    wr.next = i + 1 < n ? &wrs[i + 1] : nullptr;
    wr.sg_list = &sges[i];
    wr.num_sge = q.length > 0 ? 1 : 0;
    wr.opcode = q.opcode;
    wr.imm_data = q.imm;
    wr.remote_addr = q.remote_addr;
    wr.rkey = q.rkey;
    // Inline data is copied by the CPU when posting: never from GPU memory.
    wr.inline_data = q.opcode != WrOpcode::kRdmaRead && !q.device && q.length > 0 && q.length <= max_inline_;
    wr.signaled = q.last_of_op || ++lane.since_signal >= interval;
    if (wr.signaled) lane.since_signal = 0;
  }
  const SendWr* bad = nullptr;
  const int rc = lane.qp->post_send(wrs.data(), &bad);
  const size_t posted = rc == 0 ? n : static_cast<size_t>(bad - wrs.data());
  for (size_t i = 0; i < posted; ++i) {
    const QueuedWr& q = lane.waiting.front();
    lane.posted.push_back({lane.next_seq++, q.op_id, q.length, q.slot});
    lane.waiting.pop_front();
  }
  if (rc != 0) {
    fail_lane(lane, index, Status::failed(fmt::format("post_send failed: {}", std::strerror(rc))), done);
  }
}

void RdmaEndpointImpl::fail_lane(Lane& lane, size_t index, Status cause, std::vector<Done>& done) {
  if (!lane.failed) {
    lane.failed = true;
    lane.cause = std::move(cause);
    if (lane.qp->state() != QpState::kErr) lane.qp->modify_to_err();  // posted WRs come back flushed
    if (!closed_ && !peer_closed_) {  // a shutdown on either side is no surprise
      DLSLIME_WARN("RDMA QP {} (lane {}) is in the error state: {}", lane.qp->qp_num(), index, lane.cause.message());
    }
  }
  const Status st = flushed_status(lane, index);
  while (!lane.waiting.empty()) {
    const QueuedWr q = lane.waiting.front();
    lane.waiting.pop_front();
    if (q.slot >= 0) free_slots_.push_back(q.slot);
    finish_wr(q.op_id, 0, st, done);
  }
  if (index == 0) {
    fail_messages(lane.cause, done);
    revoke_cv_.notify_all();
  }
}

void RdmaEndpointImpl::finish_wr(uint64_t op_id, uint32_t length, const Status& status, std::vector<Done>& done) {
  Op* op = ops_.find(op_id);
  if (op == nullptr) return;
  if (!status && op->error.is_ok()) op->error = status;
  op->nbytes += status ? length : 0;
  if (--op->wrs_left > 0) return;
  Op finished = std::move(*ops_.take(op_id));
  if (finished.is_recv) on_recv_op_finished(finished, finished.error, done);  // answer the sender
  finished.uses.clear();  // the memory is no longer referenced: drop the uses before completing
  finished.temp_mr.reset();
  done.push_back({std::move(finished.state), std::move(finished.error), finished.nbytes});
  if (finished.one_sided) check_revokes(done);
}

Status RdmaEndpointImpl::wc_status(const Lane& lane, size_t index, const WorkCompletion& wc) const {
  const uint32_t qpn = lane.qp->qp_num();
  switch (wc.status) {
    case WcStatus::kSuccess: return Status::ok();
    case WcStatus::kWrFlushErr: return flushed_status(lane, index);
    case WcStatus::kRemAccessErr:
      return Status::unknown_handle(fmt::format(
          "RDMA QP {} (lane {}): the peer refused the access (REM_ACCESS_ERR): its region is no longer registered "
          "or the rkey/range is not valid there; the QP is now in the error state",
          qpn, index));
    case WcStatus::kRetryExcErr:
    case WcStatus::kRnrRetryExcErr:
      return Status::peer_closed(fmt::format("RDMA QP {} (lane {}): the peer did not answer within the retry bound "
                                             "({}): it is dead or disconnected",
                                             qpn, index, wc_status_name(wc.status)));
    default:
      return Status::failed(fmt::format("RDMA QP {} (lane {}): work completion error {}", qpn, index,
                                        wc_status_name(wc.status)));
  }
}

// A WR the device flushed (or that never got posted) once its lane failed: the cause's code.
Status RdmaEndpointImpl::flushed_status(const Lane& lane, size_t index) const {
  if (closed_) return Status::cancelled("RDMAEndpoint was shut down");
  if (!lane.failed) {
    return Status::failed(fmt::format("RDMA QP {} (lane {}): work request flushed (WR_FLUSH_ERR)", lane.qp->qp_num(),
                                      index));
  }
  return Status(lane.cause.code(), fmt::format("RDMA QP {} (lane {}): work request flushed after: {}",
                                               lane.qp->qp_num(), index, lane.cause.message()));
}

void RdmaEndpointImpl::on_send_completion(Lane& lane, size_t index, const WorkCompletion& wc,
                                          std::vector<Done>& done) {
  const Status status = wc_status(lane, index, wc);
  // RC completes in order: every WR posted before this one has completed successfully
  // (a failed one would have reported itself first).
  while (!lane.posted.empty() && lane.posted.front().seq <= wc.wr_id) {
    const PostedWr p = lane.posted.front();
    lane.posted.pop_front();
    if (p.slot >= 0) free_slots_.push_back(p.slot);
    finish_wr(p.op_id, p.length, p.seq == wc.wr_id ? status : Status::ok(), done);
  }
  if (!status) {
    if (!lane.failed) fail_lane(lane, index, status, done);
    return;
  }
  if (connected_) peer_answered_ = true;  // the peer acknowledged it
  pump(lane, index, done);
}

void RdmaEndpointImpl::on_recv_completion(const WorkCompletion& wc, std::vector<Done>& done) {
  --recvs_posted_;
  if (wc.status != WcStatus::kSuccess) {
    // The QP went to error with nothing of ours on its send queue (e.g. a fatal device
    // error): the receive's flush is the only sign of it.
    if (!lanes_[0].failed) fail_lane(lanes_[0], 0, wc_status(lanes_[0], 0, wc), done);
    return;
  }
  if (connected_) peer_answered_ = true;
  const auto slot = static_cast<uint32_t>(wc.wr_id & ~kRecvWrFlag);
  if (wc.opcode == WcOpcode::kRecv) {
    on_message(recv_pool_.data() + size_t(slot) * kEagerBuffer, wc.byte_len, done);  // copies what it keeps
  } else if (wc.opcode == WcOpcode::kRecvRdmaWithImm) {
    if (!imm_waiters_.empty()) {
      auto state = std::move(imm_waiters_.front().state);
      imm_waiters_.pop_front();
      state->set_imm_data(wc.imm_data);
      done.push_back({std::move(state), Status::ok(), wc.byte_len});
    } else {
      imm_events_.push_back({wc.imm_data, wc.byte_len});
    }
  }
  if (!closed_ && !lanes_[0].failed) post_recv_slot(slot);
}

void RdmaEndpointImpl::poll_cq(std::vector<Done>& done) {
  WorkCompletion wcs[64];
  for (;;) {
    const int n = cq_->poll(64, wcs);
    if (n < 0) {
      // A CQ overrun cannot happen with the depth chosen above; if the device reports one,
      // no completion can be trusted any more.
      std::lock_guard lock(mu_);
      for (size_t i = 0; i < lanes_.size(); ++i) {
        fail_lane(lanes_[i], i, Status::failed(fmt::format("completion queue error: {}", std::strerror(-n))), done);
      }
      std::vector<uint64_t> ids;
      ops_.for_each([&](uint64_t id, const Op&) { ids.push_back(id); });
      for (uint64_t id : ids) {
        Op op = std::move(*ops_.take(id));
        op.uses.clear();
        done.push_back({std::move(op.state), Status::failed("RDMA completion queue error"), 0});
      }
      stop_ = true;
      return;
    }
    if (n == 0) return;
    std::lock_guard lock(mu_);
    for (int i = 0; i < n; ++i) {
      const WorkCompletion& wc = wcs[i];
      size_t index = lanes_.size();
      for (size_t l = 0; l < lanes_.size(); ++l) {
        if (lanes_[l].qp->qp_num() == wc.qp_num) index = l;
      }
      if (index == lanes_.size()) continue;
      if (wc.wr_id & kRecvWrFlag) {
        on_recv_completion(wc, done);
      } else {
        on_send_completion(lanes_[index], index, wc, done);
      }
    }
  }
}

void RdmaEndpointImpl::expire(std::vector<Done>& done) {
  std::lock_guard lock(mu_);
  const auto now = Clock::now();
  expire_waits(now, done);
  keep_alive(now, done);
  std::vector<std::pair<uint64_t, Op>> expired;
  ops_.expire(now, [&](uint64_t id, Op&& op) { expired.emplace_back(id, std::move(op)); });
  for (auto& [id, op] : expired) {
    // Posted work cannot be taken back from a QP except by moving it to the error state;
    // the op completes (TIMEOUT) once its WRs are flushed, never while the NIC may still
    // touch its memory.
    const OpLimit limit = op.limit;
    if (op.error.is_ok()) {
      op.error = Status::timeout(fmt::format("{} did not complete within {}: its deadline passed",
                                             op_kind_name(op.state->kind()), limit.describe()));
    }
    const uint64_t lanes = op.lanes;
    if (lanes == 0) {
      // A send whose bytes were copied (eager) or never left: nothing refers to its memory.
      awaiting_done_.erase(op.msg_seq);
      op.uses.clear();
      done.push_back({std::move(op.state), std::move(op.error), 0});
      continue;
    }
    ops_.insert(id, std::move(op));
    for (size_t l = 0; l < lanes_.size(); ++l) {
      if (lanes & (uint64_t(1) << l)) {
        fail_lane(lanes_[l], l,
                  Status::failed(fmt::format("an op's deadline ({} ms, {}) passed: the QP was moved to the error "
                                             "state to take back its work requests",
                                             limit.limit.count(), limit.source)),
                  done);
      }
    }
  }
}

void RdmaEndpointImpl::wake() {
  if (wake_fd_ < 0) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

PendingOps<RdmaEndpointImpl::Op>::TimePoint RdmaEndpointImpl::start_deadline(const OpRequest& request, Op& op) const {
  op.limit = OpLimit::of(request.timeout, options.op_timeout, "op_timeout");
  return op.limit.deadline();
}

RdmaEndpointImpl::MessageWait RdmaEndpointImpl::start_wait(const OpRequest& request) {
  MessageWait w;
  w.limit = OpLimit::of(request.timeout, options.recv_timeout, "recv_timeout");
  w.deadline = w.limit.deadline();
  wait_deadline_ = std::min(wait_deadline_, w.deadline);
  return w;
}

Status RdmaEndpointImpl::MessageWait::expired(OpKind kind) const {
  return Status::timeout(fmt::format("{}: no {} arrived within {}", op_kind_name(kind),
                                     kind == OpKind::kImmRecv ? "immediate" : "message", limit.describe()));
}

void RdmaEndpointImpl::expire_waits(PendingOps<Op>::TimePoint now, std::vector<Done>& done) {
  if (now < wait_deadline_) return;
  wait_deadline_ = PendingOps<Op>::kNever;
  // Nothing is posted for a waiting recv (its message has not come): it ends alone.
  auto sweep = [&](auto& waiting, OpKind kind) {
    for (auto it = waiting.begin(); it != waiting.end();) {
      if (it->wait.deadline <= now) {
        done.push_back({std::move(it->state), it->wait.expired(kind), 0});
        it = waiting.erase(it);
      } else {
        wait_deadline_ = std::min(wait_deadline_, it->wait.deadline);
        ++it;
      }
    }
  };
  sweep(recvs_, OpKind::kRecv);
  sweep(imm_waiters_, OpKind::kImmRecv);
  NotificationInbox::EndedList ended;
  wait_deadline_ = std::min(wait_deadline_, notes_.expire(now, ended));
  take_ended(ended, done);
}

bool RdmaEndpointImpl::keepalive_applies() const {
  return options.keepalive.count() > 0 && connected_ && peer_answered_ && !closed_ && !closing_ && !peer_closed_ &&
         !lanes_[0].failed;
}

void RdmaEndpointImpl::keep_alive(PendingOps<Op>::TimePoint now, std::vector<Done>& done) {
  if (probe_at_ == PendingOps<Op>::kNever || now < probe_at_) return;
  probe_at_ = PendingOps<Op>::kNever;  // run() sets the next one
  if (!keepalive_applies()) return;
  Lane& lane = lanes_[0];
  // Work on lane 0 already tells within the retry bound whether the peer is there.
  if (!lane.posted.empty() || !lane.waiting.empty()) return;
  // Zero bytes: the responder checks no rkey (IBA C9-88), touches no memory and consumes
  // no receive; only its ACK matters. Signaled, and no op ends with it (op id 0).
  QueuedWr q;
  q.op_id = 0;
  q.opcode = WrOpcode::kRdmaWrite;
  q.last_of_op = true;
  lane.waiting.push_back(q);
  pump(lane, 0, done);
}

void RdmaEndpointImpl::wake_for_deadline(PendingOps<Op>::TimePoint deadline) {
  // run() publishes its wake-up time under mu_ after reading ops_.next_deadline(): either
  // it saw this op, or the time read here is the later one it sleeps until.
  if (deadline != PendingOps<Op>::kNever &&
      deadline.time_since_epoch().count() < sleep_until_ns_.load(std::memory_order_relaxed)) {
    wake();
  }
}

void RdmaEndpointImpl::complete_all(std::vector<Done>& done) {
  for (Done& d : done) d.state->complete(std::move(d.status), d.nbytes);
  done.clear();
}

void RdmaEndpointImpl::run() {
  std::vector<Done> done;
  // Whatever way the thread ends, a waiter must not sleep out its bound for nothing.
  struct NotifyAtExit {
    std::condition_variable& cv;
    ~NotifyAtExit() { cv.notify_all(); }
  } notify_at_exit{progress_cv_};
  while (!stop_) {
    {
      CompletionScope scope;  // continuations run after this turn's bookkeeping
      poll_cq(done);
      expire(done);
      complete_all(done);
    }
    if (stop_) break;
    if (cq_->req_notify() != 0) {
      // The CQ is in error; poll_cq reports it.
      CompletionScope scope;
      poll_cq(done);
      complete_all(done);
      break;
    }
    {
      CompletionScope scope;
      poll_cq(done);  // what arrived before the arm
      complete_all(done);
    }
    int timeout_ms = -1;
    {
      std::lock_guard lock(mu_);
      if (!keepalive_applies()) {
        probe_at_ = PendingOps<Op>::kNever;
      } else if (probe_at_ == PendingOps<Op>::kNever) {
        probe_at_ = Clock::now() + options.keepalive;
      }
      const auto next = std::min({ops_.next_deadline(), wait_deadline_, probe_at_});
      sleep_until_ns_.store(next.time_since_epoch().count(), std::memory_order_relaxed);  // kNever: INT64_MAX
      if (next != PendingOps<Op>::kNever) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
        timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
      }
    }
    // Once per turn, not per completion: shutdown() and say_bye() recheck what they wait for.
    progress_cv_.notify_all();
    pollfd fds[2] = {{cq_->channel_fd(), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    ::poll(fds, 2, timeout_ms);
    cq_->ack_events();
    uint64_t count = 0;
    [[maybe_unused]] ssize_t n = ::read(wake_fd_, &count, sizeof(count));
  }
}

void RdmaEndpointImpl::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (closing_) return;
    closing_ = true;
  }
  // Tell the peer first, so its posted recvs fail PEER_CLOSED instead of waiting.
  say_bye();
  std::vector<Done> done;
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    for (size_t i = 0; i < lanes_.size(); ++i) fail_lane(lanes_[i], i, Status::cancelled("RDMAEndpoint was shut down"), done);
  }
  {
    CompletionScope scope;
    complete_all(done);
  }
  // The flushed WRs complete the ops (CANCELLED) on the completion thread. Wait for that,
  // unless this is that thread (a continuation shutting down): it completes them itself.
  if (!on_own_thread()) {
    std::unique_lock lock(mu_);
    progress_cv_.wait_for(lock, kShutdownDrain, [&] { return ops_.empty(); });
  }
  // What the device never flushed (a dropped completion): the QPs are in ERR, so the NIC no
  // longer touches the memory; complete them here.
  {
    std::lock_guard lock(mu_);
    std::vector<uint64_t> ids;
    ops_.for_each([&](uint64_t id, const Op&) { ids.push_back(id); });
    for (uint64_t id : ids) {
      Op op = std::move(*ops_.take(id));
      op.uses.clear();
      done.push_back({std::move(op.state), Status::cancelled("RDMAEndpoint was shut down"), 0});
    }
  }
  CompletionScope scope;
  complete_all(done);
  stop_ = true;
  wake();
}

void RdmaEndpointImpl::revoke_region(const RegionLifetime& lifetime) {
  std::vector<Done> done;
  {
    std::lock_guard lock(mu_);
    uint64_t lanes = 0;
    ops_.for_each([&](uint64_t, const Op& op) {
      if (op.uses.holds(&lifetime)) lanes |= op.lanes;
    });
    for (size_t l = 0; l < lanes_.size(); ++l) {
      if (lanes & (uint64_t(1) << l)) {
        fail_lane(lanes_[l], l,
                  Status::failed(fmt::format("region '{}' was unregistered while in use (revoked)", lifetime.name())),
                  done);
      }
    }
  }
  CompletionScope scope;
  complete_all(done);
}

bool RdmaEndpointImpl::on_own_thread() const { return thread_.is_current(); }

// --- RDMAEndpoint ------------------------------------------------------------------------

RDMAEndpoint::RDMAEndpoint(RdmaOptions options) : RDMAEndpoint(std::move(options), std::make_shared<MemoryRegistry>()) {}

RDMAEndpoint::RDMAEndpoint(RdmaOptions options, std::shared_ptr<MemoryRegistry> regions)
    : impl_(std::make_shared<RdmaEndpointImpl>(std::move(options), std::move(regions))) {
  impl_->start();
  order_notifications(submit_while_alive(impl_));
}

RDMAEndpoint::~RDMAEndpoint() {
  shutdown();
  // The completion thread ends with the endpoint, not after it (core/completion_thread.h).
  if (!inherited_from_parent()) impl_->join_thread();
}

nlohmann::json RDMAEndpoint::endpoint_info() const { return impl_->endpoint_info(); }
void RDMAEndpoint::connect(const nlohmann::json& peer_info) {
  require_own_process();
  impl_->connect(peer_info);
}
bool RDMAEndpoint::is_connected() const { return impl_->is_connected(); }

int32_t RDMAEndpoint::register_memory_region(const std::string& name, uintptr_t addr, uint64_t offset,
                                             uint64_t length) {
  // The registry asks where the memory lives; the memory domain registers GPU memory for
  // the NIC (docs/rdma.md, "GPU memory").
  require_own_process();
  if (impl_->is_shut_down()) refuse_after_shutdown("register_memory_region");
  return impl_->regions->add(name, addr, offset, length);
}
int32_t RDMAEndpoint::register_dmabuf_memory_region(const std::string& name, int fd, uint64_t offset, uint64_t length,
                                                    uint64_t iova) {
  require_own_process();
  if (impl_->is_shut_down()) refuse_after_shutdown("register_dmabuf_memory_region");
  return add_dmabuf_region(*impl_->regions, name, fd, offset, length, iova);
}
int32_t RDMAEndpoint::add_dmabuf_region(MemoryRegistry& registry, const std::string& name, int fd, uint64_t offset,
                                        uint64_t length, uint64_t iova) {
  rdma::check_dmabuf_region(fd, offset, length, iova);
  // The region is the dma-buf's bytes, addressed at iova (as ibv_reg_dmabuf_mr makes it).
  // The registry keeps a duplicate of the fd, so endpoints made later on a shared registry
  // register the same buffer; the caller's fd is only borrowed.
  return registry.add(name, static_cast<uintptr_t>(iova), 0, length, std::make_shared<RegionDmabuf>(fd, offset));
}
int32_t RDMAEndpoint::register_remote_memory_region(const std::string& name, const nlohmann::json& entry) {
  require_own_process();
  return impl_->register_remote(name, entry);
}
void RDMAEndpoint::unregister_memory_region(const std::string& name) {
  require_own_process();
  impl_->regions->remove(name);
}
void RDMAEndpoint::unregister_memory_region(int32_t handle) {
  require_own_process();
  impl_->regions->remove(handle);
}
nlohmann::json RDMAEndpoint::mr_info() const { return impl_->mr_info(); }
nlohmann::json RDMAEndpoint::mr_info_of(const std::string& name) const { return impl_->mr_info_of(name); }

Capabilities RDMAEndpoint::capabilities() const {
  Capabilities caps;
  caps.transport = "rdma";
  caps.read = caps.write = caps.write_with_imm = caps.imm_recv = caps.send_recv = caps.notify = true;
  caps.host_memory = true;
  caps.device_memory = true;  // registered for the NIC itself (docs/rdma.md, "GPU memory")
  return caps;
}

void RDMAEndpoint::shutdown() {
  // In a fork() child the completion thread is the parent's, and the QPs, CQ and MRs are
  // the parent's kernel objects: moving a QP to ERR or saying goodbye from here would do it
  // to the parent's connection.
  if (leave_if_inherited(impl_)) return;
  impl_->shutdown();
}
Future RDMAEndpoint::do_submit(OpRequest request) { return impl_->submit(std::move(request)); }
const RdmaOptions& RDMAEndpoint::options() const { return impl_->options; }
std::vector<uint32_t> RDMAEndpoint::qp_nums() const { return impl_->qp_nums(); }

}  // namespace dlslime
