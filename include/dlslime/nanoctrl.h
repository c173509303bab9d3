#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "dlslime/export.h"

namespace dlslime {

// NanoCtrl server configuration, validated once when the server is built. Every field has a
// command-line flag of the same name (docs/control-plane.md); defaults are the flags' defaults.
struct DLSLIME_API NanoCtrlConfig {
  // Bind address and port; port 0 lets the OS choose (read it back with NanoCtrlServer::port()).
  std::string host = "127.0.0.1";
  uint16_t port = 4479;
  // For a wildcard bind, what advertised_url() names for other hosts: advertise_host, else
  // advertise_interface's IPv4 address, else the default route's interface (the rule TCP
  // endpoints follow, docs/deploy.md). Set one, not both.
  std::string advertise_host;
  std::string advertise_interface;
  // Empty: the in-memory store. Otherwise redis://[[user]:password@]host[:port][/db].
  std::string redis_url;
  // Prefix of every Redis key this server writes; servers sharing a Redis must agree on it.
  std::string key_prefix = "nanoctrl:";
  // Lifetime of agent and entity records without a heartbeat.
  std::chrono::milliseconds ttl{60000};
  // Largest request body accepted; larger ones get 413.
  std::size_t max_body_bytes = 1 << 20;
  // Most HTTP worker threads (one per open connection; the pool grows on demand up to this).
  uint32_t max_threads = 1024;
  // Most mailbox receives blocked at once; beyond it a receive gets 429. 0 = max_threads / 2.
  uint32_t max_waiters = 0;
  // Longest wait a mailbox receive may ask for (longer requests are clamped).
  std::chrono::milliseconds max_wait{60000};
  // Most messages queued in one mailbox; a post to a full mailbox gets 429.
  uint32_t mailbox_max_messages = 4096;
  // A mailbox nobody posts to or reads from for this long is dropped.
  std::chrono::milliseconds mailbox_ttl{600000};
  // Idle HTTP keep-alive connections are closed after this long.
  std::chrono::milliseconds keep_alive_timeout{5000};
  // A request's line, headers and body must all have arrived this long after its first
  // byte; a slower one gets 408 and its connection is closed. Until its request is complete
  // a connection holds no worker thread, so slow clients cannot starve heartbeats.
  std::chrono::milliseconds request_read_timeout{10000};
  // Redis connect and command timeout (a blocked receive adds its own wait to it).
  std::chrono::milliseconds redis_timeout{2000};
  // Shared secret: when set, every request but GET /healthz must carry
  // `Authorization: Bearer <token>` (others get 401). Empty = no authentication. 1-4096
  // visible ASCII characters without spaces. Never logged: to_json()/to_string() say only
  // whether it is set.
  std::string token;

  // Throws InvalidArgumentError naming the bad field.
  void validate() const;
  // The configuration as JSON (the Redis password is masked; "token" is "set" or "none").
  nlohmann::json to_json() const;
  std::string to_string() const;
};

class NanoCtrlServerImpl;

// The NanoCtrl control plane, embedded: an HTTP/JSON server over a memory or Redis store,
// serving on background threads until stop() (or destruction).
class DLSLIME_API NanoCtrlServer {
 public:
  explicit NanoCtrlServer(NanoCtrlConfig config = {});
  ~NanoCtrlServer();
  NanoCtrlServer(const NanoCtrlServer&) = delete;
  NanoCtrlServer& operator=(const NanoCtrlServer&) = delete;

  // Connects the store and binds; returns once the server accepts requests. Throws
  // ConnectionError if the address cannot be bound or Redis cannot be reached,
  // InvalidArgumentError for a bad configuration, Error if already started.
  void start();
  // Stops serving: blocked mailbox receives return empty, open requests finish. Idempotent.
  void stop();
  // Blocks until the server has stopped (by stop() from another thread).
  void wait();
  bool running() const;

  // The bound port (the OS-chosen one for port 0) and "http://host:port" for clients on
  // this host (a wildcard bind address is reported as 127.0.0.1). Valid after start().
  uint16_t port() const;
  std::string url() const;
  // The URL for clients on other hosts: the bind address, or for a wildcard bind the
  // advertise address (NanoCtrlConfig::advertise_host, advertise_interface, else the
  // default route's interface). Valid after start().
  std::string advertised_url() const;
  const NanoCtrlConfig& config() const;

 private:
  std::unique_ptr<NanoCtrlServerImpl> impl_;
};

// The `nanoctrl` command line (server | start | stop | status), shared by the installed
// binary and the Python entry point. `self_command` is how to run this same program again
// (for `start`, which launches `<self_command> server ...` as a daemon). Returns the exit code.
DLSLIME_API int nanoctrl_main(const std::vector<std::string>& args,
                              const std::vector<std::string>& self_command);

}  // namespace dlslime
