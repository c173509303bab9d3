#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "dlslime/nanoctrl.h"
#include "nanoctrl/request.h"
#include "nanoctrl/store.h"

// The control plane's semantics, independent of HTTP: each call takes a validated request
// body and returns the reply body, or throws ApiError (4xx) / StoreUnavailable (503).
//
// Key layout (p = key_prefix + scope + ":"; a scope never contains ':', so scopes never see
// each other's keys):
//   p agent:{alias}        agent record (JSON), expires after ttl without a heartbeat
//   p agent_counter        counter for auto-generated aliases
//   p mr:{alias}:{mr}      memory-region record
//   p topo:{alias}         desired topology spec
//   p mbox:{alias}         mailbox (list of JSON envelopes), dropped after mailbox_ttl idle
//   p peers:{alias}        agents that exchanged messages or topology with the alias (set)
//   p entity:{type}:{id}   generic entity record, expires after ttl without a heartbeat
//   p entity_rev:{type}    revision counter of an entity type
namespace dlslime::nanoctrl {

class ControlService {
 public:
  ControlService(Store& store, const NanoCtrlConfig& config);

  nlohmann::json start_peer_agent(const nlohmann::json& req);
  nlohmann::json heartbeat(const nlohmann::json& req);
  nlohmann::json query(const nlohmann::json& req);
  nlohmann::json get_peer_agent(const nlohmann::json& req);
  nlohmann::json cleanup(const nlohmann::json& req);
  nlohmann::json set_desired_topology(const std::string& agent, const nlohmann::json& req);
  nlohmann::json get_desired_topology(const std::string& agent, const nlohmann::json& req);
  nlohmann::json register_mr(const nlohmann::json& req);
  nlohmann::json get_mr_info(const nlohmann::json& req);
  nlohmann::json unregister_mr(const nlohmann::json& req);
  nlohmann::json register_entity(const nlohmann::json& req);
  nlohmann::json unregister_entity(const nlohmann::json& req);
  nlohmann::json get_entity_info(const nlohmann::json& req);
  nlohmann::json list_entities(const nlohmann::json& req);
  // Upstream DLSlime's /get_redis_address: the Redis URL (without its password) when NanoCtrl
  // keeps its state in Redis; 404 with the memory store, which has none to hand out.
  nlohmann::json get_redis_address(const nlohmann::json& req);
  nlohmann::json mailbox_post(const nlohmann::json& req);
  // Blocks up to the requested timeout (clamped to max_wait); the caller bounds concurrency.
  nlohmann::json mailbox_recv(const nlohmann::json& req);

  struct Stats {
    uint64_t agents = 0;
    uint64_t entities = 0;
    uint64_t mailboxes = 0;
    uint64_t mailbox_messages = 0;
  };
  // Counts over every scope (a key scan: meant for /metrics, not the hot path).
  Stats stats();

 private:
  std::string prefix(const std::string& scope) const;
  std::string agent_key(const std::string& scope, const std::string& alias) const;
  bool agent_exists(const std::string& scope, const std::string& alias);
  void require_agent(const std::string& scope, const std::string& alias, const char* role);
  // Pushes a NanoCtrl-originated message; false when the mailbox is full.
  bool notify(const std::string& scope, const std::string& to, const nlohmann::json& message);
  void link_peers(const std::string& scope, const std::string& a, const std::string& b);
  // The 409 for a cleanup whose incarnation is not the live registration's.
  ApiError stale_cleanup(const std::string& scope, const std::string& alias) const;
  void drop_agent_state(const std::string& scope, const std::string& alias, bool with_record);
  std::vector<nlohmann::json> load_json(const std::vector<std::string>& keys);

  Store& store_;
  const NanoCtrlConfig& config_;
};

}  // namespace dlslime::nanoctrl
