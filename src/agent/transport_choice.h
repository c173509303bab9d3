// How PeerAgent chooses a transport for a peer, from the two agents' NanoCtrl records and
// each transport's registry hooks (core/transport_registry.h, AgentHooks). Nothing here
// names a transport.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/transport_registry.h"

namespace dlslime {

using nlohmann::json;

// The agent hooks of transport `name`; null for one not built.
const AgentHooks* hooks_of(const std::string& name);
// The entry of transport `name` in a published transports list; null when there is none.
json transport_entry(const json& transports, const std::string& name);
// "tcp, rdma": the names in a published transports list ("none" for none).
std::string names_of(const json& transports);
// Why the agent whose NanoCtrl record is `record` cannot take a connection over
// `transport`; nullopt if it can, or if its record does not say (another implementation).
std::optional<std::string> not_served_by(const json& record, const std::string& peer, const std::string& transport);

// A transport's answer to "does it reach the peer?", with the transport's name and rank.
struct Considered {
  std::string transport;
  int rank = 0;
  TransportReach reach;
};

struct Choice {
  std::string transport;  // "" when none reaches
  std::string reason;
  json request;           // connect_to's request with what the transport chose in it
};

// Every transport built here, highest rank first, each asked whether it reaches the peer
// whose NanoCtrl record is `record` for `request`: one this agent (`served`: its published
// transports, `settings`: their configured settings by name, `address`: its published
// address) does not serve, or whose name the peer's record does not list, is passed over
// with that reason; the others answer through their reach() hook (a transport without one
// reaches every peer that serves it).
std::vector<Considered> consider_transports(const json& served, const json& settings, const std::string& address,
                                            const json& record, const std::string& peer, const json& request);
// transport="auto"'s pick from consider_transports().
Choice choose(const std::vector<Considered>& considered, const std::string& peer);

}  // namespace dlslime
