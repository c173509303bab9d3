#include "nanoctrl/control_service.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <map>
#include <random>
#include <set>

#include <fmt/format.h>

#include "core/log.h"
#include "nanoctrl/request.h"

namespace dlslime::nanoctrl {

using nlohmann::json;

namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string scope_label(const std::string& scope) { return scope.empty() ? "(none)" : "'" + scope + "'"; }

json envelope(const std::string& from, const json& message) {
  return json{{"from", from}, {"message", message}, {"ts_ms", now_ms()}};
}

constexpr const char* kServerSender = "nanoctrl";

// Names one registration of an alias: 128 random bits, so a later registration of the same
// alias (after a cleanup or expiry, here or on another NanoCtrl sharing the Redis) never
// gets the same value.
std::string new_incarnation() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
}

// The `incarnation` a request names, or "" when it names none (upstream clients).
std::string requested_incarnation(const Fields& f) {
  auto v = f.opt_string("incarnation");
  if (!v) return "";
  if (v->empty() || v->size() > 64) throw bad_request("field 'incarnation' must be the 1-64 character string "
                                                      "/start_peer_agent returned");
  return *v;
}

// The incarnation stored in an agent record ("" for an unparsable record).
std::string record_incarnation(const std::string& record) {
  json r = json::parse(record, nullptr, /*allow_exceptions=*/false);
  return r.is_object() ? r.value("incarnation", "") : "";
}

}  // namespace

ControlService::ControlService(Store& store, const NanoCtrlConfig& config) : store_(store), config_(config) {}

std::string ControlService::prefix(const std::string& scope) const { return config_.key_prefix + scope + ":"; }

std::string ControlService::agent_key(const std::string& scope, const std::string& alias) const {
  return prefix(scope) + "agent:" + alias;
}

bool ControlService::agent_exists(const std::string& scope, const std::string& alias) {
  return store_.get(agent_key(scope, alias)).has_value();
}

void ControlService::require_agent(const std::string& scope, const std::string& alias, const char* role) {
  if (!agent_exists(scope, alias)) {
    throw ApiError(404, fmt::format("{} '{}' is not a registered agent in scope {} (never registered, cleaned up, "
                                    "or expired without heartbeats)",
                                    role, alias, scope_label(scope)));
  }
}

std::vector<json> ControlService::load_json(const std::vector<std::string>& keys) {
  std::vector<json> out;
  auto values = store_.mget(keys);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!values[i]) continue;  // expired between the scan and the read
    json v = json::parse(*values[i], nullptr, /*allow_exceptions=*/false);
    if (v.is_discarded()) {
      DLSLIME_WARN("nanoctrl: ignoring unparsable record at key {}", keys[i]);
      continue;
    }
    out.push_back(std::move(v));
  }
  return out;
}

bool ControlService::notify(const std::string& scope, const std::string& to, const json& message) {
  auto depth = store_.list_push(prefix(scope) + "mbox:" + to, envelope(kServerSender, message).dump(),
                                config_.mailbox_max_messages, config_.mailbox_ttl);
  if (!depth) DLSLIME_WARN("nanoctrl: mailbox of '{}' is full; dropped {}", to, message.dump());
  return depth.has_value();
}

void ControlService::link_peers(const std::string& scope, const std::string& a, const std::string& b) {
  if (a == b) return;
  store_.set_add(prefix(scope) + "peers:" + a, b);
  store_.set_add(prefix(scope) + "peers:" + b, a);
}

void ControlService::drop_agent_state(const std::string& scope, const std::string& alias, bool with_record) {
  const std::string p = prefix(scope);
  std::vector<std::string> keys = store_.keys(glob_escape(p + "mr:" + alias + ":") + "*");
  keys.push_back(p + "topo:" + alias);
  keys.push_back(p + "mbox:" + alias);
  keys.push_back(p + "peers:" + alias);
  if (with_record) keys.push_back(agent_key(scope, alias));
  store_.del(keys);
}

// ---------------------------------------------------------------------------------- agents

ApiError ControlService::stale_cleanup(const std::string& scope, const std::string& alias) const {
  return ApiError(409, fmt::format("cleanup refused: agent '{}' in scope {} is registered by another agent now "
                                   "(its incarnation differs from the one given); a cleanup removes only the "
                                   "registration that returned that incarnation",
                                   alias, scope_label(scope)));
}

json ControlService::start_peer_agent(const json& req) {
  Fields f(req);
  const std::string scope = f.scope();
  const std::string requested = f.opt_name("alias");
  const std::string name_prefix = f.opt_name("name_prefix", "agent");

  json record = {
      {"name", ""},
      {"scope", scope},
      {"address", f.opt_string("address").value_or("")},
      {"device", f.opt_string("device") ? json(*f.opt_string("device")) : json(nullptr)},
      {"ib_port", f.opt_int("ib_port") ? json(*f.opt_int("ib_port")) : json(nullptr)},
      {"link_type", f.opt_string("link_type") ? json(*f.opt_string("link_type")) : json(nullptr)},
      {"resource", f.opt_any("resource").value_or(json(nullptr))},
      {"metadata", f.opt_object("metadata").value_or(json::object())},
      {"endpoint_info", f.opt_object("endpoint_info").value_or(json(nullptr))},
      {"registered_at_ms", now_ms()},
      {"incarnation", new_incarnation()},
  };

  std::string name = requested;
  if (!requested.empty()) {
    record["name"] = name;
    if (!store_.set_if_absent(agent_key(scope, name), record.dump(), config_.ttl)) {
      throw ApiError(409, fmt::format("agent alias '{}' is already registered in scope {}; choose another alias, "
                                      "or wait for the old agent to clean up or expire ({} ms without heartbeats)",
                                      name, scope_label(scope), config_.ttl.count()));
    }
  } else {
    // Auto alias: "<prefix>-<counter in hex>"; skip names someone chose by hand.
    bool done = false;
    for (int attempt = 0; attempt < 64 && !done; ++attempt) {
      name = fmt::format("{}-{:x}", name_prefix, store_.incr(prefix(scope) + "agent_counter"));
      record["name"] = name;
      done = store_.set_if_absent(agent_key(scope, name), record.dump(), config_.ttl);
    }
    if (!done) throw ApiError(409, "could not find a free alias with prefix '" + name_prefix + "'");
  }
  // A new incarnation of the alias starts clean: no mailbox, regions or topology left over
  // from an earlier agent of the same name that died without /cleanup. A spec set for the
  // alias before it registered (set_desired_topology "pending") is kept, and becomes this
  // agent's.
  const std::string topo_key = prefix(scope) + "topo:" + name;
  std::optional<std::string> topo = store_.get(topo_key);
  json pending = topo ? json::parse(*topo, nullptr, false) : json();
  const bool keep = pending.is_object() && pending.value("pending", false);
  drop_agent_state(scope, name, /*with_record=*/false);
  if (keep) {
    pending.erase("pending");
    store_.set(topo_key, pending.dump(), Millis(0));
  }
  DLSLIME_INFO("nanoctrl: agent '{}' registered in scope {}", name, scope_label(scope));
  return {{"status", "ok"},
          {"name", name},
          {"scope", scope},
          {"incarnation", record["incarnation"]},
          {"ttl_ms", config_.ttl.count()},
          {"heartbeat_interval_ms", std::max<int64_t>(config_.ttl.count() / 4, 1)}};
}

json ControlService::heartbeat(const json& req) {
  Fields f(req);
  const std::string scope = f.scope();
  const std::string type = f.opt_name("entity_type", "agent");
  std::string id;
  if (f.has("entity_id")) {
    id = type == "agent" ? f.req_name("entity_id") : f.req_id("entity_id");
  } else if (type == "agent" && f.has("agent_name")) {
    id = f.req_name("agent_name");
  } else {
    throw bad_request("field 'entity_id' (string) is required");
  }
  const std::string key =
      type == "agent" ? agent_key(scope, id) : prefix(scope) + "entity:" + type + ":" + id;
  // An agent that names its registration refreshes only that one, never a newer agent that
  // took the alias after it expired.
  const std::string incarnation = type == "agent" ? requested_incarnation(f) : "";
  if (!incarnation.empty()) {
    auto held = store_.get(key);
    if (held && record_incarnation(*held) != incarnation) {
      return {{"status", "not_found"},
              {"message", fmt::format("agent '{}' in scope {} is now another registration (yours expired or was "
                                      "cleaned up); register again",
                                      id, scope_label(scope))}};
    }
  }
  if (store_.expire(key, config_.ttl)) {
    return {{"status", "ok"}, {"message", "heartbeat accepted"}, {"ttl_ms", config_.ttl.count()}};
  }
  return {{"status", "not_found"},
          {"message", fmt::format("{} '{}' is not registered in scope {} (expired or cleaned up); register again",
                                  type, id, scope_label(scope))}};
}

json ControlService::query(const json& req) {
  Fields f(req);
  const std::string scope = f.scope();
  const std::string p = prefix(scope);
  std::vector<json> agents = load_json(store_.keys(glob_escape(p + "agent:") + "*"));

  // memory_keys of every agent from one scan of the region records.
  std::map<std::string, std::set<std::string>> regions;
  const std::string mr_prefix = p + "mr:";
  for (const auto& key : store_.keys(glob_escape(mr_prefix) + "*")) {
    std::string rest = key.substr(mr_prefix.size());
    auto colon = rest.find(':');
    if (colon != std::string::npos) regions[rest.substr(0, colon)].insert(rest.substr(colon + 1));
  }
  json out = json::array();
  std::sort(agents.begin(), agents.end(),
            [](const json& a, const json& b) { return a.value("name", "") < b.value("name", ""); });
  for (auto& a : agents) {
    const auto& names = regions[a.value("name", "")];
    a["memory_keys"] = json(std::vector<std::string>(names.begin(), names.end()));
    out.push_back(std::move(a));
  }
  return out;
}

json ControlService::get_peer_agent(const json& req) {
  Fields f(req);
  const std::string scope = f.scope();
  const std::string name = f.has("name") ? f.req_name("name") : f.req_name("agent_name");
  auto value = store_.get(agent_key(scope, name));
  if (!value) {
    throw ApiError(404, fmt::format("agent '{}' is not registered in scope {}", name, scope_label(scope)));
  }
  json agent = json::parse(*value);
  std::vector<std::string> names;
  const std::string mr_prefix = prefix(scope) + "mr:" + name + ":";
  for (const auto& key : store_.keys(glob_escape(mr_prefix) + "*")) names.push_back(key.substr(mr_prefix.size()));
  std::sort(names.begin(), names.end());
  agent["memory_keys"] = names;
  return {{"status", "ok"}, {"agent", agent}};
}

json ControlService::cleanup(const json& req) {
  Fields f(req);
  const std::string scope = f.scope();
  const std::string alias = f.has("agent_name") ? f.req_name("agent_name") : f.req_name("name");
  const std::string incarnation = requested_incarnation(f);
  const std::string p = prefix(scope);

  // A cleanup naming an incarnation removes only that registration: an agent whose own
  // registration was refused, or expired and was taken over, must not delete the live one.
  std::optional<std::string> record = store_.get(agent_key(scope, alias));
  if (!incarnation.empty() && record && record_incarnation(*record) != incarnation) {
    throw stale_cleanup(scope, alias);
  }

  // Its peers: agents it exchanged messages with, its topology targets, and agents whose
  // topology targets it.
  std::set<std::string> peers;
  for (auto& m : store_.set_members(p + "peers:" + alias)) peers.insert(std::move(m));
  const std::string topo_prefix = p + "topo:";
  std::vector<std::string> topo_keys = store_.keys(glob_escape(topo_prefix) + "*");
  auto topo_values = store_.mget(topo_keys);
  for (std::size_t i = 0; i < topo_keys.size(); ++i) {
    if (!topo_values[i]) continue;
    json spec = json::parse(*topo_values[i], nullptr, false);
    if (!spec.is_object() || !spec.contains("target_peers") || !spec["target_peers"].is_array()) continue;
    std::string owner = topo_keys[i].substr(topo_prefix.size());
    for (const auto& t : spec["target_peers"]) {
      if (!t.is_string()) continue;
      if (owner == alias) peers.insert(t.get<std::string>());
      if (t.get<std::string>() == alias) peers.insert(owner);
    }
  }
  peers.erase(alias);

  bool existed = record.has_value();
  if (incarnation.empty()) {
    drop_agent_state(scope, alias, /*with_record=*/true);
  } else {
    // State first, then the record only if it is still the one checked above: deleting the
    // record first would let a new registration start before its leftovers are dropped.
    drop_agent_state(scope, alias, /*with_record=*/false);
    if (record && !store_.del_if_equal(agent_key(scope, alias), *record)) throw stale_cleanup(scope, alias);
  }

  json notified = json::array();
  const json message = {{"type", "cleanup"}, {"peer", alias}};
  for (const auto& peer : peers) {
    if (agent_exists(scope, peer) && notify(scope, peer, message)) notified.push_back(peer);
  }
  DLSLIME_INFO("nanoctrl: agent '{}' cleaned up in scope {}; notified {}", alias, scope_label(scope),
               notified.dump());
  return {{"status", "ok"},
          {"message", existed ? "agent '" + alias + "' removed" : "agent '" + alias + "' was not registered"},
          {"existed", existed},
          {"notified", notified}};
}

// --------------------------------------------------------------------------------- topology

namespace {

// min_bw: a number, or a string holding one, which is what upstream DLSlime's client sends
// ("100"). Anything else is a 400 naming the field.
std::optional<double> min_bw_of(const json& req) {
  if (!req.is_object() || !req.contains("min_bw") || !req["min_bw"].is_string()) return Fields(req).opt_number("min_bw");
  const std::string text = req["min_bw"].get<std::string>();
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || !std::isfinite(value)) {
    throw bad_request("field 'min_bw' must be a number or a string holding one, got '" + text.substr(0, 64) + "'");
  }
  return value;
}

}  // namespace

json ControlService::set_desired_topology(const std::string& agent, const json& req) {
  Fields f(req);
  const std::string scope = f.scope();
  if (!is_valid_name(agent)) throw bad_request("agent name '" + agent.substr(0, 200) + "' in the path is not valid");
  std::vector<std::string> targets = f.req_name_list("target_peers");
  const bool symmetric = f.opt_bool("symmetric", false);
  auto min_bw = min_bw_of(req);
  // An agent that has not registered yet may be given its spec first, as upstream DLSlime's
  // server allows (a job's launcher often runs before its agents): the spec is kept
  // "pending" through the agent's registration, which drops other leftovers of its alias.
  const bool registered = agent_exists(scope, agent);

  const std::string p = prefix(scope);
  json spec = {{"target_peers", targets},
               {"min_bw", min_bw ? json(*min_bw) : json(nullptr)},
               {"symmetric", symmetric},
               {"updated_at_ms", now_ms()}};
  if (!registered) spec["pending"] = true;
  store_.set(p + "topo:" + agent, spec.dump(), Millis(0));

  json missing = json::array();
  for (const auto& target : targets) {
    if (target == agent) continue;
    if (!agent_exists(scope, target)) {
      missing.push_back(target);
      continue;
    }
    link_peers(scope, agent, target);
    if (registered) notify(scope, agent, {{"type", "connect_peer"}, {"peer", target}});
    if (symmetric) {
      // Merge the agent into the target's spec (last writer wins on concurrent updates of
      // the same target's spec; see docs/control-plane.md).
      json theirs = json::object();
      if (auto v = store_.get(p + "topo:" + target)) theirs = json::parse(*v, nullptr, false);
      if (!theirs.is_object()) theirs = json::object();
      json peers = theirs.value("target_peers", json::array());
      if (!peers.is_array()) peers = json::array();
      if (std::find(peers.begin(), peers.end(), json(agent)) == peers.end()) peers.push_back(agent);
      theirs["target_peers"] = peers;
      theirs["symmetric"] = theirs.value("symmetric", false);
      if (!theirs.contains("min_bw")) theirs["min_bw"] = nullptr;
      theirs["updated_at_ms"] = now_ms();
      store_.set(p + "topo:" + target, theirs.dump(), Millis(0));
      notify(scope, target, {{"type", "connect_peer"}, {"peer", agent}});
    }
  }
  return {{"status", "ok"}, {"spec", spec}, {"missing", missing}};
}

json ControlService::get_redis_address(const json& /*req*/) {
  if (store_.kind() != "redis") {
    throw ApiError(404, "not_found: this NanoCtrl keeps its state in memory (no Redis store), so it has no Redis "
                        "address to give; agents need only its HTTP API");
  }
  return {{"status", "ok"}, {"redis_address", store_.describe()}};
}

json ControlService::get_desired_topology(const std::string& agent, const json& req) {
  Fields f(req);
  const std::string scope = f.scope();
  if (!is_valid_name(agent)) throw bad_request("agent name '" + agent.substr(0, 200) + "' in the path is not valid");
  auto v = store_.get(prefix(scope) + "topo:" + agent);
  if (!v) {
    throw ApiError(404, fmt::format("agent '{}' has no desired topology in scope {}", agent, scope_label(scope)));
  }
  return {{"status", "ok"}, {"spec", json::parse(*v)}};
}

// --------------------------------------------------------------------------- memory regions

json ControlService::register_mr(const json& req) {
  Fields f(req);
  const std::string scope = f.scope();
  const std::string agent = f.req_name("agent_name");
  const std::string mr = f.req_id("mr_name");
  json info;
  if (auto blob = f.opt_object("mr_info")) {
    info = *blob;
  } else {
    auto addr = f.opt_uint("addr");
    auto length = f.opt_uint("length");
    if (!addr || !length) {
      throw bad_request("give either 'mr_info' (object) or 'addr' and 'length' (non-negative integers)");
    }
    info = {{"addr", *addr},
            {"length", *length},
            {"rkey", f.opt_uint("rkey").value_or(0)},
            {"lkey", f.opt_uint("lkey").value_or(0)}};
  }
  require_agent(scope, agent, "agent_name");
  json record = {{"agent_name", agent}, {"mr_name", mr}, {"mr_info", info}, {"updated_at_ms", now_ms()}};
  store_.set(prefix(scope) + "mr:" + agent + ":" + mr, record.dump(), Millis(0));
  return {{"status", "ok"}};
}

json ControlService::get_mr_info(const json& req) {
  Fields f(req);
  const std::string scope = f.scope();
  const std::string owner = f.has("dst") ? f.req_name("dst") : f.req_name("agent_name");
  const std::string mr = f.req_id("mr_name");
  auto v = store_.get(prefix(scope) + "mr:" + owner + ":" + mr);
  if (!v) return {{"status", "ok"}, {"mr_info", nullptr}};
  json record = json::parse(*v);
  return {{"status", "ok"}, {"mr_info", record.value("mr_info", json(nullptr))}};
}

json ControlService::unregister_mr(const json& req) {
  Fields f(req);
  const std::string scope = f.scope();
  const std::string agent = f.req_name("agent_name");
  const std::string mr = f.req_id("mr_name");
  bool existed = store_.del({prefix(scope) + "mr:" + agent + ":" + mr}) > 0;
  return {{"status", "ok"}, {"existed", existed}};
}

// ---------------------------------------------------------------------------------- entities

namespace {

// An entity's endpoint: a string ("10.0.0.1:80") or an object (upstream DLSlime's clients
// send {"host": ..., "port": ...}); absent is null.
json endpoint_of(const Fields& f) {
  auto v = f.opt_any("endpoint");
  if (!v || v->is_null()) return nullptr;
  if (!v->is_string() && !v->is_object()) {
    throw bad_request("field 'endpoint' must be a string or an object, got " + std::string(v->type_name()));
  }
  return *v;
}

std::string entity_type_of(const Fields& f) {
  std::string type = f.opt_name("entity_type", "service");
  if (type == "agent") {
    throw bad_request("entity_type 'agent' is reserved: agents register with /start_peer_agent");
  }
  return type;
}

}  // namespace

json ControlService::register_entity(const json& req) {
  Fields f(req);
  const std::string scope = f.scope();
  const std::string type = entity_type_of(f);
  const std::string id = f.req_id("entity_id");
  json info = {{"entity_type", type},
               {"entity_id", id},
               {"id", id},
               {"kind", f.opt_string("kind").value_or("")},
               {"endpoint", endpoint_of(f)},
               {"metadata", f.opt_object("metadata").value_or(json::object())},
               {"resource", f.opt_any("resource").value_or(json(nullptr))},
               {"registered_at_ms", now_ms()}};
  const std::string p = prefix(scope);
  store_.set(p + "entity:" + type + ":" + id, info.dump(), config_.ttl);
  int64_t revision = store_.incr(p + "entity_rev:" + type);
  return {{"status", "ok"}, {"message", type + " '" + id + "' registered"}, {"revision", revision}};
}

json ControlService::unregister_entity(const json& req) {
  Fields f(req);
  const std::string scope = f.scope();
  const std::string type = entity_type_of(f);
  const std::string id = f.req_id("entity_id");
  const std::string p = prefix(scope);
  bool existed = store_.del({p + "entity:" + type + ":" + id}) > 0;
  json out = {{"status", "ok"}, {"existed", existed}};
  if (existed) {
    out["revision"] = store_.incr(p + "entity_rev:" + type);
    out["message"] = type + " '" + id + "' unregistered";
  } else {
    out["message"] = type + " '" + id + "' was not registered";
  }
  return out;
}

json ControlService::get_entity_info(const json& req) {
  Fields f(req);
  const std::string scope = f.scope();
  const std::string type = entity_type_of(f);
  const std::string id = f.req_id("entity_id");
  auto v = store_.get(prefix(scope) + "entity:" + type + ":" + id);
  if (!v) return {{"status", "not_found"}, {"entity_info", nullptr}};
  return {{"status", "ok"}, {"entity_info", json::parse(*v)}};
}

json ControlService::list_entities(const json& req) {
  Fields f(req);
  const std::string scope = f.scope();
  const std::string p = prefix(scope);
  std::string pattern = glob_escape(p + "entity:") + "*";
  if (f.has("entity_type")) pattern = glob_escape(p + "entity:" + entity_type_of(f) + ":") + "*";
  auto kind = f.opt_string("kind");
  std::vector<json> found = load_json(store_.keys(pattern));
  json out = json::array();
  for (auto& e : found) {
    if (kind && e.value("kind", "") != *kind) continue;
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const json& a, const json& b) {
    return std::make_pair(a.value("entity_type", ""), a.value("entity_id", "")) <
           std::make_pair(b.value("entity_type", ""), b.value("entity_id", ""));
  });
  return {{"status", "ok"}, {"entities", out}};
}

// ----------------------------------------------------------------------------------- mailbox

json ControlService::mailbox_post(const json& req) {
  Fields f(req);
  const std::string scope = f.scope();
  const std::string to = f.req_name("to");
  const std::string from = f.opt_name("from");
  auto message = f.opt_any("message");
  if (!message) throw bad_request("field 'message' (any JSON value but null) is required");
  require_agent(scope, to, "recipient");
  auto depth = store_.list_push(prefix(scope) + "mbox:" + to, envelope(from, *message).dump(),
                                config_.mailbox_max_messages, config_.mailbox_ttl);
  if (!depth) {
    throw ApiError(429, fmt::format("mailbox of '{}' is full ({} messages waiting); the recipient is not "
                                    "receiving. Retry later",
                                    to, config_.mailbox_max_messages));
  }
  if (!from.empty() && from != to && agent_exists(scope, from)) link_peers(scope, from, to);
  return {{"status", "ok"}, {"depth", *depth}};
}

json ControlService::mailbox_recv(const json& req) {
  Fields f(req);
  const std::string scope = f.scope();
  const std::string alias = f.has("alias") ? f.req_name("alias") : f.req_name("agent_name");
  double timeout_s = f.opt_number("timeout").value_or(0.0);
  if (!(timeout_s >= 0.0)) throw bad_request("field 'timeout' must be >= 0 (seconds)");
  auto max = f.opt_uint("max").value_or(1);
  if (max < 1 || max > 1000) throw bad_request("field 'max' must be between 1 and 1000");
  require_agent(scope, alias, "agent");
  auto wait = std::min<Millis>(Millis(static_cast<int64_t>(std::min(timeout_s, 1e7) * 1000.0)), config_.max_wait);
  auto items = store_.list_pop(prefix(scope) + "mbox:" + alias, static_cast<std::size_t>(max), wait);
  json messages = json::array();
  for (const auto& item : items) {
    json v = json::parse(item, nullptr, false);
    if (!v.is_discarded()) messages.push_back(std::move(v));
  }
  return {{"status", "ok"}, {"messages", messages}};
}

// ------------------------------------------------------------------------------------- stats

ControlService::Stats ControlService::stats() {
  Stats s;
  const std::string& ns = config_.key_prefix;
  std::vector<std::string> mailboxes;
  // Keys are ns + scope + ":" + kind + ":" ...; a scope has no ':', so the kind is the
  // component after the first ':' past the namespace.
  for (const auto& key : store_.keys(glob_escape(ns) + "*")) {
    auto colon = key.find(':', ns.size());
    if (colon == std::string::npos) continue;
    std::string_view rest(key.data() + colon + 1, key.size() - colon - 1);
    if (rest.starts_with("agent:")) {
      ++s.agents;
    } else if (rest.starts_with("entity:")) {
      ++s.entities;
    } else if (rest.starts_with("mbox:")) {
      mailboxes.push_back(key);
    }
  }
  s.mailboxes = mailboxes.size();
  for (const auto& key : mailboxes) s.mailbox_messages += store_.list_len(key);
  return s;
}

}  // namespace dlslime::nanoctrl
