#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/memory_registry.h"
#include "dlslime/errors.h"
#include "dlslime/status.h"

namespace dlslime {

// A peer's regions known to one endpoint, each under a local handle, keyed by the
// transport's own remote key: the owner's handle for TCP, which the owner resolves; the
// peer's address and rkey for RDMA, or an opened IPC mapping for NVLink, which the
// initiator resolves itself. Bounds are checked here first (a fast, clear local error);
// an owner-resolved transport checks them again on the owner, whose registry is
// authoritative. Thread-safe.
template <class Key>
class RemoteRegions {
 public:
  // The last region a batch resolved against (one lookup per distinct handle per batch).
  struct Cache {
    int32_t handle = 0;
    bool valid = false;
    uint64_t length = 0;
    Key key{};
  };

  // Registering an existing name updates that entry in place and returns its handle, as
  // DLSlime does.
  int32_t add(const std::string& name, uint64_t length, Key key) {
    if (name.empty()) throw InvalidArgumentError("remote memory region name must not be empty");
    std::lock_guard lock(mu_);
    if (auto it = by_name_.find(name); it != by_name_.end()) {
      regions_[it->second] = Region{name, length, std::move(key)};
      return it->second;
    }
    const auto handle = static_cast<int32_t>(regions_.size());
    regions_.emplace(handle, Region{name, length, std::move(key)});
    by_name_.emplace(name, handle);
    return handle;
  }

  // A region known by name that no op may use (`why`: its record could not be opened, it
  // names memory this peer may not reach): its ops fail UNKNOWN_HANDLE with why, until the
  // name is registered again with a usable record.
  int32_t add_unusable(const std::string& name, std::string why) {
    const int32_t handle = add(name, 0, Key{});
    std::lock_guard lock(mu_);
    regions_[handle].unusable = std::move(why);
    return handle;
  }

  // The peer these regions came from is gone: a reconnect may reach another process, whose
  // memory an old address, rkey or handle would name by accident. Every region keeps its
  // name and handle, so that a handle never comes to name another region, but fails
  // UNKNOWN_HANDLE with `why` until its name is registered again; its key (and what the
  // key holds, such as a mapping) is released now.
  void drop_all(const std::string& why) {
    std::lock_guard lock(mu_);
    for (auto& [handle, r] : regions_) {
      if (!r.unusable.empty()) continue;
      r.key = Key{};
      r.unusable = why;
    }
  }

  // The key of region `handle`, once [offset, offset+length) is checked to lie inside it.
  Status resolve(int32_t handle, uint64_t offset, uint64_t length, Key* key) const {
    std::lock_guard lock(mu_);
    auto it = regions_.find(handle);
    if (it == regions_.end()) {
      return Status::unknown_handle(fmt::format("no remote memory region with handle {}", handle));
    }
    const Region& r = it->second;
    if (!r.unusable.empty()) {
      return Status::unknown_handle(fmt::format("remote memory region '{}' (handle {}) {}", r.name, handle, r.unusable));
    }
    if (!range_within(r.length, offset, length)) {
      return Status::out_of_bounds(fmt::format("range [{}, {}+{}) is outside remote region '{}' (handle {}, {} bytes)",
                                               offset, offset, length, r.name, handle, r.length));
    }
    *key = r.key;
    return Status::ok();
  }
  Status resolve(int32_t handle, uint64_t offset, uint64_t length, Key* key, Cache& cache) const {
    if (!cache.valid || cache.handle != handle) {
      std::lock_guard lock(mu_);
      auto it = regions_.find(handle);
      cache.handle = handle;
      cache.valid = it != regions_.end() && it->second.unusable.empty();
      if (cache.valid) {
        cache.length = it->second.length;
        cache.key = it->second.key;
      }
    }
    if (!cache.valid || !range_within(cache.length, offset, length)) {
      return resolve(handle, offset, length, key);  // the error, with its message
    }
    *key = cache.key;
    return Status::ok();
  }

  std::optional<int32_t> find(const std::string& name) const {
    std::lock_guard lock(mu_);
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return std::nullopt;
    return it->second;
  }
  void clear() {
    std::lock_guard lock(mu_);
    regions_.clear();
    by_name_.clear();
  }

 private:
  struct Region {
    std::string name;
    uint64_t length = 0;
    Key key{};
    std::string unusable;  // non-empty: why no op may use it (add_unusable, drop_all)
  };
  mutable std::mutex mu_;
  std::unordered_map<int32_t, Region> regions_;
  std::unordered_map<std::string, int32_t> by_name_;
};

// Owner-resolved transports (TCP): the key is the owner's handle.
using OwnerRemoteRegions = RemoteRegions<int32_t>;
// Adds one entry of an OwnerResolvedDomain's mr_info ({"handle", "length"[, "addr"]}).
// Throws InvalidArgumentError if it lacks an integer handle in range or a length >= 0.
int32_t add_owner_resolved(OwnerRemoteRegions& table, const std::string& name, const nlohmann::json& mr_info_entry);

}  // namespace dlslime
