// Rendezvous: the handshake protocol two PeerAgents run over their NanoCtrl mailboxes
// (docs/peer-agent.md, "The handshake"). It owns the mailbox thread, and makes, matches,
// dials and confirms connections in the agent's ConnectionTable:
//   - "connect": a side's transport, the options its peer makes its endpoint with, and its
//     endpoint_info; each side dials the other's endpoint (the transports' connect() is
//     symmetric);
//   - "dialed": a side's connect() returned (or why it failed); a connection is up once
//     both directions are;
//   - "cleanup" (from NanoCtrl): the peer agent left.
// Messages that are lost or posted before the peer registered are posted again from the
// mailbox thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "agent/connection_table.h"
#include "agent/peer_connection_state.h"
#include "agent/task_threads.h"
#include "agent/transport_choice.h"
#include "dlslime/nanoctrl_client.h"

namespace dlslime {

class PeerAgentImpl;

class Rendezvous {
 public:
  using Connection = std::shared_ptr<PeerConnectionState>;
  // Makes an endpoint of `transport` with these factory options (the registry, and the
  // agent's wrap_endpoint).
  using EndpointMaker = std::function<std::shared_ptr<Endpoint>(const std::string&, const json&)>;

  Rendezvous(NanoCtrlClient& ctrl, ConnectionTable& table, const TransportChoice& transports, EndpointMaker make,
             std::shared_ptr<TaskThreads> tasks);
  ~Rendezvous() { join(); }

  // Random per PeerAgent object, in its NanoCtrl record and in every connect message: a
  // message that a previous agent under the same alias posted before it shut down can
  // still be in our mailbox, and must not replace (or answer) the current one's.
  const std::string& instance() const { return instance_; }

  // Starts the mailbox thread, for the agent registered as `alias`.
  void start(const std::string& alias, std::weak_ptr<PeerAgentImpl> agent);

  // connect_to()'s connection to `peer` on the link `options` asks for (checked by the
  // caller): a live one there already, or a new one whose handshake starts now if the
  // peer has registered (else once it does). `default_device`: the agent's device, for
  // a request that names no local device; at most `max_connecting` attempts at once.
  Connection connect(const std::string& peer, const ConnectOptions& options, const std::string& default_device,
                     size_t max_connecting);

  bool stopping() const { return stopping_.load(); }
  // Waits, at most `bound`, for dials in progress (their "dialed" still to post) and for
  // the connections whose peer is dialing this agent now (our side is up and its "dialed"
  // has not come), so that leaving does not fail the peer's wait().
  void wait_for_peer_dials(std::chrono::milliseconds bound);
  // Stops taking new work; false if it had already stopped.
  bool stop();
  // Joins the mailbox thread (after stop()).
  void join();

 private:
  void mailbox_loop();
  bool sleep_for(std::chrono::milliseconds d);
  void on_message(const json& envelope);
  void on_cleanup(const std::string& peer);
  void on_connect(const std::string& from, const json& msg);
  void on_dialed(const std::string& from, const json& msg);

  // The connection a peer's connect message that matched none makes here (passive), or
  // the one connect_to() made meanwhile; null when the message is refused (too many
  // passive handshakes) or the agent is shutting down. `made_here`: a new passive one.
  Connection make_passive(const std::string& from, const std::string& transport, const json& msg,
                          const std::string& wanted_nic, const std::string& sender_nic, const json& peer_options,
                          bool& made_here);
  // A connection to `peer` for `requested`. Its transport and endpoint are made at once,
  // except for transport "auto" without the peer's `record` (it has not registered yet):
  // decide() makes them once the record is known.
  Connection make_connection(const std::string& peer, const ConnectOptions& requested,
                             const std::optional<json>& record, bool passive, const json& passive_from = nullptr);
  // Chooses an undecided ("auto") connection's transport from the peer's NanoCtrl record and
  // makes its endpoint. False (and the connection failed) when that endpoint cannot be made
  // or the connection ended meanwhile; true once decided (now or before).
  // `peer_transport` (with the peer's `peer_options`): the peer's connect message arrived
  // first and names the transport; it is taken as is.
  bool decide(const Connection& c, const std::optional<json>& record, const std::string& peer_transport = "",
              const json& peer_options = nullptr);
  void post_info(const Connection& c);
  // Posts our info once, addressed to the peer agent whose NanoCtrl record is `record`;
  // fails the connection instead if that agent does not serve its transport, or if the
  // transport asked for by name cannot reach it.
  void claim_and_post(const Connection& c, const json& record);
  // Posts what waits on a peer (unregistered, or unanswered); whether some connection is
  // still handshaking.
  bool post_pending();
  // Tells the peer our connect() returned (error empty) or why it failed.
  void post_dialed(const Connection& c, const std::string& error);
  // Tells the sender of connect message `msg` that this side cannot take part (it could not
  // make its endpoint): a "dialed" with ok=false and no incarnation of ours.
  void post_refusal(const std::string& from, const json& msg, const std::string& error);
  // Runs the handshake's endpoint->connect() on a handshake thread.
  void start_dial(const Connection& c, const json& peer_info);
  void dial(const Connection& c, const json& peer_info);
  // The instance id NanoCtrl has registered under `peer` now ("" when it has none).
  std::string registered_instance(const std::string& peer);
  bool is_current_instance(const std::string& peer, const std::string& instance);

  NanoCtrlClient& ctrl_;
  ConnectionTable& table_;
  const TransportChoice& transports_;
  const EndpointMaker make_endpoint_;
  const std::shared_ptr<TaskThreads> tasks_;
  const std::string instance_ = random_id();
  std::string alias_;                     // set by start(), before the mailbox thread runs
  std::weak_ptr<PeerAgentImpl> agent_;    // likewise; each connection's handle keeps it
  // Passive handshakes dialling now (bounded by kMaxPassiveHandshakes).
  std::atomic<int> passive_dials_{0};
  std::chrono::steady_clock::time_point last_refusal_log_;  // mailbox thread only
  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  std::thread mailbox_thread_;
  std::atomic<std::thread::id> mailbox_id_{};  // for shutdown() from any thread, even while another joins it
};

}  // namespace dlslime
