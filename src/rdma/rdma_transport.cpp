// The RDMA transport's entry in the transport registry (core/transport_registry.h).
// The probe is real (the selected provider's devices); RDMAEndpoint itself is not in this
// version yet, so the entry says so and the factory refuses with the same reason.
#include "core/transport_registry.h"
#include "dlslime/errors.h"
#include "rdma/verbs.h"

namespace dlslime {
namespace {

constexpr const char* kNotImplementedReason = "RDMAEndpoint is not implemented in this version yet";

TransportProbe probe_rdma() {
  TransportProbe probe;
  probe.devices = rdma::provider().list_devices();
  probe.available = false;
  probe.reason = probe.devices.empty() ? rdma::kNoDeviceReason : kNotImplementedReason;
  return probe;
}

}  // namespace

void register_rdma_transport(TransportRegistry& registry) {
  registry.add({"rdma", &probe_rdma,
                [](const nlohmann::json&, std::shared_ptr<MemoryRegistry>) -> std::shared_ptr<Endpoint> {
                  throw NotImplementedError(probe_rdma().reason);
                }});
}

}  // namespace dlslime
