// The RDMA transport's entry in the transport registry (core/transport_registry.h).
// The probe is the selected provider's device list (DLSLIME_RDMA_SIM=1: the simulated
// device) as SLIME_VISIBLE_DEVICES filters it; the factory builds an RDMAEndpoint from RdmaOptions' keys.
#include <nlohmann/json.hpp>

#include "core/log.h"
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
  try {
    probe.devices = rdma::visible_devices();
  } catch (const ConnectionError& e) {  // libibverbs cannot be loaded here: that is the reason
    probe.reason = e.what();
    return probe;
  }
  probe.available = !probe.devices.empty();
  if (!probe.available) probe.reason = rdma::no_visible_device_reason();
  return probe;
}

// Every active port of every visible device, from the device layer alone: a context is
// opened per device (no PD, CQ or QP) and its ports queried. Verbs has no port count on
// this seam; ports are numbered 1..phys_port_cnt, so the first port whose query fails
// (EINVAL past the last) ends a device's list. A port is left out when it is not active,
// its link layer is unknown or its GID table has no entry: transport="auto" must not pick
// what an endpoint cannot open.
std::vector<TransportPort> rdma_ports() {
  std::vector<TransportPort> out;
  for (const auto& name : rdma::visible_devices()) {
    std::unique_ptr<rdma::Context> ctx;
    try {
      ctx = rdma::provider().open(name);
    } catch (const std::exception& e) {
      DLSLIME_INFO("RDMA device {} cannot be opened, so none of its ports is listed: {}", name, e.what());
      continue;
    }
    for (int port = 1; port <= 255; ++port) {
      rdma::PortAttr attr;
      try {
        attr = ctx->query_port(static_cast<uint8_t>(port));
      } catch (const std::exception&) {
        break;  // past the device's last port
      }
      if (attr.state != rdma::PortState::kActive || attr.link_layer == rdma::LinkLayer::kUnspecified) continue;
      bool has_gid = false;
      for (int i = 0; i < attr.gid_table_len && !has_gid; ++i) {
        try {
          has_gid = !ctx->query_gid(static_cast<uint8_t>(port), i).empty();
        } catch (const std::exception&) {
          break;
        }
      }
      if (!has_gid) continue;
      out.push_back({name, port, rdma::link_layer_name(attr.link_layer)});
    }
  }
  return out;
}

}  // namespace

void register_rdma_transport(TransportRegistry& registry) {
  registry.add({"rdma", &probe_rdma, &RdmaTransport::make, &rdma_ports});
}

}  // namespace dlslime
