#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>

#include "core/log.h"
#include "dlslime/status.h"
#include "dlslime/tcp_endpoint.h"
#include "tcp/handshake.h"

// Opening connections: socket options, dialing lanes with the Hello exchange, and the
// listening side that answers Hellos. Both run on the endpoint's I/O thread.
namespace dlslime::tcp {

// TCP_NODELAY, keepalive (idle/interval/count), TCP_USER_TIMEOUT and buffer sizes. An
// option the kernel refuses is an error naming it (the connection must not run without
// the keepalive bounds that make a dead peer noticed).
Status apply_socket_options(asio::ip::tcp::socket& socket, const TcpOptions& options);

struct DialRequest {
  std::vector<asio::ip::tcp::endpoint> addresses;  // resolved peer address(es)
  std::string peer_label;                          // "host:port", for messages
  uint16_t lanes = 1;
  uint64_t sender_id = 0;
  uint64_t target_id = 0;  // 0 = accept whoever answers
  std::chrono::milliseconds timeout{10000};
};

struct DialResult {
  Status status;
  uint64_t peer_id = 0;
  std::vector<asio::ip::tcp::socket> sockets;  // one per lane, in lane order, on success
};

// Opens `lanes` connections, sends a Hello on each and reads the replies. `done` runs
// once on the I/O thread.
void dial_lanes(asio::io_context& ctx, DialRequest request, const TcpOptions& options,
                std::function<void(DialResult)> done);

// Accepts connections and runs the accepting half of the handshake. `decide` returns ok
// to accept a Hello or the reason to refuse it; `accepted` receives the socket.
//
// Hostile-peer bounds: a connection must complete its handshake (hello, and proof with a
// token) within options.connect_timeout in total, however slowly it trickles bytes; at
// most kMaxPendingHandshakes are incomplete at once, and a new connection past that
// evicts the oldest incomplete one (an attacker's slow connections are the old ones, a
// legitimate dialer completes in a round trip), so new handshakes are never refused.
// When accept() fails (EMFILE, ENFILE, ENOBUFS, ENOMEM...) the listener backs off from
// kMinAcceptBackoff to kMaxAcceptBackoff before accepting again instead of spinning, and
// logs one line per kLogInterval. All of it runs on the endpoint's I/O thread.
class TcpListener : public std::enable_shared_from_this<TcpListener> {
 public:
  using Decide = std::function<Status(const Hello&)>;
  using Accepted = std::function<void(asio::ip::tcp::socket, const Hello&)>;

  static constexpr size_t kMaxPendingHandshakes = 64;
  static constexpr std::chrono::milliseconds kMinAcceptBackoff{10};
  static constexpr std::chrono::milliseconds kMaxAcceptBackoff{1000};
  static constexpr std::chrono::seconds kLogInterval{5};

  // Counters since construction; readable from any thread.
  struct Stats {
    uint64_t accepted = 0;              // connections accept() returned
    uint64_t accept_failures = 0;       // accept() errors (each one followed by a back-off)
    uint64_t handshakes_completed = 0;  // handed to `accepted`
    uint64_t handshakes_refused = 0;    // answered with a refusal (bad hello, token, decide)
    uint64_t handshakes_timed_out = 0;  // not complete within connect_timeout
    uint64_t handshakes_evicted = 0;    // dropped to make room for a new connection
  };

  // Binds and listens; with port 0 and options.port_range, on the range's first free port.
  // Throws ConnectionError if the address cannot be bound or the range has no free port,
  // InvalidArgumentError for a port outside the range.
  TcpListener(asio::io_context& ctx, const asio::ip::tcp::endpoint& bind, const TcpOptions& options,
              uint64_t endpoint_id);
  void start(Decide decide, Accepted accepted);
  uint16_t port() const { return port_; }
  // Stops accepting and closes every incomplete handshake.
  void close();
  Stats stats() const;
  size_t pending_handshakes() const { return pending_.size(); }

 private:
  // Opens, binds and listens the acceptor at `at`; on failure closes it again.
  std::error_code try_listen(const asio::ip::tcp::endpoint& at);
  struct Pending;
  using PendingList = std::list<std::shared_ptr<Pending>>;

  void accept_next();
  void accept_failed(const std::error_code& ec);
  void handshake(std::shared_ptr<Pending> p);
  Status check_auth_flag(const Hello& hello) const;
  void challenge(std::shared_ptr<Pending> p);
  void evict_oldest();
  // Ends an incomplete handshake: tells the dialer why when its socket can take the
  // reply at once (never waits for a peer that does not read), then closes.
  void drop(std::shared_ptr<Pending> p, const Status& why);
  void abandon(const std::shared_ptr<Pending>& p);
  void retire(const std::shared_ptr<Pending>& p);
  void reply(std::shared_ptr<Pending> p, const Status& verdict);

  struct Counters {
    std::atomic<uint64_t> accepted{0}, accept_failures{0}, completed{0}, refused{0}, timed_out{0}, evicted{0};
  };

  asio::ip::tcp::acceptor acceptor_;
  asio::steady_timer backoff_timer_;
  std::chrono::milliseconds backoff_{0};
  TcpOptions options_;
  uint64_t endpoint_id_;
  uint16_t port_ = 0;
  bool closed_ = false;
  PendingList pending_;  // incomplete handshakes, oldest first
  Counters counters_;
  LogLimiter accept_log_{kLogInterval};
  LogLimiter evict_log_{kLogInterval};
  Decide decide_;
  Accepted accepted_;
};

}  // namespace dlslime::tcp
