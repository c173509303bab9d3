// TransportChoice: the transports a PeerAgent serves, each configured by its own hook; every
// built transport asked, through its registry hooks, whether it reaches a peer; and
// "auto"'s pick with its reason. Nothing here names a transport.
#include "agent/transport_choice.h"

#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/record_fields.h"
#include "dlslime/errors.h"
#include "dlslime/transport.h"

namespace dlslime {

// The agent hooks of transport `name` (core/transport_registry.h); null for one not built.
const AgentHooks* hooks_of(const std::string& name) {
  const TransportEntry* e = TransportRegistry::instance().find(name);
  return e ? &e->agent : nullptr;
}

// The entry of transport `name` in a published transports list; null when there is none.
json transport_entry(const json& transports, const std::string& name) {
  if (!transports.is_array()) return nullptr;
  for (const auto& t : transports) {
    if (t.is_object() && text_field(t, "name") == name) return t;
  }
  return nullptr;
}

namespace {

// The transports list of a peer's NanoCtrl record; null when the record has none (another
// implementation, or an agent from before they were published).
json published_transports(const json& record) {
  if (!record.is_object() || !record.contains("metadata") || !record["metadata"].is_object()) return nullptr;
  const json& meta = record["metadata"];
  return meta.contains("transports") && meta["transports"].is_array() ? meta["transports"] : json(nullptr);
}

// The peer's published entry for `name`, as a transport's reach() reads it: its object
// ({"name"} alone for a bare name, as earlier agents listed them); null when none.
json peer_entry(const json& record, const std::string& name) {
  const json transports = published_transports(record);
  if (transports.is_null()) return nullptr;
  for (const auto& t : transports) {
    if (t.is_string() && t.get<std::string>() == name) return json{{"name", name}};
    if (t.is_object() && text_field(t, "name") == name) return t;
  }
  return nullptr;
}

}  // namespace

std::string names_of(const json& transports) {
  std::vector<std::string> names;
  for (const auto& t : transports) names.push_back(t.at("name").get<std::string>());
  return names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "));
}

// Why the agent whose NanoCtrl record is `record` cannot take a connection over
// `transport`; nullopt if it can, or if its record does not say (another implementation).
// Names are accepted as strings too (the metadata of earlier agents: ["tcp"]).
std::optional<std::string> not_served_by(const json& record, const std::string& peer, const std::string& transport) {
  const json transports = published_transports(record);
  if (transports.is_null()) return std::nullopt;
  std::vector<std::string> names;
  for (const auto& t : transports) {
    if (t.is_string()) names.push_back(t.get<std::string>());
    if (t.is_object() && t.contains("name") && t["name"].is_string()) names.push_back(t["name"].get<std::string>());
  }
  if (std::find(names.begin(), names.end(), transport) != names.end()) return std::nullopt;
  return fmt::format("the peer agent '{}' does not serve transport \"{}\" (it serves: {})", peer, transport,
                     names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", ")));
}


namespace {

// The host name, for an agent whose transports publish no address of their own.
std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0 && name[0]) return name;
  return "127.0.0.1";
}

}  // namespace

TransportChoice::TransportChoice(const json& given, const std::string& device) {
  if (!given.is_object()) {
    throw InvalidArgumentError(fmt::format("transport_options must be an object keyed by transport name, not {}",
                                           given.dump()));
  }
  const std::vector<TransportInfo> transports = TransportRegistry::instance().list();
  std::vector<std::string> known;
  for (const auto& t : transports) known.push_back(t.name);
  for (const auto& [name, value] : given.items()) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      throw InvalidArgumentError(fmt::format("transport_options names no transport: '{}' (known: {})", name,
                                             fmt::join(known, ", ")));
    }
    if (!value.is_object()) {
      throw InvalidArgumentError(fmt::format("transport_options['{}'] must be an object, not {}", name, value.dump()));
    }
  }
  // The transports available here: each one's settings checked by itself, and what it
  // publishes ({"name", "devices"} and its advertise()), in the registry's order.
  for (const auto& t : transports) {
    if (!t.available) continue;
    const AgentHooks* hooks = hooks_of(t.name);
    const json mine = given.contains(t.name) ? given[t.name] : json::object();
    json settings = hooks && hooks->configure ? hooks->configure(mine, device) : mine;
    json entry = {{"name", t.name}, {"devices", t.devices}};
    if (hooks && hooks->advertise) entry.update(hooks->advertise(settings));
    if (address_.empty() && hooks && hooks->address) address_ = hooks->address(settings);
    settings_[t.name] = std::move(settings);
    served_.push_back(std::move(entry));
  }
  if (address_.empty()) address_ = host_name();
  if (device.empty()) return;
  std::vector<std::string> devices;
  bool found = false;
  for (const auto& t : transports) {
    if (!t.available || t.devices.empty()) continue;
    devices.push_back(fmt::format("{}: {}", t.name, fmt::join(t.devices, ", ")));
    found = found || std::find(t.devices.begin(), t.devices.end(), device) != t.devices.end();
  }
  if (!found) {
    throw InvalidArgumentError(fmt::format("device '{}' is not a device of this host (available: {})", device,
                                           devices.empty() ? "none" : fmt::format("{}", fmt::join(devices, "; "))));
  }
}

bool TransportChoice::serves(const std::string& transport) const {
  return std::any_of(served_.begin(), served_.end(), [&](const json& t) { return t["name"] == transport; });
}

json TransportChoice::settings_of(const std::string& transport) const {
  return settings_.contains(transport) ? settings_[transport] : json::object();
}

json TransportChoice::own_options(const std::string& transport, const json& request) const {
  const AgentHooks* hooks = hooks_of(transport);
  return hooks && hooks->active_options ? hooks->active_options(settings_of(transport), request)
                                        : settings_of(transport);
}

json TransportChoice::options_for_peer(const std::string& transport, const json& request) const {
  const AgentHooks* hooks = hooks_of(transport);
  return hooks && hooks->peer_options ? hooks->peer_options(settings_of(transport), request) : json::object();
}

json TransportChoice::passive_options(const std::string& transport, const json& from_peer) const {
  // Anyone may post a connect message: the transport takes only the keys its peer_options()
  // sends, never our token, timeouts or address.
  const AgentHooks* hooks = hooks_of(transport);
  return hooks && hooks->passive_options ? hooks->passive_options(settings_of(transport), from_peer)
                                         : settings_of(transport);
}

std::vector<Considered> TransportChoice::consider(const json& record, const std::string& peer,
                                                 const json& request) const {
  std::vector<Considered> out;
  for (const TransportInfo& t : TransportRegistry::instance().list()) {
    const AgentHooks* hooks = hooks_of(t.name);
    if (!hooks) continue;  // not built
    Considered c{t.name, hooks->rank, {false, "", true, request}};
    const json mine = transport_entry(served_, t.name);
    if (mine.is_null()) {
      c.reach.reason = t.available ? "this agent does not serve it" : "not available here (" + t.reason + ")";
    } else if (not_served_by(record, peer, t.name)) {
      c.reach.reason = fmt::format("the peer agent '{}' does not serve it", peer);
    } else if (hooks->reach) {
      const json theirs = peer_entry(record, t.name);
      c.reach = hooks->reach(ReachQuery{settings_of(t.name), mine, theirs, request, peer, address_});
    } else {
      c.reach = {true, "both agents serve it", true, request};
    }
    out.push_back(std::move(c));
  }
  std::stable_sort(out.begin(), out.end(), [](const Considered& a, const Considered& b) { return a.rank > b.rank; });
  return out;
}

// transport="auto": the highest-ranked transport that reaches. Its reason comes first, then
// each transport ranked above it with why it was passed over, so a user sees why NVLink or
// RDMA was not taken. Both sides of a connection come to the same answer from the same
// records, so a peer that also asks for "auto" agrees.
Choice TransportChoice::choose(const std::vector<Considered>& considered, const std::string& peer) {
  auto best = std::find_if(considered.begin(), considered.end(), [](const Considered& c) { return c.reach.ok; });
  if (best == considered.end()) {
    std::vector<std::string> why;
    for (const auto& c : considered) why.push_back(c.transport + ": " + c.reach.reason);
    return {"", fmt::format("no transport reaches the peer agent '{}' ({})", peer, fmt::join(why, "; ")), nullptr};
  }
  Choice out{best->transport, best->transport + ": " + best->reach.reason, best->reach.request};
  for (auto it = considered.begin(); it != best; ++it) {
    out.reason += fmt::format(" ({}: {})", it->transport, it->reach.reason);
  }
  return out;
}

}  // namespace dlslime
