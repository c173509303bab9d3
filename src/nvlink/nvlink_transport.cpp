// The NVLink transport's entry in the transport registry (core/transport_registry.h). The
// probe is the device runtime's: available with a GPU (or DLSLIME_GPU_SIM=1), else the
// runtime's reason, which names the GPU and DLSLIME_GPU_SIM; the factory builds an
// NVLinkEndpoint from NvlinkOptions' keys.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/transport_registry.h"
#include "dlslime/nvlink_endpoint.h"
#include "gpu/device_runtime.h"

namespace dlslime {

struct NvlinkTransport {
  static std::shared_ptr<Endpoint> make(const nlohmann::json& options, std::shared_ptr<MemoryRegistry> memory) {
    return std::shared_ptr<Endpoint>(new NVLinkEndpoint(NvlinkOptions::from_json(options), std::move(memory)));
  }
};

namespace {

TransportProbe probe_nvlink() {
  TransportProbe probe;
  probe.reason = gpu::unavailable_reason();
  probe.available = probe.reason.empty();
  if (probe.available) {
    gpu::Runtime& rt = gpu::runtime();
    for (int d = 0; d < rt.device_count(); ++d) probe.devices.push_back(fmt::format("{}:{}", rt.name(), d));
  }
  return probe;
}

}  // namespace

void register_nvlink_transport(TransportRegistry& registry) {
  TransportEntry entry;
  entry.name = "nvlink";
  entry.probe = &probe_nvlink;
  entry.make = &NvlinkTransport::make;
  registry.add(std::move(entry));
}

}  // namespace dlslime
