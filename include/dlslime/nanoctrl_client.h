#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "dlslime/export.h"

namespace dlslime {

class NanoCtrlClientImpl;

// HTTP/JSON client of NanoCtrl (docs/control-plane.md lists the routes). Thread-safe: calls
// from several threads run concurrently on separate connections, so a blocked mailbox
// receive never holds up a heartbeat.
//
// Errors: a 400 or 413 reply throws InvalidArgumentError, 401 (missing or wrong token)
// AuthenticationError, 404 NotFoundError, 409/429/other 4xx Error, 503 or an unreachable
// server ConnectionError, a reply that did not come in time TimeoutError. The exception text
// is the server's message.
class DLSLIME_API NanoCtrlClient {
 public:
  // `url`: "http://host:port" (the scheme may be left out). `scope`: added to every request;
  // empty = no scope. `timeout`: connect and reply deadline of ordinary calls. `token`: the
  // NanoCtrl's bearer token, sent as `Authorization: Bearer <token>` with every request;
  // empty = the environment variable DLSLIME_NANOCTRL_TOKEN, and no header when that is unset
  // or empty too. Throws InvalidArgumentError for a token an HTTP header cannot carry.
  explicit NanoCtrlClient(const std::string& url = "http://127.0.0.1:4479", std::string scope = "",
                          std::chrono::milliseconds timeout = std::chrono::milliseconds(10000),
                          const std::string& token = "");
  ~NanoCtrlClient();
  NanoCtrlClient(const NanoCtrlClient&) = delete;
  NanoCtrlClient& operator=(const NanoCtrlClient&) = delete;

  const std::string& url() const;
  const std::string& scope() const;
  // Whether requests carry a bearer token (the token itself is not readable back).
  bool has_token() const;

  // GET /healthz. Returns the body; throws ConnectionError when unhealthy or unreachable.
  nlohmann::json healthz();

  // Agents. `fields` is the /start_peer_agent body (alias, address, device, ib_port,
  // link_type, resource, metadata, endpoint_info, name_prefix); the reply carries `name`.
  nlohmann::json start_peer_agent(const nlohmann::json& fields);
  // "ok" or "not_found" (the record expired: register again).
  std::string heartbeat(const std::string& entity_id, const std::string& entity_type = "agent");
  nlohmann::json query();                                   // array of agent records
  std::optional<nlohmann::json> get_peer_agent(const std::string& name);  // nullopt if absent
  nlohmann::json cleanup(const std::string& agent_name);    // reply has `notified`

  // Desired topology.
  nlohmann::json set_desired_topology(const std::string& agent, const std::vector<std::string>& target_peers,
                                      bool symmetric = false, std::optional<double> min_bw = std::nullopt);
  std::optional<nlohmann::json> get_desired_topology(const std::string& agent);

  // Memory-region records. `mr_info` is the transport's blob for the region (kept as is).
  void register_mr(const std::string& agent_name, const std::string& mr_name, const nlohmann::json& mr_info);
  std::optional<nlohmann::json> get_mr_info(const std::string& owner, const std::string& mr_name);
  bool unregister_mr(const std::string& agent_name, const std::string& mr_name);

  // Generic entity registry.
  nlohmann::json register_entity(const std::string& entity_id, const std::string& kind,
                                 const std::string& entity_type, const nlohmann::json& extra);
  bool unregister_entity(const std::string& entity_id, const std::string& entity_type = "service");
  std::optional<nlohmann::json> get_entity_info(const std::string& entity_id,
                                                const std::string& entity_type = "service");
  nlohmann::json list_entities(const std::string& entity_type = "", const std::string& kind = "");

  // Mailbox. post() returns the recipient's queue depth after the post. recv() waits up
  // to `timeout` for the first message and returns up to `max_messages` (empty on timeout);
  // each message is {"from", "message", "ts_ms"}.
  uint64_t post(const std::string& to, const nlohmann::json& message, const std::string& from = "");
  std::vector<nlohmann::json> recv(const std::string& alias, std::chrono::milliseconds timeout,
                                   uint32_t max_messages = 1);

  // Any route: POST `body` (with the scope added) to `path` and return the reply body.
  // Same error mapping as the named calls.
  nlohmann::json call(const std::string& path, const nlohmann::json& body);

 private:
  std::unique_ptr<NanoCtrlClientImpl> impl_;
};

}  // namespace dlslime
