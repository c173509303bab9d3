#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "dlslime/endpoint.h"
#include "dlslime/export.h"

namespace dlslime {

// NVLinkEndpoint options (docs/nvlink.md, "NVLinkEndpoint"). Parsed and validated once, at construction.
struct DLSLIME_API NvlinkOptions {
  // The GPU this endpoint copies with: its stream, its events, and where it maps the peer's memory.
  int device = 0;
  // Deadline of read and write ops, from submission; 0 = none. A GPU copy cannot be taken
  // back, so an op past its deadline completes with TIMEOUT once its copies have finished.
  std::chrono::milliseconds op_timeout{30000};
  // How long a recv_notify waits when it sets no timeout of its own (0: no limit), as the
  // other transports' recv_timeout.
  std::chrono::milliseconds recv_timeout{0};

  // `base` with the keys of `options` applied (the keys of to_json()). Throws
  // InvalidArgumentError for an unknown key, a value of the wrong type or out of range.
  static NvlinkOptions from_json(const nlohmann::json& options, NvlinkOptions base);
  static NvlinkOptions from_json(const nlohmann::json& options);  // over the defaults
  void validate() const;
  nlohmann::json to_json() const;
};

class NVLinkEndpointImpl;
class MemoryRegistry;
struct NvlinkTransport;

// One-sided reads and writes between GPU memory of processes on one host, over CUDA IPC
// (or the simulated GPU under DLSLIME_GPU_SIM=1). See docs/nvlink.md.
class DLSLIME_API NVLinkEndpoint final : public Endpoint {
 public:
  // Throws gpu::GpuUnavailableError (a GpuError) without a GPU runtime, InvalidArgumentError
  // for bad options or an unknown device.
  explicit NVLinkEndpoint(NvlinkOptions options = NvlinkOptions());
  ~NVLinkEndpoint() override;

  nlohmann::json endpoint_info() const override;
  // Checks the peer is on this host and opens the IPC handles of its published regions,
  // registering each under its name (a region that cannot be opened is kept, and its ops fail).
  // Once the connected peer has exited (seen through its pidfd), connect() drops its regions
  // (their handles fail UNKNOWN_HANDLE) and connects to the new peer; ConnectionError while
  // the peer is alive.
  void connect(const nlohmann::json& peer_info) override;
  bool is_connected() const override;

  // Device memory only (InvalidArgumentError for host memory). The region's IPC handle is
  // that of the allocation holding addr+offset, published with the region's place in it.
  int32_t register_memory_region(const std::string& name, uintptr_t addr, uint64_t offset,
                                 uint64_t length) override;
  int32_t register_remote_memory_region(const std::string& name, const nlohmann::json& mr_info_entry) override;
  void unregister_memory_region(const std::string& name) override;
  void unregister_memory_region(int32_t handle) override;
  nlohmann::json mr_info() const override;
  nlohmann::json mr_info_of(const std::string& name) const override;

  // read/write with their copies queued on `stream` (a cudaStream_t; nullptr: the device's
  // default stream) instead of the endpoint's own, so they run after the work already on it.
  Future read_on(std::vector<Assignment> assignments, void* stream, std::chrono::milliseconds timeout = {});
  Future write_on(std::vector<Assignment> assignments, void* stream, std::chrono::milliseconds timeout = {},
                  std::optional<std::string> notification = std::nullopt);

  // The handles named regions have (upstream's named assignments), or nullopt.
  std::optional<int32_t> local_handle(const std::string& name) const;
  std::optional<int32_t> remote_handle(const std::string& name) const;

  Capabilities capabilities() const override;
  void shutdown() override;
  const NvlinkOptions& options() const;

 protected:
  Future do_submit(OpRequest request) override;

 private:
  friend struct NvlinkTransport;
  NVLinkEndpoint(NvlinkOptions options, std::shared_ptr<MemoryRegistry> regions);

  std::shared_ptr<NVLinkEndpointImpl> impl_;
};

}  // namespace dlslime
