// AscendDirectEndpoint (docs/ascend.md): one-sided reads and writes and notifications over
// one HIXL engine (hixl_engine.h), on an NPU or on the simulated HIXL.
//
// Threads: the caller's thread resolves an op (bounds, handles) and queues it; one worker
// thread per endpoint makes every engine call that moves bytes or links engines: it
// connects (or reconnects) the links an op needs, starts each op's transfers
// (TransferAsync, or TransferSync where the library has no async transfers), polls the
// outstanding requests with a bounded, backing-off interval (no spinning per op, no thread
// per op), enforces deadlines, sends notifications and collects the peer's. One thread owns
// the engine's links, so a link is never disconnected under a transfer starting on it.
//
// Deadlines: the library sets none. An op past its deadline has its link disconnected (the
// library requires that before the link is used again, and it fails what is in flight on
// it, so no transfer of the op can still touch its memory), then fails TIMEOUT; ops that
// were in flight on that link fail with the reason. The next op to that engine reconnects.
#include "dlslime/ascend_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <list>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ascend/ascend_endpoint_impl.h"
#include "ascend/library_loader.h"
#include "ascend/notify_codec.h"
#include "ascend/npu_memory.h"
#include "core/log.h"
#include "core/notify_fence.h"
#include "core/transport_registry.h"
#include "core/op_limit.h"
#include "dlslime/errors.h"

namespace dlslime {

using namespace ascend;

namespace {

// How the worker polls outstanding requests: from kPollMin, doubling to kPollMax while
// nothing completes; notifications are collected at least every kNotifyPoll.
constexpr auto kPollMin = std::chrono::microseconds(20);
constexpr auto kPollMax = std::chrono::microseconds(1000);
constexpr auto kNotifyPoll = std::chrono::milliseconds(2);
// While connected, the worker probes the link to the peer this often (a notify the peer
// drops): HIXL gives an idle link no liveness signal of its own (its heartbeat comes with
// AutoConnect=1), and a recv_notify waiting on a dead peer must end (docs/ascend.md,
// "Liveness"). A probe waits at most kProbeTimeout.
constexpr auto kProbeInterval = std::chrono::milliseconds(1000);
constexpr int32_t kProbeTimeout = 1000;
// Notifications held for recv_notify: at most this many bytes (with the inbox's overhead
// each); the worker stops collecting from the library while kHeldPause are held, so that
// the library's own bound (4,096 unread per link) pushes back on the sender.
constexpr uint64_t kInboxBudget = 64ull << 20;
constexpr size_t kHeldPause = 1024;

// The library's detail, where the CANN plugin has one for this thread's last call.
std::string detail() {
  if (sim_selected()) return {};
  const std::string d = library_last_error();
  return d.empty() ? d : " (" + d + ")";
}

Status status_of(uint32_t code, const std::string& what) {
  const std::string msg = fmt::format("{}: {}{}", what, hixl_status_name(code), detail());
  switch (code) {
    case kHixlSuccess: return Status::ok();
    case kHixlParamInvalid: return Status::invalid_argument(msg);
    case kHixlTimeout: return Status::timeout(msg);
    case kHixlNotConnected: return Status::not_connected(msg);
    case kHixlResourceExhausted: return Status(StatusCode::kBatchOverflow, msg);
    case kHixlUnsupported: return Status(StatusCode::kNotImplemented, msg);
    default: return Status::failed(msg);
  }
}

// Why the library refused to start a transfer. This side checked every range against the
// regions it knows (both sides') first, so PARAM_INVALID means the peer's engine no longer
// has the remote memory registered (the link's view of the peer's memory dropped it): the
// region was unregistered there, which the contract reports as UNKNOWN_HANDLE.
template <class Part>
Status transfer_refused(uint32_t rc, OpKind kind, const Part& p) {
  const std::string what = fmt::format("{} of {} item(s) to engine '{}'", op_kind_name(kind), p.descs.size(), p.engine);
  if (rc == kHixlParamInvalid) {
    return Status::unknown_handle(fmt::format("{}: {}: the peer's engine does not have the remote memory registered "
                                              "(unregistered there?){}",
                                              what, hixl_status_name(rc), detail()));
  }
  return status_of(rc, what);
}

// A free TCP port on `host` for an engine asked to listen on port 0: the engine's own
// listener binds it next (a port another process takes in between makes Initialize fail,
// which says so).
int pick_free_port(const std::string& host) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) {
    throw InvalidArgumentError(fmt::format("AscendDirectEndpoint host '{}' is not an IPv4 address", host));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw ConnectionError(fmt::format("AscendDirectEndpoint: socket() failed: {}", std::strerror(errno)));
  socklen_t len = sizeof sa;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) {
    throw ConnectionError(fmt::format("AscendDirectEndpoint: no free port on {}: {}", host, std::strerror(err)));
  }
  return ntohs(sa.sin_port);
}

}  // namespace

// --- AscendDomain --------------------------------------------------------------------------

namespace ascend {

AscendDomain::AscendDomain(std::shared_ptr<HixlEngine> engine, std::string engine_name)
    : engine_(std::move(engine)), engine_name_(std::move(engine_name)) {}

void AscendDomain::region_added(int32_t handle, const LocalRegion& region) {
  const MemType type = npu_memory().classify(region.addr, region.length);
  MemHandle mh = nullptr;
  std::shared_ptr<HixlEngine> engine;
  {
    std::lock_guard lock(mu_);
    engine = engine_;
  }
  const uint32_t rc = engine->RegisterMem({region.addr, region.length}, type, mh);
  if (rc != kHixlSuccess) {
    throw InvalidArgumentError(fmt::format("memory region '{}' ({} bytes of {} memory at {:#x}) could not be registered "
                                           "with the Ascend engine: {}{}",
                                           region.name, region.length, type == MemType::kDevice ? "NPU" : "host",
                                           region.addr, hixl_status_name(rc), detail()));
  }
  std::lock_guard lock(mu_);
  mems_[handle] = {mh, type};
}

void AscendDomain::region_removed(int32_t handle, const LocalRegion& region) {
  Mem mem;
  std::shared_ptr<HixlEngine> engine;
  {
    std::lock_guard lock(mu_);
    auto it = mems_.find(handle);
    if (it == mems_.end()) return;
    mem = it->second;
    mems_.erase(it);
    engine = engine_;
  }
  if (const uint32_t rc = engine->DeregisterMem(mem.handle); rc != kHixlSuccess) {
    DLSLIME_WARN("AscendDirectEndpoint: deregistering memory region '{}' failed: {}", region.name,
                 hixl_status_name(rc));
  }
}

nlohmann::json AscendDomain::describe(int32_t handle, const LocalRegion& region) const {
  std::lock_guard lock(mu_);
  auto it = mems_.find(handle);
  const bool npu = it != mems_.end() && it->second.type == MemType::kDevice;
  return {{"handle", handle},
          {"addr", region.addr},
          {"length", region.length},
          {"engine", engine_name_},
          {"memory", npu ? "npu" : "host"}};
}

void AscendDomain::rebind(std::shared_ptr<HixlEngine> engine, std::string engine_name) {
  std::lock_guard lock(mu_);
  engine_ = std::move(engine);
  engine_name_ = std::move(engine_name);
}

bool AscendDomain::registered(int32_t handle) const {
  std::lock_guard lock(mu_);
  return mems_.count(handle) != 0;
}

}  // namespace ascend

// --- AscendEndpointImpl ---------------------------------------------------------------------

AscendEndpointImpl::AscendEndpointImpl(AscendOptions opts, std::shared_ptr<MemoryRegistry> regs)
    : options(std::move(opts)),
      regions(std::move(regs)),
      inbox_(kInboxBudget, "the Ascend endpoint's fixed 64 MiB of held notifications") {
  options.validate();
  // The registry's transports teach the memory registry where device memory is (NPU memory
  // included: TransportEntry::device_memory); an endpoint made without it must not miss that.
  (void)TransportRegistry::instance();
  NpuMemory& npu = npu_memory();  // ConnectionError without a runtime, naming it
  if (options.device >= npu.device_count()) {
    throw InvalidArgumentError(fmt::format("AscendDirectEndpoint: no NPU device {} (the {} runtime has {})",
                                           options.device, npu.name(), npu.device_count()));
  }
  engine_ = start_engine(options.host, options.port, &name_);
  caps_ = engine_->GetCapability();
  domain_ = std::make_shared<AscendDomain>(engine_, name_);
}

std::shared_ptr<HixlEngine> AscendEndpointImpl::start_engine(const std::string& host, int port, std::string* name) {
  // A port picked here is free when picked, not when the engine binds it: another process
  // may take it in between. Then another is picked (an engine is initialized once).
  constexpr int kAttempts = 8;
  for (int attempt = 1;; ++attempt) {
    std::shared_ptr<HixlEngine> engine(make_engine());
    *name = fmt::format("{}:{}", host, port == 0 ? pick_free_port(host) : port);
    const uint32_t rc = engine->Initialize(*name, options.engine_options);
    if (rc == kHixlSuccess) return engine;
    if (port != 0 || rc != kHixlFailed || attempt == kAttempts) {
      throw ConnectionError(fmt::format("AscendDirectEndpoint: the engine '{}' could not start: {}{}", *name,
                                        hixl_status_name(rc), detail()));
    }
  }
}

void AscendEndpointImpl::init(const std::string& host, int port) {
  AscendOptions wanted = options;
  wanted.host = host;
  wanted.port = port;
  wanted.validate();
  {
    std::lock_guard lock(mu_);
    if (closed_) throw InvalidArgumentError("AscendDirectEndpoint.init: the endpoint is shut down");
    if (!links_.empty() || !incoming_.empty() || regions->size() > 0) {
      throw InvalidArgumentError("AscendDirectEndpoint.init(host, port) restarts the engine: call it before "
                                 "registering memory and before connect()");
    }
  }
  std::string name;
  std::shared_ptr<HixlEngine> engine = start_engine(host, port, &name);
  std::shared_ptr<HixlEngine> old;
  {
    std::lock_guard lock(mu_);
    old = std::exchange(engine_, engine);
    name_ = name;
  }
  domain_->rebind(engine, name);
  old->Finalize();
}

void AscendEndpointImpl::start() {
  regions->attach(domain_);
  regions->watch(std::static_pointer_cast<RegionRevoker>(shared_from_this()));
  thread_.start([self = shared_from_this()] { self->run(); });
}

AscendEndpointImpl::~AscendEndpointImpl() {
  thread_.join();
  engine_->Finalize();
}

nlohmann::json AscendEndpointImpl::endpoint_info() const {
  return {{"transport", "ascend"}, {"engine", engine_name()}, {"mr_info", mr_info()}};
}

nlohmann::json AscendEndpointImpl::mr_info() const { return regions->mr_info(*domain_); }
nlohmann::json AscendEndpointImpl::mr_info_of(const std::string& name) const {
  return regions->mr_info_of(name, *domain_);
}

void AscendEndpointImpl::connect(const nlohmann::json& peer) {
  if (!peer.is_object()) throw ConnectionError(fmt::format("peer endpoint_info must be an object, not {}", peer.dump()));
  if (peer.contains("transport") && peer["transport"] != "ascend") {
    throw ConnectionError(fmt::format("peer endpoint_info is of transport {}, not ascend", peer["transport"].dump()));
  }
  if (!peer.contains("engine") || !peer["engine"].is_string() || peer["engine"].get<std::string>().empty()) {
    throw ConnectionError("peer endpoint_info lacks a string 'engine' (is it an ascend endpoint's info?)");
  }
  const std::string engine = peer["engine"].get<std::string>();
  const nlohmann::json mrs = peer.contains("mr_info") ? peer["mr_info"] : nlohmann::json::object();
  if (!mrs.is_object()) throw ConnectionError("peer endpoint_info: 'mr_info' must be an object");
  // Connecting after the peer has gone (its engine stopped answering) replaces it, as on the
  // other transports: its regions stay under their names and handles but fail UNKNOWN_HANDLE
  // until registered again, so an old handle can never reach the new peer's memory.
  std::string old_gone;
  {
    std::lock_guard lock(mu_);
    auto it = links_.find(peer_);
    if (!peer_.empty() && peer_ != engine && it != links_.end() && it->second.gone) old_gone = peer_;
  }
  if (!old_gone.empty()) {
    remote_.drop_all(fmt::format("was dropped: the peer's engine '{}' that published it is gone", old_gone));
  }
  // The peer's regions first, then the link: the link's snapshot of the peer's memory holds
  // every region the peer published in this info (it registered them before taking it).
  for (const auto& item : mrs.items()) add_remote(item.key(), item.value(), /*strict=*/false);
  auto job = std::make_shared<ConnectJob>();
  job->engine = engine;
  {
    std::lock_guard lock(mu_);
    if (closed_) throw ConnectionError("AscendDirectEndpoint is shut down");
    connect_jobs_.push_back(job);
  }
  wake();
  std::unique_lock lock(job->mu);
  job->cv.wait(lock, [&] { return job->done; });
  if (!job->error.empty()) throw ConnectionError(job->error);
  // send_notify goes to the peer connected last; notifications from every linked peer are
  // received, and those held stay.
  std::lock_guard state_lock(mu_);
  peer_ = engine;
  inbox_.connected(/*drop_held=*/!old_gone.empty());
}

bool AscendEndpointImpl::is_connected() const {
  std::lock_guard lock(mu_);
  if (closed_ || peer_.empty()) return false;
  auto it = links_.find(peer_);
  return it != links_.end() && it->second.up && !it->second.gone;
}

int32_t AscendEndpointImpl::add_remote(const std::string& name, const nlohmann::json& entry, bool strict) {
  RemoteKey key;
  uint64_t length = 0;
  try {
    auto number = [&](const char* field) -> uint64_t {
      if (!entry.is_object() || !entry.contains(field) || !entry[field].is_number_integer() ||
          (!entry[field].is_number_unsigned() && entry[field].get<int64_t>() < 0)) {
        throw InvalidArgumentError(fmt::format("remote memory region '{}': mr_info entry needs an integer '{}' >= 0 "
                                               "(got {})",
                                               name, field, entry.dump()));
      }
      return entry[field].get<uint64_t>();
    };
    length = number("length");
    key.addr = number("addr");
    if (key.addr > UINTPTR_MAX - length) {
      throw InvalidArgumentError(fmt::format("remote memory region '{}': addr {:#x} + length {} overflows", name,
                                             key.addr, length));
    }
    if (!entry.contains("engine") || !entry["engine"].is_string() || entry["engine"].get<std::string>().empty()) {
      throw InvalidArgumentError(fmt::format("remote memory region '{}' names no engine (is it an ascend endpoint's "
                                             "mr_info entry?): {}",
                                             name, entry.dump()));
    }
    key.engine = entry["engine"].get<std::string>();
    std::lock_guard lock(mu_);
    key.seq = ++remote_seq_;
  } catch (const std::exception& e) {
    if (strict) throw;
    DLSLIME_DEBUG("Ascend: remote region '{}' is unusable: {}", name, e.what());
    return remote_.add_unusable(name, fmt::format("could not be used: {}", e.what()));
  }
  return remote_.add(name, length, std::move(key));
}

Future AscendEndpointImpl::submit(OpRequest request) {
  auto state = std::make_shared<OpState>(request.kind);
  Future future(state);
  auto fail = [&](Status status) {
    state->complete(std::move(status));
    return future;
  };
  if (request.kind == OpKind::kRecvNotify) {
    NotificationInbox::EndedList ended;
    {
      std::lock_guard lock(mu_);
      if (closed_) return fail(Status::cancelled("AscendDirectEndpoint is shut down"));
      state->set_canceller(std::static_pointer_cast<OpCanceller>(shared_from_this()), 0);
      inbox_.post(state, OpLimit::of(request.timeout, options.recv_timeout, "recv_timeout"), ended);
    }
    wake();  // its deadline, and notifications are collected sooner while one waits
    for (auto& e : ended) e.complete();
    return future;
  }
  Op op;
  op.state = state;
  op.kind = request.kind;
  op.limit = OpLimit::of(request.timeout, options.op_timeout, "op_timeout");
  op.deadline = op.limit.deadline();
  if (request.kind == OpKind::kSendNotify) {
    op.notification = std::move(*request.notification);
  } else {
    ResolveCache cache;
    cache.npu = true;  // this transport moves NPU memory
    RemoteRegions<RemoteKey>::Cache remote_cache;
    int32_t checked_local = -1;
    const TransferOp dir = request.kind == OpKind::kRead ? TransferOp::kRead : TransferOp::kWrite;
    for (const Assignment& a : request.assignments) {
      uintptr_t local = 0;
      if (Status st = regions->resolve(a.local_handle, a.source_offset, a.length, &local, cache); !st) {
        return fail(std::move(st));
      }
      op.uses.hold(cache);
      if (a.local_handle != checked_local) {
        if (!domain_->registered(a.local_handle)) {
          return fail(Status::invalid_argument(fmt::format(
              "local memory region {} is not registered with this endpoint's Ascend engine", a.local_handle)));
        }
        checked_local = a.local_handle;
      }
      RemoteKey rk;
      if (Status st = remote_.resolve(a.remote_handle, a.target_offset, a.length, &rk, remote_cache); !st) {
        return fail(std::move(st));
      }
      if (a.length == 0) continue;
      auto part = std::find_if(op.parts.begin(), op.parts.end(), [&](const Part& p) { return p.engine == rk.engine; });
      if (part == op.parts.end()) {
        op.parts.push_back(Part{rk.engine, dir, {}, nullptr, false, rk.seq});
        part = std::prev(op.parts.end());
      }
      part->newest_region = std::max(part->newest_region, rk.seq);
      part->descs.push_back({local, rk.addr + a.target_offset, a.length});
      op.nbytes += a.length;
    }
  }
  {
    std::lock_guard lock(mu_);
    if (closed_) return fail(Status::cancelled("AscendDirectEndpoint is shut down"));
    incoming_.push_back(std::move(op));
  }
  wake();
  return future;
}

void AscendEndpointImpl::wake() {
  {
    std::lock_guard lock(wake_mu_);
    ++wakes_;
  }
  wake_cv_.notify_all();
}

// --- the worker ----------------------------------------------------------------------------

// Makes (or remakes) the link to `engine`. Worker thread only; no lock held. nullopt: the
// link must be remade but transfers are in flight on it; ask again once they have ended.
std::optional<Status> AscendEndpointImpl::ensure_link(const std::string& engine, uint64_t newest_region,
                                                      bool retry_now) {
  Link* link;
  {
    std::lock_guard lock(mu_);
    link = &links_[engine];
  }
  // A link snapshots the peer's memory when it is made: a region of the peer registered here
  // after that may be memory the link cannot reach, so such an op relinks first, once
  // nothing is in flight on the link (a Disconnect fails what is).
  const bool stale = link->up && newest_region > link->made_at;
  if (link->up && !link->broken && !stale) return Status::ok();
  if (link->in_flight > 0) return std::nullopt;
  // A relink that just failed is not tried again for every queued op: they fail together.
  if (!retry_now && !link->unreachable.is_ok() && Clock::now() < link->retry_at) return link->unreachable;
  if (link->up) {
    const uint32_t rc = hixl()->Disconnect(engine, static_cast<int32_t>(options.connect_timeout.count()));
    if (rc != kHixlSuccess && rc != kHixlNotConnected) {
      DLSLIME_WARN("AscendDirectEndpoint: disconnecting from engine '{}' failed: {}", engine, hixl_status_name(rc));
    }
    std::lock_guard lock(mu_);
    link->up = false;
  }
  uint64_t made_at;
  {
    std::lock_guard lock(mu_);
    made_at = remote_seq_;
  }
  uint32_t rc = hixl()->Connect(engine, static_cast<int32_t>(options.connect_timeout.count()));
  if (rc == kHixlAlreadyConnected) rc = kHixlSuccess;  // a link the library kept
  if (rc != kHixlSuccess) {
    const Status connecting = status_of(rc, fmt::format("connecting to the Ascend engine '{}' (connect_timeout {} ms)",
                                                        engine, options.connect_timeout.count()));
    std::lock_guard lock(mu_);
    // Once linked, a peer whose engine cannot be reached again is gone.
    link->unreachable = link->ever_up ? Status::peer_closed(fmt::format("the peer's engine '{}' cannot be reached any "
                                                                        "more: {}",
                                                                        engine, connecting.message()))
                                      : connecting;
    link->gone = link->ever_up;
    link->retry_at = Clock::now() + std::min<Clock::duration>(options.connect_timeout, std::chrono::seconds(1));
    return link->unreachable;
  }
  std::lock_guard lock(mu_);
  link->up = true;
  link->broken = false;
  link->ever_up = true;
  link->unreachable = Status::ok();
  link->made_at = made_at;
  if (link->gone) {
    link->gone = false;
    if (engine == peer_) inbox_.connected(/*drop_held=*/false);  // the peer is back
  }
  return Status::ok();
}

bool AscendEndpointImpl::probe(const std::string& engine, std::vector<Ended>& ended) {
  if (!caps_.notify) return true;  // nothing to probe with (ADXL before 8.3)
  const uint32_t rc = hixl()->SendNotify(engine, NotifyDesc{engine_name(), kPingNotify}, kProbeTimeout);
  if (rc == kHixlSuccess || rc == kHixlResourceExhausted) return true;  // a full queue is a live peer
  const Status why = Status::peer_closed(fmt::format("the peer's engine '{}' stopped answering: a probe over the link "
                                                     "failed with {}",
                                                     engine, hixl_status_name(rc)));
  NotificationInbox::EndedList gone;
  {
    std::lock_guard lock(mu_);
    Link& link = links_[engine];
    link.gone = true;
    link.broken = true;  // the next op relinks, and fails PEER_CLOSED if it cannot
    link.why_down = why.message();
    if (engine == peer_) inbox_.gone(why, /*drop_held=*/false, gone);
  }
  for (auto& e : gone) ended.push_back({std::move(e.state), std::move(e.status), 0});
  return false;
}

// Why a started transfer failed. The library says only FAILED; this side knows whether it
// disconnected the link itself (a deadline, shutdown, a revoked region), and otherwise a
// probe tells a gone peer (PEER_CLOSED) from one that refused the transfer: it checks every
// range against what it has registered now, so a live peer refuses memory that was
// unregistered there since (UNKNOWN_HANDLE, as the contract reports it).
Status AscendEndpointImpl::part_failed(const Op& op, const Part& p, uint32_t rc, std::vector<Ended>& ended) {
  const std::string what = fmt::format("{} of {} item(s) to engine '{}'", op_kind_name(op.kind), p.descs.size(), p.engine);
  if (rc != kHixlSuccess && rc != kHixlFailed) return status_of(rc, what);
  std::string why;
  bool up, gone;
  {
    std::lock_guard lock(mu_);
    const Link& link = links_[p.engine];
    why = link.why_down;
    up = link.up;
    gone = link.gone;
  }
  if (!up) return Status::failed(fmt::format("{} failed: {}", what, why.empty() ? "its link was disconnected" : why));
  if (gone || !probe(p.engine, ended)) {
    std::lock_guard lock(mu_);
    return Status::peer_closed(fmt::format("{} failed: {}", what, links_[p.engine].why_down));
  }
  if (!caps_.notify) return Status::failed(fmt::format("{} failed (the library does not say why){}", what, detail()));
  return Status::unknown_handle(fmt::format("{} failed: the peer's engine refused it: the memory is not registered "
                                            "there any more (unregistered?)",
                                            what));
}

// Disconnects `engine` after an op's deadline (or to revoke a region): everything in flight
// on the link fails, and the library holds no reference to those ops' memory afterwards.
void AscendEndpointImpl::break_link(const std::string& engine, const std::string& why) {
  Link* link;
  {
    std::lock_guard lock(mu_);
    link = &links_[engine];
    if (!link->up) return;
  }
  const uint32_t rc = hixl()->Disconnect(engine, static_cast<int32_t>(options.connect_timeout.count()));
  if (rc != kHixlSuccess && rc != kHixlNotConnected) {
    DLSLIME_WARN("AscendDirectEndpoint: disconnecting from engine '{}' ({}) failed: {}", engine, why,
                 hixl_status_name(rc));
  }
  std::lock_guard lock(mu_);
  link->up = false;
  link->broken = false;
  link->why_down = why;
}

void AscendEndpointImpl::start_op(Op& op, std::vector<Ended>& ended) {
  for (Part& p : op.parts) {
    if (p.started) continue;
    const std::optional<Status> st = ensure_link(p.engine, p.newest_region);
    if (!st) return;  // relinks once the link is idle
    if (!*st) {
      op.error = *st;
      continue;
    }
    if (!op.error.is_ok()) continue;  // a part failed: start no more
    if (caps_.transfer_async) {
      TransferReq req = nullptr;
      const uint32_t rc = hixl()->TransferAsync(p.engine, p.dir, p.descs, req);
      if (rc != kHixlSuccess) {
        op.error = rc == kHixlParamInvalid ? transfer_refused(rc, op.kind, p) : part_failed(op, p, rc, ended);
        continue;
      }
      p.req = req;
      p.started = true;
      std::lock_guard lock(mu_);
      ++links_[p.engine].in_flight;
    } else {
      // The library has no async transfers (ADXL before 8.3): the worker waits, within the
      // op's deadline, as the library allows.
      const auto left = op.limit.none() ? std::chrono::milliseconds(INT32_MAX)
                                        : std::chrono::duration_cast<std::chrono::milliseconds>(op.deadline - Clock::now());
      const int32_t timeout_ms = static_cast<int32_t>(std::clamp<int64_t>(left.count(), 1, INT32_MAX));
      const uint32_t rc = hixl()->TransferSync(p.engine, p.dir, p.descs, timeout_ms);
      p.started = p.finished = true;
      if (rc == kHixlTimeout) break_link(p.engine, "a transfer passed its deadline");
      if (rc != kHixlSuccess) {
        op.error = rc == kHixlTimeout
                       ? Status::timeout(fmt::format("{} did not complete within {}", op_kind_name(op.kind),
                                                     op.limit.describe()))
                       : rc == kHixlParamInvalid ? transfer_refused(rc, op.kind, p) : part_failed(op, p, rc, ended);
      }
    }
  }
  op.started = std::all_of(op.parts.begin(), op.parts.end(), [](const Part& p) { return p.started; }) ||
               !op.error.is_ok();
}

// Sends one notification to the connected peer, in fragments the library can carry.
// nullopt: its link is being remade; ask again.
std::optional<Status> AscendEndpointImpl::send_notification(const Op& op) {
  std::string peer;
  {
    std::lock_guard lock(mu_);
    peer = peer_;
  }
  if (peer.empty()) return Status::not_connected("AscendDirectEndpoint is not connected");
  const std::optional<Status> linked = ensure_link(peer, 0);
  if (!linked || !*linked) return linked;
  const auto left = op.limit.none() ? std::chrono::milliseconds(INT32_MAX)
                                    : std::chrono::duration_cast<std::chrono::milliseconds>(op.deadline - Clock::now());
  const int32_t timeout_ms = static_cast<int32_t>(std::clamp<int64_t>(left.count(), 1, INT32_MAX));
  for (std::string& fragment : encode_notification(op.notification, ++notify_seq_)) {
    NotifyDesc desc{engine_name(), std::move(fragment)};
    const uint32_t rc = hixl()->SendNotify(peer, desc, timeout_ms);
    if (rc == kHixlResourceExhausted) {
      return Status(StatusCode::kBatchOverflow,
                    fmt::format("send_notify to engine '{}': {}: the peer holds {} unread notifies from this engine, the "
                                "library's budget per link (a notification of up to 4 KiB takes up to 6)",
                                peer, hixl_status_name(rc), kMaxUnreadNotifies));
    }
    if (rc != kHixlSuccess) return status_of(rc, fmt::format("send_notify to engine '{}'", peer));
  }
  return Status::ok();
}

void AscendEndpointImpl::collect_notifications(std::vector<Ended>& ended) {
  std::vector<NotifyDesc> got;
  if (const uint32_t rc = hixl()->GetNotifies(got); rc != kHixlSuccess) {
    DLSLIME_DEBUG("AscendDirectEndpoint: GetNotifies failed: {}", hixl_status_name(rc));
    return;
  }
  if (got.empty()) return;
  NotificationInbox::EndedList inbox_ended;
  {
    std::lock_guard lock(mu_);
    for (NotifyDesc& n : got) {
      std::optional<std::string> whole = assembler_.add(n.name, std::move(n.notify_msg));
      if (!whole) continue;
      if (Status st = inbox_.deliver(std::move(*whole), inbox_ended); !st) {
        DLSLIME_WARN("AscendDirectEndpoint: a notification from engine '{}' was dropped: {}", n.name, st.message());
      }
    }
  }
  for (auto& e : inbox_ended) ended.push_back({std::move(e.state), std::move(e.status), 0});
}

void AscendEndpointImpl::run() {
  std::list<Op> ops;  // queued, started or waiting for a link; worker-owned
  std::vector<Ended> ended;
  auto poll = kPollMin;
  auto last_notify_poll = Clock::now() - kNotifyPoll;
  auto last_probe = Clock::now();
  for (;;) {
    uint64_t seen;
    {
      std::lock_guard lock(wake_mu_);
      seen = wakes_;
    }
    std::vector<std::shared_ptr<ConnectJob>> jobs;
    std::vector<const RegionLifetime*> revoking;
    bool closed;
    {
      std::lock_guard lock(mu_);
      for (Op& op : incoming_) ops.push_back(std::move(op));
      incoming_.clear();
      jobs.swap(connect_jobs_);
      revoking = revoking_;
      closed = closed_;
    }
    for (auto& job : jobs) {
      // A link busy with ops (nullopt) is up already: the one asked for.
      const Status st = closed ? Status::cancelled("AscendDirectEndpoint is shut down")
                               : ensure_link(job->engine, 0, /*retry_now=*/true).value_or(Status::ok());
      std::lock_guard lock(job->mu);
      job->error = st.is_ok() ? std::string() : st.message();
      job->done = true;
      job->cv.notify_all();
    }
    if (closed) {
      // Shutdown: nothing new starts; every link goes, which fails what is in flight, so
      // the ops below end once the library has let go of their memory.
      std::vector<std::string> up;
      {
        std::lock_guard lock(mu_);
        for (auto& [engine, link] : links_) {
          if (link.up) up.push_back(engine);
        }
      }
      for (const std::string& e : up) break_link(e, "AscendDirectEndpoint was shut down");
    }
    // Regions being revoked (unregister past its drain timeout): the links carrying their
    // ops go.
    for (const RegionLifetime* lifetime : revoking) {
      for (Op& op : ops) {
        if (!op.uses.holds(lifetime)) continue;
        for (Part& p : op.parts) {
          if (p.started && !p.finished) {
            break_link(p.engine, fmt::format("memory region '{}' was unregistered", lifetime->name()));
          }
        }
      }
    }
    bool progressed = false;
    const auto now = Clock::now();
    for (auto it = ops.begin(); it != ops.end();) {
      Op& op = *it;
      if (!op.started) {
        if (closed) {
          op.error = Status::cancelled(fmt::format("{}: AscendDirectEndpoint was shut down", op_kind_name(op.kind)));
          op.started = true;
        } else if (op.kind == OpKind::kSendNotify) {
          if (std::optional<Status> sent = send_notification(op)) {
            op.error = std::move(*sent);
            op.started = true;
          }
        } else if (now > op.deadline) {
          op.error = Status::timeout(fmt::format("{} did not start within {}: its link could not be made in time",
                                                 op_kind_name(op.kind), op.limit.describe()));
          op.started = true;
        } else {
          start_op(op, ended);
        }
        if (op.started) progressed = true;
      }
      // Poll its requests.
      bool unfinished = false;
      for (Part& p : op.parts) {
        if (!p.started || p.finished) {
          unfinished |= !p.started && op.error.is_ok();
          continue;
        }
        TransferStatus ts = TransferStatus::kWaiting;
        const uint32_t rc = hixl()->GetTransferStatus(p.req, ts);
        if (rc == kHixlSuccess && ts == TransferStatus::kWaiting) {
          unfinished = true;
          continue;
        }
        p.finished = true;
        progressed = true;
        {
          std::lock_guard lock(mu_);
          --links_[p.engine].in_flight;
        }
        if ((rc != kHixlSuccess || ts != TransferStatus::kCompleted) && op.error.is_ok()) {
          op.error = part_failed(op, p, rc, ended);
        }
      }
      if (closed && op.error.is_ok()) {
        op.error = Status::cancelled(fmt::format("{}: AscendDirectEndpoint was shut down", op_kind_name(op.kind)));
      }
      if (unfinished && op.started && Clock::now() > op.deadline && op.error.is_ok()) {
        // Past its deadline: its links go (the library requires it, and it ends the
        // transfers), and it fails TIMEOUT once they have.
        op.error = Status::timeout(fmt::format("{} did not complete within {}", op_kind_name(op.kind),
                                               op.limit.describe()));
        for (Part& p : op.parts) {
          if (p.started && !p.finished) {
            break_link(p.engine, fmt::format("another op on the link passed its deadline ({})", op.limit.describe()));
          }
        }
        progressed = true;
        ++it;  // polled again: its requests end as failed now
        continue;
      }
      if (unfinished || !op.started) {
        ++it;
        continue;
      }
      ended.push_back({std::move(op.state), std::move(op.error), op.nbytes});
      it = ops.erase(it);  // drops its region uses
    }
    if (!closed && caps_.notify && Clock::now() - last_probe >= kProbeInterval) {
      std::string peer;
      {
        std::lock_guard lock(mu_);
        auto it = links_.find(peer_);
        if (it != links_.end() && it->second.up && !it->second.gone && !it->second.broken) peer = peer_;
      }
      if (!peer.empty()) probe(peer, ended);
      last_probe = Clock::now();
    }
    const bool collect = !closed && caps_.notify && Clock::now() - last_notify_poll >= kNotifyPoll;
    if (collect) {
      size_t held;
      {
        std::lock_guard lock(mu_);
        held = inbox_.held();
      }
      if (held < kHeldPause) collect_notifications(ended);
      last_notify_poll = Clock::now();
    }
    Clock::time_point inbox_deadline;
    {
      NotificationInbox::EndedList expired;
      std::lock_guard lock(mu_);
      inbox_deadline = inbox_.expire(Clock::now(), expired);
      for (auto& e : expired) ended.push_back({std::move(e.state), std::move(e.status), 0});
      // Tell revoke_region which regions no op here holds any more.
      revoked_.clear();
      for (const RegionLifetime* lifetime : revoking_) {
        if (std::none_of(ops.begin(), ops.end(), [&](const Op& op) { return op.uses.holds(lifetime); })) {
          revoked_.push_back(lifetime);
        }
      }
      if (!ended.empty() || progressed || !revoked_.empty()) drained_cv_.notify_all();
      if (closed && ops.empty() && incoming_.empty() && ended.empty()) {
        worker_done_ = true;
        drained_cv_.notify_all();
        break;
      }
    }
    if (!ended.empty()) {
      CompletionScope scope;
      for (Ended& e : ended) {
        const uint64_t nbytes = e.status.is_ok() ? e.nbytes : 0;
        e.state->complete(std::move(e.status), nbytes);
      }
      ended.clear();
      poll = kPollMin;
      continue;
    }
    // Wait: briefly while requests are outstanding (backing off while nothing completes),
    // else until woken, a recv_notify's deadline, or the next notification poll.
    const bool outstanding = !ops.empty();
    poll = progressed ? kPollMin : std::min<std::chrono::microseconds>(poll * 2, kPollMax);
    auto until = Clock::now() + (outstanding ? std::chrono::duration_cast<Clock::duration>(poll)
                                             : std::chrono::duration_cast<Clock::duration>(kNotifyPoll));
    until = std::min(until, inbox_deadline);
    std::unique_lock lock(wake_mu_);
    wake_cv_.wait_until(lock, until, [&] { return wakes_ != seen; });
  }
  // Shut down: recv_notifys still waiting end CANCELLED.
  NotificationInbox::EndedList gone;
  {
    std::lock_guard lock(mu_);
    inbox_.gone(Status::cancelled("AscendDirectEndpoint is shut down"), /*drop_held=*/true, gone);
  }
  CompletionScope scope;
  for (auto& e : gone) e.complete();
}

void AscendEndpointImpl::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = true;
  }
  wake();
}

bool AscendEndpointImpl::cancel_op(OpState& op, uint64_t) {
  NotificationInbox::EndedList ended;
  {
    std::lock_guard lock(mu_);
    if (!inbox_.withdraw(op, ended)) return false;
  }
  for (auto& e : ended) e.complete();
  return true;
}

void AscendEndpointImpl::revoke_region(const RegionLifetime& lifetime) {
  if (on_own_thread()) return;
  {
    std::lock_guard lock(mu_);
    revoking_.push_back(&lifetime);
  }
  wake();
  // Waits until no op of the worker holds it (they ended: their links went, which ended
  // their transfers), or the worker has ended.
  std::unique_lock lock(mu_);
  drained_cv_.wait(lock, [&] {
    return worker_done_ || std::find(revoked_.begin(), revoked_.end(), &lifetime) != revoked_.end();
  });
  revoking_.erase(std::remove(revoking_.begin(), revoking_.end(), &lifetime), revoking_.end());
}

bool AscendEndpointImpl::on_own_thread() const { return thread_.is_current(); }

std::optional<int32_t> AscendEndpointImpl::remote_handle(const std::string& name) const { return remote_.find(name); }

// --- AscendDirectEndpoint ------------------------------------------------------------------

AscendDirectEndpoint::AscendDirectEndpoint(AscendOptions options)
    : AscendDirectEndpoint(std::move(options), std::make_shared<MemoryRegistry>()) {}

AscendDirectEndpoint::AscendDirectEndpoint(AscendOptions options, std::shared_ptr<MemoryRegistry> regions)
    : impl_(std::make_shared<AscendEndpointImpl>(std::move(options), std::move(regions))) {
  impl_->start();
  order_notifications(submit_while_alive(impl_));
}

AscendDirectEndpoint::~AscendDirectEndpoint() {
  shutdown();
  if (!inherited_from_parent()) impl_->join_thread();
}

nlohmann::json AscendDirectEndpoint::endpoint_info() const { return impl_->endpoint_info(); }
void AscendDirectEndpoint::connect(const nlohmann::json& peer_info) {
  require_own_process();
  impl_->connect(peer_info);
}
bool AscendDirectEndpoint::is_connected() const { return impl_->is_connected(); }

int32_t AscendDirectEndpoint::register_memory_region(const std::string& name, uintptr_t addr, uint64_t offset,
                                                     uint64_t length) {
  require_own_process();
  if (impl_->is_shut_down()) refuse_after_shutdown("register_memory_region");
  if (offset > UINTPTR_MAX - addr) {
    throw InvalidArgumentError(fmt::format("memory region '{}': address {:#x} + offset {} overflows", name, addr, offset));
  }
  return impl_->regions->add(name, addr, offset, length);  // the domain registers it with the engine
}
int32_t AscendDirectEndpoint::register_remote_memory_region(const std::string& name, const nlohmann::json& entry) {
  require_own_process();
  return impl_->add_remote(name, entry, /*strict=*/true);
}
void AscendDirectEndpoint::unregister_memory_region(const std::string& name) {
  require_own_process();
  impl_->regions->remove(name);
}
void AscendDirectEndpoint::unregister_memory_region(int32_t handle) {
  require_own_process();
  impl_->regions->remove(handle);
}
nlohmann::json AscendDirectEndpoint::mr_info() const { return impl_->mr_info(); }
nlohmann::json AscendDirectEndpoint::mr_info_of(const std::string& name) const { return impl_->mr_info_of(name); }

std::optional<int32_t> AscendDirectEndpoint::local_handle(const std::string& name) const {
  return impl_->regions->find(name);
}
std::optional<int32_t> AscendDirectEndpoint::remote_handle(const std::string& name) const {
  return impl_->remote_handle(name);
}
std::string AscendDirectEndpoint::engine_name() const { return impl_->engine_name(); }
void AscendDirectEndpoint::init(const std::string& host, int port) {
  require_own_process();
  impl_->init(host, port);
}

Capabilities AscendDirectEndpoint::capabilities() const {
  Capabilities caps;
  caps.transport = "ascend";
  caps.read = caps.write = true;
  caps.notify = impl_->library_caps().notify;
  caps.host_memory = caps.device_memory = true;
  return caps;
}

void AscendDirectEndpoint::shutdown() {
  if (leave_if_inherited(impl_)) return;
  impl_->shutdown();
}
Future AscendDirectEndpoint::do_submit(OpRequest request) { return impl_->submit(std::move(request)); }
const AscendOptions& AscendDirectEndpoint::options() const { return impl_->options; }

}  // namespace dlslime
