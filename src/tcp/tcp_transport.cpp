// The TCP transport's entry in the transport registry (core/transport_registry.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

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

void register_tcp_transport(TransportRegistry& registry) {
  registry.add({"tcp", [] { return TransportProbe{true, "", {}}; }, &TcpTransport::make});
}

}  // namespace dlslime
