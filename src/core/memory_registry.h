#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "dlslime/export.h"
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
  bool npu = false;     // set by a transport that moves NPU memory (MemoryKind::kNpu)
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
// hold a use of it, so the uses are dropped. Registered with MemoryRegistry::watch.
class RegionRevoker {
 public:
  virtual ~RegionRevoker() = default;
  // Drops every use of `lifetime` this transport holds; returns once they are dropped.
  virtual void revoke_region(const RegionLifetime& lifetime) = 0;
  // True if the calling thread is the one that would have to drop the uses (an I/O
  // thread calling unregister from a completion callback): waiting there would deadlock.
  virtual bool on_own_thread() const = 0;
};

// Where registered memory lives. Host memory is plain process memory; device memory (a
// GPU's) may not be touched by host code, so only a transport whose capabilities include
// device_memory may take it.
//
// kNpu: an NPU's memory (the ascend transport's, docs/ascend.md), which only a transport that
// says so moves: a domain is told of such a region only if it takes() it, mr_info() for a
// domain that does not take it leaves it out (the owner-resolved view lists every region),
// and resolve() refuses it unless the cache asks for it (ResolveCache::npu), so no other
// transport's I/O thread touches it.
enum class MemoryKind : uint8_t { kHost, kDevice, kNpu };
const char* memory_kind_name(MemoryKind kind) noexcept;

// Where the byte at `addr` lives, asked through the device-runtime seam: host memory when
// no GPU runtime can be used in this process (no device memory can exist then). The
// registry asks it for every region; transports ask it for raw buffers outside regions
// (messages).
struct MemoryPlace {
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;  // the GPU, for device memory
};
MemoryPlace memory_place_of(uintptr_t addr);
// Where [start, +length) lives; device memory must lie inside one allocation
// (InvalidArgumentError naming `what` otherwise).
MemoryPlace memory_place_of(std::string_view what, uintptr_t start, uint64_t length);
// Device memory outside the GPU runtime (an NPU's): kDevice and its device when [start,
// +length) is that memory, nullopt when none of it is, InvalidArgumentError when part of it
// is. memory_place_of asks each probe added here after the GPU runtime. Added once per
// transport that has such memory (TransportEntry::device_memory, added with the entry).
using DeviceMemoryProbe = std::function<std::optional<MemoryPlace>(uintptr_t start, uint64_t length)>;
void add_device_memory_probe(DeviceMemoryProbe probe);

// The dma-buf a region was registered from (RDMA's register_dmabuf_memory_region): the
// region's bytes are the buffer's [offset, +length), addressed at the region's addr, as
// ibv_reg_dmabuf_mr registers them. The registry keeps its own duplicate of the caller's
// descriptor for the region's life, so that a transport attached later registers the same
// buffer, and the caller may close theirs at once.
class RegionDmabuf {
 public:
  RegionDmabuf(int fd, uint64_t offset);  // duplicates fd; InvalidArgumentError if it cannot
  ~RegionDmabuf();
  RegionDmabuf(const RegionDmabuf&) = delete;
  RegionDmabuf& operator=(const RegionDmabuf&) = delete;
  int fd() const { return fd_; }
  uint64_t offset() const { return offset_; }

 private:
  int fd_;
  uint64_t offset_;
};

struct LocalRegion {
  std::string name;
  uintptr_t addr = 0;  // already includes the registration offset
  uint64_t length = 0;
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;          // the device ordinal for device memory
  uint64_t generation = 0;  // distinct per registration in this registry, never reused
  std::shared_ptr<RegionLifetime> lifetime;
  std::shared_ptr<const RegionDmabuf> dmabuf;  // null: the memory at addr itself
};

// A transport's view of the registry (as UCX separates memory domains from interfaces):
// it prepares each region for its hardware when it is registered (RDMA: an MR and its
// rkey; NVLink: an IPC handle) and says what a peer needs to address it. Attached weakly
// with MemoryRegistry::attach; the callbacks run outside the registry's lock.
class MemoryDomain {
 public:
  virtual ~MemoryDomain() = default;
  // A region was registered (also called, at attach, for every region already there).
  // Throwing rejects the registration: the region is removed again and the error reaches
  // the caller of register_memory_region.
  virtual void region_added(int32_t handle, const LocalRegion& region) = 0;
  // The region was unregistered and has drained: nothing in flight refers to it.
  virtual void region_removed(int32_t handle, const LocalRegion& region) = 0;
  // This domain's mr_info entry for the region.
  virtual nlohmann::json describe(int32_t handle, const LocalRegion& region) const = 0;
  // Whether the domain's transport moves memory of this kind: only such regions reach
  // region_added/region_removed/describe. Every kind but NPU memory by default.
  virtual bool takes(MemoryKind kind) const { return kind != MemoryKind::kNpu; }
};

// The domain of transports whose peer names a region by its owner's handle and lets the
// owner resolve addresses (TCP): nothing to prepare; the entry is {handle, addr, length}.
class DLSLIME_API OwnerResolvedDomain final : public MemoryDomain {
 public:
  static const OwnerResolvedDomain& instance();
  void region_added(int32_t, const LocalRegion&) override {}
  void region_removed(int32_t, const LocalRegion&) override {}
  nlohmann::json describe(int32_t handle, const LocalRegion& region) const override;
  // The registry's own view (PeerAgent's records, the memory pools): every region, whatever
  // it is; an owner-resolved transport checks the kind when it resolves (resolve()).
  bool takes(MemoryKind) const override { return true; }
};

// Where a two-sided chunk lies in registered memory (MemoryRegistry::find_containing).
struct RegionMatch {
  int32_t handle = -1;
  uint64_t offset = 0;  // of the chunk's first byte within the region
};

// The agent-wide registry of named memory: every region this process registered, shared
// by all endpoints (of every transport) of one PeerAgent, so a handle means the same
// region on each. Handles are never reused within a registry, so a stale handle held by a
// peer can never alias a newer region. Thread-safe. Exported (DLSLIME_API) for the Python
// binding's memory pools (TcpMemoryPool, RDMAMemoryPool), which are views of one registry.
class DLSLIME_API MemoryRegistry {
 public:
  // How long unregister (and re-registration of a name for other bytes) waits for the
  // transfers in flight on the region before it revokes them.
  static constexpr std::chrono::milliseconds kDefaultDrainTimeout{5000};

  // Registers [addr+offset, +length). Where the memory lives (host, or which GPU) is asked
  // here, once, through the device-runtime seam (gpu/device_runtime.h), so that every
  // transport and the PeerAgent see the same kind and none can mistake device memory for
  // host memory; without a GPU runtime every region is host memory. Re-registering a name
  // replaces it under a new handle unless it describes the same bytes, in which case the
  // old handle is returned; the replaced region is drained as by remove(). Throws
  // InvalidArgumentError on address overflow, a null address with length > 0, or device
  // memory that runs past its allocation. `dmabuf`: the buffer the region's bytes are
  // (RegionDmabuf); such a registration always replaces the name's old region.
  int32_t add(const std::string& name, uintptr_t addr, uint64_t offset, uint64_t length,
              std::shared_ptr<const RegionDmabuf> dmabuf = nullptr);
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
  // Attaches a memory domain (weakly): region_added runs at once for every region already
  // registered, then for each new one. Throws what region_added throws.
  void attach(std::weak_ptr<MemoryDomain> domain);

  // On success stores the address of byte `offset` of region `handle`.
  // NPU memory (MemoryKind::kNpu) is refused (INVALID_ARGUMENT) unless `npu`, or the cache's
  // npu flag, says the caller moves it.
  Status resolve(int32_t handle, uint64_t offset, uint64_t length, uintptr_t* out, bool npu = false) const;
  Status resolve(int32_t handle, uint64_t offset, uint64_t length, uintptr_t* out, ResolveCache& cache) const;
  std::optional<int32_t> find(const std::string& name) const;
  // The region holding all of [addr, addr+length) (the most recently registered one when
  // several do), for transports that must name the region of a raw buffer (RDMA's send and
  // recv need its key). O(log n) unless registrations overlap.
  std::optional<RegionMatch> find_containing(uintptr_t addr, uint64_t length) const;
  std::optional<LocalRegion> get(int32_t handle) const;
  size_t size() const;

  // {name: domain.describe(...)}: what a peer of that domain's transport needs to build
  // remote handles.
  nlohmann::json mr_info(const MemoryDomain& domain = OwnerResolvedDomain::instance()) const;
  // mr_info()'s entry for region `name` alone (null when there is none): O(log n).
  nlohmann::json mr_info_of(const std::string& name,
                            const MemoryDomain& domain = OwnerResolvedDomain::instance()) const;

 private:
  void drain(const std::shared_ptr<RegionLifetime>& lifetime);
  // Removes `handle` (under mu_) and returns what was removed.
  LocalRegion erase_locked(int32_t handle);
  void retire(int32_t handle, const LocalRegion& region);  // drain, then tell the domains
  std::vector<std::shared_ptr<MemoryDomain>> domains() const;

  mutable std::mutex mu_;
  std::atomic<int64_t> drain_timeout_{kDefaultDrainTimeout.count()};
  std::vector<std::weak_ptr<RegionRevoker>> revokers_;  // guarded by mu_
  std::vector<std::weak_ptr<MemoryDomain>> domains_;    // guarded by mu_
  int32_t next_handle_ = 0;
  uint64_t next_generation_ = 1;
  std::unordered_map<int32_t, LocalRegion> regions_;
  std::unordered_map<std::string, int32_t> by_name_;
  std::multimap<uintptr_t, int32_t> by_addr_;  // region start -> handle
  uint64_t longest_ = 0;                       // the longest region ever registered
};

}  // namespace dlslime
