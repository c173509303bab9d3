#include "dlslime/peer_agent.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "core/region_table.h"
#include "dlslime/errors.h"
#include "dlslime/nanoctrl_client.h"

namespace dlslime {

using nlohmann::json;

// The shared state behind a PeerConnection handle. The agent's mutex guards the map of
// connections; each connection's own mutex guards its fields.
std::string random_instance_id() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

// The instance id in an agent record from NanoCtrl ("" for none or no record).
std::string instance_of(const std::optional<json>& record) {
  if (!record || !record->contains("metadata") || !(*record)["metadata"].is_object()) return "";
  const json& meta = (*record)["metadata"];
  return meta.contains("instance") && meta["instance"].is_string() ? meta["instance"].get<std::string>() : "";
}

class PeerConnectionState {
 public:
  PeerConnectionState(std::string peer, std::string conn_id, std::shared_ptr<TcpEndpoint> ep)
      : peer_alias(std::move(peer)), conn_id(std::move(conn_id)), endpoint(std::move(ep)) {}

  const std::string peer_alias;
  const std::string conn_id;
  const std::string transport = "tcp";
  const std::shared_ptr<TcpEndpoint> endpoint;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::string state = "connecting";  // connecting | connected | failed | closed
  std::string error;
  std::string peer_instance;    // the peer agent's instance id, from its first connect message
  bool auth_failed = false;     // failed because the tokens differ (wait() raises AuthenticationError)
  json peer_info;               // the peer's endpoint_info, once known
  uint64_t peer_endpoint_id = 0;
  bool info_sent = false;       // our endpoint_info was posted to the peer (it had registered)
  std::chrono::steady_clock::time_point last_post;  // when, for re-posting
  std::map<std::string, int32_t> remote_handles;  // remote region name -> handle

  void finish(const std::string& new_state, const std::string& why, bool auth = false) {
    {
      std::lock_guard lock(mu);
      if (state == "closed") return;
      state = new_state;
      error = why;
      auth_failed = auth;
    }
    cv.notify_all();
  }
  bool failed_on_auth() const {
    std::lock_guard lock(mu);
    return state == "failed" && auth_failed;
  }
  // Usable for new ops: handshake done and the endpoint still has its peer.
  bool alive() const {
    std::lock_guard lock(mu);
    if (state == "connecting") return true;
    return state == "connected" && endpoint->is_connected();
  }
};

void PeerConnection::wait(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(state_->mu);
  if (!state_->cv.wait_for(lock, timeout, [&] { return state_->state != "connecting"; })) {
    if (!state_->info_sent) {
      throw TimeoutError(fmt::format("connection to '{}' not established within {} ms: no agent '{}' has "
                                     "registered with NanoCtrl (same scope?)",
                                     state_->peer_alias, timeout.count(), state_->peer_alias));
    }
    throw TimeoutError(fmt::format("connection to '{}' not established within {} ms (the peer agent is "
                                   "registered but did not answer the handshake)",
                                   state_->peer_alias, timeout.count()));
  }
  if (state_->auth_failed) {
    throw AuthenticationError(fmt::format("connection to '{}' failed: {}", state_->peer_alias, state_->error));
  }
  if (state_->state != "connected") {
    throw ConnectionError(fmt::format("connection to '{}' {}: {}", state_->peer_alias, state_->state, state_->error));
  }
}

bool PeerConnection::is_connected() const {
  std::lock_guard lock(state_->mu);
  return state_->state == "connected" && state_->endpoint->is_connected();
}

std::string PeerConnection::state() const {
  std::lock_guard lock(state_->mu);
  if (state_->state == "connected" && !state_->endpoint->is_connected()) return "closed";
  return state_->state;
}

std::string PeerConnection::error() const {
  std::lock_guard lock(state_->mu);
  return state_->error;
}

std::string PeerConnection::conn_id() const { return state_->conn_id; }
std::string PeerConnection::peer_alias() const { return state_->peer_alias; }
std::string PeerConnection::transport() const { return state_->transport; }
std::shared_ptr<Endpoint> PeerConnection::endpoint() const { return state_->endpoint; }

json PeerConnection::peer_endpoint_info() const {
  std::lock_guard lock(state_->mu);
  return state_->state == "connected" ? state_->peer_info : json(nullptr);
}

// ---------------------------------------------------------------------------------------

class PeerAgentImpl {
 public:
  explicit PeerAgentImpl(PeerAgentOptions options);
  ~PeerAgentImpl() { shutdown(); }

  void start();
  void shutdown();
  PeerConnection connect_to(const std::string& peer, const ConnectOptions& options);
  std::shared_ptr<PeerConnectionState> find(const std::string& peer) const;
  std::shared_ptr<TcpEndpoint> endpoint_for_io(const std::string& peer);
  std::vector<Assignment> resolve(const std::string& peer, const std::vector<NamedAssignment>& named);
  int32_t register_region(const std::string& name, uintptr_t addr, uint64_t offset, uint64_t length);
  void unregister_region(const std::string& name);
  std::vector<std::string> peers() const;

  PeerAgentOptions options;
  NanoCtrlClient ctrl;
  std::string alias;

 private:
  json registration_body() const;
  void register_with_ctrl();
  void publish_regions();
  std::shared_ptr<PeerConnectionState> make_connection(const std::string& peer, const ConnectOptions& options);
  void post_info(const std::shared_ptr<PeerConnectionState>& c);
  // Posts our info once, addressed to the peer agent instance `instance` (from its record).
  void claim_and_post(const std::shared_ptr<PeerConnectionState>& c, const std::string& instance);
  bool post_pending();
  void complete_handshake(const std::shared_ptr<PeerConnectionState>& c, const json& peer_info);
  void retire(const std::shared_ptr<PeerConnectionState>& c, const std::string& why);
  // The instance id NanoCtrl has registered under `peer` now ("" when it has none).
  std::string registered_instance(const std::string& peer);
  bool is_current_instance(const std::string& peer, const std::string& instance);
  void mailbox_loop();
  void heartbeat_loop();
  void on_message(const json& envelope);
  bool sleep_for(std::chrono::milliseconds d);

  std::shared_ptr<LocalRegionTable> regions_ = std::make_shared<LocalRegionTable>();
  // Random per PeerAgent object, in its NanoCtrl record and in every connect message: a
  // message that a previous agent under the same alias posted before it shut down can
  // still be in our mailbox, and must not replace (or answer) the current one's.
  const std::string instance_ = random_instance_id();
  std::chrono::milliseconds heartbeat_interval_{15000};
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<PeerConnectionState>> conns_;
  uint64_t next_conn_ = 0;
  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  std::thread mailbox_thread_;
  std::thread heartbeat_thread_;
};

namespace {

constexpr auto kMailboxWait = std::chrono::milliseconds(500);
// How often connections to peers that have not registered yet look for them.
constexpr auto kPeerPoll = std::chrono::milliseconds(50);
// A handshake message not answered within this long is posted again.
constexpr auto kRepost = std::chrono::milliseconds(1000);

std::string local_address(const TcpOptions& tcp) {
  if (!tcp.advertise_host.empty()) return tcp.advertise_host;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0 && name[0]) return name;
  return "127.0.0.1";
}

// transport="rdma" on this build: say exactly why and what to use instead.
[[noreturn]] void throw_rdma_unavailable() {
  std::error_code ec;
  bool devices = false;
  for (auto it = std::filesystem::directory_iterator("/sys/class/infiniband", ec);
       !ec && it != std::filesystem::directory_iterator(); ++it) {
    devices = true;
  }
  throw Error(StatusCode::kNotImplemented,
              fmt::format("transport=\"rdma\" is not available: {}; use transport=\"tcp\", which works on any host",
                          devices ? "this build of DLSlime has no RDMA transport (BUILD_RDMA)"
                                  : "no RDMA devices were found (/sys/class/infiniband is empty) and this build "
                                    "has no RDMA transport"));
}

}  // namespace

PeerAgentImpl::PeerAgentImpl(PeerAgentOptions opts)
    : options(std::move(opts)), ctrl(options.ctrl_url, options.scope, options.ctrl_timeout, options.ctrl_token) {
  options.tcp.validate();
  if (options.heartbeat_interval.count() < 0) throw InvalidArgumentError("heartbeat_interval must be >= 0");
}

json PeerAgentImpl::registration_body() const {
  json body = {{"address", local_address(options.tcp)},
               {"metadata", {{"transports", {"tcp"}}, {"instance", instance_}}}};
  if (!alias.empty()) body["alias"] = alias;
  return body;
}

void PeerAgentImpl::register_with_ctrl() {
  json reply = ctrl.start_peer_agent(registration_body());
  if (!reply.contains("name") || !reply["name"].is_string()) {
    throw Error(StatusCode::kProtocolError, "NanoCtrl's /start_peer_agent reply has no 'name': " + reply.dump());
  }
  alias = reply["name"].get<std::string>();
  if (options.heartbeat_interval.count() > 0) {
    heartbeat_interval_ = options.heartbeat_interval;
  } else if (reply.contains("heartbeat_interval_ms") && reply["heartbeat_interval_ms"].is_number()) {
    heartbeat_interval_ = std::chrono::milliseconds(std::max<int64_t>(reply["heartbeat_interval_ms"].get<int64_t>(), 10));
  }
}

void PeerAgentImpl::start() {
  alias = options.alias;
  register_with_ctrl();
  mailbox_thread_ = std::thread([this] { mailbox_loop(); });
  heartbeat_thread_ = std::thread([this] { heartbeat_loop(); });
  DLSLIME_INFO("PeerAgent '{}' registered with {} (scope '{}')", alias, ctrl.url(), options.scope);
}

bool PeerAgentImpl::sleep_for(std::chrono::milliseconds d) {
  std::unique_lock lock(stop_mu_);
  return !stop_cv_.wait_for(lock, d, [&] { return stopping_.load(); });
}

void PeerAgentImpl::heartbeat_loop() {
  while (sleep_for(heartbeat_interval_)) {
    try {
      if (ctrl.heartbeat(alias) == "not_found") {
        // NanoCtrl forgot us (restart on the memory store, or a long partition): register
        // again under the same alias and publish our regions again.
        DLSLIME_WARN("PeerAgent '{}': NanoCtrl no longer knows this agent; registering again", alias);
        register_with_ctrl();
        publish_regions();
      }
    } catch (const std::exception& e) {
      DLSLIME_WARN("PeerAgent '{}': heartbeat failed (will retry): {}", alias, e.what());
    }
  }
}

void PeerAgentImpl::mailbox_loop() {
  bool waiting_for_peers = false;
  while (!stopping_) {
    std::vector<json> messages;
    try {
      messages = ctrl.recv(alias, waiting_for_peers ? kPeerPoll : kMailboxWait, 32);
    } catch (const std::exception& e) {
      if (stopping_) return;
      DLSLIME_WARN("PeerAgent '{}': mailbox receive failed (will retry): {}", alias, e.what());
      sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    for (const auto& m : messages) {
      try {
        on_message(m);
      } catch (const std::exception& e) {
        DLSLIME_WARN("PeerAgent '{}': dropped a malformed mailbox message {}: {}", alias, m.dump(), e.what());
      }
    }
    waiting_for_peers = post_pending();
  }
}

void PeerAgentImpl::on_message(const json& envelope) {
  const json& msg = envelope.at("message");
  const std::string type = msg.at("type").get<std::string>();
  if (type == "cleanup") {
    const std::string peer = msg.at("peer").get<std::string>();
    std::shared_ptr<PeerConnectionState> c;
    std::string instance;
    {
      std::lock_guard lock(mu_);
      auto it = conns_.find(peer);
      if (it == conns_.end()) return;
      c = it->second;
    }
    {
      std::lock_guard clock(c->mu);
      instance = c->peer_instance;
    }
    // A cleanup that reaches us late (the alias is registered again by a new agent, and
    // this connection is to that agent or still waiting for it) is about the old agent.
    const std::string now = registered_instance(peer);
    if (!now.empty() && (instance.empty() || instance == now)) {
      DLSLIME_DEBUG("PeerAgent '{}': ignoring a late cleanup of an earlier '{}'", alias, peer);
      return;
    }
    {
      std::lock_guard lock(mu_);
      auto it = conns_.find(peer);
      if (it == conns_.end() || it->second != c) return;
      conns_.erase(it);
    }
    retire(c, "the peer agent '" + peer + "' shut down");
    return;
  }
  if (type == "connect_peer") return;  // desired-topology intent; connect_to drives connections
  if (type != "connect") {
    DLSLIME_DEBUG("PeerAgent '{}': ignoring mailbox message of type '{}'", alias, type);
    return;
  }
  const std::string from = envelope.at("from").get<std::string>();
  const json& info = msg.at("endpoint_info");
  if (msg.value("transport", "tcp") != "tcp") {
    DLSLIME_WARN("PeerAgent '{}': '{}' asked for transport '{}', which this agent does not serve", alias, from,
                 msg.value("transport", ""));
    return;
  }
  const uint64_t peer_id = info.at("endpoint_id").get<uint64_t>();
  const std::string instance = msg.value("instance", "");
  const std::string to_instance = msg.value("to_instance", "");
  if (!to_instance.empty() && to_instance != instance_) {
    // Posted to an earlier agent under our alias, which left before reading it.
    DLSLIME_DEBUG("PeerAgent '{}': ignoring a connect message from '{}' meant for an earlier '{}'", alias, from,
                  alias);
    return;
  }
  if (!is_current_instance(from, instance)) {
    DLSLIME_DEBUG("PeerAgent '{}': ignoring a connect message from an earlier '{}' (instance {})", alias, from,
                  instance);
    return;
  }
  std::shared_ptr<PeerConnectionState> c, stale;
  bool send_info = false;
  bool duplicate = false;
  const bool peer_has_ours = msg.value("have_peer_info", false);
  {
    std::lock_guard lock(mu_);
    auto it = conns_.find(from);
    if (it != conns_.end()) {
      std::lock_guard clock(it->second->mu);
      const bool same_endpoint = it->second->peer_endpoint_id == peer_id;
      const bool new_incarnation = it->second->peer_endpoint_id != 0 && !same_endpoint;
      const bool dead = it->second->state == "failed" || it->second->state == "closed" ||
                        (it->second->state == "connected" && !it->second->endpoint->is_connected());
      // A repeat from the endpoint a finished handshake was with (it crossed our answer in
      // the mailbox) is not a reconnect, even when that handshake failed (e.g. the tokens
      // differ): replacing would retry it forever and lose the reason.
      if (new_incarnation || (dead && !same_endpoint)) {
        stale = it->second;
        conns_.erase(it);
      } else if (it->second->peer_endpoint_id == peer_id && it->second->state != "connecting") {
        // A repeat of a handshake that already finished here; the peer may still lack
        // our info (our post was lost), so answer it once more.
        c = it->second;
        duplicate = true;
      } else {
        c = it->second;
      }
    }
  }
  if (duplicate) {
    if (!peer_has_ours) post_info(c);
    return;
  }
  if (stale) retire(stale, "replaced: the peer agent reconnected");
  if (!c) {
    // The peer connects first: make the mirror connection with default options.
    ConnectOptions defaults;
    defaults.transport = "tcp";
    c = make_connection(from, defaults);
    std::lock_guard lock(mu_);
    auto [it, inserted] = conns_.emplace(from, c);
    if (!inserted) c = it->second;  // connect_to() raced us
  }
  {
    std::lock_guard lock(c->mu);
    c->peer_info = info;
    c->peer_endpoint_id = peer_id;
    c->peer_instance = instance;
    send_info = !c->info_sent || !peer_has_ours;
    c->info_sent = true;
  }
  if (send_info) post_info(c);
  complete_handshake(c, info);
}

std::string PeerAgentImpl::registered_instance(const std::string& peer) {
  return instance_of(ctrl.get_peer_agent(peer));
}

bool PeerAgentImpl::is_current_instance(const std::string& peer, const std::string& instance) {
  if (instance.empty()) return true;  // a peer that does not say (another implementation)
  // Asked every time, not cached: the answer changes when the alias is taken over, and a
  // stale message can arrive after that. Connect messages are few (handshakes only).
  return registered_instance(peer) == instance;
}

std::shared_ptr<PeerConnectionState> PeerAgentImpl::make_connection(const std::string& peer,
                                                                     const ConnectOptions& o) {
  std::shared_ptr<TcpEndpoint> ep(new TcpEndpoint(o.local_host, o.local_port, options.tcp, regions_));
  std::string id;
  {
    std::lock_guard lock(mu_);
    id = fmt::format("{}->{}#{}", alias, peer, next_conn_++);
  }
  return std::make_shared<PeerConnectionState>(peer, id, std::move(ep));
}

void PeerAgentImpl::post_info(const std::shared_ptr<PeerConnectionState>& c) {
  bool have_peer_info = false;
  std::string to_instance;
  {
    std::lock_guard lock(c->mu);
    have_peer_info = !c->peer_info.is_null();
    to_instance = c->peer_instance;
    c->last_post = std::chrono::steady_clock::now();
  }
  // have_peer_info tells the peer whether it must (re)send its own info.
  const json msg = {{"type", "connect"},
                    {"transport", "tcp"},
                    {"conn_id", c->conn_id},
                    {"have_peer_info", have_peer_info},
                    {"instance", instance_},
                    {"to_instance", to_instance},
                    {"endpoint_info", c->endpoint->endpoint_info()}};
  ctrl.post(c->peer_alias, msg, alias);
}

void PeerAgentImpl::complete_handshake(const std::shared_ptr<PeerConnectionState>& c, const json& peer_info) {
  try {
    c->endpoint->connect(peer_info);
    c->finish("connected", "");
    DLSLIME_INFO("PeerAgent '{}': connected to '{}' over tcp ({})", alias, c->peer_alias, c->conn_id);
  } catch (const std::exception& e) {
    c->finish("failed", e.what(), dynamic_cast<const AuthenticationError*>(&e) != nullptr);
    DLSLIME_WARN("PeerAgent '{}': connecting to '{}' failed: {}", alias, c->peer_alias, e.what());
  }
}

void PeerAgentImpl::retire(const std::shared_ptr<PeerConnectionState>& c, const std::string& why) {
  c->endpoint->shutdown();
  c->finish("closed", why);
}

PeerConnection PeerAgentImpl::connect_to(const std::string& peer, const ConnectOptions& o) {
  if (stopping_) throw ConnectionError("connect_to() on a PeerAgent that was shut down", StatusCode::kCancelled);
  if (peer.empty()) throw InvalidArgumentError("peer alias must be a non-empty string");
  if (peer == alias) throw InvalidArgumentError(fmt::format("an agent cannot connect to itself ('{}')", peer));
  if (o.transport == "rdma") throw_rdma_unavailable();
  if (o.transport != "tcp") {
    throw InvalidArgumentError(fmt::format("unknown transport '{}' (use \"tcp\" or \"rdma\")", o.transport));
  }
  std::shared_ptr<PeerConnectionState> stale;
  {
    std::lock_guard lock(mu_);
    auto it = conns_.find(peer);
    if (it != conns_.end()) {
      // A handshake that failed on the token cannot succeed on a retry: keep its reason.
      if (it->second->alive() || it->second->failed_on_auth()) return PeerConnection(it->second);
      stale = it->second;
      conns_.erase(it);
    }
  }
  if (stale) retire(stale, "replaced by a new connect_to()");
  auto c = make_connection(peer, o);
  {
    std::lock_guard lock(mu_);
    auto [it, inserted] = conns_.emplace(peer, c);
    if (!inserted) {
      // The peer's handshake arrived meanwhile and made the connection: use that one.
      c->endpoint->shutdown();
      return PeerConnection(it->second);
    }
  }
  // Agents of one job start concurrently: a peer that has not registered yet gets our
  // endpoint_info as soon as it does (post_pending, from the mailbox thread).
  try {
    if (auto record = ctrl.get_peer_agent(peer)) claim_and_post(c, instance_of(record));
  } catch (...) {
    std::lock_guard lock(mu_);
    conns_.erase(peer);
    c->endpoint->shutdown();
    throw;
  }
  return PeerConnection(c);
}

void PeerAgentImpl::claim_and_post(const std::shared_ptr<PeerConnectionState>& c, const std::string& instance) {
  {
    std::lock_guard lock(c->mu);
    if (c->info_sent) return;
    c->info_sent = true;
    if (c->peer_instance.empty()) c->peer_instance = instance;
  }
  post_info(c);
}

bool PeerAgentImpl::post_pending() {
  // Two kinds of connections wait on the peer: those whose peer has not registered yet,
  // and those whose info was posted but never answered (the message can be lost, e.g. a
  // registration that clears a stale mailbox right after we posted): post again.
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<PeerConnectionState>> unregistered, unanswered;
  {
    std::lock_guard lock(mu_);
    for (const auto& [peer, c] : conns_) {
      std::lock_guard clock(c->mu);
      if (c->state != "connecting") continue;
      if (!c->info_sent) {
        unregistered.push_back(c);
      } else if (c->peer_info.is_null() && now - c->last_post > kRepost) {
        unanswered.push_back(c);
      }
    }
  }
  for (const auto& c : unregistered) {
    try {
      if (auto record = ctrl.get_peer_agent(c->peer_alias)) claim_and_post(c, instance_of(record));
    } catch (const std::exception& e) {
      DLSLIME_DEBUG("PeerAgent '{}': waiting for '{}' to register: {}", alias, c->peer_alias, e.what());
    }
  }
  for (const auto& c : unanswered) {
    try {
      // Address the current agent under that alias: the one we wrote to may have been
      // replaced, and its successor ignores messages meant for it.
      if (auto record = ctrl.get_peer_agent(c->peer_alias)) {
        std::lock_guard lock(c->mu);
        if (c->peer_info.is_null()) c->peer_instance = instance_of(record);
      }
      post_info(c);
    } catch (const std::exception& e) {
      DLSLIME_DEBUG("PeerAgent '{}': re-posting to '{}' failed: {}", alias, c->peer_alias, e.what());
    }
  }
  std::lock_guard lock(mu_);
  for (const auto& [peer, c] : conns_) {
    std::lock_guard clock(c->mu);
    if (c->state == "connecting") return true;
  }
  return false;
}

std::shared_ptr<PeerConnectionState> PeerAgentImpl::find(const std::string& peer) const {
  std::lock_guard lock(mu_);
  auto it = conns_.find(peer);
  return it == conns_.end() ? nullptr : it->second;
}

std::vector<std::string> PeerAgentImpl::peers() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, c] : conns_) out.push_back(name);
  return out;
}

std::shared_ptr<TcpEndpoint> PeerAgentImpl::endpoint_for_io(const std::string& peer) {
  auto c = find(peer);
  if (!c) {
    throw Error(StatusCode::kNotConnected,
                fmt::format("no connection to '{}'; call connect_to(\"{}\", transport=\"tcp\") first", peer, peer));
  }
  std::lock_guard lock(c->mu);
  if (c->state != "connected") {
    throw Error(StatusCode::kNotConnected,
                fmt::format("the connection to '{}' is {}{}; wait() on it after connect_to()", peer, c->state,
                            c->error.empty() ? "" : " (" + c->error + ")"));
  }
  return c->endpoint;
}

std::vector<Assignment> PeerAgentImpl::resolve(const std::string& peer, const std::vector<NamedAssignment>& named) {
  auto c = find(peer);
  endpoint_for_io(peer);  // same errors as numeric I/O
  std::vector<Assignment> out;
  out.reserve(named.size());
  for (const auto& n : named) {
    auto local = regions_->find(n.local_name);
    if (!local) throw NotFoundError(fmt::format("no local memory region named '{}'", n.local_name));
    int32_t remote = -1;
    json entry;
    {
      std::lock_guard lock(c->mu);
      if (auto it = c->remote_handles.find(n.remote_name); it != c->remote_handles.end()) {
        remote = it->second;
      } else if (c->peer_info.contains("mr_info") && c->peer_info["mr_info"].contains(n.remote_name)) {
        entry = c->peer_info["mr_info"][n.remote_name];
      }
    }
    if (remote < 0) {
      if (entry.is_null()) {
        // Registered after the handshake: NanoCtrl has the peer's record.
        auto record = ctrl.get_mr_info(peer, n.remote_name);
        if (!record) {
          throw NotFoundError(fmt::format("peer '{}' has no memory region named '{}' (not registered, or not yet "
                                          "published)",
                                          peer, n.remote_name));
        }
        entry = *record;
      }
      remote = c->endpoint->register_remote_memory_region(n.remote_name, entry);
      std::lock_guard lock(c->mu);
      c->remote_handles[n.remote_name] = remote;
    }
    out.push_back({*local, remote, n.remote_offset, n.local_offset, n.length});
  }
  return out;
}

int32_t PeerAgentImpl::register_region(const std::string& name, uintptr_t addr, uint64_t offset, uint64_t length) {
  const int32_t handle = regions_->add(name, addr, offset, length);
  try {
    ctrl.register_mr(alias, name, regions_->mr_info()[name]);
  } catch (...) {
    regions_->remove(handle);
    throw;
  }
  return handle;
}

void PeerAgentImpl::unregister_region(const std::string& name) {
  regions_->remove(name);
  ctrl.unregister_mr(alias, name);
}

void PeerAgentImpl::publish_regions() {
  for (const auto& [name, entry] : regions_->mr_info().items()) ctrl.register_mr(alias, name, entry);
}

void PeerAgentImpl::shutdown() {
  if (stopping_.exchange(true)) return;
  stop_cv_.notify_all();
  std::map<std::string, std::shared_ptr<PeerConnectionState>> conns;
  {
    std::lock_guard lock(mu_);
    conns.swap(conns_);
  }
  // Endpoints first: the peers see the goodbye and fail their pending ops at once.
  for (auto& [peer, c] : conns) retire(c, "this agent shut down");
  if (!alias.empty()) {
    try {
      ctrl.cleanup(alias);
    } catch (const std::exception& e) {
      DLSLIME_WARN("PeerAgent '{}': NanoCtrl cleanup failed (its records expire with the TTL): {}", alias, e.what());
    }
  }
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (mailbox_thread_.joinable()) mailbox_thread_.join();
}

// ---------------------------------------------------------------------------------------

PeerAgent::PeerAgent(PeerAgentOptions options) : impl_(std::make_shared<PeerAgentImpl>(std::move(options))) {
  impl_->start();
}

PeerAgent::~PeerAgent() { impl_->shutdown(); }

const std::string& PeerAgent::alias() const { return impl_->alias; }
const std::string& PeerAgent::scope() const { return impl_->options.scope; }
const std::string& PeerAgent::ctrl_url() const { return impl_->ctrl.url(); }

int32_t PeerAgent::register_memory_region(const std::string& name, uintptr_t addr, uint64_t offset,
                                          uint64_t length) {
  return impl_->register_region(name, addr, offset, length);
}

void PeerAgent::unregister_memory_region(const std::string& name) { impl_->unregister_region(name); }

PeerConnection PeerAgent::connect_to(const std::string& peer_alias, const ConnectOptions& options) {
  return impl_->connect_to(peer_alias, options);
}

std::optional<PeerConnection> PeerAgent::connection(const std::string& peer_alias) const {
  auto c = impl_->find(peer_alias);
  if (!c) return std::nullopt;
  return PeerConnection(c);
}

std::vector<std::string> PeerAgent::peers() const { return impl_->peers(); }

Future PeerAgent::send(const std::string& peer, const Chunk& chunk) { return impl_->endpoint_for_io(peer)->send(chunk); }
Future PeerAgent::recv(const std::string& peer, const Chunk& chunk) { return impl_->endpoint_for_io(peer)->recv(chunk); }

Future PeerAgent::read(const std::string& peer, std::vector<Assignment> assignments) {
  return impl_->endpoint_for_io(peer)->read(std::move(assignments));
}

Future PeerAgent::write(const std::string& peer, std::vector<Assignment> assignments) {
  return impl_->endpoint_for_io(peer)->write(std::move(assignments));
}

Future PeerAgent::read(const std::string& peer, const std::vector<NamedAssignment>& assignments) {
  auto resolved = impl_->resolve(peer, assignments);
  return impl_->endpoint_for_io(peer)->read(std::move(resolved));
}

Future PeerAgent::write(const std::string& peer, const std::vector<NamedAssignment>& assignments) {
  auto resolved = impl_->resolve(peer, assignments);
  return impl_->endpoint_for_io(peer)->write(std::move(resolved));
}

Future PeerAgent::write_with_imm(const std::string& peer, std::vector<Assignment> assignments, uint32_t imm_data) {
  return impl_->endpoint_for_io(peer)->write_with_imm(std::move(assignments), imm_data);
}

Future PeerAgent::imm_recv(const std::string& peer) { return impl_->endpoint_for_io(peer)->imm_recv(); }

void PeerAgent::shutdown() { impl_->shutdown(); }

}  // namespace dlslime
