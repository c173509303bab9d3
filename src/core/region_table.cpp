#include "core/region_table.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "core/log.h"
#include "dlslime/errors.h"

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
      fill(it->second, cache);
      cache.length = it->second.length;
    } else {
      cache.use = RegionUse();
    }
  }
  return cache.valid && range_within(cache.length, offset, length);
}

}  // namespace

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

void LocalRegionTable::watch(std::weak_ptr<RegionRevoker> revoker) {
  std::lock_guard lock(mu_);
  std::erase_if(revokers_, [](const auto& w) { return w.expired(); });
  revokers_.push_back(std::move(revoker));
}

void LocalRegionTable::drain(const std::shared_ptr<RegionLifetime>& lifetime) {
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

int32_t LocalRegionTable::add(const std::string& name, uintptr_t addr, uint64_t offset, uint64_t length) {
  if (name.empty()) throw InvalidArgumentError("memory region name must not be empty");
  if (addr == 0 && length > 0) throw InvalidArgumentError(fmt::format("memory region '{}': address is null", name));
  constexpr uint64_t kMax = std::numeric_limits<uintptr_t>::max();
  if (offset > kMax - addr || length > kMax - addr - offset) {
    throw InvalidArgumentError(
        fmt::format("memory region '{}': addr {:#x} + offset {} + length {} overflows the address space", name, addr,
                    offset, length));
  }
  const uintptr_t start = addr + offset;
  std::shared_ptr<RegionLifetime> replaced;
  int32_t handle = 0;
  {
    std::lock_guard lock(mu_);
    if (auto it = by_name_.find(name); it != by_name_.end()) {
      const LocalRegion& old = regions_.at(it->second);
      if (old.addr == start && old.length == length) return it->second;
      replaced = old.lifetime;
      regions_.erase(it->second);
      by_name_.erase(it);
    }
    if (next_handle_ == std::numeric_limits<int32_t>::max()) throw InvalidArgumentError("region handles exhausted");
    handle = next_handle_++;
    regions_.emplace(handle, LocalRegion{name, start, length, std::make_shared<RegionLifetime>(handle, name)});
    by_name_.emplace(name, handle);
  }
  if (replaced) drain(replaced);  // the caller may reuse or free the old bytes once this returns
  return handle;
}

void LocalRegionTable::remove(const std::string& name) {
  std::shared_ptr<RegionLifetime> lifetime;
  {
    std::lock_guard lock(mu_);
    auto it = by_name_.find(name);
    if (it == by_name_.end()) throw NotFoundError(fmt::format("no local memory region named '{}'", name));
    lifetime = regions_.at(it->second).lifetime;
    regions_.erase(it->second);
    by_name_.erase(it);
  }
  drain(lifetime);
}

void LocalRegionTable::remove(int32_t handle) {
  std::shared_ptr<RegionLifetime> lifetime;
  {
    std::lock_guard lock(mu_);
    auto it = regions_.find(handle);
    if (it == regions_.end()) throw NotFoundError(fmt::format("no local memory region with handle {}", handle));
    lifetime = it->second.lifetime;
    by_name_.erase(it->second.name);
    regions_.erase(it);
  }
  drain(lifetime);
}

Status LocalRegionTable::resolve(int32_t handle, uint64_t offset, uint64_t length, uintptr_t* out) const {
  std::lock_guard lock(mu_);
  auto it = regions_.find(handle);
  if (it == regions_.end()) return Status::unknown_handle(fmt::format("no memory region with handle {}", handle));
  const LocalRegion& r = it->second;
  if (!range_within(r.length, offset, length)) {
    return Status::out_of_bounds(fmt::format("range [{}, {}+{}) is outside region '{}' (handle {}, {} bytes)", offset,
                                             offset, length, r.name, handle, r.length));
  }
  *out = r.addr + offset;
  return Status::ok();
}

Status LocalRegionTable::resolve(int32_t handle, uint64_t offset, uint64_t length, uintptr_t* out,
                                 ResolveCache& cache) const {
  const auto fill = [](const LocalRegion& r, ResolveCache& c) {
    c.base = r.addr;
    c.use = RegionUse(r.lifetime);  // under the table's lock: see drain()
  };
  if (!cached_range(cache, mu_, regions_, handle, offset, length, fill)) {
    return resolve(handle, offset, length, out);  // the error, with its message
  }
  *out = static_cast<uintptr_t>(cache.base + offset);
  return Status::ok();
}

std::optional<int32_t> LocalRegionTable::find(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

size_t LocalRegionTable::size() const {
  std::lock_guard lock(mu_);
  return regions_.size();
}

nlohmann::json LocalRegionTable::mr_info() const {
  std::lock_guard lock(mu_);
  nlohmann::json info = nlohmann::json::object();
  for (const auto& [handle, r] : regions_) {
    info[r.name] = {{"handle", handle}, {"addr", r.addr}, {"length", r.length}};
  }
  return info;
}

int32_t RemoteRegionTable::add(const std::string& name, const nlohmann::json& entry) {
  if (name.empty()) throw InvalidArgumentError("remote memory region name must not be empty");
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!entry.is_object() || !entry.contains(key) || !entry[key].is_number_integer()) {
      throw InvalidArgumentError(fmt::format(
          "remote memory region '{}': mr_info entry needs an integer '{}' (got {})", name, key, entry.dump()));
    }
    return entry[key];
  };
  RemoteRegion region;
  region.name = name;
  const int64_t peer_handle = field("handle").get<int64_t>();
  if (peer_handle < 0 || peer_handle > std::numeric_limits<int32_t>::max()) {
    throw InvalidArgumentError(fmt::format("remote memory region '{}': handle {} out of range", name, peer_handle));
  }
  region.peer_handle = static_cast<int32_t>(peer_handle);
  if (field("length").is_number_unsigned() || field("length").get<int64_t>() >= 0) {
    region.length = field("length").get<uint64_t>();
  } else {
    throw InvalidArgumentError(fmt::format("remote memory region '{}': negative length", name));
  }
  if (entry.contains("addr") && entry["addr"].is_number_unsigned()) region.addr = entry["addr"].get<uint64_t>();

  std::lock_guard lock(mu_);
  if (auto it = by_name_.find(name); it != by_name_.end()) {
    regions_[it->second] = region;
    return it->second;
  }
  const auto handle = static_cast<int32_t>(regions_.size());
  regions_.emplace(handle, std::move(region));
  by_name_.emplace(name, handle);
  return handle;
}

Status RemoteRegionTable::resolve(int32_t handle, uint64_t offset, uint64_t length, int32_t* peer_handle) const {
  std::lock_guard lock(mu_);
  auto it = regions_.find(handle);
  if (it == regions_.end()) return Status::unknown_handle(fmt::format("no remote memory region with handle {}", handle));
  const RemoteRegion& r = it->second;
  if (!range_within(r.length, offset, length)) {
    return Status::out_of_bounds(fmt::format("range [{}, {}+{}) is outside remote region '{}' (handle {}, {} bytes)",
                                             offset, offset, length, r.name, handle, r.length));
  }
  *peer_handle = r.peer_handle;
  return Status::ok();
}

Status RemoteRegionTable::resolve(int32_t handle, uint64_t offset, uint64_t length, int32_t* peer_handle,
                                  ResolveCache& cache) const {
  const auto owner_handle = [](const RemoteRegion& r, ResolveCache& c) {
    c.base = uint64_t{static_cast<uint32_t>(r.peer_handle)};
  };
  if (!cached_range(cache, mu_, regions_, handle, offset, length, owner_handle)) {
    return resolve(handle, offset, length, peer_handle);  // the error, with its message
  }
  *peer_handle = static_cast<int32_t>(static_cast<uint32_t>(cache.base));
  return Status::ok();
}

std::optional<int32_t> RemoteRegionTable::find(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

void RemoteRegionTable::clear() {
  std::lock_guard lock(mu_);
  regions_.clear();
  by_name_.clear();
}

}  // namespace dlslime
