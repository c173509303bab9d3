// The RDMA transport's entry in the transport registry (core/transport_registry.h).
// The probe is the selected provider's device list (DLSLIME_RDMA_SIM=1: the simulated
// device) as SLIME_VISIBLE_DEVICES filters it; the factory builds an RDMAEndpoint from RdmaOptions' keys.
#include <nlohmann/json.hpp>

#include "core/transport_registry.h"
#include "dlslime/errors.h"
#include "dlslime/rdma_endpoint.h"
#include "rdma/rdma_device.h"

namespace dlslime {

struct RdmaTransport {
  static std::shared_ptr<Endpoint> make(const nlohmann::json& options, std::shared_ptr<MemoryRegistry> memory) {
    return std::shared_ptr<Endpoint>(new RDMAEndpoint(RdmaOptions::from_json(options), std::move(memory)));
  }
};

namespace {

TransportProbe probe_rdma() {
  TransportProbe probe;
  probe.devices = rdma::visible_devices();
  probe.available = !probe.devices.empty();
  if (!probe.available) probe.reason = rdma::no_visible_device_reason();
  return probe;
}

}  // namespace

void register_rdma_transport(TransportRegistry& registry) {
  registry.add({"rdma", &probe_rdma, &RdmaTransport::make});
}

}  // namespace dlslime
