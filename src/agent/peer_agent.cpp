#include "dlslime/peer_agent.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "agent/control_session.h"
#include "agent/local_regions.h"
#include "agent/peer_connection_state.h"
#include "agent/remote_regions_by_name.h"
#include "agent/task_threads.h"
#include "agent/transport_choice.h"
#include "core/log.h"
#include "core/memory_registry.h"
#include "core/op_state.h"
#include "core/record_fields.h"
#include "core/transport_registry.h"
#include "dlslime/errors.h"
#include "dlslime/nanoctrl_client.h"

namespace dlslime {

using nlohmann::json;


class PeerAgentImpl : public std::enable_shared_from_this<PeerAgentImpl> {
 public:
  explicit PeerAgentImpl(PeerAgentOptions options);
  ~PeerAgentImpl() { shutdown(); }

  void start();
  void shutdown();
  PeerConnection connect_to(const std::string& peer, const ConnectOptions& options);
  // The connections to `peer`, in the order they were made.
  std::vector<std::shared_ptr<PeerConnectionState>> connections_to(const std::string& peer) const;
  // The one `on` selects; null for none; InvalidArgumentError naming them for several.
  std::shared_ptr<PeerConnectionState> select(const std::string& peer, const ConnectionFilter& on) const;
  std::shared_ptr<Endpoint> endpoint_for_io(const std::string& peer, const ConnectionFilter& on);
  // read/write by region names: resolves and submits on one lookup of the connection.
  Future named_op(const std::string& peer, const std::vector<NamedAssignment>& named, OpKind kind,
                  const ConnectionFilter& on);
  int32_t register_region(const std::string& name, uintptr_t addr, uint64_t offset, uint64_t length) {
    return local_.add(name, addr, offset, length);
  }
  void unregister_region(const std::string& name) { local_.remove(name); }
  std::vector<std::string> peers() const;
  std::vector<std::string> sync_regions(const std::shared_ptr<PeerConnectionState>& c) { return by_name_.sync(c); }
  // The connection to `peer` that `on` selects if it can take ops (connected), else the
  // error I/O raises.
  std::shared_ptr<PeerConnectionState> connected(const std::string& peer, const ConnectionFilter& on) const;
  std::vector<std::string> local_region_names() const { return local_.names(); }
  // Set once by start(), before any thread of the agent runs; never changed after.
  const std::string& alias() const { return alias_; }

  PeerAgentOptions options;
  NanoCtrlClient ctrl;

 private:
  // A named op that failed with an unknown handle, resolved again and submitted once more
  // on the same connection; `outer` completes with that attempt.
  void retry_named(const std::shared_ptr<PeerConnectionState>& c, const std::vector<NamedAssignment>& named,
                   OpKind kind, const std::shared_ptr<OpState>& outer, const Status& first);
  // What this agent registers with NanoCtrl (its ControlSession adds the alias).
  json registration_body() const;
  // The transport's agent-wide settings (configured at construction); {} for one not served.
  json settings_of(const std::string& transport) const;
  // Through the transport's hooks (core/transport_registry.h): the factory options of
  // connect_to's endpoint for `request` (ConnectOptions::to_json()), what the peer is told
  // to make its side with, and the options of a passive side's endpoint from what the peer
  // sent (docs/peer-agent.md, "Transport options").
  json own_options(const std::string& transport, const json& request) const;
  json options_for_peer(const std::string& transport, const json& request) const;
  json passive_options(const std::string& transport, const json& from_peer) const;
  // Every built transport, highest rank first, with whether it reaches the peer whose record
  // is `record` for `request`, and why (not).
  std::vector<Considered> consider(const json& record, const std::string& peer, const json& request) const;
  // Whether this agent serves `transport` (published at registration).
  bool serves(const std::string& transport) const;
  // A connection to `peer` for `requested`. Its transport and endpoint are made at once,
  // except for transport "auto" without the peer's `record` (it has not registered yet):
  // decide() makes them once the record is known. `reason`: why this transport (for a
  // transport the caller named or the peer's message did).
  std::shared_ptr<PeerConnectionState> make_connection(const std::string& peer, const ConnectOptions& requested,
                                                       const std::optional<json>& record, bool passive,
                                                       const json& passive_from = nullptr);
  // Chooses an undecided ("auto") connection's transport from the peer's NanoCtrl record and
  // makes its endpoint. False (and the connection failed) when that endpoint cannot be made
  // or the connection ended meanwhile; true once decided (now or before).
  // `peer_transport` (with the peer's `peer_options`): the peer's connect message arrived
  // first and names the transport; it is taken as is.
  bool decide(const std::shared_ptr<PeerConnectionState>& c, const std::optional<json>& record,
              const std::string& peer_transport = "", const json& peer_options = nullptr);
  // Makes an endpoint through the transport registry (and wrap_endpoint).
  std::shared_ptr<Endpoint> make_endpoint(const std::string& transport, const json& endpoint_options);
  // (incarnation, endpoint) of every connection with an endpoint (LocalRegions' records).
  std::vector<std::pair<std::string, std::shared_ptr<Endpoint>>> connection_endpoints() const;
  // The connection a peer's connect message belongs to: the one it answers (to_incarnation),
  // the one with its incarnation, else one of its transport on a NIC pair it can be on
  // (unpaired first). Null when none; `mu_` held.
  std::shared_ptr<PeerConnectionState> match_locked(const std::string& peer, const std::string& transport,
                                                    const json& msg, const std::string& local,
                                                    const std::string& remote) const;
  void erase_locked(const std::shared_ptr<PeerConnectionState>& c);
  // Forgets a connection a peer's message made (map entry and endpoint).
  void drop_passive(const std::shared_ptr<PeerConnectionState>& c, const std::string& why);
  // Runs the handshake's endpoint->connect() on a handshake thread.
  void start_dial(const std::shared_ptr<PeerConnectionState>& c, const json& peer_info);
  void post_info(const std::shared_ptr<PeerConnectionState>& c);
  // Posts our info once, addressed to the peer agent whose NanoCtrl record is `record`;
  // fails the connection instead if that agent does not serve its transport.
  void claim_and_post(const std::shared_ptr<PeerConnectionState>& c, const json& record);
  bool post_pending();
  // Tells the peer our connect() returned (error empty) or why it failed.
  void post_dialed(const std::shared_ptr<PeerConnectionState>& c, const std::string& error);
  void on_dialed(const std::string& from, const json& msg);
  // Waits, at most `bound`, for dials in progress (their "dialed" still to post) and for
  // the connections whose peer is dialing this agent now (our side is up and its "dialed"
  // has not come), so that leaving does not fail the peer's wait().
  void wait_for_peer_dials(std::chrono::milliseconds bound);
  void dial(const std::shared_ptr<PeerConnectionState>& c, const json& peer_info);
  void retire(const std::shared_ptr<PeerConnectionState>& c, const std::string& why);
  // A peer's cleanup: the connection is closed for new ops at once, but its endpoint is
  // shut down only once its transport has seen the loss itself (or kPeerGoneGrace passed),
  // so what the peer answered before it left (the acknowledgement of our last send) still
  // completes those ops instead of being cancelled by our shutdown.
  void retire_after_peer_loss(const std::shared_ptr<PeerConnectionState>& c, const std::string& why);
  // Shuts down the endpoints retire_after_peer_loss() left whose transport has seen the
  // loss or whose grace has passed; all of them with `all`. Mailbox thread, and shutdown().
  // Returns whether some are left.
  bool shut_down_retired(bool all);
  // The instance id NanoCtrl has registered under `peer` now ("" when it has none).
  std::string registered_instance(const std::string& peer);
  bool is_current_instance(const std::string& peer, const std::string& instance);
  void mailbox_loop();
  void on_message(const json& envelope);
  bool sleep_for(std::chrono::milliseconds d);

  std::string alias_;
  // The transports available here at construction, with their devices and what each
  // advertises: what the agent serves and publishes ([{"name", "devices", ...}], in the
  // registry's order). Set by the constructor, read-only after, like settings_ (transport
  // name -> its configured agent settings) and address_ (published in the record).
  json served_;
  json settings_ = json::object();
  std::string address_;
  std::shared_ptr<MemoryRegistry> regions_ = std::make_shared<MemoryRegistry>();
  // This agent's regions, published to NanoCtrl.
  LocalRegions local_{ctrl, alias_, regions_, [this] { return connection_endpoints(); }};
  // The peers' regions by name, resolved per connection.
  RemoteRegionsByName by_name_{ctrl, regions_};
  // The registration with NanoCtrl and its heartbeat (made by start()).
  std::unique_ptr<ControlSession> session_;
  // Passive handshakes dialling now (bounded by kMaxPassiveHandshakes).
  std::atomic<int> passive_dials_{0};
  std::chrono::steady_clock::time_point last_refusal_log_;  // mailbox thread only
  std::shared_ptr<TaskThreads> tasks_ = std::make_shared<TaskThreads>();
  // Random per PeerAgent object, in its NanoCtrl record and in every connect message: a
  // message that a previous agent under the same alias posted before it shut down can
  // still be in our mailbox, and must not replace (or answer) the current one's.
  const std::string instance_ = random_id();
  mutable std::mutex mu_;
  // peer alias -> its connections (several on different NIC pairs), in the order made.
  std::multimap<std::string, std::shared_ptr<PeerConnectionState>> conns_;
  // Connections whose handshake completed and whose peer then left (its cleanup), for a
  // connect_to() that comes after; forgotten once the alias is registered again.
  std::multimap<std::string, std::shared_ptr<PeerConnectionState>> departed_;  // mu_
  // Endpoints of connections closed by a peer's cleanup, until shut_down_retired().
  std::vector<std::pair<std::shared_ptr<Endpoint>, std::chrono::steady_clock::time_point>> retired_;  // mu_
  uint64_t next_conn_ = 0;
  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  std::thread mailbox_thread_;
  std::atomic<std::thread::id> mailbox_id_{};  // for shutdown() from any thread, even while another joins it
};

namespace {

constexpr auto kMailboxWait = std::chrono::milliseconds(500);
// How often connections to peers that have not registered yet look for them.
constexpr auto kPeerPoll = std::chrono::milliseconds(50);
// How long the endpoint of a connection whose peer cleaned up may stay up waiting for its
// transport to see the loss (a goodbye or EOF normally arrives before the cleanup does).
constexpr auto kPeerGoneGrace = std::chrono::milliseconds(2000);
// A handshake message not answered within this long is posted again.
constexpr auto kRepost = std::chrono::milliseconds(1000);
// How long shutdown() waits for peers whose dial to this agent is in flight.
constexpr auto kPeerDialGrace = std::chrono::milliseconds(3000);
// Handshakes a peer's connect message (not our connect_to) may have dialling at once. The
// mailbox is unauthenticated without a NanoCtrl token: anyone can post connect messages
// under any alias, each pointing at an address of their choice. Past the bound such a
// message is dropped; a real peer posts again every kRepost while unanswered.
constexpr int kMaxPassiveHandshakes = 8;

// The host name, for an agent whose transports publish no address of their own.
std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0 && name[0]) return name;
  return "127.0.0.1";
}

}  // namespace

std::vector<Considered> PeerAgentImpl::consider(const json& record, const std::string& peer,
                                                const json& request) const {
  return consider_transports(served_, settings_, address_, record, peer, request);
}

PeerAgentImpl::PeerAgentImpl(PeerAgentOptions opts)
    : options(std::move(opts)), ctrl(options.ctrl_url, options.scope, options.ctrl_timeout, options.ctrl_token) {
  if (options.heartbeat_interval.count() < 0) throw InvalidArgumentError("heartbeat_interval must be >= 0");
  if (options.max_connecting == 0) throw InvalidArgumentError("max_connecting must be >= 1");
  const json& given = options.transport_options;
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
  served_ = json::array();
  for (const auto& t : transports) {
    if (!t.available) continue;
    const AgentHooks* hooks = hooks_of(t.name);
    const json mine = given.contains(t.name) ? given[t.name] : json::object();
    json settings = hooks && hooks->configure ? hooks->configure(mine, options.device) : mine;
    json entry = {{"name", t.name}, {"devices", t.devices}};
    if (hooks && hooks->advertise) entry.update(hooks->advertise(settings));
    if (address_.empty() && hooks && hooks->address) address_ = hooks->address(settings);
    settings_[t.name] = std::move(settings);
    served_.push_back(std::move(entry));
  }
  if (address_.empty()) address_ = host_name();
  if (!options.device.empty()) {
    std::vector<std::string> devices;
    bool found = false;
    for (const auto& t : transports) {
      if (!t.available || t.devices.empty()) continue;
      devices.push_back(fmt::format("{}: {}", t.name, fmt::join(t.devices, ", ")));
      found = found || std::find(t.devices.begin(), t.devices.end(), options.device) != t.devices.end();
    }
    if (!found) {
      throw InvalidArgumentError(fmt::format("device '{}' is not a device of this host (available: {})", options.device,
                                             devices.empty() ? "none" : fmt::format("{}", fmt::join(devices, "; "))));
    }
  }
}

json PeerAgentImpl::registration_body() const {
  return {{"address", address_}, {"metadata", {{"transports", served_}, {"instance", instance_}}}};
}

void PeerAgentImpl::start() {
  session_ = std::make_unique<ControlSession>(
      ctrl, options.heartbeat_interval, [this] { return registration_body(); }, [this] { local_.publish_all(); });
  alias_ = session_->start(options.alias);  // a refused registration throws: nothing to clean up
  session_->start_heartbeat();              // its thread may read alias_ (publishing again)
  mailbox_thread_ = std::thread([this] {
    mailbox_id_ = std::this_thread::get_id();
    mailbox_loop();
  });
  DLSLIME_INFO("PeerAgent '{}' registered with {} (scope '{}')", alias_, ctrl.url(), options.scope);
}

bool PeerAgentImpl::sleep_for(std::chrono::milliseconds d) {
  std::unique_lock lock(stop_mu_);
  return !stop_cv_.wait_for(lock, d, [&] { return stopping_.load(); });
}

void PeerAgentImpl::mailbox_loop() {
  // Connections waiting for their peer to register, or endpoints for their transport to see a
  // loss: look again every kPeerPoll instead of kMailboxWait.
  bool poll_soon = false;
  while (!stopping_) {
    std::vector<json> messages;
    try {
      messages = ctrl.recv(alias_, poll_soon ? kPeerPoll : kMailboxWait, 32);
    } catch (const std::exception& e) {
      if (stopping_) return;
      DLSLIME_WARN("PeerAgent '{}': mailbox receive failed (will retry): {}", alias_, e.what());
      sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    for (const auto& m : messages) {
      try {
        on_message(m);
      } catch (const std::exception& e) {
        DLSLIME_WARN("PeerAgent '{}': dropped a malformed mailbox message {}: {}", alias_, m.dump(), e.what());
      }
    }
    poll_soon = post_pending();
    // Endpoints left waiting for their transport to see the loss are looked at again soon.
    if (shut_down_retired(false)) poll_soon = true;
  }
}

void PeerAgentImpl::on_message(const json& envelope) {
  const json& msg = envelope.at("message");
  const std::string type = msg.at("type").get<std::string>();
  if (type == "cleanup") {
    const std::string peer = msg.at("peer").get<std::string>();
    {
      std::lock_guard lock(mu_);
      std::erase_if(departed_, [&](const auto& entry) { return entry.first == peer; });  // an earlier departure
    }
    const auto conns = connections_to(peer);
    if (conns.empty()) return;
    const std::string now = registered_instance(peer);
    for (const auto& c : conns) {
      std::string instance;
      {
        std::lock_guard clock(c->mu);
        instance = c->peer_instance;
      }
      // A cleanup that reaches us late (the alias is registered again by a new agent, and
      // this connection is to that agent or still waiting for it) is about the old agent.
      if (!now.empty() && (instance.empty() || instance == now)) {
        DLSLIME_DEBUG("PeerAgent '{}': ignoring a late cleanup of an earlier '{}' ({})", alias_, peer, c->conn_id);
        continue;
      }
      bool completed = false;
      {
        std::lock_guard clock(c->mu);
        completed = c->was_connected;
      }
      {
        std::lock_guard lock(mu_);
        erase_locked(c);
        // Its handshake completed: a connect_to() that comes after the peer left (it wrote
        // and shut down before we asked) gets this connection, not a new attempt towards
        // an agent that is gone.
        if (completed) departed_.emplace(peer, c);
      }
      retire_after_peer_loss(c, "the peer agent '" + peer + "' shut down");
    }
    return;
  }
  if (type == "connect_peer") return;  // desired-topology intent; connect_to drives connections
  if (type == "dialed") {
    on_dialed(envelope.at("from").get<std::string>(), msg);
    return;
  }
  if (type != "connect") {
    DLSLIME_DEBUG("PeerAgent '{}': ignoring mailbox message of type '{}'", alias_, type);
    return;
  }
  const std::string from = envelope.at("from").get<std::string>();
  const json& info = msg.at("endpoint_info");  // the peer transport's blob: passed on, never parsed
  const std::string transport = msg.at("transport").get<std::string>();
  if (!msg.contains("incarnation") || !is_random_id(msg["incarnation"])) {
    // The incarnation tells a reconnect from a repeat; without one the message cannot be
    // placed (an agent of an older version, or a forgery).
    DLSLIME_WARN("PeerAgent '{}': dropped a connect message from '{}' with {} incarnation (16 hex digits "
                 "expected; an agent of an older version?)",
                 alias_, from, msg.contains("incarnation") ? "a malformed" : "no");
    return;
  }
  const std::string peer_incarnation = msg["incarnation"].get<std::string>();
  if (!serves(transport)) {
    DLSLIME_WARN("PeerAgent '{}': '{}' asked for transport \"{}\", which this agent does not serve (it serves: {})",
                 alias_, from, transport, names_of(served_));
    return;
  }
  const json peer_options = msg.value("transport_options", json::object());
  if (!peer_options.is_object()) {
    DLSLIME_WARN("PeerAgent '{}': dropped a connect message from '{}': transport_options is not an object", alias_,
                 from);
    return;
  }
  const std::string instance = msg.value("instance", "");
  const std::string to_instance = msg.value("to_instance", "");
  if (!to_instance.empty() && to_instance != instance_) {
    // Posted to an earlier agent under our alias, which left before reading it.
    DLSLIME_DEBUG("PeerAgent '{}': ignoring a connect message from '{}' meant for an earlier '{}'", alias_, from,
                  alias_);
    return;
  }
  if (!is_current_instance(from, instance)) {
    DLSLIME_DEBUG("PeerAgent '{}': ignoring a connect message from an earlier '{}' (instance {})", alias_, from,
                  instance);
    return;
  }
  std::shared_ptr<PeerConnectionState> c, stale;
  bool made_here = false;  // a passive connection made for this message
  bool send_info = false;
  bool duplicate = false;
  const bool peer_has_ours = msg.value("have_peer_info", false);
  // The NIC pair the message is for: the sender's device, and the one it asks us to use
  // (RDMA's peer_device; "" when it leaves that to us).
  const std::string sender_nic = device_of(info);
  const std::string wanted_nic =
      peer_options.contains("device") && peer_options["device"].is_string() ? peer_options["device"].get<std::string>() : "";
  {
    std::lock_guard lock(mu_);
    if (auto found = match_locked(from, transport, msg, wanted_nic, sender_nic)) {
      std::lock_guard clock(found->mu);
      const bool same_endpoint = found->peer_incarnation == peer_incarnation;
      const bool new_incarnation = !found->peer_incarnation.empty() && !same_endpoint;
      const bool dead = found->state == "failed" || found->state == "closed" ||
                        (found->state == "connected" && !(found->endpoint && found->endpoint->is_connected()));
      // A repeat from the endpoint a finished handshake was with (it crossed our answer in
      // the mailbox) is not a reconnect, even when that handshake failed (e.g. the tokens
      // differ): replacing would retry it forever and lose the reason.
      if (new_incarnation || (dead && !same_endpoint)) {
        stale = found;
      } else if (same_endpoint && found->state != "connecting") {
        // A repeat of a handshake that already finished here; the peer may still lack
        // our info (our post was lost), so answer it once more.
        c = found;
        duplicate = true;
      } else {
        c = found;
      }
    }
    if (stale) erase_locked(stale);
  }
  if (duplicate) {
    if (!peer_has_ours) post_info(c);
    bool confirm = false;
    {
      std::lock_guard lock(c->mu);
      confirm = c->dialed && c->peer_confirms;
    }
    if (confirm) post_dialed(c, "");  // our "dialed" may be what the peer still waits for
    return;
  }
  if (stale) retire(stale, "replaced: the peer agent reconnected");
  if (!c) {
    // The peer connects first: make the mirror connection with default options, unless
    // the passive handshakes are all taken (see kMaxPassiveHandshakes). Nothing is made
    // for a dropped message; the peer's repost gets in once a handshake ends.
    if (passive_dials_.load() >= kMaxPassiveHandshakes) {
      const auto now = std::chrono::steady_clock::now();
      if (now - last_refusal_log_ > std::chrono::seconds(1)) {
        last_refusal_log_ = now;
        DLSLIME_WARN("PeerAgent '{}': {} handshakes that peers started are in progress; dropping the connect "
                     "message from '{}' (it is posted again if the peer is real)",
                     alias_, kMaxPassiveHandshakes, from);
      }
      return;
    }
    ConnectOptions requested;
    requested.transport = transport;
    auto made = make_connection(from, requested, std::nullopt, /*passive=*/true, peer_options);
    {
      std::lock_guard lock(mu_);
      if (!stopping_) {
        // connect_to() may have made this connection meanwhile: use that one.
        c = match_locked(from, transport, msg, wanted_nic, sender_nic);
        if (!c) c = conns_.emplace(from, made)->second;
      }
    }
    if (c != made) made->shutdown_endpoint();
    if (!c) return;  // shutting down
    made_here = c == made;
  }
  // Our connect_to(transport="auto") still waits for the peer's record, and the peer has
  // chosen: take its transport (one this agent serves, checked above).
  if (!decide(c, std::nullopt, transport, peer_options)) return;
  if (const std::string ours = c->transport_name(); ours != transport) {
    // Both sides called connect_to, with different transports: neither can succeed. The
    // peer's repeats of this message count as the same handshake (and get our message, so
    // the peer fails too) instead of making a passive connection over its transport.
    {
      std::lock_guard lock(c->mu);
      c->peer_incarnation = peer_incarnation;
    }
    c->shutdown_endpoint();
    c->finish("failed", fmt::format("the peer '{}' connects over \"{}\", this side over \"{}\"", from, transport,
                                    ours));
    return;
  }
  bool dial_now = false;
  bool confirm_again = false;
  {
    std::lock_guard lock(c->mu);
    c->peer_info = info;
    c->peer_incarnation = peer_incarnation;
    c->peer_instance = instance;
    c->remote_nic = sender_nic;
    c->peer_confirms = msg.contains("confirms_dial") && msg["confirms_dial"].is_boolean() &&
                       msg["confirms_dial"].get<bool>();
    send_info = !c->info_sent || !peer_has_ours;
    c->info_sent = true;
    // A repeat that arrives while the first one's dial runs, or after it (waiting for the
    // peer's "dialed"), dials nothing; after it, it says "dialed" again (ours may be lost).
    dial_now = c->state == "connecting" && !c->dialing && !c->dialed;
    if (dial_now) c->dialing = true;
    confirm_again = c->dialed && c->peer_confirms;
  }
  if (send_info) {
    try {
      post_info(c);
    } catch (const std::exception& e) {
      // A sender we cannot answer (its alias is not registered: not a real agent) gets no
      // connection kept for it.
      if (made_here) drop_passive(c, std::string("answering the peer failed: ") + e.what());
      throw;
    }
  }
  if (confirm_again) post_dialed(c, "");
  if (dial_now) start_dial(c, info);
}

void PeerAgentImpl::post_dialed(const std::shared_ptr<PeerConnectionState>& c, const std::string& error) {
  json msg = {{"type", "dialed"}, {"incarnation", c->incarnation}, {"instance", instance_}, {"ok", error.empty()}};
  {
    std::lock_guard lock(c->mu);
    msg["to_incarnation"] = c->peer_incarnation;
    msg["to_instance"] = c->peer_instance;
  }
  if (!error.empty()) msg["error"] = error;
  try {
    ctrl.post(c->peer_alias, msg, alias_);
  } catch (const std::exception& e) {
    // The peer re-posts its connect message while it waits, and gets "dialed" again then.
    DLSLIME_DEBUG("PeerAgent '{}': telling '{}' that {} failed: {}", alias_, c->peer_alias,
                  error.empty() ? "our dial is up" : "our dial failed", e.what());
  }
}

void PeerAgentImpl::on_dialed(const std::string& from, const json& msg) {
  const std::string ours = text_field(msg, "to_incarnation");
  const std::string theirs = text_field(msg, "incarnation");
  const bool ok = !msg.contains("ok") || !msg["ok"].is_boolean() || msg["ok"].get<bool>();
  for (const auto& c : connections_to(from)) {
    bool up = false;
    {
      std::lock_guard lock(c->mu);
      // Only the peer endpoint this connection shook hands with can confirm it.
      if (c->incarnation != ours || c->peer_incarnation.empty() || c->peer_incarnation != theirs) continue;
      if (c->state != "connecting") return;
      if (ok) {
        c->peer_dialed = true;
        up = c->dialed;
      }
    }
    if (!ok) {
      const std::string why = fmt::format("the peer agent '{}' could not connect to this agent: {}", from,
                                          text_field(msg, "error"));
      if (c->passive) {
        drop_passive(c, why);
      } else {
        c->shutdown_endpoint();
        c->finish("failed", why);
      }
    } else if (up) {
      c->finish("connected", "");
      DLSLIME_INFO("PeerAgent '{}': connected to '{}' over {} ({})", alias_, c->peer_alias, c->transport_name(),
                   c->conn_id);
    }
    return;
  }
  DLSLIME_DEBUG("PeerAgent '{}': a \"dialed\" message from '{}' matches no connection", alias_, from);
}

std::shared_ptr<PeerConnectionState> PeerAgentImpl::match_locked(const std::string& peer, const std::string& transport,
                                                                  const json& msg, const std::string& local,
                                                                  const std::string& remote) const {
  const auto [first, last] = conns_.equal_range(peer);
  const std::string to_incarnation = msg.value("to_incarnation", "");
  const std::string incarnation = msg.value("incarnation", "");
  std::shared_ptr<PeerConnectionState> unpaired, paired;
  for (auto it = first; it != last; ++it) {
    const auto& c = it->second;
    if (!to_incarnation.empty() && c->incarnation == to_incarnation) return c;  // it answers this one
    std::lock_guard clock(c->mu);
    if (c->peer_incarnation == incarnation) return c;  // a repeat
  }
  for (auto it = first; it != last; ++it) {
    const auto& c = it->second;
    const std::string t = c->transport_name();
    if (t != transport && t != "auto") continue;
    if (!c->could_be_on(local, remote)) continue;
    std::lock_guard clock(c->mu);
    if (c->peer_incarnation.empty()) {
      if (!unpaired) unpaired = c;
    } else if (!paired) {
      paired = c;
    }
  }
  return unpaired ? unpaired : paired;
}

void PeerAgentImpl::erase_locked(const std::shared_ptr<PeerConnectionState>& c) {
  for (auto [it, last] = conns_.equal_range(c->peer_alias); it != last; ++it) {
    if (it->second == c) {
      conns_.erase(it);
      return;
    }
  }
}

void PeerAgentImpl::drop_passive(const std::shared_ptr<PeerConnectionState>& c, const std::string& why) {
  {
    std::lock_guard lock(mu_);
    erase_locked(c);
  }
  c->shutdown_endpoint();
  c->finish("failed", why);
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

json PeerAgentImpl::settings_of(const std::string& transport) const {
  return settings_.contains(transport) ? settings_[transport] : json::object();
}

json PeerAgentImpl::own_options(const std::string& transport, const json& request) const {
  const AgentHooks* hooks = hooks_of(transport);
  return hooks && hooks->active_options ? hooks->active_options(settings_of(transport), request)
                                        : settings_of(transport);
}

json PeerAgentImpl::options_for_peer(const std::string& transport, const json& request) const {
  const AgentHooks* hooks = hooks_of(transport);
  return hooks && hooks->peer_options ? hooks->peer_options(settings_of(transport), request) : json::object();
}

json PeerAgentImpl::passive_options(const std::string& transport, const json& from_peer) const {
  // Anyone may post a connect message: the transport takes only the keys its peer_options()
  // sends, never our token, timeouts or address.
  const AgentHooks* hooks = hooks_of(transport);
  return hooks && hooks->passive_options ? hooks->passive_options(settings_of(transport), from_peer)
                                         : settings_of(transport);
}

bool PeerAgentImpl::serves(const std::string& transport) const {
  return std::any_of(served_.begin(), served_.end(), [&](const json& t) { return t["name"] == transport; });
}

std::shared_ptr<Endpoint> PeerAgentImpl::make_endpoint(const std::string& transport, const json& endpoint_options) {
  std::shared_ptr<Endpoint> made = TransportRegistry::instance().make(transport, endpoint_options, regions_);
  std::shared_ptr<Endpoint> ep = made;
  if (options.wrap_endpoint) {
    try {
      ep = options.wrap_endpoint(made);
    } catch (...) {
      made->shutdown();
      throw;
    }
    if (!ep) {
      made->shutdown();
      throw InvalidArgumentError("PeerAgentOptions::wrap_endpoint returned no endpoint");
    }
  }
  return ep;
}

std::shared_ptr<PeerConnectionState> PeerAgentImpl::make_connection(const std::string& peer,
                                                                     const ConnectOptions& requested,
                                                                     const std::optional<json>& record, bool passive,
                                                                     const json& passive_from) {
  std::string id;
  {
    std::lock_guard lock(mu_);
    id = fmt::format("{}->{}#{}", alias_, peer, next_conn_++);
  }
  auto c = std::make_shared<PeerConnectionState>(peer, id, requested, passive);
  c->agent = weak_from_this();
  if (requested.transport == "auto") {
    if (record) decide(c, record);  // a failure fails the connection: wait() says why
    return c;
  }
  const std::string& t = requested.transport;
  const json endpoint_options = passive ? passive_options(t, passive_from) : own_options(t, c->request);
  auto ep = make_endpoint(t, endpoint_options);
  const std::string nic = device_of(ep->endpoint_info());
  std::lock_guard lock(c->mu);
  c->transport = t;
  c->selection_reason = passive ? fmt::format("{}: the peer agent '{}' connected over it", t, peer)
                                : fmt::format("{}: requested", t);
  c->peer_options = options_for_peer(t, c->request);
  c->endpoint = std::move(ep);
  c->local_nic = nic;
  // A transport whose endpoints name a device: the peer's is the one asked for until the
  // peer's endpoint_info says.
  if (!passive && !nic.empty()) c->remote_nic = requested.peer_device;
  return c;
}

bool PeerAgentImpl::decide(const std::shared_ptr<PeerConnectionState>& c, const std::optional<json>& record,
                           const std::string& peer_transport, const json& peer_options) {
  if (c->ep()) return true;
  Choice choice;
  if (peer_transport.empty()) {
    choice = choose(consider(record.value_or(json()), c->peer_alias, c->request), c->peer_alias);
    if (choice.transport.empty()) {
      c->finish("failed", choice.reason);
      return false;
    }
  } else {
    choice = {peer_transport, fmt::format("{}: the peer agent '{}' connects over it", peer_transport, c->peer_alias),
              c->request};
  }
  std::shared_ptr<Endpoint> ep;
  try {
    ep = make_endpoint(choice.transport, peer_transport.empty() ? own_options(choice.transport, choice.request)
                                                                : passive_options(choice.transport, peer_options));
  } catch (const std::exception& e) {
    c->finish("failed", fmt::format("{}; but making its endpoint failed: {}", choice.reason, e.what()));
    return false;
  }
  const std::string nic = device_of(ep->endpoint_info());
  {
    std::lock_guard lock(c->mu);
    if (!c->endpoint && c->state == "connecting") {
      c->transport = choice.transport;
      c->selection_reason = choice.reason;
      c->peer_options = options_for_peer(choice.transport, choice.request);
      c->endpoint = ep;
      c->local_nic = nic;
      if (!nic.empty() && c->remote_nic.empty() && peer_transport.empty()) {
        c->remote_nic = text_field(choice.request, "peer_device");
      }
      ep.reset();
    }
  }
  if (ep) {
    ep->shutdown();  // decided meanwhile by another thread, or the connection ended
    return c->ep() != nullptr;
  }
  DLSLIME_INFO("PeerAgent '{}': transport for '{}': {}", alias_, c->peer_alias, c->selection_reason);
  return true;
}

void PeerAgentImpl::post_info(const std::shared_ptr<PeerConnectionState>& c) {
  bool have_peer_info = false;
  std::string to_instance, transport, to_incarnation;
  json peer_options;
  std::shared_ptr<Endpoint> ep;
  {
    std::lock_guard lock(c->mu);
    have_peer_info = !c->peer_info.is_null();
    to_incarnation = c->peer_incarnation;
    to_instance = c->peer_instance;
    c->last_post = std::chrono::steady_clock::now();
    transport = c->transport;
    peer_options = c->peer_options;
    ep = c->endpoint;
  }
  if (!ep) return;  // undecided: nothing to tell the peer yet
  // have_peer_info tells the peer whether it must (re)send its own info.
  const json msg = {{"type", "connect"},
                    {"transport", transport},
                    {"transport_options", peer_options},
                    {"incarnation", c->incarnation},
                    {"conn_id", c->conn_id},
                    {"have_peer_info", have_peer_info},
                    {"instance", instance_},
                    {"to_instance", to_instance},
                    {"to_incarnation", to_incarnation},
                    {"confirms_dial", true},  // we post "dialed" once our connect() returned
                    {"endpoint_info", ep->endpoint_info()}};
  ctrl.post(c->peer_alias, msg, alias_);
}

void PeerAgentImpl::start_dial(const std::shared_ptr<PeerConnectionState>& c, const json& peer_info) {
  // Off the mailbox thread: connect() can wait out the connect timeout (an address that
  // accepts and never answers), and handshakes and cleanups behind it must not wait.
  if (c->passive) passive_dials_.fetch_add(1);
  if (!tasks_->spawn([this, c, peer_info] { dial(c, peer_info); })) {
    if (c->passive) passive_dials_.fetch_sub(1);
    retire(c, "this agent shut down");
  }
}

void PeerAgentImpl::dial(const std::shared_ptr<PeerConnectionState>& c, const json& peer_info) {
  try {
    c->ep()->connect(peer_info);  // decided before any dial (on_message)
    bool up = false, confirm = false;
    {
      std::lock_guard lock(c->mu);
      c->dialed = true;
      confirm = c->peer_confirms;
      up = !c->peer_confirms || c->peer_dialed;
    }
    // Up before the peer hears of it: once it has, it may write, leave, and have its
    // cleanup reach us before this thread runs again. (Our own user may see us up and
    // leave before the post below: shutdown() waits for this dial to end first.)
    if (up) {
      c->finish("connected", "");
      DLSLIME_INFO("PeerAgent '{}': connected to '{}' over {} ({})", alias_, c->peer_alias, c->transport_name(),
                   c->conn_id);
    } else {
      DLSLIME_DEBUG("PeerAgent '{}': our side to '{}' is up; waiting for its side ({})", alias_, c->peer_alias,
                    c->conn_id);
    }
    if (confirm) post_dialed(c, "");
  } catch (const std::exception& e) {
    const bool auth = dynamic_cast<const AuthenticationError*>(&e) != nullptr;
    DLSLIME_WARN("PeerAgent '{}': connecting to '{}' failed: {}", alias_, c->peer_alias, e.what());
    bool confirm = false;
    {
      std::lock_guard lock(c->mu);
      confirm = c->peer_confirms;
    }
    // The peer waits for our side: tell it why it will not come (an authentication failure
    // it sees itself, with its own error).
    if (confirm && !auth && !stopping_) post_dialed(c, e.what());
    if (auth) {
      // Kept open (until replaced or shut down): the peer's own handshake against this
      // endpoint must end with the authentication error too, not with a refused dial.
      c->finish("failed", e.what(), /*auth=*/true);
    } else if (c->passive) {
      // Nobody asked for it here: forget it, so failed (or forged) handshakes keep nothing.
      drop_passive(c, e.what());
    } else {
      // The caller's handle keeps the state and reason; the listener and sockets close now.
      c->shutdown_endpoint();
      c->finish("failed", e.what());
    }
  }
  {
    std::lock_guard lock(c->mu);
    c->dialing = false;
  }
  c->cv.notify_all();  // shutdown() waits for dials in progress (wait_for_peer_dials)
  if (c->passive) passive_dials_.fetch_sub(1);
}

void PeerAgentImpl::retire(const std::shared_ptr<PeerConnectionState>& c, const std::string& why) {
  c->shutdown_endpoint();
  c->finish("closed", why);
}

void PeerAgentImpl::retire_after_peer_loss(const std::shared_ptr<PeerConnectionState>& c, const std::string& why) {
  c->finish("closed", why);
  if (auto ep = c->ep()) {
    std::lock_guard lock(mu_);
    retired_.emplace_back(std::move(ep), std::chrono::steady_clock::now() + kPeerGoneGrace);
  }
  shut_down_retired(false);
}

bool PeerAgentImpl::shut_down_retired(bool all) {
  std::vector<std::shared_ptr<Endpoint>> done;
  {
    std::lock_guard lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(retired_, [&](const auto& r) {
      if (!all && r.first->is_connected() && now < r.second) return false;
      done.push_back(r.first);
      return true;
    });
  }
  for (auto& ep : done) ep->shutdown();  // outside mu_: it waits for the I/O thread
  std::lock_guard lock(mu_);
  return !retired_.empty();
}

PeerConnection PeerAgentImpl::connect_to(const std::string& peer, const ConnectOptions& o) {
  if (stopping_) throw ConnectionError("connect_to() on a PeerAgent that was shut down", StatusCode::kCancelled);
  if (peer.empty()) throw InvalidArgumentError("peer alias must be a non-empty string");
  if (peer == alias_) throw InvalidArgumentError(fmt::format("an agent cannot connect to itself ('{}')", peer));
  if (o.transport != "auto") {
    try {
      TransportRegistry::instance().require(o.transport);  // unknown: InvalidArgumentError naming the known ones
    } catch (const NotImplementedError& e) {
      throw NotImplementedError(fmt::format("{}; available here: {}", e.what(), names_of(served_)));
    } catch (const InvalidArgumentError& e) {
      throw InvalidArgumentError(fmt::format("{} (or \"auto\")", e.what()));
    }
    if (!serves(o.transport)) {  // available now, but not when this agent was made (a plug-in)
      throw NotImplementedError(fmt::format("PeerAgent '{}' does not serve transport \"{}\" (it was not available "
                                            "when the agent was made); it serves: {}",
                                            alias_, o.transport, names_of(served_)));
    }
  }
  // The NIC pair asked for ("" = any): a live connection on it (and of this transport) is
  // returned; another pair makes another connection to the same peer.
  const std::string want_local = o.local_device.empty() ? options.device : o.local_device;
  const std::string& want_remote = o.peer_device;
  auto same_link = [&](const std::shared_ptr<PeerConnectionState>& c) {
    const std::string t = c->transport_name();
    const bool transport_ok = o.transport == "auto" || t == "auto" || t == o.transport;
    // A connection whose transport names no devices (TCP) matches any: one per peer.
    return transport_ok && c->could_be_on(want_local, want_remote);
  };
  std::vector<std::shared_ptr<PeerConnectionState>> stale;
  std::shared_ptr<PeerConnectionState> departed;
  {
    std::lock_guard lock(mu_);
    for (auto [it, last] = departed_.equal_range(peer); it != last; ++it) {
      if (same_link(it->second)) departed = it->second;  // the latest
    }
    for (auto [it, last] = conns_.equal_range(peer); it != last;) {
      if (!same_link(it->second)) {
        ++it;
        continue;
      }
      // A handshake that failed on the token cannot succeed on a retry: keep its reason.
      if (it->second->alive() || it->second->failed_on_auth()) return PeerConnection(it->second);
      stale.push_back(it->second);
      it = conns_.erase(it);
    }
    // Each attempt holds an endpoint until its peer answers, which a peer that registered
    // and never runs never does (hostile review N10): the attempts are bounded.
    size_t connecting = 0;
    for (const auto& [name, other] : conns_) {
      if (!other->passive && other->connecting()) ++connecting;
    }
    if (connecting >= options.max_connecting) {
      throw ConnectionError(fmt::format("PeerAgent '{}' has {} connect_to() attempts in progress, the most it allows "
                                        "(max_connecting): wait for some to connect or fail, or raise the bound",
                                        alias_, connecting),
                            StatusCode::kFailed);
    }
  }
  for (const auto& c : stale) retire(c, "replaced by a new connect_to()");
  // The peer's record, if it has registered: "auto" chooses from it. Agents of one job start
  // concurrently: a peer that has not registered yet gets our endpoint_info as soon as it
  // does (post_pending, from the mailbox thread), and "auto" chooses then.
  const std::optional<json> record = ctrl.get_peer_agent(peer);
  if (departed) {
    // The agent it was with is gone and none has registered under its alias since.
    if (!record) return PeerConnection(departed);
    std::lock_guard lock(mu_);
    std::erase_if(departed_, [&](const auto& entry) { return entry.first == peer; });
  }
  auto c = make_connection(peer, o, record, /*passive=*/false);
  {
    std::lock_guard lock(mu_);
    for (auto [it, last] = conns_.equal_range(peer); it != last; ++it) {
      // The peer's handshake arrived meanwhile and made the connection: use that one.
      if (same_link(it->second) && it->second->alive()) {
        c->shutdown_endpoint();
        return PeerConnection(it->second);
      }
    }
    conns_.emplace(peer, c);
  }
  try {
    if (record) claim_and_post(c, *record);
  } catch (...) {
    {
      std::lock_guard lock(mu_);
      erase_locked(c);
    }
    c->shutdown_endpoint();
    throw;
  }
  return PeerConnection(c);
}

void PeerAgentImpl::claim_and_post(const std::shared_ptr<PeerConnectionState>& c, const json& record) {
  {
    std::lock_guard lock(c->mu);
    if (c->info_sent) return;
    c->info_sent = true;
  }
  if (!decide(c, record)) return;  // "auto": the peer's record is known now
  // Known before any handshake: say so now rather than let wait() time out.
  if (auto why = not_served_by(record, c->peer_alias, c->transport_name())) {
    c->shutdown_endpoint();
    c->finish("failed", *why);
    return;
  }
  // A transport asked for by name that its reach() says cannot connect the two fails now,
  // with its reason, rather than once the peer answered (its endpoint's connect() would
  // refuse it then). One whose answer the peer's record cannot settle (an earlier agent)
  // is tried.
  if (!c->passive && c->requested.transport != "auto") {
    const std::string t = c->transport_name();
    for (const Considered& k : consider(record, c->peer_alias, c->request)) {
      if (k.transport != t || k.reach.ok || !k.reach.checked) continue;
      c->shutdown_endpoint();
      c->finish("failed", fmt::format("transport \"{}\" cannot reach the peer agent '{}': {}; choose another or "
                                      "transport=\"auto\"",
                                      t, c->peer_alias, k.reach.reason));
      return;
    }
  }
  {
    std::lock_guard lock(c->mu);
    if (c->peer_instance.empty()) c->peer_instance = instance_of(record);
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
      } else if ((c->peer_info.is_null() || (c->dialed && c->peer_confirms && !c->peer_dialed)) &&
                 now - c->last_post > kRepost) {
        // No answer, or no "dialed" yet: our connect message again makes the peer repeat it.
        unanswered.push_back(c);
      }
    }
  }
  for (const auto& c : unregistered) {
    try {
      if (auto record = ctrl.get_peer_agent(c->peer_alias)) claim_and_post(c, *record);
    } catch (const std::exception& e) {
      DLSLIME_DEBUG("PeerAgent '{}': waiting for '{}' to register: {}", alias_, c->peer_alias, e.what());
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
      DLSLIME_DEBUG("PeerAgent '{}': re-posting to '{}' failed: {}", alias_, c->peer_alias, e.what());
    }
  }
  std::lock_guard lock(mu_);
  for (const auto& [peer, c] : conns_) {
    std::lock_guard clock(c->mu);
    if (c->state == "connecting") return true;
  }
  return false;
}

std::vector<std::shared_ptr<PeerConnectionState>> PeerAgentImpl::connections_to(const std::string& peer) const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<PeerConnectionState>> out;
  for (auto [it, last] = conns_.equal_range(peer); it != last; ++it) out.push_back(it->second);
  return out;
}

namespace {

std::string nic_label(const std::string& nic) { return nic.empty() ? "None" : "'" + nic + "'"; }

}  // namespace

std::shared_ptr<PeerConnectionState> PeerAgentImpl::select(const std::string& peer, const ConnectionFilter& on) const {
  std::vector<std::shared_ptr<PeerConnectionState>> found;
  for (auto& c : connections_to(peer)) {
    if (c->on_nics(on.local_nic, on.remote_nic)) found.push_back(std::move(c));
  }
  if (found.size() <= 1) return found.empty() ? nullptr : found.front();
  // Several NIC pairs and nothing to choose between them: a silent pick could move the
  // bytes over a NIC the caller did not mean (or one whose peer region is another's).
  std::vector<std::string> choices;
  for (const auto& c : found) {
    std::lock_guard lock(c->mu);
    choices.push_back(fmt::format("local_nic={} remote_nic={} ({}, {})", nic_label(c->local_nic),
                                  nic_label(c->remote_nic), c->transport, c->conn_id));
  }
  throw InvalidArgumentError(fmt::format("{} connections to '{}' match; pass local_nic=/remote_nic= to choose one: {}",
                                         found.size(), peer, fmt::join(choices, "; ")));
}

std::vector<std::string> PeerAgentImpl::peers() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, c] : conns_) {
    if (out.empty() || out.back() != name) out.push_back(name);
  }
  return out;
}

std::shared_ptr<PeerConnectionState> PeerAgentImpl::connected(const std::string& peer, const ConnectionFilter& on) const {
  auto c = select(peer, on);
  if (!c) {
    if (!on.local_nic.empty() || !on.remote_nic.empty()) {
      std::vector<std::string> have;
      for (const auto& other : connections_to(peer)) {
        std::lock_guard lock(other->mu);
        have.push_back(fmt::format("local_nic={} remote_nic={}", nic_label(other->local_nic), nic_label(other->remote_nic)));
      }
      if (!have.empty()) {
        throw ConnectionError(fmt::format("no connection to '{}' on local_nic={} remote_nic={} (its connections: {})",
                                          peer, on.local_nic.empty() ? "any" : nic_label(on.local_nic),
                                          on.remote_nic.empty() ? "any" : nic_label(on.remote_nic),
                                          fmt::join(have, "; ")),
                              StatusCode::kNotConnected);
      }
    }
    throw ConnectionError(
        fmt::format("no connection to '{}'; call connect_to(\"{}\") first", peer, peer),
        StatusCode::kNotConnected);
  }
  std::lock_guard lock(c->mu);
  if (c->state != "connected") {
    throw ConnectionError(fmt::format("the connection to '{}' is {}{}; wait() on it after connect_to()", peer,
                                      c->state, c->error.empty() ? "" : " (" + c->error + ")"),
                          StatusCode::kNotConnected);
  }
  return c;
}

std::shared_ptr<Endpoint> PeerAgentImpl::endpoint_for_io(const std::string& peer, const ConnectionFilter& on) {
  return connected(peer, on)->ep();
}

namespace {

Future submit_named(Endpoint& ep, std::vector<Assignment> resolved, OpKind kind) {
  return kind == OpKind::kRead ? ep.read(std::move(resolved)) : ep.write(std::move(resolved));
}

}  // namespace

Future PeerAgentImpl::named_op(const std::string& peer, const std::vector<NamedAssignment>& named, OpKind kind,
                               const ConnectionFilter& on) {
  // One lookup: the handles are resolved in this connection's remote table, so they must
  // be submitted on this connection's endpoint, even if a reconnect replaces it meanwhile.
  auto c = connected(peer, on);
  Future first = submit_named(*c->ep(), by_name_.resolve(c, named, /*fresh=*/false), kind);
  // An unknown handle means the peer registered a name again (a new buffer, a new handle)
  // since we cached it: resolve once more from NanoCtrl and retry once, off the I/O thread
  // that completes `first` (resolving is an HTTP call).
  auto outer = std::make_shared<OpState>(kind);
  std::weak_ptr<PeerAgentImpl> weak = weak_from_this();
  std::shared_ptr<TaskThreads> tasks = tasks_;
  first.state()->on_complete([weak, tasks, c, named, kind, outer](const OpState& done) {
    const Status status = done.status();
    if (status.code() != StatusCode::kUnknownHandle) {
      outer->complete(status, done.nbytes());
      return;
    }
    const bool spawned = tasks->spawn([weak, c, named, kind, outer, status] {
      if (auto self = weak.lock()) {
        self->retry_named(c, named, kind, outer, status);
      } else {
        outer->complete(status);
      }
    });
    if (!spawned) outer->complete(status);  // the agent is shutting down
  });
  return Future(outer);
}

void PeerAgentImpl::retry_named(const std::shared_ptr<PeerConnectionState>& c,
                                const std::vector<NamedAssignment>& named, OpKind kind,
                                const std::shared_ptr<OpState>& outer, const Status& first) {
  try {
    Future again = submit_named(*c->ep(), by_name_.resolve(c, named, /*fresh=*/true), kind);
    again.state()->on_complete([outer](const OpState& done) { outer->complete(done.status(), done.nbytes()); });
  } catch (const Error& e) {
    outer->complete(Status(e.code(), fmt::format("{} (resolving again after: {})", e.what(), first.message())));
  } catch (const std::exception& e) {
    outer->complete(Status::failed(fmt::format("{} (resolving again after: {})", e.what(), first.message())));
  }
}

std::vector<std::pair<std::string, std::shared_ptr<Endpoint>>> PeerAgentImpl::connection_endpoints() const {
  std::vector<std::shared_ptr<PeerConnectionState>> conns;
  {
    std::lock_guard lock(mu_);
    for (const auto& [peer, c] : conns_) conns.push_back(c);
  }
  std::vector<std::pair<std::string, std::shared_ptr<Endpoint>>> out;
  for (const auto& c : conns) {
    if (auto ep = c->ep()) out.emplace_back(c->incarnation, std::move(ep));
  }
  return out;
}

void PeerAgentImpl::wait_for_peer_dials(std::chrono::milliseconds bound) {
  // The mailbox thread delivers "dialed": it cannot wait for itself.
  if (std::this_thread::get_id() == mailbox_id_.load()) return;
  const auto deadline = std::chrono::steady_clock::now() + bound;
  std::vector<std::shared_ptr<PeerConnectionState>> waiting;
  {
    std::lock_guard lock(mu_);
    for (const auto& [peer, c] : conns_) waiting.push_back(c);
  }
  for (const auto& c : waiting) {
    std::unique_lock lock(c->mu);
    // A dial in progress has yet to post its "dialed" (before our cleanup does), and a
    // peer we await is dialing us.
    c->cv.wait_until(lock, deadline, [&] {
      return !c->dialing && (c->state != "connecting" || !c->dialed || !c->peer_confirms || c->peer_dialed);
    });
  }
}

void PeerAgentImpl::shutdown() {
  if (stopping_) return;
  wait_for_peer_dials(kPeerDialGrace);
  if (stopping_.exchange(true)) return;
  stop_cv_.notify_all();
  // The heartbeat first: one still running could register us again after cleanup.
  if (session_) session_->stop();
  auto retire_all = [this] {
    std::multimap<std::string, std::shared_ptr<PeerConnectionState>> conns;
    {
      std::lock_guard lock(mu_);
      conns.swap(conns_);
    }
    for (auto& [peer, c] : conns) retire(c, "this agent shut down");
    std::lock_guard lock(mu_);
    departed_.clear();
  };
  // Endpoints first: the peers see the goodbye and fail their pending ops at once (and
  // handshakes dialling now end).
  retire_all();
  if (session_) session_->leave();  // only a registration of ours
  if (mailbox_thread_.joinable()) mailbox_thread_.join();
  tasks_->close();
  retire_all();  // any the mailbox thread made while stopping
  shut_down_retired(true);
}

// ---------------------------------------------------------------------------------------

PeerAgent::PeerAgent(PeerAgentOptions options) : impl_(std::make_shared<PeerAgentImpl>(std::move(options))) {
  impl_->start();
}

PeerAgent::~PeerAgent() { impl_->shutdown(); }

const std::string& PeerAgent::alias() const { return impl_->alias(); }
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

std::optional<PeerConnection> PeerAgent::connection(const std::string& peer_alias, const ConnectionFilter& on) const {
  auto c = impl_->select(peer_alias, on);
  if (!c) return std::nullopt;
  return PeerConnection(c);
}

std::vector<PeerConnection> PeerAgent::connections(const std::string& peer_alias) const {
  std::vector<PeerConnection> out;
  for (auto& c : impl_->connections_to(peer_alias)) out.emplace_back(std::move(c));
  return out;
}

std::vector<std::string> PeerAgent::peers() const { return impl_->peers(); }

std::vector<std::string> PeerConnection::sync_memory_regions() const {
  auto agent = state_->agent.lock();
  if (!agent) throw ConnectionError("sync_memory_regions(): the agent of this connection is gone", StatusCode::kNotConnected);
  return agent->sync_regions(state_);
}

std::vector<std::string> PeerAgent::list_agents() const {
  std::vector<std::string> out;
  for (const auto& a : impl_->ctrl.query()) {
    if (a.is_object() && a.contains("name") && a["name"].is_string()) out.push_back(a["name"].get<std::string>());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<nlohmann::json> PeerAgent::agent_record(const std::string& alias) const {
  return impl_->ctrl.get_peer_agent(alias);
}

std::optional<nlohmann::json> PeerAgent::get_mr_info(const std::string& peer, const std::string& name) const {
  return impl_->ctrl.get_mr_info(peer, name);
}

std::vector<std::string> PeerAgent::local_region_names() const { return impl_->local_region_names(); }

std::vector<std::string> PeerAgent::sync_memory_regions(const std::string& peer, const ConnectionFilter& on) {
  return impl_->sync_regions(impl_->connected(peer, on));
}

Future PeerAgent::send(const std::string& peer, const Chunk& chunk, const ConnectionFilter& on) {
  return impl_->endpoint_for_io(peer, on)->send(chunk);
}

Future PeerAgent::recv(const std::string& peer, const Chunk& chunk, const ConnectionFilter& on) {
  return impl_->endpoint_for_io(peer, on)->recv(chunk);
}

Future PeerAgent::read(const std::string& peer, std::vector<Assignment> assignments, const ConnectionFilter& on) {
  return impl_->endpoint_for_io(peer, on)->read(std::move(assignments));
}

Future PeerAgent::write(const std::string& peer, std::vector<Assignment> assignments, const ConnectionFilter& on) {
  return impl_->endpoint_for_io(peer, on)->write(std::move(assignments));
}

Future PeerAgent::read(const std::string& peer, const std::vector<NamedAssignment>& assignments,
                       const ConnectionFilter& on) {
  return impl_->named_op(peer, assignments, OpKind::kRead, on);
}

Future PeerAgent::write(const std::string& peer, const std::vector<NamedAssignment>& assignments,
                        const ConnectionFilter& on) {
  return impl_->named_op(peer, assignments, OpKind::kWrite, on);
}

Future PeerAgent::write_with_imm(const std::string& peer, std::vector<Assignment> assignments, uint32_t imm_data,
                                 const ConnectionFilter& on) {
  return impl_->endpoint_for_io(peer, on)->write_with_imm(std::move(assignments), imm_data);
}

Future PeerAgent::imm_recv(const std::string& peer, const ConnectionFilter& on) {
  return impl_->endpoint_for_io(peer, on)->imm_recv();
}

void PeerAgent::shutdown() { impl_->shutdown(); }

}  // namespace dlslime
