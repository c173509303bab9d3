#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "dlslime/status.h"

namespace dlslime {

// Overflow-safe bounds test: is [offset, offset+length) inside a region of `size` bytes?
// A zero-length range at offset == size is inside (it touches no byte).
constexpr bool range_within(uint64_t size, uint64_t offset, uint64_t length) noexcept {
  return offset <= size && length <= size - offset;
}

// The lifetime of one registration of a local region: how many in-flight references
// (RegionUse) point into its memory. Unregistering removes the region from its table at
// once (no new reference can be taken) and then waits until the count is zero, so that
// once unregister returns nothing in flight reads or writes the memory: the owner may
// free it. Transports take a RegionUse for every piece of work that keeps an address of
// the region beyond the call that resolved it (an op's local buffers, a frame being
// placed, a queued answer) and drop it in their one finish path.
class RegionLifetime {
 public:
  RegionLifetime(int32_t handle, std::string name) : handle_(handle), name_(std::move(name)) {}
  int32_t handle() const noexcept { return handle_; }
  const std::string& name() const noexcept { return name_; }

  void acquire() noexcept { users_.fetch_add(1, std::memory_order_seq_cst); }
  void release() noexcept;
  uint64_t users() const noexcept { return users_.load(std::memory_order_seq_cst); }
  // Blocks until no reference is left or `deadline` passes; true if none is left.
  bool wait_unused(std::chrono::steady_clock::time_point deadline);

 private:
  const int32_t handle_;
  const std::string name_;
  std::atomic<uint64_t> users_{0};
  std::atomic<bool> draining_{false};  // someone waits in wait_unused: release() notifies
  std::mutex mu_;
  std::condition_variable cv_;
};

// One in-flight reference to a region's memory (RAII). Copying takes another reference.
class RegionUse {
 public:
  RegionUse() = default;
  explicit RegionUse(std::shared_ptr<RegionLifetime> lifetime) : lifetime_(std::move(lifetime)) {
    if (lifetime_) lifetime_->acquire();
  }
  RegionUse(const RegionUse& o) : RegionUse(o.lifetime_) {}
  RegionUse(RegionUse&& o) noexcept = default;
  RegionUse& operator=(RegionUse o) noexcept {
    std::swap(lifetime_, o.lifetime_);
    return *this;
  }
  ~RegionUse() {
    if (lifetime_) lifetime_->release();
  }
  const RegionLifetime* lifetime() const noexcept { return lifetime_.get(); }
  explicit operator bool() const noexcept { return lifetime_ != nullptr; }

 private:
  std::shared_ptr<RegionLifetime> lifetime_;
};

// The last region a batch resolved against (see the resolve overloads below): the items
// of a batch mostly name the same one or two regions, so with this they take no lock and
// no lookup each. Use one cache per table and per batch. A local cache also holds a use
// of its region (taken under the table's lock, so an unregister either sees it or the
// lookup fails), which RegionUses::hold copies for whoever keeps the address.
struct ResolveCache {
  int32_t handle = 0;
  bool valid = false;
  uint64_t base = 0;    // local: the region's address; remote: the owner's handle
  uint64_t length = 0;
  RegionUse use;        // local tables only
};

// The regions one piece of in-flight work refers to (few: consecutive repeats of a
// region are held once).
class RegionUses {
 public:
  // Holds the cache's region unless it is the one held last.
  void hold(const ResolveCache& cache) {
    if (cache.use && (uses_.empty() || uses_.back().lifetime() != cache.use.lifetime())) uses_.push_back(cache.use);
  }
  void take(RegionUses&& other);
  bool holds(const RegionLifetime* lifetime) const noexcept;
  bool empty() const noexcept { return uses_.empty(); }
  void clear() noexcept { uses_.clear(); }

 private:
  std::vector<RegionUse> uses_;
};

// What unregister calls when in-flight work still refers to a region at its deadline: a
// transport (endpoint) sharing the table fails the ops and closes the connections that
// hold a use of it, so the uses are dropped. Registered with LocalRegionTable::watch.
class RegionRevoker {
 public:
  virtual ~RegionRevoker() = default;
  // Drops every use of `lifetime` this transport holds; returns once they are dropped.
  virtual void revoke_region(const RegionLifetime& lifetime) = 0;
  // True if the calling thread is the one that would have to drop the uses (an I/O
  // thread calling unregister from a completion callback): waiting there would deadlock.
  virtual bool on_own_thread() const = 0;
};

struct LocalRegion {
  std::string name;
  uintptr_t addr = 0;  // already includes the registration offset
  uint64_t length = 0;
  std::shared_ptr<RegionLifetime> lifetime;
};

// Regions this process registered. Handles are never reused within a table, so a stale
// handle held by a peer can never alias a newer region. Thread-safe.
class LocalRegionTable {
 public:
  // How long unregister (and re-registration of a name for other bytes) waits for the
  // transfers in flight on the region before it revokes them.
  static constexpr std::chrono::milliseconds kDefaultDrainTimeout{5000};

  // Registers [addr+offset, +length). Re-registering a name replaces it under a new
  // handle unless it describes the same bytes, in which case the old handle is returned;
  // the replaced region is drained as by remove(). Throws InvalidArgumentError on address
  // overflow or a null address with length > 0.
  int32_t add(const std::string& name, uintptr_t addr, uint64_t offset, uint64_t length);
  // Unregisters: new lookups fail at once; returns once nothing in flight refers to the
  // region's memory. Transfers still using it after the drain timeout are revoked (their
  // ops fail, the connections carrying them close). Throws NotFoundError if absent,
  // TimeoutError if the region is somehow still in use after revocation (then its memory
  // must not be freed).
  void remove(const std::string& name);
  void remove(int32_t handle);
  void set_drain_timeout(std::chrono::milliseconds timeout) { drain_timeout_.store(timeout.count()); }
  // Transports that take uses of this table's regions register here (weakly).
  void watch(std::weak_ptr<RegionRevoker> revoker);

  // On success stores the address of byte `offset` of region `handle`.
  Status resolve(int32_t handle, uint64_t offset, uint64_t length, uintptr_t* out) const;
  Status resolve(int32_t handle, uint64_t offset, uint64_t length, uintptr_t* out, ResolveCache& cache) const;
  std::optional<int32_t> find(const std::string& name) const;
  size_t size() const;

  // {name: {"handle", "addr", "length"}}: what a peer needs to build a remote handle.
  nlohmann::json mr_info() const;

 private:
  void drain(const std::shared_ptr<RegionLifetime>& lifetime);

  mutable std::mutex mu_;
  std::atomic<int64_t> drain_timeout_{kDefaultDrainTimeout.count()};
  std::vector<std::weak_ptr<RegionRevoker>> revokers_;  // guarded by mu_
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
