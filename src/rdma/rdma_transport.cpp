// The RDMA transport's entry in the transport registry (core/transport_registry.h).
// The probe is the selected provider's device list (DLSLIME_RDMA_SIM=1: the simulated
// device) as SLIME_VISIBLE_DEVICES filters it; the factory builds an RDMAEndpoint from RdmaOptions' keys.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "core/record_fields.h"
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

// --- what PeerAgent needs (core/transport_registry.h, AgentHooks) --------------------------

// The agent's device (PeerAgentOptions::device): the one its connections use where
// connect_to and the peer name none ("": the first with an active port).
nlohmann::json rdma_settings(const nlohmann::json& settings, const std::string& device) {
  for (const auto& [key, value] : settings.items()) {
    if (key != "device" || !value.is_string()) {
      throw InvalidArgumentError(fmt::format("unknown rdma agent option '{}' (known: device, a string)", key));
    }
  }
  return {{"device", settings.value("device", device)}};
}

// Every active port here, as "auto" compares them: [{"device", "ib_port", "link_layer"}].
nlohmann::json rdma_advertise(const nlohmann::json&) {
  nlohmann::json ports = nlohmann::json::array();
  for (const auto& p : TransportRegistry::instance().ports("rdma")) {
    ports.push_back({{"device", p.device}, {"ib_port", p.port}, {"link_layer", p.link_layer}});
  }
  return {{"ports", std::move(ports)}};
}

// A published port: a device, a port number and a link layer, each of its type; nullopt for
// an entry that lacks one (a malformed record).
struct PublishedPort {
  std::string device;
  int64_t ib_port = 0;
  std::string link_layer;
};
std::optional<PublishedPort> published_port(const nlohmann::json& p) {
  const std::optional<int64_t> port = int_field(p, "ib_port");
  PublishedPort out{text_field(p, "device"), port.value_or(0), text_field(p, "link_layer")};
  if (!port || out.device.empty() || out.link_layer.empty()) return std::nullopt;
  return out;
}

nlohmann::json ports_of(const nlohmann::json& entry) {
  return entry.is_object() && entry.contains("ports") && entry["ports"].is_array() ? entry["ports"]
                                                                                 : nlohmann::json::array();
}

std::string layer_label(const std::string& layer) {
  if (layer == "Ethernet") return "RoCE";
  if (layer == "InfiniBand") return "IB";
  return layer;
}

// Reaches when a usable port of this agent (within local_device and ib_port) and one the peer
// publishes (within peer_device; ib_port is both sides', as upstream DLSlime's) have the same
// link layer. Both sides come to the same answer from the same records. A peer entry with
// no "ports" at all (an agent from before they were published) is not checked.
TransportReach rdma_reach(const ReachQuery& q) {
  const nlohmann::json& mine = q.mine;
  const nlohmann::json& theirs = q.theirs;
  const std::string& peer = q.peer;
  TransportReach r{false, "", true, q.request};
  const std::string asked = text_field(q.request, "local_device");
  const std::string want_local = asked.empty() ? text_field(q.settings, "device") : asked;
  const nlohmann::json& request = q.request;
  const std::string want_peer = text_field(request, "peer_device");
  const int64_t ib_port = int_field(request, "ib_port").value_or(1);
  std::vector<PublishedPort> local;
  for (const auto& p : ports_of(mine)) {
    const std::optional<PublishedPort> port = published_port(p);  // ours: always well formed
    if (port && (want_local.empty() || port->device == want_local) && port->ib_port == ib_port) local.push_back(*port);
  }
  if (local.empty()) {
    r.reason = fmt::format("this agent has no usable RDMA port {}{}", want_local.empty() ? "" : want_local + " ", ib_port);
    return r;
  }
  if (!theirs.is_object() || !theirs.contains("ports")) {
    r.checked = false;  // an agent from before ports were published: tried when asked for
    r.reason = fmt::format("the peer agent '{}' publishes no RDMA device", peer);
    return r;
  }
  const nlohmann::json published = ports_of(theirs);
  std::vector<PublishedPort> remote;
  size_t malformed = 0;
  for (const auto& p : published) {
    const std::optional<PublishedPort> port = published_port(p);
    if (!port) {
      ++malformed;
      continue;
    }
    if ((want_peer.empty() || port->device == want_peer) && port->ib_port == ib_port) remote.push_back(*port);
  }
  if (remote.empty()) {
    if (malformed > 0) {
      r.reason = fmt::format(
          "the peer agent '{}' publishes {} malformed RDMA port(s) (each needs a string device and link_layer and "
          "an integer ib_port){}",
          peer, malformed, published.size() > malformed ? " and no usable one" : "");
    } else if (published.empty()) {
      r.reason = fmt::format("the peer agent '{}' publishes no RDMA device", peer);
    } else {
      r.reason = want_peer.empty() ? fmt::format("the peer agent '{}' publishes no RDMA port {}", peer, ib_port)
                                   : fmt::format("the peer agent '{}' publishes no RDMA device '{}' port {}", peer,
                                                 want_peer, ib_port);
    }
    return r;
  }
  for (const auto& l : local) {
    for (const auto& p : remote) {
      if (l.link_layer != p.link_layer) continue;
      r.ok = true;
      r.request["local_device"] = l.device;
      r.request["peer_device"] = p.device;
      r.reason = fmt::format("both agents serve {} ({} here, {} on '{}')", layer_label(l.link_layer), l.device, p.device,
                             peer);
      return r;
    }
  }
  auto layers = [](const std::vector<PublishedPort>& ports) {
    std::vector<std::string> out;
    for (const auto& p : ports) out.push_back(p.device + " " + layer_label(p.link_layer));
    return fmt::format("{}", fmt::join(out, ", "));
  };
  r.reason = fmt::format("no RDMA link layer in common (this agent: {}; '{}': {})", layers(local), peer, layers(remote));
  return r;
}

nlohmann::json rdma_endpoint_options(const nlohmann::json& settings, const nlohmann::json& request) {
  const std::string device = text_field(request, "local_device");
  return {{"ib_port", request.value("ib_port", 1)},
          {"num_qp", request.value("qp_num", 1)},
          {"device_name", device.empty() ? settings.value("device", std::string()) : device}};
}

// The connection's shape, in connect_to's terms, for the peer: our peer_device is its device.
nlohmann::json rdma_peer_options(const nlohmann::json&, const nlohmann::json& request) {
  return {{"qp_num", request.value("qp_num", 1)},
          {"device", request.value("peer_device", std::string())},
          {"ib_port", request.value("ib_port", 1)}};
}

// The caller's qp_num and ib_port, and its peer_device as our device (empty: ours). The types
// are checked here; the values by RdmaOptions (InvalidArgumentError).
nlohmann::json rdma_passive_options(const nlohmann::json& settings, const nlohmann::json& from_peer) {
  nlohmann::json request = nlohmann::json::object();
  auto take = [&](const char* key, const char* as, bool integer) {
    if (!from_peer.contains(key)) return;
    const nlohmann::json& v = from_peer[key];
    if (integer ? !v.is_number_integer() : !v.is_string()) {
      throw InvalidArgumentError(fmt::format("the peer's rdma option {} must be {}, not {}", key,
                                             integer ? "an integer" : "a string", v.dump()));
    }
    request[as] = v;
  };
  take("qp_num", "qp_num", true);
  take("ib_port", "ib_port", true);
  take("device", "local_device", false);
  return rdma_endpoint_options(settings, request);
}

}  // namespace

void register_rdma_transport(TransportRegistry& registry) {
  TransportEntry entry{"rdma", &probe_rdma, &RdmaTransport::make, &rdma_ports};
  entry.agent.rank = 200;
  entry.agent.configure = &rdma_settings;
  entry.agent.advertise = &rdma_advertise;
  entry.agent.reach = &rdma_reach;
  entry.agent.active_options = &rdma_endpoint_options;
  entry.agent.peer_options = &rdma_peer_options;
  entry.agent.passive_options = &rdma_passive_options;
  registry.add(std::move(entry));
}

}  // namespace dlslime
