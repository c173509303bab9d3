#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>

#include "dlslime/status.h"
#include "dlslime/tcp_endpoint.h"
#include "tcp/handshake.h"

// Opening connections: socket options, dialing lanes with the Hello exchange, and the
// listening side that answers Hellos. Both run on the endpoint's I/O thread.
namespace dlslime::tcp {

// TCP_NODELAY, keepalive (idle/interval/count), TCP_USER_TIMEOUT and buffer sizes.
void apply_socket_options(asio::ip::tcp::socket& socket, const TcpOptions& options);

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
class TcpListener : public std::enable_shared_from_this<TcpListener> {
 public:
  using Decide = std::function<Status(const Hello&)>;
  using Accepted = std::function<void(asio::ip::tcp::socket, const Hello&)>;

  // Binds and listens; throws ConnectionError if the address cannot be bound.
  TcpListener(asio::io_context& ctx, const asio::ip::tcp::endpoint& bind, const TcpOptions& options,
              uint64_t endpoint_id);
  void start(Decide decide, Accepted accepted);
  uint16_t port() const { return port_; }
  void close();

 private:
  // Half-open connections waiting for their Hello; beyond this, new ones are closed at
  // once (a Hello flood cannot exhaust memory or descriptors).
  static constexpr size_t kMaxPendingHandshakes = 64;
  struct Pending;

  void accept_next();
  void handshake(std::shared_ptr<Pending> p);
  Status check_auth_flag(const Hello& hello) const;
  void challenge(std::shared_ptr<Pending> p);
  void abandon(const std::shared_ptr<Pending>& p);
  void reply(std::shared_ptr<Pending> p, const Status& verdict);

  asio::ip::tcp::acceptor acceptor_;
  TcpOptions options_;
  uint64_t endpoint_id_;
  uint16_t port_ = 0;
  bool closed_ = false;
  size_t pending_ = 0;
  Decide decide_;
  Accepted accepted_;
};

}  // namespace dlslime::tcp
