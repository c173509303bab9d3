#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "dlslime/status.h"

namespace dlslime {

// Overflow-safe bounds test: is [offset, offset+length) inside a region of `size` bytes?
// A zero-length range at offset == size is inside (it touches no byte).
constexpr bool range_within(uint64_t size, uint64_t offset, uint64_t length) noexcept {
  return offset <= size && length <= size - offset;
}

// The last region a batch resolved against (see the resolve overloads below): the items
// of a batch mostly name the same one or two regions, so with this they take no lock and
// no lookup each. Use one cache per table and per batch.
struct ResolveCache {
  int32_t handle = 0;
  bool valid = false;
  uint64_t base = 0;    // local: the region's address; remote: the owner's handle
  uint64_t length = 0;
};

struct LocalRegion {
  std::string name;
  uintptr_t addr = 0;  // already includes the registration offset
  uint64_t length = 0;
};

// Regions this process registered. Handles are never reused within a table, so a stale
// handle held by a peer can never alias a newer region. Thread-safe.
class LocalRegionTable {
 public:
  // Registers [addr+offset, +length). Re-registering a name replaces it under a new
  // handle unless it describes the same bytes, in which case the old handle is returned.
  // Throws InvalidArgumentError on address overflow or a null address with length > 0.
  int32_t add(const std::string& name, uintptr_t addr, uint64_t offset, uint64_t length);
  // Throw NotFoundError if absent.
  void remove(const std::string& name);
  void remove(int32_t handle);

  // On success stores the address of byte `offset` of region `handle`.
  Status resolve(int32_t handle, uint64_t offset, uint64_t length, uintptr_t* out) const;
  Status resolve(int32_t handle, uint64_t offset, uint64_t length, uintptr_t* out, ResolveCache& cache) const;
  std::optional<int32_t> find(const std::string& name) const;
  size_t size() const;

  // {name: {"handle", "addr", "length"}}: what a peer needs to build a remote handle.
  nlohmann::json mr_info() const;

 private:
  mutable std::mutex mu_;
  int32_t next_handle_ = 0;
  std::unordered_map<int32_t, LocalRegion> regions_;
  std::unordered_map<std::string, int32_t> by_name_;
};

struct RemoteRegion {
  std::string name;
  int32_t peer_handle = -1;  // the handle in the owner's LocalRegionTable
  uintptr_t addr = 0;        // informational; the owner resolves addresses itself
  uint64_t length = 0;
};

// Peer regions known to this endpoint, made from entries of the peer's mr_info. Bounds
// are checked here first (a fast, clear local error) and again by the owner, whose table
// is authoritative. Thread-safe.
class RemoteRegionTable {
 public:
  // Registering an existing name updates that entry in place and returns its handle, as
  // DLSlime does. Throws InvalidArgumentError if the entry lacks an integer "handle" and
  // "length".
  int32_t add(const std::string& name, const nlohmann::json& mr_info_entry);
  // The owner's handle for [offset, offset+length) of region `handle` (no copy of the
  // entry: this runs once per item of every batch).
  Status resolve(int32_t handle, uint64_t offset, uint64_t length, int32_t* peer_handle) const;
  Status resolve(int32_t handle, uint64_t offset, uint64_t length, int32_t* peer_handle, ResolveCache& cache) const;
  std::optional<int32_t> find(const std::string& name) const;
  void clear();

 private:
  mutable std::mutex mu_;
  std::unordered_map<int32_t, RemoteRegion> regions_;
  std::unordered_map<std::string, int32_t> by_name_;
};

}  // namespace dlslime
