// NVLinkEndpoint (include/dlslime/nvlink_endpoint.h, docs/nvlink.md): one-sided copies
// between GPU memory of processes on one host, through the device-runtime seam
// (gpu/device_runtime.h), so the same code runs on CUDA IPC and on the simulated GPU.
//
// How it works: registering a region exports the IPC handle of the allocation that holds
// it, with the region's offset in that allocation (a caching allocator's sub-allocations
// share one allocation). The peer opens each handle once per process (Mapping) and
// addresses the region at base + offset, checking every item against the length the owner
// published. An op queues its copies on a stream, records an event after them and asks the
// runtime to call back (launch_host_func) once they ran; the completion thread sleeps until
// such a callback, then queries the events and completes the futures whose copies have
// finished. A copy queued on a GPU cannot be taken back, so nothing completes an op before
// its copies have run: not shutdown, not a deadline.
//
// Threads: any thread submits (under mu_); the completion thread completes ops outside
// mu_, inside a CompletionScope, after dropping their region uses and mappings.
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/notify_fence.h"
#include "core/log.h"
#include "core/memory_registry.h"
#include "core/op_state.h"
#include "core/remote_regions.h"
#include "dlslime/errors.h"
#include "dlslime/nvlink_endpoint.h"
#include "gpu/device_runtime.h"
#include "nvlink/nvlink_endpoint_impl.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace dlslime {

using Clock = std::chrono::steady_clock;

namespace {

// While ops are pending, the completion thread also queries their events this often: CUDA
// does not run host functions after a context error, so a callback may never come.
constexpr auto kSafetyPoll = std::chrono::milliseconds(200);

std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string pid_namespace() {
  char buf[128] = {};
  const ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace

namespace nvlink {

const std::string& boot_id() {
  static const std::string id = first_line("/proc/sys/kernel/random/boot_id");
  return id;
}

// Names this process among all processes of the host (a forked child gets a new one), so
// that a peer can tell whether a published region lives in its own address space.
std::string process_token() {
  static std::mutex mu;
  static pid_t pid = 0;
  static std::string token;
  std::lock_guard lock(mu);
  if (getpid() != pid) {
    pid = getpid();
    std::random_device rd;
    token = fmt::format("{}:{}:{:08x}{:08x}", boot_id(), pid, rd(), rd());
  }
  return token;
}

Mapping::~Mapping() {
  try {
    gpu::runtime().ipc_close(base);
  } catch (const std::exception& e) {
    DLSLIME_WARN("NVLink: closing a peer's IPC mapping failed: {}", e.what());
  }
}

std::shared_ptr<Mapping> open_mapping(const gpu::IpcHandle& handle, int device) {
  // CUDA maps a handle once per process: every endpoint of this process shares the mapping.
  static std::mutex mu;
  static std::map<std::pair<std::array<uint8_t, gpu::IpcHandle::kSize>, int>, std::weak_ptr<Mapping>> cache;
  std::lock_guard lock(mu);
  std::erase_if(cache, [](const auto& kv) { return kv.second.expired(); });
  const auto key = std::make_pair(handle.bytes, device);
  if (auto it = cache.find(key); it != cache.end()) {
    if (auto m = it->second.lock()) return m;
  }
  gpu::Runtime& rt = gpu::runtime();
  void* base = rt.ipc_open(handle, device);
  auto mapping = std::make_shared<Mapping>();
  mapping->base = base;  // closed by ~Mapping from here on
  mapping->size = rt.allocation_range(base).size;
  cache[key] = mapping;
  return mapping;
}

namespace {
std::mutex g_domains_mu;
std::unordered_map<std::string, std::weak_ptr<NvlinkDomain>>& domains() {
  static auto* all = new std::unordered_map<std::string, std::weak_ptr<NvlinkDomain>>();  // outlives exit
  return *all;
}
std::string random_token() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}
}  // namespace

NvlinkDomain::NvlinkDomain() : token_(random_token()) {}

void NvlinkDomain::publish(const std::shared_ptr<MemoryRegistry>& registry) {
  registry_ = registry;
  std::lock_guard lock(g_domains_mu);
  std::erase_if(domains(), [](const auto& kv) { return kv.second.expired(); });
  domains()[token_] = weak_from_this();
}

std::shared_ptr<NvlinkDomain> NvlinkDomain::find(const std::string& token) {
  std::lock_guard lock(g_domains_mu);
  auto it = domains().find(token);
  return it == domains().end() ? nullptr : it->second.lock();
}

void NvlinkDomain::region_added(int32_t handle, const LocalRegion& region) {
  gpu::Runtime& rt = gpu::runtime();
  const auto* ptr = reinterpret_cast<const void*>(region.addr);
  const gpu::PointerInfo info = rt.pointer_info(ptr);
  // Host memory in a registry shared with other transports (PeerAgent): not exported;
  // describe() says so and a peer's ops on it fail. NVLinkEndpoint itself refuses it.
  if (info.type != gpu::MemoryType::kDevice) return;
  const gpu::AddressRange range = rt.allocation_range(ptr);
  const uint64_t offset = region.addr - range.base;
  if (!range_within(range.size, offset, region.length)) {
    throw InvalidArgumentError(fmt::format("memory region '{}' [{:#x}, +{}) runs past the end of its device allocation "
                                           "[{:#x}, +{})",
                                           region.name, region.addr, region.length, range.base, range.size));
  }
  gpu::IpcHandle ipc;
  try {
    ipc = rt.ipc_get_handle(reinterpret_cast<void*>(range.base));
  } catch (const Error& e) {
    // Memory CUDA IPC cannot share: NVLink cannot take this region, but the other transports
    // of a shared registry (PeerAgent) may, so it is recorded, not thrown (which would veto
    // the region for all of them). A peer's ops on it fail with this reason.
    std::string why = fmt::format("memory region '{}' is GPU memory NVLink cannot export: {}", region.name, e.what());
    DLSLIME_INFO("NVLink: {}", why);
    std::lock_guard lock(mu_);
    refused_[handle] = Refused{std::move(why), info.device};
    return;
  }
  Export e{ipc, offset, range.size, info.device};
  std::lock_guard lock(mu_);
  exports_[handle] = e;
}

void NvlinkDomain::region_removed(int32_t handle, const LocalRegion&) {
  std::lock_guard lock(mu_);
  exports_.erase(handle);
  refused_.erase(handle);
}

nlohmann::json NvlinkDomain::describe(int32_t handle, const LocalRegion& region) const {
  nlohmann::json j = {{"handle", handle}, {"addr", region.addr}, {"length", region.length},
                      {"process", process_token()}, {"domain", token_}};
  std::lock_guard lock(mu_);
  auto it = exports_.find(handle);
  if (auto r = refused_.find(handle); r != refused_.end()) {
    j["memory"] = "device";
    j["device"] = r->second.device;
    j["not_exported"] = r->second.why;
    return j;
  }
  if (it == exports_.end()) {
    j["memory"] = "host";
    return j;
  }
  j["memory"] = "device";
  j["device"] = it->second.device;
  j["ipc_handle"] = it->second.handle.to_hex();
  j["alloc_offset"] = it->second.alloc_offset;
  j["alloc_size"] = it->second.alloc_size;
  return j;
}

bool NvlinkDomain::exported(int32_t handle) const {
  std::lock_guard lock(mu_);
  return exports_.contains(handle);
}

std::optional<std::string> NvlinkDomain::refusal(int32_t handle) const {
  std::lock_guard lock(mu_);
  auto it = refused_.find(handle);
  if (it == refused_.end()) return std::nullopt;
  return it->second.why;
}

std::string NvlinkDomain::unexported_reason(int32_t handle) const {
  if (auto why = refusal(handle)) return *why;
  return fmt::format("local region {} is host memory: NVLink moves GPU memory only", handle);
}

}  // namespace nvlink

using namespace nvlink;

// --- NvlinkOptions -----------------------------------------------------------------------

namespace {
constexpr int64_t kMaxTimeoutMs = 365LL * 24 * 3600 * 1000;

int64_t int_option(const std::string& key, const nlohmann::json& value, int64_t lo, int64_t hi) {
  const bool ok = value.is_number_integer() &&
                  !(value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(hi)) &&
                  value.get<int64_t>() >= lo && value.get<int64_t>() <= hi;
  if (!ok) {
    throw InvalidArgumentError(
        fmt::format("NVLinkEndpoint option {}={} must be an integer in {}..{}", key, value.dump(), lo, hi));
  }
  return value.get<int64_t>();
}
}  // namespace

NvlinkOptions NvlinkOptions::from_json(const nlohmann::json& options, NvlinkOptions base) {
  if (options.is_null()) return base;
  if (!options.is_object()) {
    throw InvalidArgumentError(fmt::format("NVLinkEndpoint options must be an object, not {}", options.dump()));
  }
  for (const auto& item : options.items()) {
    if (item.key() == "device") {
      base.device = static_cast<int>(int_option(item.key(), item.value(), 0, 1 << 16));
    } else if (item.key() == "op_timeout_ms") {
      base.op_timeout = std::chrono::milliseconds(int_option(item.key(), item.value(), 0, kMaxTimeoutMs));
    } else if (item.key() == "recv_timeout_ms") {
      base.recv_timeout = std::chrono::milliseconds(int_option(item.key(), item.value(), 0, kMaxTimeoutMs));
    } else {
      throw InvalidArgumentError(fmt::format(
          "unknown NVLinkEndpoint option '{}' (known: device, op_timeout_ms, recv_timeout_ms)", item.key()));
    }
  }
  base.validate();
  return base;
}

NvlinkOptions NvlinkOptions::from_json(const nlohmann::json& options) { return from_json(options, NvlinkOptions()); }

void NvlinkOptions::validate() const {
  if (device < 0) throw InvalidArgumentError(fmt::format("NVLinkEndpoint option device={} must be >= 0", device));
  if (op_timeout.count() < 0 || op_timeout.count() > kMaxTimeoutMs) {
    throw InvalidArgumentError(fmt::format("NVLinkEndpoint option op_timeout_ms={} must be in 0..{}",
                                           op_timeout.count(), kMaxTimeoutMs));
  }
  if (recv_timeout.count() < 0 || recv_timeout.count() > kMaxTimeoutMs) {
    throw InvalidArgumentError(fmt::format("NVLinkEndpoint option recv_timeout_ms={} must be in 0..{}",
                                           recv_timeout.count(), kMaxTimeoutMs));
  }
}

nlohmann::json NvlinkOptions::to_json() const {
  return {{"device", device}, {"op_timeout_ms", op_timeout.count()}, {"recv_timeout_ms", recv_timeout.count()}};
}

// --- NVLinkEndpointImpl --------------------------------------------------------------------

NVLinkEndpointImpl::NVLinkEndpointImpl(NvlinkOptions opts, std::shared_ptr<MemoryRegistry> regs)
    : options(std::move(opts)), regions(std::move(regs)), rt_(gpu::runtime()) {
  options.validate();
  if (options.device >= rt_.device_count()) {
    throw InvalidArgumentError(fmt::format("NVLinkEndpoint: no GPU device {} (the {} runtime has {})", options.device,
                                           rt_.name(), rt_.device_count()));
  }
  stream_ = rt_.stream_create(options.device);
  waker_ = std::make_shared<Waker>();
}

void NVLinkEndpointImpl::start() {
  domain_->publish(regions);
  regions->attach(domain_);
  regions->watch(std::static_pointer_cast<RegionRevoker>(shared_from_this()));
  // The thread holds the endpoint alive until its last op's copies have run.
  thread_.start([self = shared_from_this()] { self->run(); });
  notes_->start();
}

NVLinkEndpointImpl::~NVLinkEndpointImpl() {
  thread_.join();
  remote_.clear();  // drops the mappings (ipc_close once no endpoint uses them)
  try {
    for (gpu::Event e : free_events_) rt_.event_destroy(e);
    rt_.stream_destroy(stream_);
  } catch (const std::exception& e) {
    DLSLIME_WARN("NVLinkEndpoint: releasing its stream and events failed: {}", e.what());
  }
  if (peer_pidfd_ >= 0) ::close(peer_pidfd_);
}

nlohmann::json NVLinkEndpointImpl::endpoint_info() const {
  return {{"transport", "nvlink"},    {"device", options.device}, {"host", boot_id()},
          {"pid", getpid()},          {"pid_ns", pid_namespace()}, {"process", process_token()},
          {"notify_socket", notes_->address()}, {"mr_info", mr_info()}};
}

nlohmann::json NVLinkEndpointImpl::mr_info() const { return regions->mr_info(*domain_); }
nlohmann::json NVLinkEndpointImpl::mr_info_of(const std::string& name) const {
  return regions->mr_info_of(name, *domain_);
}

void NVLinkEndpointImpl::connect(const nlohmann::json& peer) {
  if (!peer.is_object()) throw ConnectionError(fmt::format("peer endpoint_info must be an object, not {}", peer.dump()));
  if (peer.contains("transport") && peer["transport"] != "nvlink") {
    throw ConnectionError(fmt::format("peer endpoint_info is of transport {}, not nvlink", peer["transport"].dump()));
  }
  auto text = [&](const char* key) {
    if (!peer.contains(key) || !peer[key].is_string()) {
      throw ConnectionError(fmt::format("peer endpoint_info lacks a string '{}' (is it an nvlink endpoint's info?)", key));
    }
    return peer[key].get<std::string>();
  };
  const std::string host = text("host");
  const std::string process = text("process");
  const std::string pid_ns = text("pid_ns");
  if (!peer.contains("pid") || !peer["pid"].is_number_integer()) {
    throw ConnectionError("peer endpoint_info lacks an integer 'pid'");
  }
  const auto pid = peer["pid"].get<int64_t>();
  // pid_t is positive; 0 or a negative one would make the pidfd and kill() checks name this
  // process's group or every process (hostile review N12).
  if (pid <= 0 || pid > std::numeric_limits<pid_t>::max()) {
    throw ConnectionError(fmt::format("peer endpoint_info 'pid' {} is not a process id", pid));
  }
  if (host != boot_id()) {
    throw ConnectionError(fmt::format("NVLink connects endpoints on one host: the peer runs on another (boot id {}, "
                                      "this host's {}); use RDMA or TCP",
                                      host, boot_id()));
  }
  const nlohmann::json mrs = peer.contains("mr_info") ? peer["mr_info"] : nlohmann::json::object();
  if (!mrs.is_object()) throw ConnectionError("peer endpoint_info: 'mr_info' must be an object");
  // A peer without one (an older version) takes no notifications: send_notify fails
  // NOT_CONNECTED, naming it.
  const std::string notify_socket = peer.contains("notify_socket") ? text("notify_socket") : std::string();
  {
    std::lock_guard lock(mu_);
    if (closed_) throw ConnectionError("NVLinkEndpoint is shut down");
    if (connecting_) throw ConnectionError("NVLinkEndpoint: another connect() is in progress");
    if (connected_) {
      // Only a peer whose exit this endpoint has seen can be replaced: a live one may still
      // copy into our regions, and there is no channel to tell it to stop.
      if (!peer_exited_locked()) {
        throw ConnectionError("NVLinkEndpoint is already connected, to a peer that is alive or whose exit it cannot "
                              "see: it connects to another peer only once its peer has exited");
      }
      drop_dead_peer_locked();
    }
    // The peer's exit is seen through a pidfd (poll says readable once it has exited), where
    // its pid means the same process here: the same pid namespace.
    if (peer_pidfd_ >= 0) ::close(peer_pidfd_);  // left by a connect that failed opening the regions
    peer_pidfd_ = -1;
    peer_pid_ = 0;
    if (process != process_token() && pid_ns == pid_namespace() && pid > 0) {
      const int fd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
      if (fd < 0 && errno == ESRCH) throw ConnectionError(fmt::format("the peer process (pid {}) has exited", pid));
      peer_pidfd_ = fd;  // -1 (an old kernel): the peer's exit goes unseen, its memory stays mapped
      peer_pid_ = pid;
    }
    connecting_ = true;
    peer_is_this_process_ = process == process_token();
  }
  try {
    // Every published region, opened now; one that cannot be opened fails only its own ops.
    for (const auto& item : mrs.items()) add_remote(item.key(), item.value(), /*strict=*/false);
    if (!notify_socket.empty()) {
      // Whose dial our channel accepts: the peer's pid where it means the same process.
      const int64_t accept_from = process == process_token() ? int64_t{getpid()} : pid_ns == pid_namespace() ? pid : 0;
      notes_->connect(notify_socket, accept_from);
    }
  } catch (...) {
    std::lock_guard lock(mu_);
    connecting_ = false;
    throw;
  }
  std::lock_guard lock(mu_);
  connecting_ = false;
  connected_ = true;
}

void NVLinkEndpointImpl::drop_dead_peer_locked() {
  // The dead peer's regions stay under their names and handles, so that a handle is never
  // reused for another region, but they fail UNKNOWN_HANDLE from now on, and their mappings
  // go: ipc_close once no endpoint of this process and no op uses them. Ops already queued
  // on them are not waited for: each holds its mappings (Op::mappings) until its copies have
  // run, and completes as it would have (the memory stays mapped until then), while this
  // connect goes on. A new peer's region of the same name takes the entry over (add()).
  remote_.drop_all(fmt::format("was dropped: the peer process (pid {}) that published it has exited", peer_pid_));
  ::close(peer_pidfd_);
  peer_pidfd_ = -1;
  connected_ = false;
}

bool NVLinkEndpointImpl::is_connected() const {
  std::lock_guard lock(mu_);
  return connected_ && !closed_ && !peer_exited_locked();
}

bool NVLinkEndpointImpl::peer_exited_locked() const {
  if (peer_pidfd_ < 0) return false;
  pollfd p{peer_pidfd_, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

int32_t NVLinkEndpointImpl::add_remote(const std::string& name, const nlohmann::json& entry, bool strict) {
  RemoteKey key;
  uint64_t length = 0;
  std::string unusable;  // non-empty: kept under its name, its ops fail with this
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
    if (entry.is_object() && entry.contains("not_exported") && entry["not_exported"].is_string()) {
      throw InvalidArgumentError(fmt::format("remote memory region '{}' was not exported by the peer: {}", name,
                                             entry["not_exported"].get<std::string>()));
    }
    if (!entry.contains("ipc_handle")) {
      throw InvalidArgumentError(fmt::format("remote memory region '{}' is not device memory the peer exported "
                                             "(memory: {}); NVLink reaches only GPU memory",
                                             name, entry.is_object() && entry.contains("memory")
                                                       ? entry["memory"].dump()
                                                       : std::string("unknown")));
    }
    const bool same_process = entry.contains("process") && entry["process"] == process_token();
    if (same_process) {
      // Our own memory: a process cannot open its own IPC handle (CUDA), and needs none. The
      // region is found by handle in the exporting endpoint's registry, never by the record's
      // address, and only for a peer that is this process.
      bool peer_here = false;
      {
        std::lock_guard lock(mu_);
        peer_here = peer_is_this_process_;
      }
      if (!peer_here) {
        // Well formed, but not this connection's to name: kept under its name like a dead
        // peer's region (even from register_remote_memory_region), and its ops fail with why.
        unusable = "names this process, but the peer is another one (or none is connected): refused";
        DLSLIME_WARN("NVLink: remote memory region '{}' {}", name, unusable);
      } else if (!entry.contains("domain") || !entry["domain"].is_string()) {
        throw InvalidArgumentError(fmt::format("remote memory region '{}' names this process but no 'domain'", name));
      } else {
        const uint64_t owner_handle = number("handle");
        key.owner = NvlinkDomain::find(entry["domain"].get<std::string>());
        std::shared_ptr<MemoryRegistry> owner_regions = key.owner ? key.owner->registry() : nullptr;
        std::optional<LocalRegion> region;
        if (owner_regions && owner_handle <= static_cast<uint64_t>(INT32_MAX)) {
          key.owner_handle = static_cast<int32_t>(owner_handle);
          if (key.owner->exported(key.owner_handle)) region = owner_regions->get(key.owner_handle);
        }
        if (!region) {
          throw InvalidArgumentError(fmt::format("remote memory region '{}': no NVLink endpoint of this process exports "
                                                 "GPU memory under domain {} and handle {}",
                                                 name, entry["domain"].dump(), owner_handle));
        }
        if (length > region->length) {
          throw InvalidArgumentError(fmt::format("remote memory region '{}': the record's length {} is longer than the "
                                                 "registered region ({} bytes)",
                                                 name, length, region->length));
        }
      }
    } else {
      if (!entry["ipc_handle"].is_string()) {
        throw InvalidArgumentError(fmt::format("remote memory region '{}': 'ipc_handle' must be a hex string", name));
      }
      const gpu::IpcHandle handle = gpu::IpcHandle::from_hex(entry["ipc_handle"].get<std::string>());
      const uint64_t offset = number("alloc_offset");
      key.mapping = open_mapping(handle, options.device);
      // The owner's published place must lie in the allocation its handle opened: a copy
      // past it would fault the GPU context (on CUDA, for every user of the process).
      if (!range_within(key.mapping->size, offset, length)) {
        throw InvalidArgumentError(fmt::format("remote memory region '{}': [{}, +{}) runs past the peer's allocation "
                                               "({} bytes)",
                                               name, offset, length, key.mapping->size));
      }
      key.addr = reinterpret_cast<uintptr_t>(key.mapping->base) + offset;
    }
  } catch (const std::exception& e) {
    if (strict) throw;
    unusable = fmt::format("could not be opened: {}", e.what());
    DLSLIME_DEBUG("NVLink: remote region '{}' is unusable: {}", name, e.what());
  }
  return unusable.empty() ? remote_.add(name, length, std::move(key)) : remote_.add_unusable(name, std::move(unusable));
}

Future NVLinkEndpointImpl::submit(OpRequest request, std::optional<gpu::Stream> stream) {
  auto state = std::make_shared<OpState>(request.kind);
  Future future(state);
  auto fail = [&](Status status) {
    state->complete(std::move(status));
    return future;
  };
  const bool is_read = request.kind == OpKind::kRead;
  struct Copy {
    void* dst;
    const void* src;
    uint64_t n;
  };
  if (request.kind == OpKind::kSendNotify || request.kind == OpKind::kRecvNotify) {
    {
      std::lock_guard lock(mu_);
      if (closed_) return fail(Status::cancelled("NVLinkEndpoint is shut down"));
    }
    if (request.kind == OpKind::kRecvNotify) {
      return notes_->receive(OpLimit::of(request.timeout, options.recv_timeout, "recv_timeout"));
    }
    return notes_->send(std::move(*request.notification), OpLimit::of(request.timeout, options.op_timeout, "op_timeout"));
  }
  std::vector<Copy> copies;
  copies.reserve(request.assignments.size());
  std::unique_lock lock(mu_);
  if (closed_) return lock.unlock(), fail(Status::cancelled("NVLinkEndpoint is shut down"));
  if (!connected_) return lock.unlock(), fail(Status::not_connected("NVLinkEndpoint is not connected"));
  if (peer_exited_locked()) {
    return lock.unlock(), fail(Status::peer_closed(fmt::format("the peer process (pid {}) has exited", peer_pid_)));
  }
  // Resolve every item first: a bad one fails this op, and nothing of it is queued.
  Op op;
  op.state = state;
  ResolveCache cache;
  RemoteRegions<RemoteKey>::Cache remote_cache;
  int32_t checked_local = -1;
  const Mapping* held = nullptr;
  for (const Assignment& a : request.assignments) {
    uintptr_t local = 0;
    if (Status st = regions->resolve(a.local_handle, a.source_offset, a.length, &local, cache); !st) {
      return lock.unlock(), fail(std::move(st));
    }
    op.uses.hold(cache);
    if (a.local_handle != checked_local) {
      if (!domain_->exported(a.local_handle)) {
        return lock.unlock(), fail(Status::invalid_argument(domain_->unexported_reason(a.local_handle)));
      }
      checked_local = a.local_handle;
    }
    RemoteKey rk;
    if (Status st = remote_.resolve(a.remote_handle, a.target_offset, a.length, &rk, remote_cache); !st) {
      return lock.unlock(), fail(std::move(st));
    }
    if (rk.owner) {
      // This process's own region: resolved where it is registered, every time (it may have
      // been unregistered), and held while the copies run.
      uintptr_t own = 0;
      if (!rk.owner->exported(rk.owner_handle)) {
        return lock.unlock(), fail(Status::unknown_handle(fmt::format(
                                  "remote memory region {} was unregistered by its owner", a.remote_handle)));
      }
      std::shared_ptr<MemoryRegistry> owner_regions = rk.owner->registry();
      ResolveCache owner_cache;
      Status st = owner_regions ? owner_regions->resolve(rk.owner_handle, a.target_offset, a.length, &own, owner_cache)
                                : Status::unknown_handle("its owner endpoint is gone");
      if (!st) {
        return lock.unlock(), fail(Status(st.code(), fmt::format("remote memory region {}: {}", a.remote_handle,
                                                                 st.message())));
      }
      op.uses.hold(owner_cache);
      rk.addr = own - a.target_offset;  // so that rk.addr + target_offset below is `own`
    }
    if (rk.mapping && rk.mapping.get() != held) {
      op.mappings.push_back(rk.mapping);  // the peer's memory stays mapped until the copies ran
      held = rk.mapping.get();
    }
    if (a.length == 0) continue;
    auto* remote = reinterpret_cast<void*>(rk.addr + a.target_offset);
    auto* mine = reinterpret_cast<void*>(local);
    copies.push_back(is_read ? Copy{mine, remote, a.length} : Copy{remote, mine, a.length});
    op.nbytes += a.length;
  }
  op.limit = OpLimit::of(request.timeout, options.op_timeout, "op_timeout");
  op.deadline = op.limit.deadline();

  const gpu::Stream s = stream ? *stream : stream_;
  size_t queued = 0;
  try {
    for (; queued < copies.size(); ++queued) rt_.memcpy_async(copies[queued].dst, copies[queued].src, copies[queued].n, s);
  } catch (const Error& e) {
    op.error = Status(e.code(), fmt::format("{}: queuing copy {} of {} failed: {}", op_kind_name(request.kind),
                                            queued + 1, copies.size(), e.what()));
  }
  if (queued == 0 && !op.error.is_ok()) return lock.unlock(), fail(std::move(op.error));
  try {
    op.event = take_event_locked();
    rt_.event_record(op.event, s);
  } catch (const Error& e) {
    // The stream took the copies but not the event: wait for the stream's work here (rare,
    // a broken context), so the op never completes while its copies may run.
    if (op.event != nullptr) free_events_.push_back(op.event);
    DLSLIME_WARN("NVLinkEndpoint: recording a completion event failed ({}); waiting for the copies", e.what());
    gpu::Event tmp = nullptr;
    try {
      tmp = rt_.event_create(options.device);
      rt_.event_record(tmp, s);
      rt_.event_synchronize(tmp);
      rt_.event_destroy(tmp);
    } catch (const Error&) {
    }
    return lock.unlock(), fail(Status(e.code(), fmt::format("{}: recording its completion event failed: {}",
                                                            op_kind_name(request.kind), e.what())));
  }
  // Wakes the completion thread once the copies ran. The box keeps the waker alive for a
  // callback that runs after this endpoint is gone.
  auto* box = new std::shared_ptr<Waker>(waker_);
  try {
    rt_.launch_host_func(s, &Waker::callback, box);
  } catch (const Error& e) {
    delete box;  // the safety poll finds the event instead
    DLSLIME_DEBUG("NVLinkEndpoint: launch_host_func failed: {}", e.what());
  }
  pending_.push_back(std::move(op));
  lock.unlock();
  waker_->notify();  // the thread's wait bound changes with pending ops
  return future;
}

gpu::Event NVLinkEndpointImpl::take_event_locked() {
  if (!free_events_.empty()) {
    gpu::Event e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  return rt_.event_create(options.device);
}

void NVLinkEndpointImpl::Waker::callback(void* arg) {
  auto* box = static_cast<std::shared_ptr<Waker>*>(arg);
  (*box)->notify();
  delete box;
}

void NVLinkEndpointImpl::Waker::notify() {
  {
    std::lock_guard lock(mu);
    ++count;
  }
  cv.notify_all();
}

void NVLinkEndpointImpl::run() {
  struct Done {
    std::shared_ptr<OpState> state;
    Status status;
    uint64_t nbytes;
  };
  std::vector<Done> done;
  for (;;) {
    uint64_t seen;
    {
      std::lock_guard lock(waker_->mu);
      seen = waker_->count;  // before the sweep: a callback after it wakes the wait below
    }
    bool has_pending;
    {
      std::lock_guard lock(mu_);
      for (auto it = pending_.begin(); it != pending_.end();) {
        Status status;
        bool finished = false;
        try {
          finished = rt_.event_query(it->event);
        } catch (const Error& e) {
          finished = true;  // the copies failed on the device: they are not running any more
          status = Status(e.code(), fmt::format("{} failed on the GPU: {}", op_kind_name(it->state->kind()), e.what()));
        }
        if (!finished) {
          ++it;
          continue;
        }
        if (status.is_ok()) status = it->error;
        if (status.is_ok() && Clock::now() > it->deadline) {
          status = Status::timeout(fmt::format("{} did not complete within {}: its copies finished after its deadline",
                                               op_kind_name(it->state->kind()), it->limit.describe()));
        }
        free_events_.push_back(it->event);
        done.push_back({std::move(it->state), std::move(status), it->nbytes});
        it = pending_.erase(it);  // drops the op's region uses and mappings first
      }
      has_pending = !pending_.empty();
      if (!done.empty()) drained_cv_.notify_all();
      if (closed_ && !has_pending && done.empty()) break;
    }
    if (!done.empty()) {
      CompletionScope scope;  // continuations run after this turn's bookkeeping
      for (Done& d : done) {
        const uint64_t nbytes = d.status.is_ok() ? d.nbytes : 0;
        d.state->complete(std::move(d.status), nbytes);
      }
      done.clear();
      continue;
    }
    std::unique_lock lock(waker_->mu);
    auto woken = [&] { return waker_->count != seen; };
    if (has_pending) {
      waker_->cv.wait_for(lock, kSafetyPoll, woken);
    } else {
      waker_->cv.wait(lock, woken);
    }
  }
}

void NVLinkEndpointImpl::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = true;
    // A queued GPU copy cannot be taken back: these ops complete CANCELLED once their
    // copies have run (their bytes may have arrived), never before.
    for (Op& op : pending_) {
      if (op.error.is_ok()) {
        op.error = Status::cancelled(fmt::format("{}: NVLinkEndpoint was shut down while its copies ran",
                                                 op_kind_name(op.state->kind())));
      }
    }
  }
  waker_->notify();  // an idle completion thread ends now; a busy one once its ops are done
  notes_->shutdown();
}

void NVLinkEndpointImpl::revoke_region(const RegionLifetime& lifetime) {
  // The GPU copies using it cannot be revoked: wait for them (never on the completion
  // thread itself, which must complete them).
  if (on_own_thread()) return;
  std::unique_lock lock(mu_);
  drained_cv_.wait(lock, [&] {
    return std::none_of(pending_.begin(), pending_.end(), [&](const Op& op) { return op.uses.holds(&lifetime); });
  });
}

bool NVLinkEndpointImpl::on_own_thread() const { return thread_.is_current(); }

std::optional<int32_t> NVLinkEndpointImpl::remote_handle(const std::string& name) const { return remote_.find(name); }

// --- NVLinkEndpoint ------------------------------------------------------------------------

namespace {
// The stream of the submit in progress on this thread (read_on/write_on): Endpoint::submit
// checks the request and calls do_submit on the same thread.
thread_local std::optional<gpu::Stream> t_stream;
struct StreamScope {
  explicit StreamScope(void* stream) { t_stream = static_cast<gpu::Stream>(stream); }
  ~StreamScope() { t_stream.reset(); }
};
}  // namespace

NVLinkEndpoint::NVLinkEndpoint(NvlinkOptions options)
    : NVLinkEndpoint(std::move(options), std::make_shared<MemoryRegistry>()) {}

NVLinkEndpoint::NVLinkEndpoint(NvlinkOptions options, std::shared_ptr<MemoryRegistry> regions)
    : impl_(std::make_shared<NVLinkEndpointImpl>(std::move(options), std::move(regions))) {
  impl_->start();
  order_notifications(submit_while_alive(impl_));
}

NVLinkEndpoint::~NVLinkEndpoint() {
  shutdown();
  // The completion thread ends with the endpoint, once its queued copies have run
  // (core/completion_thread.h).
  if (!inherited_from_parent()) impl_->join_thread();
}

nlohmann::json NVLinkEndpoint::endpoint_info() const { return impl_->endpoint_info(); }
void NVLinkEndpoint::connect(const nlohmann::json& peer_info) {
  require_own_process();
  impl_->connect(peer_info);
}
bool NVLinkEndpoint::is_connected() const { return impl_->is_connected(); }

int32_t NVLinkEndpoint::register_memory_region(const std::string& name, uintptr_t addr, uint64_t offset,
                                               uint64_t length) {
  require_own_process();
  if (impl_->is_shut_down()) refuse_after_shutdown("register_memory_region");
  if (offset > UINTPTR_MAX - addr) {
    throw InvalidArgumentError(fmt::format("memory region '{}': address {:#x} + offset {} overflows", name, addr, offset));
  }
  const uintptr_t start = addr + offset;
  const gpu::PointerInfo info = gpu::runtime().pointer_info(reinterpret_cast<const void*>(start));
  if (info.type != gpu::MemoryType::kDevice) {
    throw InvalidArgumentError(fmt::format("NVLinkEndpoint registers GPU memory only: memory region '{}' at {:#x} is {} "
                                           "memory (use TcpEndpoint or RDMAEndpoint for host memory)",
                                           name, start, gpu::memory_type_name(info.type)));
  }
  const int32_t handle = impl_->regions->add(name, addr, offset, length);
  // Registered on this endpoint, for NVLink: memory it cannot export is refused here, as
  // host memory is above (a registry shared with other transports keeps such a region for
  // them; see NvlinkDomain).
  if (std::optional<std::string> why = impl_->export_refusal(handle)) {
    impl_->regions->remove(handle);
    throw InvalidArgumentError(*why);
  }
  return handle;
}
int32_t NVLinkEndpoint::register_remote_memory_region(const std::string& name, const nlohmann::json& entry) {
  require_own_process();
  return impl_->add_remote(name, entry, /*strict=*/true);
}
void NVLinkEndpoint::unregister_memory_region(const std::string& name) {
  require_own_process();
  impl_->regions->remove(name);
}
void NVLinkEndpoint::unregister_memory_region(int32_t handle) {
  require_own_process();
  impl_->regions->remove(handle);
}
nlohmann::json NVLinkEndpoint::mr_info() const { return impl_->mr_info(); }
nlohmann::json NVLinkEndpoint::mr_info_of(const std::string& name) const { return impl_->mr_info_of(name); }

Future NVLinkEndpoint::read_on(std::vector<Assignment> assignments, void* stream, std::chrono::milliseconds timeout) {
  StreamScope scope(stream);
  return read(std::move(assignments), timeout);
}
Future NVLinkEndpoint::write_on(std::vector<Assignment> assignments, void* stream, std::chrono::milliseconds timeout,
                                std::optional<std::string> notification) {
  StreamScope scope(stream);
  return write(std::move(assignments), timeout, std::move(notification));
}

std::optional<int32_t> NVLinkEndpoint::local_handle(const std::string& name) const { return impl_->regions->find(name); }
std::optional<int32_t> NVLinkEndpoint::remote_handle(const std::string& name) const { return impl_->remote_handle(name); }

Capabilities NVLinkEndpoint::capabilities() const {
  Capabilities caps;
  caps.transport = "nvlink";
  caps.read = caps.write = caps.notify = true;
  caps.device_memory = true;
  return caps;
}

void NVLinkEndpoint::shutdown() {
  // In a fork() child the endpoint's threads are the parent's, and its IPC mappings and
  // streams are the parent's GPU objects.
  if (leave_if_inherited(impl_)) return;
  impl_->shutdown();
}
Future NVLinkEndpoint::do_submit(OpRequest request) {
  std::optional<gpu::Stream> stream = t_stream;
  t_stream.reset();  // this submit's only
  return impl_->submit(std::move(request), stream);
}
const NvlinkOptions& NVLinkEndpoint::options() const { return impl_->options; }

}  // namespace dlslime
