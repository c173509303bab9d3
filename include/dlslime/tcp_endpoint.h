#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "dlslime/endpoint.h"
#include "dlslime/export.h"

namespace dlslime {

// TcpEndpoint options, parsed once at construction. Defaults are documented in docs/tcp.md;
// from_env() applies the DLSLIME_TCP_* variables on top of them.
struct DLSLIME_API TcpOptions {
  // What endpoint_info()["host"] says when bound to a wildcard address (docs/deploy.md):
  // advertise_host, else advertise_interface's IPv4 address, else the address of the
  // interface holding the default route, else of the first non-loopback interface that is
  // up, else 127.0.0.1 (with a warning). Set one of the two, not both; from_env() reads
  // DLSLIME_TCP_ADVERTISE_HOST and DLSLIME_TCP_ADVERTISE_INTERFACE.
  std::string advertise_host;
  std::string advertise_interface;
  // With port 0, listen on a free port of this range ("20000-20100", or one port) instead
  // of one the OS chooses, so a firewall can be opened for it; an explicit port must lie
  // in it. Empty: any port. from_env(): DLSLIME_TCP_PORT_RANGE.
  std::string port_range;
  // Connections ("lanes") this side dials to the peer; batches and large items are striped
  // over them. Two-sided messages always use lane 0, so they stay in order.
  uint32_t lanes = 2;
  // Items larger than this are split into chunks of at most this size (striping unit).
  uint64_t chunk_size = 1 << 20;
  // Deadline for connect() (dial + handshake, all lanes).
  std::chrono::milliseconds connect_timeout{10000};
  // Deadline of read, write and send ops, counted from submission. 0 = none.
  std::chrono::milliseconds op_timeout{30000};
  // Deadline of recv ops, counted from posting. 0 (default) = none: a recv waits for its
  // message, but still fails promptly when the peer is lost.
  std::chrono::milliseconds recv_timeout{0};
  // SO_SNDBUF / SO_RCVBUF in bytes; 0 keeps the OS default (and its autotuning).
  int sndbuf = 0;
  int rcvbuf = 0;
  // TCP keepalive: a silent peer is declared dead after idle + interval*count seconds.
  int keepalive_idle_s = 5;
  int keepalive_interval_s = 1;
  int keepalive_count = 5;
  // Most ops in flight per endpoint and most items per batch; beyond: status 400.
  uint32_t max_inflight_ops = 65536;
  uint32_t max_batch_items = 1 << 20;
  // Bytes of messages that arrived before a matching recv was posted and are held in
  // memory; past it the connection stops reading until a recv is posted.
  uint64_t unexpected_buffer_bytes = 16 << 20;
  // GPU memory crosses TCP through pinned staging buffers (docs/tcp.md "GPU memory"): at
  // most this many per direction per endpoint, each at most chunk_size bytes.
  uint32_t gpu_staging_chunks = 4;
  // Shared secret. When set, every connection is authenticated in the handshake by HMAC-
  // SHA256 challenge and response (the token never crosses the wire), and only a peer with
  // the same token can connect, read or write. Both sides must agree: set or not set.
  // At least kMinTokenSize bytes. from_env() fills it from DLSLIME_TCP_TOKEN. It
  // authenticates; it does not encrypt (docs/reliability.md).
  std::string token;
  static constexpr size_t kMinTokenSize = 16;
  // The same-host path (docs/tcp.md "Same-host path"): when the peer is a process on this
  // host that passes a cross-memory-attach probe, it copies our writes out of our memory
  // itself (process_vm_readv) and the TCP connection only carries their requests and
  // acknowledgements. Either side turning it off keeps the writes on TCP.
  // from_env(): DLSLIME_TCP_SAME_HOST=0 turns it off.
  bool same_host = true;

  static TcpOptions from_env();
  // `base` with the keys of `options` applied: the keys of to_json() (`authenticated`
  // excepted) and `token`. Throws InvalidArgumentError for an unknown key, a value of the
  // wrong type or out of range (validate()).
  static TcpOptions from_json(const nlohmann::json& options, TcpOptions base = from_env());
  // Throws InvalidArgumentError naming the bad option.
  void validate() const;
  nlohmann::json to_json() const;
};

class TcpEndpointImpl;
class MemoryRegistry;
struct TcpTransport;

// Peer-to-peer transport over TCP (asio). See docs/tcp.md for the wire protocol.
class DLSLIME_API TcpEndpoint final : public Endpoint {
 public:
  // Binds and listens at once; port 0 lets the OS choose. Throws ConnectionError if the
  // address cannot be bound, InvalidArgumentError for bad options.
  explicit TcpEndpoint(const std::string& ip = "0.0.0.0", uint16_t port = 0,
                       TcpOptions options = TcpOptions::from_env());
  ~TcpEndpoint() override;

  nlohmann::json endpoint_info() const override;
  void connect(const nlohmann::json& peer_info) override;
  bool is_connected() const override;

  int32_t register_memory_region(const std::string& name, uintptr_t addr, uint64_t offset,
                                 uint64_t length) override;
  int32_t register_remote_memory_region(const std::string& name, const nlohmann::json& mr_info_entry) override;
  void unregister_memory_region(const std::string& name) override;
  void unregister_memory_region(int32_t handle) override;
  nlohmann::json mr_info() const override;
  nlohmann::json mr_info_of(const std::string& name) const override;

  Capabilities capabilities() const override;
  void shutdown() override;

  std::string host() const;
  uint16_t port() const;
  // The listener's counters since construction, for operators watching for floods and
  // hostile dialers: accepted, accept_failures (each followed by a back-off; EMFILE and the
  // like), handshakes_completed, handshakes_refused (bad hello, token or target),
  // handshakes_timed_out (not done within connect_timeout), handshakes_evicted (dropped for
  // a newer connection past the pending limit). A JSON object of unsigned integers.
  nlohmann::json listener_stats() const;
  const TcpOptions& options() const;
  // Which path this endpoint's writes take to the connected peer, and why:
  // {"path": "cma" | "tcp", "reason": text} (docs/tcp.md "Same-host path").
  nlohmann::json same_host() const;

 protected:
  Future do_submit(OpRequest request) override;

 private:
  friend struct TcpTransport;
  // Endpoints made by the transport registry for one PeerAgent share the agent's memory
  // registry, so a region handle means the same region on every connection of the agent.
  TcpEndpoint(const std::string& ip, uint16_t port, TcpOptions options, std::shared_ptr<MemoryRegistry> regions);

  std::shared_ptr<TcpEndpointImpl> impl_;
};

}  // namespace dlslime
