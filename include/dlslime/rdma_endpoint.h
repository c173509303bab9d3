#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "dlslime/endpoint.h"
#include "dlslime/export.h"

namespace dlslime {

// RDMAEndpoint options (docs/rdma.md, "Options"). Parsed and validated once, at construction.
struct DLSLIME_API RdmaOptions {
  // Device to open; empty: the first device (of the selected provider) with an active port.
  std::string device_name;
  uint8_t ib_port = 1;
  // "auto" (whatever the port is), "RoCE" (Ethernet) or "IB": a port of another link layer is refused.
  std::string link_type = "auto";
  // GID table index; -1 picks one (RoCE v2 with an IPv4-mapped address first, docs/rdma.md).
  int gid_index = -1;
  // Queue pairs to the peer; batches and large items are striped over them.
  uint32_t num_qp = 1;
  // Send/receive queue depth per QP. A batch needing more WRs is queued in software.
  uint32_t max_send_wr = 256;
  uint32_t max_recv_wr = 256;
  // Payloads up to this many bytes are posted inline (the device may grant less).
  uint32_t max_inline_data = 64;
  // Items larger than this are cut into work requests of at most this size.
  uint64_t chunk_size = 1 << 20;
  // Deadline of read and write ops, from submission; 0 = none. On expiry the op's QP is
  // moved to the error state (the only way to take back posted work), so other ops in
  // flight on it fail too, and the endpoint is no longer connected.
  std::chrono::milliseconds op_timeout{30000};
  // Deadline of a recv or imm_recv waiting for its message or immediate, from submission
  // (their own timeout, OpRequest::timeout, wins); 0 = none. It fails with TIMEOUT alone
  // and the connection lives (nothing is posted for a waiting recv: nothing to take back).
  std::chrono::milliseconds recv_timeout{0};
  // Liveness (review F11): while connected and lane 0 is idle, a zero-length RDMA write is
  // posted this often; a dead peer fails it within the RC retry bound, which fails the
  // connection (waiting recvs and imm_recvs get PEER_CLOSED). Only once the peer has
  // answered on this connection (it may not have connected back yet). 0 = no probe: a
  // dead peer is then noticed only at the next op.
  std::chrono::milliseconds keepalive{2000};
  // RC transport: ACK timeout exponent (4.096 us * 2^timeout, 0 = infinite), retries.
  uint32_t ack_timeout = 14;
  uint32_t retry_cnt = 7;
  uint32_t rnr_retry = 7;

  // `base` with the keys of `options` applied (the keys of to_json()). Throws
  // InvalidArgumentError for an unknown key, a value of the wrong type or out of range.
  static RdmaOptions from_json(const nlohmann::json& options, RdmaOptions base);
  static RdmaOptions from_json(const nlohmann::json& options);  // over the defaults
  void validate() const;  // throws InvalidArgumentError naming the bad option
  nlohmann::json to_json() const;
};

class RdmaEndpointImpl;
class MemoryRegistry;
struct RdmaTransport;

// Peer-to-peer transport over RDMA RC queue pairs (libibverbs, or the simulated device
// under DLSLIME_RDMA_SIM=1). See docs/rdma.md.
class DLSLIME_API RDMAEndpoint final : public Endpoint {
 public:
  // Opens the device and creates the QPs (in INIT). Throws InvalidArgumentError for bad
  // options, NotFoundError for an unknown device, ConnectionError for a port that is
  // down, of the wrong link layer, or without a usable GID.
  explicit RDMAEndpoint(RdmaOptions options = RdmaOptions());
  ~RDMAEndpoint() override;

  nlohmann::json endpoint_info() const override;
  void connect(const nlohmann::json& peer_info) override;
  bool is_connected() const override;

  int32_t register_memory_region(const std::string& name, uintptr_t addr, uint64_t offset,
                                 uint64_t length) override;
  // Upstream DLSlime's dma-buf registration (docs/rdma.md, "GPU memory"): [offset, +length)
  // of the dma-buf `fd` (borrowed for the call), addressed as [iova, +length). `iova` must be
  // the GPU address of that byte in this process (the pointer the dma-buf was exported
  // from): the region is that GPU memory, registered as any GPU region is. Throws
  // InvalidArgumentError for a bad fd, an empty or out-of-range range, or an iova that is
  // not GPU memory; what registering GPU memory throws otherwise.
  int32_t register_dmabuf_memory_region(const std::string& name, int fd, uint64_t offset, uint64_t length,
                                        uint64_t iova);
  // The same into a memory registry shared by RDMA endpoints (the Python RDMAMemoryPool's).
  static int32_t add_dmabuf_region(MemoryRegistry& registry, const std::string& name, int fd, uint64_t offset,
                                   uint64_t length, uint64_t iova);
  int32_t register_remote_memory_region(const std::string& name, const nlohmann::json& mr_info_entry) override;
  void unregister_memory_region(const std::string& name) override;
  void unregister_memory_region(int32_t handle) override;
  nlohmann::json mr_info() const override;
  nlohmann::json mr_info_of(const std::string& name) const override;

  Capabilities capabilities() const override;
  void shutdown() override;

  const RdmaOptions& options() const;
  // QP numbers, in lane order (tests: fault injection on the simulated device).
  std::vector<uint32_t> qp_nums() const;

 protected:
  Future do_submit(OpRequest request) override;

 private:
  friend struct RdmaTransport;
  RDMAEndpoint(RdmaOptions options, std::shared_ptr<MemoryRegistry> regions);

  std::shared_ptr<RdmaEndpointImpl> impl_;
};

}  // namespace dlslime
