// TransportChoice: what a PeerAgent serves and publishes, and how it chooses a transport
// for a peer, from the two agents' NanoCtrl records and each transport's registry hooks
// (core/transport_registry.h, AgentHooks). Nothing here names a transport.
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

// What a PeerAgent serves, and how it chooses a transport for a peer. Made once, from
// PeerAgentOptions (each transport checks its own settings), read-only after.
class TransportChoice {
 public:
  // `transport_options`: by transport name (InvalidArgumentError for another name, or a
  // value that is not an object); `device`: PeerAgentOptions::device, which must be a
  // device of some available transport when given.
  TransportChoice(const json& transport_options, const std::string& device);

  // The transports available here at construction, with their devices and what each
  // advertises ([{"name", "devices", ...}], in the registry's order): published in the
  // agent's NanoCtrl record.
  const json& served() const { return served_; }
  // The address the agent publishes (the first transport's that has one, else the host name).
  const std::string& address() const { return address_; }
  bool serves(const std::string& transport) const;
  // "tcp, rdma" ("none" for none).
  std::string names() const { return names_of(served_); }

  // Through the transport's hooks (core/transport_registry.h): the factory options of
  // connect_to's endpoint for `request` (ConnectOptions::to_json()), what the peer is told
  // to make its side with, and the options of a passive side's endpoint from what the peer
  // sent (docs/peer-agent.md, "Transport options").
  json own_options(const std::string& transport, const json& request) const;
  json options_for_peer(const std::string& transport, const json& request) const;
  json passive_options(const std::string& transport, const json& from_peer) const;

  // Every transport built here, highest rank first, each asked whether it reaches the peer
  // whose NanoCtrl record is `record` for `request`: one this agent does not serve, or whose
  // name the peer's record does not list, is passed over with that reason; the others
  // answer through their reach() hook (a transport without one reaches every peer that
  // serves it).
  std::vector<Considered> consider(const json& record, const std::string& peer, const json& request) const;
  // transport="auto"'s pick from consider().
  static Choice choose(const std::vector<Considered>& considered, const std::string& peer);

 private:
  // The transport's configured agent settings; {} for one not served.
  json settings_of(const std::string& transport) const;

  json served_ = json::array();
  json settings_ = json::object();  // transport name -> its configured agent settings
  std::string address_;
};

}  // namespace dlslime
