#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "dlslime/endpoint.h"
#include "dlslime/export.h"

namespace dlslime {

// AscendDirectEndpoint options (docs/ascend.md, "Options"). Parsed and validated once, at
// construction.
struct DLSLIME_API AscendOptions {
  // The engine's name is "host:port"; the engine listens there. Port 0 picks a free port.
  std::string host = "127.0.0.1";
  int port = 0;
  // The NPU this endpoint's process uses (the library's current device).
  int device = 0;
  // How long connect() (and a reconnect before an op) waits for the peer's engine.
  std::chrono::milliseconds connect_timeout{10000};
  // Deadline of read and write ops, from submission; 0 = none. The library sets none: an op
  // past it fails TIMEOUT and its link is disconnected, as the library requires; the next op
  // reconnects.
  std::chrono::milliseconds op_timeout{30000};
  // How long a recv_notify waits when it sets no timeout of its own (0: no limit).
  std::chrono::milliseconds recv_timeout{0};
  // Passed to the library's Initialize, validated against the values it documents:
  // RdmaTrafficClass, RdmaServiceLevel, BufferPool, LocalCommRes, AutoConnect.
  std::map<std::string, std::string> engine_options;

  // `base` with the keys of `options` applied (the keys of to_json(); engine options under
  // their own names). Throws InvalidArgumentError for an unknown key, a value of the wrong
  // type or out of range.
  static AscendOptions from_json(const nlohmann::json& options, AscendOptions base);
  static AscendOptions from_json(const nlohmann::json& options);  // over the defaults
  void validate() const;
  nlohmann::json to_json() const;
};

class AscendEndpointImpl;
class MemoryRegistry;
struct AscendTransport;

// One-sided reads and writes, and notifications, between NPU (or host) memory of processes
// on one host or several, over Huawei's HIXL/ADXL (or the simulated HIXL under
// DLSLIME_ASCEND_SIM=1). See docs/ascend.md.
class DLSLIME_API AscendDirectEndpoint final : public Endpoint {
 public:
  // Throws ConnectionError without the CANN runtime (naming it and DLSLIME_ASCEND_SIM),
  // InvalidArgumentError for bad options.
  explicit AscendDirectEndpoint(AscendOptions options = AscendOptions());
  ~AscendDirectEndpoint() override;

  // {"transport": "ascend", "engine": "host:port", "mr_info": {...}}.
  nlohmann::json endpoint_info() const override;
  // Links this engine to the peer's (waiting at most connect_timeout) and registers its
  // published regions. Connecting to another peer later keeps the first one's regions: each
  // remote region names its own engine, and an op goes to the engine of its region.
  void connect(const nlohmann::json& peer_info) override;
  bool is_connected() const override;

  // NPU or host memory; the engine registers it (MEM_DEVICE or MEM_HOST).
  int32_t register_memory_region(const std::string& name, uintptr_t addr, uint64_t offset,
                                 uint64_t length) override;
  int32_t register_remote_memory_region(const std::string& name, const nlohmann::json& mr_info_entry) override;
  void unregister_memory_region(const std::string& name) override;
  void unregister_memory_region(int32_t handle) override;
  nlohmann::json mr_info() const override;
  nlohmann::json mr_info_of(const std::string& name) const override;

  // The handles named regions have (upstream's named assignments), or nullopt.
  std::optional<int32_t> local_handle(const std::string& name) const;
  std::optional<int32_t> remote_handle(const std::string& name) const;
  // This endpoint's engine name, "host:port".
  std::string engine_name() const;
  // Upstream's two-step form (AscendDirectEndpoint() then init(host, port)): restarts the
  // engine under "host:port" (port 0: a free one). Only before any region is registered and
  // any connect(): InvalidArgumentError after.
  void init(const std::string& host, int port);

  Capabilities capabilities() const override;
  void shutdown() override;
  const AscendOptions& options() const;

 protected:
  Future do_submit(OpRequest request) override;

 private:
  friend struct AscendTransport;
  AscendDirectEndpoint(AscendOptions options, std::shared_ptr<MemoryRegistry> regions);

  std::shared_ptr<AscendEndpointImpl> impl_;
};

}  // namespace dlslime
