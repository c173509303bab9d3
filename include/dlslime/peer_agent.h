#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dlslime/endpoint.h"
#include "dlslime/export.h"
#include "dlslime/future.h"

namespace dlslime {

struct DLSLIME_API PeerAgentOptions {
  std::string ctrl_url = "http://127.0.0.1:4479";
  // Empty: NanoCtrl picks one ("agent-<n>").
  std::string alias;
  // Agents see only agents of the same scope.
  std::string scope;
  // The device (NIC) this agent's connections use where connect_to (or a peer's handshake)
  // names none (upstream DLSlime's `device`); empty: each transport's first usable one. Must
  // be a device available_transports() lists for a transport the agent serves
  // (InvalidArgumentError otherwise).
  std::string device;
  // How often the agent heartbeats; 0 = what NanoCtrl suggests at registration (ttl / 4).
  std::chrono::milliseconds heartbeat_interval{0};
  // Deadline of each control-plane request.
  std::chrono::milliseconds ctrl_timeout{10000};
  // At most this many connect_to() attempts in progress at once: connections still
  // "connecting", each holding an endpoint (sockets, and for TCP an I/O thread) while its
  // peer has not registered or answered. One more fails at once with ConnectionError
  // (Python: ConnectionError) instead of growing without bound; an attempt that ends (connected,
  // failed, replaced, or the agent shut down) frees its place. Must be >= 1.
  size_t max_connecting = 64;
  // NanoCtrl's bearer token. Empty: DLSLIME_NANOCTRL_TOKEN (none when that is unset too).
  std::string ctrl_token;
  // Each transport's agent-wide options, keyed by its name; each transport checks its own
  // (InvalidArgumentError for an unknown key or a bad value), and a name that is no
  // transport is refused too. What the built-in ones take (docs/peer-agent.md):
  //   "tcp":    TcpEndpoint's option keys over DLSLIME_TCP_* (TcpOptions::from_json), with
  //             "token", the shared secret every TCP connection authenticates with (it never
  //             leaves this process); the bind address comes per connection (ConnectOptions).
  //   "rdma":   {"device"}: overrides `device` above for RDMA.
  //   "nvlink": {"device": GPU ordinal of this process's runtime, 0 by default}: the GPU its
  //             endpoints copy with; published for transport="auto".
  nlohmann::json transport_options = nlohmann::json::object();
  // For fault-injection tests: called with every endpoint the agent makes (connect_to's and
  // the ones made for a peer's connect message), and the agent uses the endpoint it returns
  // instead (a decorator that delays, drops or fails ops). Empty: endpoints are used as made.
  std::function<std::shared_ptr<Endpoint>(std::shared_ptr<Endpoint>)> wrap_endpoint;
};

// connect_to()'s options: DLSlime's connect_to keywords. Each transport reads the ones it
// knows and ignores the rest (docs/peer-agent.md, "Transport options").
struct DLSLIME_API ConnectOptions {
  // A name from available_transports(), or "auto": the highest-ranked transport both agents
  // serve that reaches the peer (NVLink on one host and GPU runtime; RDMA with a common link
  // layer; TCP anywhere). PeerConnection::selection_reason() says which, and why each one
  // ranked above it was passed over. "rdma" is DLSlime's default; "tcp" works on every
  // host. NVLink moves GPU memory only (docs/peer-agent.md).
  std::string transport = "rdma";
  // The NIC pair (RDMA's devices here and on the peer); empty: any.
  std::string local_device;
  std::string peer_device;
  // TCP's bind address for this connection's endpoint (port 0: the OS picks one).
  std::string local_host = "0.0.0.0";
  uint16_t local_port = 0;
  // RDMA's port and queue pairs per connection.
  int ib_port = 1;
  int qp_num = 1;
  // More keys for a transport that takes others (a plug-in's own); they override the above.
  nlohmann::json extra = nlohmann::json::object();

  // {"local_host", "local_port", "ib_port", "qp_num", "local_device", "peer_device"} and
  // `extra`: what the transports' hooks read.
  nlohmann::json to_json() const;
};

// One item of a named batch: regions by name instead of handle. Offsets are in PeerAgent
// order (LOCAL first), unlike Assignment.
struct DLSLIME_API NamedAssignment {
  std::string local_name;
  std::string remote_name;
  uint64_t local_offset = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

// Selects one of several connections to a peer by the NIC pair it is on (upstream DLSlime's
// local_nic/remote_nic): the RDMA device on this side and on the peer's. Empty: any.
struct DLSLIME_API ConnectionFilter {
  std::string local_nic;
  std::string remote_nic;
};

class PeerConnectionState;

// A handle to this agent's connection to one peer.
class DLSLIME_API PeerConnection {
 public:
  explicit PeerConnection(std::shared_ptr<PeerConnectionState> state) : state_(std::move(state)) {}

  // Waits until the handshake completed: both directions are up (each side's connect()
  // returned; an agent that writes and leaves at once cannot fail its peer's dial). A
  // handshake that completed returns, even if the peer has left since (state() says
  // "closed"). Throws TimeoutError after `timeout`, and ConnectionError if the handshake
  // failed.
  void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(60000)) const;
  bool is_connected() const;
  // "connecting", "connected", "failed" or "closed".
  std::string state() const;
  // Why the connection failed or closed; empty otherwise.
  std::string error() const;
  std::string conn_id() const;
  std::string peer_alias() const;
  // The transport in use ("auto" while connect_to(transport="auto") waits for the peer to
  // register, which it needs to choose).
  std::string transport() const;
  // What was chosen and why, e.g. "nvlink: both agents on host h, GPU 0 -> GPU 1 via CUDA IPC",
  // "rdma: both agents serve RoCE (sim_rdma0 here, sim_rdma0 on 'b')" or "tcp: the peer agent
  // 'b' publishes no RDMA device"; empty while undecided.
  std::string selection_reason() const;
  // The RDMA devices of this side and of the peer ("" for TCP and NVLink). Before the handshake the
  // peer's is the requested peer_device ("" when none was asked for).
  std::string local_nic() const;
  std::string remote_nic() const;
  // The underlying endpoint (a TcpEndpoint for transport "tcp", an RDMAEndpoint for "rdma", an
  // NVLinkEndpoint for "nvlink";
  // what wrap_endpoint returned, when set). Null while the transport is undecided.
  std::shared_ptr<Endpoint> endpoint() const;
  // The peer's endpoint_info() (with its mr_info) once the handshake completed; null before.
  nlohmann::json peer_endpoint_info() const;
  // PeerAgent::sync_memory_regions for this connection.
  std::vector<std::string> sync_memory_regions() const;

 private:
  std::shared_ptr<PeerConnectionState> state_;
};

class PeerAgentImpl;

// Finds peers and connects them through NanoCtrl. The agent registers with NanoCtrl,
// heartbeats (and registers again if NanoCtrl forgot it), and exchanges each side's
// endpoint_info through NanoCtrl's mailbox when connect_to() is called on either side.
// Thread-safe.
class DLSLIME_API PeerAgent {
 public:
  // Throws ConnectionError if NanoCtrl is unreachable, Error (409) if the alias is taken.
  explicit PeerAgent(PeerAgentOptions options = {});
  ~PeerAgent();
  PeerAgent(const PeerAgent&) = delete;
  PeerAgent& operator=(const PeerAgent&) = delete;

  const std::string& alias() const;
  const std::string& scope() const;
  const std::string& ctrl_url() const;

  // The bytes [addr+offset, addr+offset+length), shared by every connection of the agent
  // and published to NanoCtrl so peers can resolve the name.
  int32_t register_memory_region(const std::string& name, uintptr_t addr, uint64_t offset, uint64_t length);
  void unregister_memory_region(const std::string& name);

  // Starts connecting to `peer_alias` and returns at once; wait on the connection. A peer
  // that has not registered yet is connected as soon as it does (agents of one job start
  // concurrently); wait() says so if it never does. Calling it again returns the existing
  // connection on the same NIC pair (and transport) while it is alive; another NIC pair
  // (local_device/peer_device) makes another connection to the same peer. Throws InvalidArgumentError for a bad alias or an unknown
  // transport (naming the known ones), NotImplementedError for a transport that is not
  // available here (saying why). A peer that does not serve the transport fails the
  // connection (wait() raises ConnectionError naming the ones it serves).
  PeerConnection connect_to(const std::string& peer_alias, const ConnectOptions& options = {});
  // The connection to `peer_alias` on the NICs `on` selects; nullopt if none. Several
  // matching (connections on different NIC pairs, and no filter to tell them apart) throw
  // InvalidArgumentError naming each one's NICs: the caller says which.
  std::optional<PeerConnection> connection(const std::string& peer_alias, const ConnectionFilter& on = {}) const;
  // Every connection to `peer_alias`, in the order they were made.
  std::vector<PeerConnection> connections(const std::string& peer_alias) const;
  std::vector<std::string> peers() const;
  // The aliases of the agents registered with NanoCtrl in this scope (this one too), sorted.
  std::vector<std::string> list_agents() const;
  // A peer's NanoCtrl record ({"name", "address", "metadata": {"transports", ...}, ...}),
  // this agent's own for its own alias; nullopt for an agent that is not registered.
  std::optional<nlohmann::json> agent_record(const std::string& alias) const;
  // The published record of region `name` of agent `peer` (NanoCtrl's copy); nullopt if none.
  std::optional<nlohmann::json> get_mr_info(const std::string& peer, const std::string& name) const;
  // The names of this agent's regions.
  std::vector<std::string> local_region_names() const;
  // Resolves every region the peer has published for this connection again (NanoCtrl's
  // records), replacing the cached handles; returns their names. Throws like I/O does when
  // there is no connection.
  std::vector<std::string> sync_memory_regions(const std::string& peer, const ConnectionFilter& on = {});

  // I/O on the connection to `peer` that `on` selects, as connection() does: none throws
  // ConnectionError, several InvalidArgumentError naming their NICs. `timeout` and
  // `exact_size` are the endpoint ops' (Endpoint::send/recv/read/..., OpRequest): zero is
  // the endpoint's op_timeout, for recv and imm_recv its recv_timeout; a recv that times
  // out consumes nothing. A named op that is resolved again after UNKNOWN_HANDLE gives the
  // second attempt the same timeout.
  Future send(const std::string& peer, const Chunk& chunk, const ConnectionFilter& on = {},
              std::chrono::milliseconds timeout = {});
  Future recv(const std::string& peer, const Chunk& chunk, const ConnectionFilter& on = {}, bool exact_size = false,
              std::chrono::milliseconds timeout = {});
  Future read(const std::string& peer, std::vector<Assignment> assignments, const ConnectionFilter& on = {},
              std::chrono::milliseconds timeout = {});
  // write: `notification` as Endpoint::write's (the peer's recv_notify gets it once the
  // bytes are in place); a named write resolved again sends it with the attempt that works.
  Future write(const std::string& peer, std::vector<Assignment> assignments, const ConnectionFilter& on = {},
               std::chrono::milliseconds timeout = {}, std::optional<std::string> notification = std::nullopt);
  Future read(const std::string& peer, const std::vector<NamedAssignment>& assignments,
              const ConnectionFilter& on = {}, std::chrono::milliseconds timeout = {});
  Future write(const std::string& peer, const std::vector<NamedAssignment>& assignments,
               const ConnectionFilter& on = {}, std::chrono::milliseconds timeout = {},
               std::optional<std::string> notification = std::nullopt);
  Future write_with_imm(const std::string& peer, std::vector<Assignment> assignments, uint32_t imm_data = 0,
                        const ConnectionFilter& on = {}, std::chrono::milliseconds timeout = {});
  Future imm_recv(const std::string& peer, const ConnectionFilter& on = {}, std::chrono::milliseconds timeout = {});
  // Notifications (Endpoint::send_notify/recv_notify) on the connection `on` selects.
  Future send_notify(const std::string& peer, std::string notification, const ConnectionFilter& on = {},
                     std::chrono::milliseconds timeout = {});
  Future recv_notify(const std::string& peer, const ConnectionFilter& on = {}, std::chrono::milliseconds timeout = {});

  // Removes the agent's records from NanoCtrl (its peers are notified) and shuts down every
  // connection; peers' pending futures on them fail promptly. Idempotent.
  void shutdown();

 private:
  std::shared_ptr<PeerAgentImpl> impl_;
};

}  // namespace dlslime
