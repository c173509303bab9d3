// The TCP transport's entry in the transport registry (core/transport_registry.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/advertise_address.h"
#include "core/transport_registry.h"
#include "dlslime/errors.h"
#include "dlslime/tcp_endpoint.h"

namespace dlslime {

struct TcpTransport {
  // Options: the bind address ("ip", "port") and TcpOptions' keys (TcpOptions::from_json).
  static std::shared_ptr<Endpoint> make(const nlohmann::json& options, std::shared_ptr<MemoryRegistry> memory) {
    std::string ip = "0.0.0.0";
    uint16_t port = 0;
    nlohmann::json rest = nlohmann::json::object();
    for (const auto& [key, value] : options.items()) {
      if (key == "ip") {
        if (!value.is_string()) throw InvalidArgumentError(fmt::format("tcp option ip must be a string, not {}", value.dump()));
        ip = value.get<std::string>();
      } else if (key == "port") {
        if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > 65535) {
          throw InvalidArgumentError(fmt::format("tcp option port must be an integer in 0..65535, not {}", value.dump()));
        }
        port = value.get<uint16_t>();
      } else {
        rest[key] = value;
      }
    }
    return std::shared_ptr<Endpoint>(new TcpEndpoint(ip, port, TcpOptions::from_json(rest), std::move(memory)));
  }
};

namespace {

// The agent's TCP settings: TcpOptions' keys and the token, over DLSLIME_TCP_* (from_env()).
nlohmann::json tcp_settings(const nlohmann::json& settings, const std::string& /*device*/) {
  const TcpOptions o = TcpOptions::from_json(settings.is_null() ? nlohmann::json::object() : settings);
  nlohmann::json j = o.to_json();
  j.erase("authenticated");  // a report of whether a token is set, not an option
  j["token"] = o.token;      // to_json() leaves the secret out; the factory needs it (never published)
  return j;
}

// The address an agent publishes: what its endpoints advertise for their default wildcard
// bind (core/advertise_address.h).
std::string tcp_address(const nlohmann::json& settings) {
  return choose_advertise_address("0.0.0.0", settings.value("advertise_host", ""),
                                  settings.value("advertise_interface", ""), "PeerAgent TCP option advertise_interface")
      .host;
}

TransportReach tcp_reach(const ReachQuery& q) { return {true, "both agents serve it", true, q.request}; }

// Every agent setting, and the bind address connect_to() asks for (local_host, local_port).
nlohmann::json tcp_endpoint_options(const nlohmann::json& settings, const nlohmann::json& request) {
  nlohmann::json j = settings;
  j["ip"] = request.value("local_host", std::string("0.0.0.0"));
  j["port"] = request.value("local_port", 0);
  return j;
}

// The connection's shape, chosen by the side that called connect_to. Everything else
// (timeouts, buffers, the token, the bind address) stays each agent's own.
nlohmann::json tcp_peer_options(const nlohmann::json& settings, const nlohmann::json&) {
  return {{"lanes", settings.at("lanes")}, {"chunk_size", settings.at("chunk_size")}};
}

nlohmann::json tcp_passive_options(const nlohmann::json& settings, const nlohmann::json& from_peer) {
  nlohmann::json j = tcp_endpoint_options(settings, nlohmann::json::object());
  for (const char* key : {"lanes", "chunk_size"}) {
    if (from_peer.contains(key)) j[key] = from_peer[key];  // checked by the factory (InvalidArgumentError)
  }
  return j;
}

}  // namespace

void register_tcp_transport(TransportRegistry& registry) {
  TransportEntry entry;
  entry.name = "tcp";
  entry.probe = [] { return TransportProbe{true, "", {}}; };
  entry.make = &TcpTransport::make;
  entry.agent.rank = 100;  // works between any two hosts: what "auto" falls back to
  entry.agent.configure = &tcp_settings;
  entry.agent.reach = &tcp_reach;
  entry.agent.active_options = &tcp_endpoint_options;
  entry.agent.peer_options = &tcp_peer_options;
  entry.agent.passive_options = &tcp_passive_options;
  entry.agent.address = &tcp_address;
  registry.add(std::move(entry));
}

}  // namespace dlslime
