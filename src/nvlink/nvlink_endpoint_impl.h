// NVLinkEndpoint's implementation (nvlink_endpoint.cpp, docs/nvlink.md): the memory domain
// that exports IPC handles, the process-wide table of the peers' mapped allocations, and
// the endpoint with its stream, events and completion thread.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/completion_thread.h"
#include "core/memory_registry.h"
#include "core/op_limit.h"
#include "core/op_state.h"
#include "core/remote_regions.h"
#include "dlslime/nvlink_endpoint.h"
#include "gpu/device_runtime.h"
#include "nvlink/notify_channel.h"

namespace dlslime {
namespace nvlink {

const std::string& boot_id();        // this host's boot id: "same host" for NVLink
std::string process_token();         // names this process on the host (new after fork)

// A peer's allocation mapped into this process (ipc_open); ipc_close when the last user
// (a remote region, an op in flight) lets go.
struct Mapping {
  void* base = nullptr;
  size_t size = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();
};
// The mapping of `handle` on `device`, opened once per process and shared.
std::shared_ptr<Mapping> open_mapping(const gpu::IpcHandle& handle, int device);

// Exports each device-memory region: the IPC handle of the allocation holding it and the
// region's place in that allocation (mr_info: ipc_handle, alloc_offset, alloc_size, device).
// Device memory that has no IPC handle (VMM memory from cuMemCreate, as PyTorch's
// expandable_segments allocates; managed memory) is not exported: the domain records why
// (mr_info: not_exported) and NVLink ops on the region fail with it, but it does not refuse
// the region, which the registry's other transports (TCP, RDMA) may take (review F10).
//
// An endpoint of this process reaches another one's regions without IPC (a process cannot
// open its own handles): it finds the exporting domain by the token describe() publishes
// (find) and resolves the region by handle in that domain's registry, within the registered
// bounds. The record's address is never used: a record is the peer's word, and a forged one
// naming this process must not choose where our copies land (issue 21, N1).
class NvlinkDomain final : public MemoryDomain, public std::enable_shared_from_this<NvlinkDomain> {
 public:
  NvlinkDomain();
  void region_added(int32_t handle, const LocalRegion& region) override;
  void region_removed(int32_t handle, const LocalRegion& region) override;
  nlohmann::json describe(int32_t handle, const LocalRegion& region) const override;
  bool exported(int32_t handle) const;  // device memory with an IPC handle
  // Why a device-memory region could not be exported; nullopt if it was, or is host memory.
  std::optional<std::string> refusal(int32_t handle) const;
  // Why NVLink cannot move the region's bytes: the refusal, or that it is host memory.
  std::string unexported_reason(int32_t handle) const;

  // Makes the domain findable by its token, resolving in `registry` (the endpoint's).
  void publish(const std::shared_ptr<MemoryRegistry>& registry);
  // The live domain of this process with `token`, or null.
  static std::shared_ptr<NvlinkDomain> find(const std::string& token);
  std::shared_ptr<MemoryRegistry> registry() const { return registry_.lock(); }

 private:
  const std::string token_;
  std::weak_ptr<MemoryRegistry> registry_;
  struct Export {
    gpu::IpcHandle handle;
    uint64_t alloc_offset = 0;
    uint64_t alloc_size = 0;
    int device = 0;
  };
  struct Refused {
    std::string why;
    int device = 0;
  };
  mutable std::mutex mu_;
  std::unordered_map<int32_t, Export> exports_;
  std::unordered_map<int32_t, Refused> refused_;
};

}  // namespace nvlink

class NVLinkEndpointImpl final : public RegionRevoker, public std::enable_shared_from_this<NVLinkEndpointImpl> {
 public:
  NVLinkEndpointImpl(NvlinkOptions options, std::shared_ptr<MemoryRegistry> regions);
  ~NVLinkEndpointImpl() override;
  void start();  // attaches the memory domain and starts the completion thread

  nlohmann::json endpoint_info() const;
  void connect(const nlohmann::json& peer_info);
  bool is_connected() const;
  // shutdown() has run.
  bool is_shut_down() const {
    std::lock_guard lock(mu_);
    return closed_;
  }
  // strict: throw on an unusable entry; else keep it, so that its ops fail with the reason.
  int32_t add_remote(const std::string& name, const nlohmann::json& entry, bool strict);
  nlohmann::json mr_info() const;
  nlohmann::json mr_info_of(const std::string& name) const;
  // stream: nullopt = the endpoint's own stream.
  Future submit(OpRequest request, std::optional<gpu::Stream> stream = std::nullopt);
  void shutdown();
  void join_thread() {  // after shutdown(): the completion and notification threads end
    thread_.join();
    notes_->join();
  }
  std::optional<int32_t> remote_handle(const std::string& name) const;
  std::optional<std::string> export_refusal(int32_t handle) const { return domain_->refusal(handle); }

  const NvlinkOptions options;
  const std::shared_ptr<MemoryRegistry> regions;

  // RegionRevoker
  void revoke_region(const RegionLifetime& lifetime) override;
  bool on_own_thread() const override;

 private:
  using Clock = std::chrono::steady_clock;

  // How this endpoint addresses a peer's region: its first byte, mapped here.
  struct RemoteKey {
    uintptr_t addr = 0;
    std::shared_ptr<nvlink::Mapping> mapping;  // null for this process's own memory
    // This process's own memory: the exporting domain and the region's handle there,
    // resolved at every op (its registered bounds, held while the copies run).
    std::shared_ptr<nvlink::NvlinkDomain> owner;
    int32_t owner_handle = -1;
  };
  struct Op {
    std::shared_ptr<OpState> state;
    RegionUses uses;
    std::vector<std::shared_ptr<nvlink::Mapping>> mappings;
    gpu::Event event = nullptr;
    uint64_t nbytes = 0;
    Status error;  // a copy that could not be queued, or shutdown: the op's status once its copies ran
    Clock::time_point deadline;
    OpLimit limit;  // its deadline's source, for the timeout's message
  };
  // What the runtime's host callbacks notify: the completion thread sleeps on it.
  struct Waker {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t count = 0;
    void notify();
    static void callback(void* box);  // box: a new std::shared_ptr<Waker>, deleted here
  };
  void run();
  gpu::Event take_event_locked();
  bool peer_exited_locked() const;
  void drop_dead_peer_locked();

  gpu::Runtime& rt_;
  std::shared_ptr<nvlink::NvlinkDomain> domain_ = std::make_shared<nvlink::NvlinkDomain>();
  gpu::Stream stream_ = nullptr;
  std::shared_ptr<Waker> waker_;

  mutable std::mutex mu_;
  bool connected_ = false;
  bool connecting_ = false;  // a connect() is opening the peer's regions (outside mu_)
  bool peer_is_this_process_ = false;  // the connected peer's info names this process
  bool closed_ = false;
  int peer_pidfd_ = -1;
  int64_t peer_pid_ = 0;
  std::list<Op> pending_;
  std::vector<gpu::Event> free_events_;
  std::condition_variable drained_cv_;  // an op finished (revoke_region waits on it)

  RemoteRegions<RemoteKey> remote_;
  CompletionThread thread_;
  // Notifications (send_notify, recv_notify): their own channel to the peer.
  const std::shared_ptr<nvlink::NotifyChannel> notes_ = std::make_shared<nvlink::NotifyChannel>();
};

}  // namespace dlslime
