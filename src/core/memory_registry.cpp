#include "core/memory_registry.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <shared_mutex>

#include <fmt/format.h>

#include "core/host_mappings.h"
#include "core/log.h"
#include "dlslime/errors.h"
#include "gpu/device_runtime.h"

namespace dlslime {

namespace {

// The cached resolve of both tables: refreshes `cache` when it holds another handle (one
// lookup under the table's lock) and reports whether [offset, offset+length) lies inside
// the cached region. On false the caller's uncached resolve produces the error.
template <class Regions, class Fill>
bool cached_range(ResolveCache& cache, std::mutex& mu, const Regions& regions, int32_t handle, uint64_t offset,
                  uint64_t length, Fill fill) {
  if (!cache.valid || cache.handle != handle) {
    std::lock_guard lock(mu);
    auto it = regions.find(handle);
    cache.handle = handle;
    cache.valid = it != regions.end();
    if (cache.valid) {
      fill(it->second, cache);  // may find the region is not the caller's to use
      cache.length = it->second.length;
      if (!cache.valid) cache.use = RegionUse();
    } else {
      cache.use = RegionUse();
    }
  }
  return cache.valid && range_within(cache.length, offset, length);
}

}  // namespace

namespace {
std::shared_mutex probes_mu;
std::vector<DeviceMemoryProbe>& probes() {
  static std::vector<DeviceMemoryProbe> all;
  return all;
}
// A transport's own device memory (an NPU's), else host memory.
MemoryPlace transport_memory_place(uintptr_t start, uint64_t length) {
  std::shared_lock lock(probes_mu);
  for (const DeviceMemoryProbe& probe : probes()) {
    if (std::optional<MemoryPlace> place = probe(start, length)) return *place;
  }
  return {};
}
}  // namespace

void add_device_memory_probe(DeviceMemoryProbe probe) {
  std::unique_lock lock(probes_mu);
  probes().push_back(std::move(probe));
}

MemoryPlace memory_place_of(uintptr_t addr) {
  gpu::Runtime* rt = nullptr;
  try {
    rt = &gpu::runtime();
  } catch (const gpu::GpuUnavailableError&) {
    return transport_memory_place(addr, 1);
  }
  const gpu::PointerInfo info = rt->pointer_info(reinterpret_cast<const void*>(addr));
  if (info.type != gpu::MemoryType::kDevice) return transport_memory_place(addr, 1);
  return {MemoryKind::kDevice, info.device};
}

MemoryPlace memory_place_of(std::string_view what, uintptr_t start, uint64_t length) {
  // Device memory must lie inside one allocation: IPC handles, dma-bufs and staging
  // copies all name allocations.
  if (length == 0) return {};
  gpu::Runtime* rt = nullptr;
  try {
    rt = &gpu::runtime();
  } catch (const gpu::GpuUnavailableError&) {
  }
  if (rt == nullptr || rt->pointer_info(reinterpret_cast<const void*>(start)).type != gpu::MemoryType::kDevice) {
    try {
      return transport_memory_place(start, length);
    } catch (const InvalidArgumentError& e) {
      throw InvalidArgumentError(fmt::format("{}: {}", what, e.what()));
    }
  }
  const MemoryPlace where = memory_place_of(start);
  const gpu::AddressRange range = gpu::runtime().allocation_range(reinterpret_cast<const void*>(start));
  if (start < range.base || !range_within(range.size, start - range.base, length)) {
    throw InvalidArgumentError(fmt::format("{}: [{:#x}, +{}) runs past its device allocation [{:#x}, +{})", what,
                                           start, length, range.base, range.size));
  }
  return where;
}

void RegionLifetime::release() noexcept {
  if (users_.fetch_sub(1, std::memory_order_seq_cst) == 1 && draining_.load(std::memory_order_seq_cst)) {
    std::lock_guard lock(mu_);  // the waiter is either before its check or inside wait
    cv_.notify_all();
  }
}

bool RegionLifetime::wait_unused(std::chrono::steady_clock::time_point deadline) {
  draining_.store(true, std::memory_order_seq_cst);
  std::unique_lock lock(mu_);
  return cv_.wait_until(lock, deadline, [&] { return users_.load(std::memory_order_seq_cst) == 0; });
}

void RegionUses::take(RegionUses&& other) {
  for (auto& u : other.uses_) {
    if (uses_.empty() || uses_.back().lifetime() != u.lifetime()) uses_.push_back(std::move(u));
  }
  other.uses_.clear();
}

bool RegionUses::holds(const RegionLifetime* lifetime) const noexcept {
  for (const auto& u : uses_) {
    if (u.lifetime() == lifetime) return true;
  }
  return false;
}

void MemoryRegistry::watch(std::weak_ptr<RegionRevoker> revoker) {
  std::lock_guard lock(mu_);
  std::erase_if(revokers_, [](const auto& w) { return w.expired(); });
  revokers_.push_back(std::move(revoker));
}

void MemoryRegistry::drain(const std::shared_ptr<RegionLifetime>& lifetime) {
  if (lifetime->users() == 0) return;  // the common case: nothing in flight
  std::vector<std::shared_ptr<RegionRevoker>> revokers;
  {
    std::lock_guard lock(mu_);
    for (const auto& w : revokers_) {
      if (auto r = w.lock()) revokers.push_back(std::move(r));
    }
  }
  // On a thread that must itself drop the uses (a completion callback on an I/O thread),
  // waiting would only run out the deadline: revoke at once.
  const bool on_io_thread = std::any_of(revokers.begin(), revokers.end(), [](auto& r) { return r->on_own_thread(); });
  const auto timeout = std::chrono::milliseconds(drain_timeout_.load());
  if (!on_io_thread && lifetime->wait_unused(std::chrono::steady_clock::now() + timeout)) return;
  DLSLIME_WARN("unregistering region '{}' (handle {}): {} transfer(s) still use it{}; revoking them",
               lifetime->name(), lifetime->handle(), lifetime->users(),
               on_io_thread ? " (called on an I/O thread)" : fmt::format(" after {} ms", timeout.count()));
  for (auto& r : revokers) r->revoke_region(*lifetime);
  if (!lifetime->wait_unused(std::chrono::steady_clock::now() + std::chrono::seconds(5))) {
    throw TimeoutError(fmt::format(
        "region '{}' is still in use by {} transfer(s) after they were revoked; do not free its memory",
        lifetime->name(), lifetime->users()));
  }
}

const char* memory_kind_name(MemoryKind kind) noexcept {
  switch (kind) {
    case MemoryKind::kHost: return "host";
    case MemoryKind::kDevice: return "device";
    case MemoryKind::kNpu: return "npu";
  }
  return "unknown";
}

const OwnerResolvedDomain& OwnerResolvedDomain::instance() {
  static const OwnerResolvedDomain domain;
  return domain;
}

nlohmann::json OwnerResolvedDomain::describe(int32_t handle, const LocalRegion& r) const {
  nlohmann::json entry = {{"handle", handle}, {"addr", r.addr}, {"length", r.length}};
  // Where the bytes live, for an initiator that picks how to move them (TCP's same-host
  // path cannot place bytes in device memory). Host memory says nothing, as before.
  if (r.kind != MemoryKind::kHost) entry["memory"] = memory_kind_name(r.kind);
  return entry;
}

void MemoryRegistry::attach(std::weak_ptr<MemoryDomain> domain) {
  auto d = domain.lock();
  if (!d) return;
  std::vector<std::pair<int32_t, LocalRegion>> existing;
  {
    std::lock_guard lock(mu_);
    std::erase_if(domains_, [](const auto& w) { return w.expired(); });
    domains_.push_back(std::move(domain));
    existing.assign(regions_.begin(), regions_.end());
  }
  for (const auto& [handle, region] : existing) {
    if (d->takes(region.kind)) d->region_added(handle, region);
  }
}

std::vector<std::shared_ptr<MemoryDomain>> MemoryRegistry::domains() const {
  std::vector<std::shared_ptr<MemoryDomain>> out;
  std::lock_guard lock(mu_);
  for (const auto& w : domains_) {
    if (auto d = w.lock()) out.push_back(std::move(d));
  }
  return out;
}

LocalRegion MemoryRegistry::erase_locked(int32_t handle) {
  auto it = regions_.find(handle);
  LocalRegion region = std::move(it->second);
  regions_.erase(it);
  by_name_.erase(region.name);
  for (auto [a, b] = by_addr_.equal_range(region.addr); a != b; ++a) {
    if (a->second == handle) {
      by_addr_.erase(a);
      break;
    }
  }
  return region;
}

void MemoryRegistry::retire(int32_t handle, const LocalRegion& region) {
  drain(region.lifetime);  // throws TimeoutError if a use outlives its revocation
  for (const auto& d : domains()) {
    if (!d->takes(region.kind)) continue;
    try {
      d->region_removed(handle, region);
    } catch (const std::exception& e) {
      DLSLIME_WARN("memory region '{}': a memory domain failed to release it: {}", region.name, e.what());
    }
  }
}

RegionDmabuf::RegionDmabuf(int fd, uint64_t offset) : fd_(::fcntl(fd, F_DUPFD_CLOEXEC, 0)), offset_(offset) {
  if (fd_ < 0) {
    throw InvalidArgumentError(fmt::format("dma-buf fd {} cannot be duplicated: {}", fd, std::strerror(errno)));
  }
}
RegionDmabuf::~RegionDmabuf() { ::close(fd_); }

int32_t MemoryRegistry::add(const std::string& name, uintptr_t addr, uint64_t offset, uint64_t length,
                            std::shared_ptr<const RegionDmabuf> dmabuf) {
  if (name.empty()) throw InvalidArgumentError("memory region name must not be empty");
  if (addr == 0 && length > 0) throw InvalidArgumentError(fmt::format("memory region '{}': address is null", name));
  constexpr uint64_t kMax = std::numeric_limits<uintptr_t>::max();
  if (offset > kMax - addr || length > kMax - addr - offset) {
    throw InvalidArgumentError(
        fmt::format("memory region '{}': addr {:#x} + offset {} + length {} overflows the address space", name, addr,
                    offset, length));
  }
  const uintptr_t start = addr + offset;
  const auto [kind, device] = memory_place_of(fmt::format("memory region '{}'", name), start, length);
  // Host memory the process cannot read would fault an I/O thread on first use (a dma-buf's
  // iova is no address of this process: its fd is what is registered). Read-only memory is
  // taken: a NIC registers it for remote reads (docs/rdma.md, "Read-only memory").
  if (kind == MemoryKind::kHost && !dmabuf) {
    if (auto why = host_pages_problem(start, length, /*write=*/false)) {
      throw InvalidArgumentError(
          fmt::format("memory region '{}': [{:#x}, +{}) cannot be registered: {}", name, start, length, *why));
    }
  }
  std::optional<std::pair<int32_t, LocalRegion>> replaced;
  int32_t handle = 0;
  LocalRegion added;
  {
    std::lock_guard lock(mu_);
    if (auto it = by_name_.find(name); it != by_name_.end()) {
      const LocalRegion& old = regions_.at(it->second);
      if (old.addr == start && old.length == length && old.kind == kind && old.device == device && !old.dmabuf &&
          !dmabuf) {
        return it->second;
      }
      const int32_t old_handle = it->second;
      replaced.emplace(old_handle, erase_locked(old_handle));
    }
    if (next_handle_ == std::numeric_limits<int32_t>::max()) throw InvalidArgumentError("region handles exhausted");
    handle = next_handle_++;
    added = LocalRegion{name,   start, length, kind, device, next_generation_++, std::make_shared<RegionLifetime>(handle, name),
                        std::move(dmabuf)};
    regions_.emplace(handle, added);
    by_name_.emplace(name, handle);
    by_addr_.emplace(start, handle);
    longest_ = std::max(longest_, length);
  }
  // The caller may reuse or free the old bytes once this returns.
  if (replaced) retire(replaced->first, replaced->second);
  for (const auto& d : domains()) {
    if (!d->takes(added.kind)) continue;
    try {
      d->region_added(handle, added);
    } catch (...) {
      // A domain that cannot take the region (RDMA cannot register it) fails the whole
      // registration: no transport may see a region another one refused.
      {
        std::lock_guard lock(mu_);
        if (regions_.count(handle) != 0) erase_locked(handle);
      }
      retire(handle, added);
      throw;
    }
  }
  return handle;
}

void MemoryRegistry::remove(const std::string& name) {
  int32_t handle = 0;
  LocalRegion region;
  {
    std::lock_guard lock(mu_);
    auto it = by_name_.find(name);
    if (it == by_name_.end()) throw NotFoundError(fmt::format("no local memory region named '{}'", name));
    handle = it->second;
    region = erase_locked(handle);
  }
  retire(handle, region);
}

void MemoryRegistry::remove(int32_t handle) {
  LocalRegion region;
  {
    std::lock_guard lock(mu_);
    if (regions_.count(handle) == 0) {
      throw NotFoundError(fmt::format("no local memory region with handle {}", handle));
    }
    region = erase_locked(handle);
  }
  retire(handle, region);
}

Status MemoryRegistry::resolve(int32_t handle, uint64_t offset, uint64_t length, uintptr_t* out, bool npu) const {
  std::lock_guard lock(mu_);
  auto it = regions_.find(handle);
  if (it == regions_.end()) return Status::unknown_handle(fmt::format("no memory region with handle {}", handle));
  const LocalRegion& r = it->second;
  if (r.kind == MemoryKind::kNpu && !npu) {
    return Status::invalid_argument(fmt::format("memory region '{}' (handle {}) is NPU memory, which only the ascend "
                                                "transport moves",
                                                r.name, handle));
  }
  if (!range_within(r.length, offset, length)) {
    return Status::out_of_bounds(fmt::format("range [{}, {}+{}) is outside region '{}' (handle {}, {} bytes)", offset,
                                             offset, length, r.name, handle, r.length));
  }
  *out = r.addr + offset;
  return Status::ok();
}

Status MemoryRegistry::resolve(int32_t handle, uint64_t offset, uint64_t length, uintptr_t* out,
                                 ResolveCache& cache) const {
  const auto fill = [](const LocalRegion& r, ResolveCache& c) {
    c.base = r.addr;
    c.use = RegionUse(r.lifetime);  // under the table's lock: see drain()
    if (r.kind == MemoryKind::kNpu && !c.npu) c.valid = false;  // refused below, with why
  };
  if (!cached_range(cache, mu_, regions_, handle, offset, length, fill)) {
    return resolve(handle, offset, length, out, cache.npu);  // the error, with its message
  }
  *out = static_cast<uintptr_t>(cache.base + offset);
  return Status::ok();
}

std::optional<int32_t> MemoryRegistry::find(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::optional<RegionMatch> MemoryRegistry::find_containing(uintptr_t addr, uint64_t length) const {
  std::lock_guard lock(mu_);
  std::optional<RegionMatch> best;
  uint64_t best_generation = 0;
  // Regions starting at or before addr, nearest first, back to the furthest start from
  // which the longest region ever registered could still reach addr.
  for (auto it = by_addr_.upper_bound(addr); it != by_addr_.begin();) {
    --it;
    if (addr - it->first > longest_) break;
    const LocalRegion& r = regions_.at(it->second);
    if (range_within(r.length, addr - r.addr, length) && r.generation > best_generation) {
      best = RegionMatch{it->second, addr - r.addr};
      best_generation = r.generation;
    }
  }
  return best;
}

std::optional<LocalRegion> MemoryRegistry::get(int32_t handle) const {
  std::lock_guard lock(mu_);
  auto it = regions_.find(handle);
  if (it == regions_.end()) return std::nullopt;
  return it->second;
}

size_t MemoryRegistry::size() const {
  std::lock_guard lock(mu_);
  return regions_.size();
}

nlohmann::json MemoryRegistry::mr_info_of(const std::string& name, const MemoryDomain& domain) const {
  std::lock_guard lock(mu_);
  auto named = by_name_.find(name);
  if (named == by_name_.end()) return nullptr;
  auto it = regions_.find(named->second);
  return it == regions_.end() || !domain.takes(it->second.kind) ? nlohmann::json()
                                                                 : domain.describe(it->first, it->second);
}

nlohmann::json MemoryRegistry::mr_info(const MemoryDomain& domain) const {
  std::lock_guard lock(mu_);
  nlohmann::json info = nlohmann::json::object();
  for (const auto& [handle, r] : regions_) {
    if (domain.takes(r.kind)) info[r.name] = domain.describe(handle, r);
  }
  return info;
}

}  // namespace dlslime
