#include "core/region_table.h"

#include <limits>

#include <fmt/format.h>

#include "dlslime/errors.h"

namespace dlslime {

namespace {

// The cached resolve of both tables: refreshes `cache` when it holds another handle (one
// lookup under the table's lock) and reports whether [offset, offset+length) lies inside
// the cached region. On false the caller's uncached resolve produces the error.
template <class Regions, class BaseOf>
bool cached_range(ResolveCache& cache, std::mutex& mu, const Regions& regions, int32_t handle, uint64_t offset,
                  uint64_t length, BaseOf base_of) {
  if (!cache.valid || cache.handle != handle) {
    std::lock_guard lock(mu);
    auto it = regions.find(handle);
    cache.handle = handle;
    cache.valid = it != regions.end();
    if (cache.valid) {
      cache.base = base_of(it->second);
      cache.length = it->second.length;
    }
  }
  return cache.valid && range_within(cache.length, offset, length);
}

}  // namespace

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
  std::lock_guard lock(mu_);
  if (auto it = by_name_.find(name); it != by_name_.end()) {
    const LocalRegion& old = regions_.at(it->second);
    if (old.addr == start && old.length == length) return it->second;
    regions_.erase(it->second);
    by_name_.erase(it);
  }
  if (next_handle_ == std::numeric_limits<int32_t>::max()) throw InvalidArgumentError("region handles exhausted");
  const int32_t handle = next_handle_++;
  regions_.emplace(handle, LocalRegion{name, start, length});
  by_name_.emplace(name, handle);
  return handle;
}

void LocalRegionTable::remove(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) throw NotFoundError(fmt::format("no local memory region named '{}'", name));
  regions_.erase(it->second);
  by_name_.erase(it);
}

void LocalRegionTable::remove(int32_t handle) {
  std::lock_guard lock(mu_);
  auto it = regions_.find(handle);
  if (it == regions_.end()) throw NotFoundError(fmt::format("no local memory region with handle {}", handle));
  by_name_.erase(it->second.name);
  regions_.erase(it);
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
  if (!cached_range(cache, mu_, regions_, handle, offset, length, [](const LocalRegion& r) { return r.addr; })) {
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
  const auto owner_handle = [](const RemoteRegion& r) { return uint64_t{static_cast<uint32_t>(r.peer_handle)}; };
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
