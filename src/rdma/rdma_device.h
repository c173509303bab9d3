// What an RDMAEndpoint opens before it has QPs: the device (chosen by name or as the first
// with an active port), its port and GID, the protection domain, and the memory domain
// that registers every region of the agent's MemoryRegistry as an MR of that PD.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/memory_registry.h"
#include "rdma/verbs.h"

namespace dlslime {
struct RdmaOptions;
}

namespace dlslime::rdma {

// "auto" -> kUnspecified, "RoCE" -> kEthernet, "IB" -> kInfiniBand (case-insensitive);
// InvalidArgumentError otherwise.
LinkLayer parse_link_type(const std::string& link_type);

// The selected provider's devices that SLIME_VISIBLE_DEVICES (comma-separated names, as
// upstream DLSlime) lets this process use; all of them when it is unset or empty.
std::vector<std::string> visible_devices();
// Why visible_devices() is empty: no device at all, or the variable hides them.
std::string no_visible_device_reason();

// An open device and PD. The MRs of the memory domain and the endpoint's CQ and QPs hold
// it alive: they must be destroyed before it (declaration order below: pd before ctx).
struct Device {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<ProtectionDomain> pd;
  uint8_t port = 1;
  PortAttr port_attr;
  DeviceCaps caps;  // ibv_query_device's limits, which every CQ and QP must fit
  int gid_index = 0;
  GidEntry gid;
};

// Opens the device the options name (or the first with an active port), checks the port
// (active, the link layer asked for) and picks the GID (docs/rdma.md "GID selection").
// NotFoundError for an unknown device, ConnectionError for a port that is down, of another
// link layer, or without a usable GID.
std::shared_ptr<Device> open_device(const RdmaOptions& options);

// Registers [addr, +length) as an MR of `pd` (docs/rdma.md, "GPU memory"). Host memory:
// reg_mr. Device memory (GPUDirect RDMA: the NIC moves its bytes, host code never touches
// them): a dma-buf the GPU runtime exports (reg_dmabuf_mr), else the device address itself
// (reg_mr, which works where a peer-memory module such as nvidia-peermem is loaded). When
// neither works it throws VerbsError naming why each failed; device memory never falls
// back to anything host code would touch.
std::unique_ptr<MemoryRegion> register_memory(ProtectionDomain& pd, uintptr_t addr, uint64_t length, MemoryKind kind,
                                              uint32_t access);

// The checks of register_dmabuf_memory_region (RDMAEndpoint's and RDMAMemoryPool's):
// InvalidArgumentError unless `fd` is an open descriptor whose buffer holds [offset,
// +length), length > 0, and `iova` is GPU memory (rdma_endpoint.h says why).
void check_dmabuf_region(int fd, uint64_t offset, uint64_t length, uint64_t iova);

// An MR's local key, and whether it is device memory (never posted inline: inline data is
// copied by the CPU at post time).
struct LocalKey {
  uint32_t lkey = 0;
  bool device = false;
  bool writable = true;  // false: read-only memory, registered for remote reads only
};

// The RDMA memory domain: one MR per region (local write, remote read and write), host or
// device memory (register_memory), published as {addr, rkey, length, handle}. Zero-length
// regions get no MR; their entry has no rkey and a peer cannot address them.
class RdmaMemoryDomain final : public MemoryDomain {
 public:
  explicit RdmaMemoryDomain(std::shared_ptr<Device> device) : device_(std::move(device)) {}
  void region_added(int32_t handle, const LocalRegion& region) override;
  void region_removed(int32_t handle, const LocalRegion& region) override;
  nlohmann::json describe(int32_t handle, const LocalRegion& region) const override;
  // The key of region `handle`'s MR; nullopt when it has none.
  std::optional<LocalKey> lkey(int32_t handle) const;
  // Called with a region's rkey just before its MR is deregistered (the endpoint tells its
  // peer and waits until nothing the peer has in flight can still reach it). Set once,
  // before the domain is attached.
  std::function<void(uint32_t rkey)> before_deregister;

 private:
  std::shared_ptr<Device> device_;  // declared first: destroyed after the MRs
  mutable std::mutex mu_;
  // By handle (a registry never reuses one).
  struct Registered {
    std::unique_ptr<MemoryRegion> mr;
    bool device = false;
    bool writable = true;
  };
  std::unordered_map<int32_t, Registered> mrs_;
};

}  // namespace dlslime::rdma
