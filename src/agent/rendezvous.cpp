// Rendezvous: the handshake two PeerAgents run over their NanoCtrl mailboxes.
#include "agent/rendezvous.h"

#include <fmt/format.h>

#include "core/log.h"
#include "core/record_fields.h"
#include "dlslime/errors.h"

namespace dlslime {

namespace {

constexpr auto kMailboxWait = std::chrono::milliseconds(500);
// How often connections to peers that have not registered yet look for them.
constexpr auto kPeerPoll = std::chrono::milliseconds(50);
// How long the endpoint of a connection whose peer cleaned up may stay up waiting for its
// transport to see the loss (a goodbye or EOF normally arrives before the cleanup does).
constexpr auto kPeerGoneGrace = std::chrono::milliseconds(2000);
// A handshake message not answered within this long is posted again.
constexpr auto kRepost = std::chrono::milliseconds(1000);
// Handshakes a peer's connect message (not our connect_to) may have dialling at once. The
// mailbox is unauthenticated without a NanoCtrl token: anyone can post connect messages
// under any alias, each pointing at an address of their choice. Past the bound such a
// message is dropped; a real peer posts again every kRepost while unanswered.
constexpr int kMaxPassiveHandshakes = 8;

}  // namespace

Rendezvous::Rendezvous(NanoCtrlClient& ctrl, ConnectionTable& table, const TransportChoice& transports,
                       EndpointMaker make, std::shared_ptr<TaskThreads> tasks)
    : ctrl_(ctrl), table_(table), transports_(transports), make_endpoint_(std::move(make)), tasks_(std::move(tasks)) {}

void Rendezvous::start(const std::string& alias, std::weak_ptr<PeerAgentImpl> agent) {
  alias_ = alias;
  agent_ = std::move(agent);
  mailbox_thread_ = std::thread([this] {
    mailbox_id_ = std::this_thread::get_id();
    mailbox_loop();
  });
}

bool Rendezvous::stop() {
  if (stopping_.exchange(true)) return false;
  {
    std::lock_guard lock(stop_mu_);  // a waiter between its check and its wait sees the flag
  }
  stop_cv_.notify_all();
  return true;
}

void Rendezvous::join() {
  if (!mailbox_thread_.joinable()) return;
  if (std::this_thread::get_id() == mailbox_thread_.get_id()) {
    mailbox_thread_.detach();  // the agent ended from its own mailbox thread
  } else {
    mailbox_thread_.join();
  }
}

bool Rendezvous::sleep_for(std::chrono::milliseconds d) {
  std::unique_lock lock(stop_mu_);
  return !stop_cv_.wait_for(lock, d, [&] { return stopping_.load(); });
}

void Rendezvous::mailbox_loop() {
  // Connections waiting for their peer to register, or endpoints for their transport to see a
  // loss: look again every kPeerPoll instead of kMailboxWait.
  bool poll_soon = false;
  while (!stopping_) {
    std::vector<json> messages;
    try {
      messages = ctrl_.recv(alias_, poll_soon ? kPeerPoll : kMailboxWait, 32);
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
    if (table_.shut_down_departed_endpoints(false)) poll_soon = true;
  }
}

void Rendezvous::on_message(const json& envelope) {
  const json& msg = envelope.at("message");
  const std::string type = msg.at("type").get<std::string>();
  if (type == "cleanup") {
    on_cleanup(msg.at("peer").get<std::string>());
  } else if (type == "dialed") {
    on_dialed(envelope.at("from").get<std::string>(), msg);
  } else if (type == "connect") {
    on_connect(envelope.at("from").get<std::string>(), msg);
  } else if (type != "connect_peer") {  // connect_peer: desired-topology intent; connect_to drives connections
    DLSLIME_DEBUG("PeerAgent '{}': ignoring mailbox message of type '{}'", alias_, type);
  }
}

void Rendezvous::on_cleanup(const std::string& peer) {
  table_.forget_departed(peer);  // an earlier departure
  const auto conns = table_.to(peer);
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
    table_.depart(c, "the peer agent '" + peer + "' shut down", kPeerGoneGrace);
  }
}

namespace {

// How a peer's connect message from its endpoint `peer_incarnation` relates to the
// connection it matched.
enum class Fit {
  kSame,      // this connection's handshake (the first message, or one while it runs)
  kRepeat,    // a repeat of a handshake that already finished here
  kReplaced,  // the peer reconnected (a new endpoint), or this one is dead: replace it
};

Fit fit_of(const PeerConnectionState& found, const std::string& peer_incarnation) {
  std::lock_guard lock(found.mu);
  const bool same_endpoint = found.peer_incarnation == peer_incarnation;
  const bool new_incarnation = !found.peer_incarnation.empty() && !same_endpoint;
  const bool dead = found.state == "failed" || found.state == "closed" ||
                    (found.state == "connected" && !(found.endpoint && found.endpoint->is_connected()));
  // A repeat from the endpoint a finished handshake was with (it crossed our answer in the
  // mailbox) is not a reconnect, even when that handshake failed (e.g. the tokens differ):
  // replacing would retry it forever and lose the reason.
  if (new_incarnation || (dead && !same_endpoint)) return Fit::kReplaced;
  // The peer may still lack our info (our post was lost): it is answered once more.
  if (same_endpoint && found.state != "connecting") return Fit::kRepeat;
  return Fit::kSame;
}

}  // namespace

Rendezvous::Connection Rendezvous::make_passive(const std::string& from, const std::string& transport,
                                                const json& msg, const std::string& wanted_nic,
                                                const std::string& sender_nic, const json& peer_options,
                                                bool& made_here) {
  // The peer connects first: make the mirror connection with default options, unless the
  // passive handshakes are all taken (see kMaxPassiveHandshakes). Nothing is made for a
  // dropped message; the peer's repost gets in once a handshake ends.
  if (passive_dials_.load() >= kMaxPassiveHandshakes) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_refusal_log_ > std::chrono::seconds(1)) {
      last_refusal_log_ = now;
      DLSLIME_WARN("PeerAgent '{}': {} handshakes that peers started are in progress; dropping the connect "
                   "message from '{}' (it is posted again if the peer is real)",
                   alias_, kMaxPassiveHandshakes, from);
    }
    return nullptr;
  }
  ConnectOptions requested;
  requested.transport = transport;
  Connection made;
  try {
    made = make_connection(from, requested, std::nullopt, /*passive=*/true, peer_options);
  } catch (const std::exception& e) {
    // E.g. no free port in this agent's port_range. Without an answer the peer would wait
    // for a handshake that never comes, and time out without the reason.
    const std::string why = fmt::format("this agent cannot make a {} endpoint: {}", transport, e.what());
    DLSLIME_WARN("PeerAgent '{}': refusing the connection '{}' asked for: {}", alias_, from, why);
    post_refusal(from, msg, why);
    return nullptr;
  }
  // connect_to() may have made this connection meanwhile: use that one.
  auto c = table_.match_or_add(from, transport, msg, wanted_nic, sender_nic, made);
  made_here = c == made;
  if (!made_here) made->shutdown_endpoint();
  return c;
}

void Rendezvous::on_connect(const std::string& from, const json& msg) {
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
  if (!transports_.serves(transport)) {
    DLSLIME_WARN("PeerAgent '{}': '{}' asked for transport \"{}\", which this agent does not serve (it serves: {})",
                 alias_, from, transport, transports_.names());
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
  Connection c, stale;
  bool made_here = false;  // a passive connection made for this message
  bool send_info = false;
  bool duplicate = false;
  const bool peer_has_ours = msg.value("have_peer_info", false);
  // The NIC pair the message is for: the sender's device, and the one it asks us to use
  // (RDMA's peer_device; "" when it leaves that to us).
  const std::string sender_nic = device_of(info);
  const std::string wanted_nic =
      peer_options.contains("device") && peer_options["device"].is_string() ? peer_options["device"].get<std::string>() : "";
  if (auto found = table_.match(from, transport, msg, wanted_nic, sender_nic)) {
    switch (fit_of(*found, peer_incarnation)) {
      case Fit::kReplaced:
        stale = found;
        table_.erase(stale);
        break;
      case Fit::kRepeat:
        c = found;
        duplicate = true;
        break;
      case Fit::kSame:
        c = found;
        break;
    }
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
  if (stale) stale->close("replaced: the peer agent reconnected");
  if (!c) {
    c = make_passive(from, transport, msg, wanted_nic, sender_nic, peer_options, made_here);
    if (!c) return;  // refused, or shutting down
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
      if (made_here) table_.drop(c, std::string("answering the peer failed: ") + e.what());
      throw;
    }
  }
  if (confirm_again) post_dialed(c, "");
  if (dial_now) start_dial(c, info);
}


void Rendezvous::post_refusal(const std::string& from, const json& msg, const std::string& error) {
  const json out = {{"type", "dialed"},
                    {"incarnation", ""},
                    {"instance", instance_},
                    {"ok", false},
                    {"error", error},
                    {"to_incarnation", msg.value("incarnation", "")},
                    {"to_instance", msg.value("instance", "")}};
  try {
    ctrl_.post(from, out, alias_);
  } catch (const std::exception& e) {
    // The peer re-posts its connect message while it waits, and is refused again then.
    DLSLIME_DEBUG("PeerAgent '{}': telling '{}' that its connection is refused failed: {}", alias_, from, e.what());
  }
}

void Rendezvous::post_dialed(const Connection& c, const std::string& error) {
  json msg = {{"type", "dialed"}, {"incarnation", c->incarnation}, {"instance", instance_}, {"ok", error.empty()}};
  {
    std::lock_guard lock(c->mu);
    msg["to_incarnation"] = c->peer_incarnation;
    msg["to_instance"] = c->peer_instance;
  }
  if (!error.empty()) msg["error"] = error;
  try {
    ctrl_.post(c->peer_alias, msg, alias_);
  } catch (const std::exception& e) {
    // The peer re-posts its connect message while it waits, and gets "dialed" again then.
    DLSLIME_DEBUG("PeerAgent '{}': telling '{}' that {} failed: {}", alias_, c->peer_alias,
                  error.empty() ? "our dial is up" : "our dial failed", e.what());
  }
}

void Rendezvous::on_dialed(const std::string& from, const json& msg) {
  const std::string ours = text_field(msg, "to_incarnation");
  const std::string theirs = text_field(msg, "incarnation");
  const bool ok = !msg.contains("ok") || !msg["ok"].is_boolean() || msg["ok"].get<bool>();
  for (const auto& c : table_.to(from)) {
    bool up = false;
    {
      std::lock_guard lock(c->mu);
      // Only the peer endpoint this connection shook hands with can confirm it; a refusal
      // (post_refusal) comes before the peer has one, and names our incarnation only.
      const bool refusal = !ok && theirs.empty() && c->peer_incarnation.empty();
      if (c->incarnation != ours || (!refusal && (c->peer_incarnation.empty() || c->peer_incarnation != theirs))) {
        continue;
      }
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
        table_.drop(c, why);
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


std::string Rendezvous::registered_instance(const std::string& peer) {
  return instance_of(ctrl_.get_peer_agent(peer));
}

bool Rendezvous::is_current_instance(const std::string& peer, const std::string& instance) {
  if (instance.empty()) return true;  // a peer that does not say (another implementation)
  // Asked every time, not cached: the answer changes when the alias is taken over, and a
  // stale message can arrive after that. Connect messages are few (handshakes only).
  return registered_instance(peer) == instance;
}


Rendezvous::Connection Rendezvous::make_connection(const std::string& peer,
                                                                     const ConnectOptions& requested,
                                                                     const std::optional<json>& record, bool passive,
                                                                     const json& passive_from) {
  auto c = std::make_shared<PeerConnectionState>(peer, table_.next_id(alias_, peer), requested, passive);
  c->agent = agent_;
  if (requested.transport == "auto") {
    if (record) decide(c, record);  // a failure fails the connection: wait() says why
    return c;
  }
  const std::string& t = requested.transport;
  const json endpoint_options = passive ? transports_.passive_options(t, passive_from) : transports_.own_options(t, c->request);
  auto ep = make_endpoint_(t, endpoint_options);
  const std::string nic = device_of(ep->endpoint_info());
  std::lock_guard lock(c->mu);
  c->transport = t;
  c->selection_reason = passive ? fmt::format("{}: the peer agent '{}' connected over it", t, peer)
                                : fmt::format("{}: requested", t);
  c->peer_options = transports_.options_for_peer(t, c->request);
  c->endpoint = std::move(ep);
  c->local_nic = nic;
  // A transport whose endpoints name a device: the peer's is the one asked for until the
  // peer's endpoint_info says.
  if (!passive && !nic.empty()) c->remote_nic = requested.peer_device;
  return c;
}

bool Rendezvous::decide(const Connection& c, const std::optional<json>& record,
                           const std::string& peer_transport, const json& peer_options) {
  if (c->ep()) return true;
  Choice choice;
  if (peer_transport.empty()) {
    choice = TransportChoice::choose(transports_.consider(record.value_or(json()), c->peer_alias, c->request), c->peer_alias);
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
    ep = make_endpoint_(choice.transport, peer_transport.empty() ? transports_.own_options(choice.transport, choice.request)
                                                                : transports_.passive_options(choice.transport, peer_options));
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
      c->peer_options = transports_.options_for_peer(choice.transport, choice.request);
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

void Rendezvous::post_info(const Connection& c) {
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
  ctrl_.post(c->peer_alias, msg, alias_);
}

void Rendezvous::start_dial(const Connection& c, const json& peer_info) {
  // Off the mailbox thread: connect() can wait out the connect timeout (an address that
  // accepts and never answers), and handshakes and cleanups behind it must not wait.
  if (c->passive) passive_dials_.fetch_add(1);
  if (!tasks_->spawn([this, c, peer_info] { dial(c, peer_info); })) {
    if (c->passive) passive_dials_.fetch_sub(1);
    c->close("this agent shut down");
  }
}

void Rendezvous::dial(const Connection& c, const json& peer_info) {
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
      table_.drop(c, e.what());
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


Rendezvous::Connection Rendezvous::connect(const std::string& peer, const ConnectOptions& o,
                                           const std::string& default_device, size_t max_connecting) {
  // The NIC pair asked for ("" = any): a live connection on it (and of this transport) is
  // returned; another pair makes another connection to the same peer.
  const std::string want_local = o.local_device.empty() ? default_device : o.local_device;
  const std::string& want_remote = o.peer_device;
  auto same_link = [&](const Connection& c) {
    const std::string t = c->transport_name();
    const bool transport_ok = o.transport == "auto" || t == "auto" || t == o.transport;
    // A connection whose transport names no devices (TCP) matches any: one per peer.
    return transport_ok && c->could_be_on(want_local, want_remote);
  };
  ConnectionTable::Lookup found = table_.lookup(peer, same_link);
  if (found.existing) return found.existing;
  for (const auto& c : found.stale) c->close("replaced by a new connect_to()");
  // Each attempt holds an endpoint until its peer answers, which a peer that registered and
  // never runs never does (hostile review N10): the attempts are bounded.
  if (found.connecting >= max_connecting) {
    throw ConnectionError(fmt::format("PeerAgent '{}' has {} connect_to() attempts in progress, the most it allows "
                                      "(max_connecting): wait for some to connect or fail, or raise the bound",
                                      alias_, found.connecting),
                          StatusCode::kFailed);
  }
  // The peer's record, if it has registered: "auto" chooses from it. Agents of one job start
  // concurrently: a peer that has not registered yet gets our endpoint_info as soon as it
  // does (post_pending, from the mailbox thread), and "auto" chooses then.
  const std::optional<json> record = ctrl_.get_peer_agent(peer);
  if (found.departed) {
    // The agent it was with is gone and none has registered under its alias since.
    if (!record) return found.departed;
    table_.forget_departed(peer);
  }
  auto made = make_connection(peer, o, record, /*passive=*/false);
  // The peer's handshake may have made the connection meanwhile: use that one.
  auto c = table_.live_or_add(peer, same_link, made);
  if (c != made) {
    made->shutdown_endpoint();
    return c;
  }
  try {
    if (record) claim_and_post(c, *record);
  } catch (...) {
    table_.erase(c);
    c->shutdown_endpoint();
    throw;
  }
  return c;
}

void Rendezvous::claim_and_post(const Connection& c, const json& record) {
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
    for (const Considered& k : transports_.consider(record, c->peer_alias, c->request)) {
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

bool Rendezvous::post_pending() {
  // Two kinds of connections wait on the peer: those whose peer has not registered yet,
  // and those whose info was posted but never answered (the message can be lost, e.g. a
  // registration that clears a stale mailbox right after we posted): post again.
  const auto now = std::chrono::steady_clock::now();
  std::vector<Connection> unregistered, unanswered;
  for (const auto& c : table_.all()) {
    std::lock_guard lock(c->mu);
    if (c->state != "connecting") continue;
    if (!c->info_sent) {
      unregistered.push_back(c);
    } else if ((c->peer_info.is_null() || (c->dialed && c->peer_confirms && !c->peer_dialed)) &&
               now - c->last_post > kRepost) {
      // No answer, or no "dialed" yet: our connect message again makes the peer repeat it.
      unanswered.push_back(c);
    }
  }
  for (const auto& c : unregistered) {
    try {
      if (auto record = ctrl_.get_peer_agent(c->peer_alias)) claim_and_post(c, *record);
    } catch (const std::exception& e) {
      DLSLIME_DEBUG("PeerAgent '{}': waiting for '{}' to register: {}", alias_, c->peer_alias, e.what());
    }
  }
  for (const auto& c : unanswered) {
    try {
      // Address the current agent under that alias: the one we wrote to may have been
      // replaced, and its successor ignores messages meant for it.
      if (auto record = ctrl_.get_peer_agent(c->peer_alias)) {
        std::lock_guard lock(c->mu);
        if (c->peer_info.is_null()) c->peer_instance = instance_of(record);
      }
      post_info(c);
    } catch (const std::exception& e) {
      DLSLIME_DEBUG("PeerAgent '{}': re-posting to '{}' failed: {}", alias_, c->peer_alias, e.what());
    }
  }
  return table_.any_connecting();
}


void Rendezvous::wait_for_peer_dials(std::chrono::milliseconds bound) {
  // The mailbox thread delivers "dialed": it cannot wait for itself.
  if (std::this_thread::get_id() == mailbox_id_.load()) return;
  const auto deadline = std::chrono::steady_clock::now() + bound;
  for (const auto& c : table_.all()) {
    std::unique_lock lock(c->mu);
    // A dial in progress has yet to post its "dialed" (before our cleanup does), and a
    // peer we await is dialing us.
    c->cv.wait_until(lock, deadline, [&] {
      return !c->dialing && (c->state != "connecting" || !c->dialed || !c->peer_confirms || c->peer_dialed);
    });
  }
}


}  // namespace dlslime
