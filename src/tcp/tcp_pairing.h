#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>

#include "core/remote_regions.h"
#include "dlslime/status.h"
#include "dlslime/tcp_endpoint.h"
#include "tcp/answer_budget.h"
#include "tcp/handshake.h"
#include "tcp/tcp_connection.h"
#include "tcp/tcp_socket.h"

namespace dlslime {

class MessageMatcher;

// Who this endpoint is paired with, over which connections: the peer's id, the dialed
// lanes (our requests) and accepted ones (the peer's), the verdict on each hello, the
// connect() calls waiting for their dial, and why the last connection was lost. A
// TcpEndpoint serves one peer at a time; a new one may pair once the last has gone.
//
// Threads: the I/O thread, except the connect waits (connects_mu_, any thread) and
// lanes_up()/connected() (atomics read by submitting threads).
class Pairing {
 public:
  // connect() calls waiting for their dial, so that shutdown() can end them at once.
  struct ConnectWait {
    std::promise<Status> promise;
    std::atomic<bool> finished{false};
    void finish(Status st) {  // the first outcome wins: the dial's, or shutdown's
      if (!finished.exchange(true)) promise.set_value(std::move(st));
    }
  };

  // `handler` receives every connection's frames. When a different peer pairs, `held`
  // loses the messages held from the previous one, and `remote_regions` drops that peer's
  // regions: the new owner would resolve an old handle to a region of its own.
  Pairing(asio::io_context& io, const TcpOptions& options, uint64_t endpoint_id, const std::atomic<bool>& shut_down,
          tcp::FrameHandler& handler, MessageMatcher& held, OwnerRemoteRegions& remote_regions);

  // Called on the I/O thread once dialed lanes are up, before the connect() waiting for
  // them returns (the same-host offer goes out here).
  void on_dialed(std::function<void()> fn) { on_dialed_ = std::move(fn); }

  // Any thread: a wait for a dial, which shutdown (finish_connect_waits) ends at once.
  std::shared_ptr<ConnectWait> add_connect_wait();
  void finish_connect_waits(const Status& why);

  // Dials the peer of `request` unless already connected, and finishes `wait` with the
  // outcome. `owner` keeps the endpoint (and so this) alive: the dial completes later.
  void dial(tcp::DialRequest request, std::shared_ptr<ConnectWait> wait, std::weak_ptr<void> owner);
  // The listener's questions: may this hello connect, and adopting the socket it opened.
  Status decide_hello(const tcp::Hello& hello) const;
  void adopt_accepted(asio::ip::tcp::socket socket, const tcp::Hello& hello);
  // Tests and fuzzers: adopts `socket` as the next dialed lane of peer `peer_id`.
  std::shared_ptr<tcp::TcpConnection> adopt_dialed_for_test(asio::ip::tcp::socket socket, uint64_t peer_id);

  // `conn` said goodbye: it leaves the lanes (closed quietly). True if none are left.
  bool remove_lane(tcp::TcpConnection& conn);
  // The connection was lost (`why`): kept for the NOT_CONNECTED errors that follow.
  void lost(const Status& why) { last_loss_ = why.message(); }
  // Closes every lane quietly and unpairs: a new peer may connect now.
  void drop_lanes();

  uint64_t peer_id() const { return peer_id_; }
  // Any thread: whether dialed lanes are up, and how many (the submitting thread plans
  // over them; a reconnect in between is caught when the op starts).
  bool connected() const { return connected_.load(std::memory_order_acquire); }
  uint16_t lanes_up() const { return lanes_up_.load(std::memory_order_relaxed); }
  const std::vector<std::shared_ptr<tcp::TcpConnection>>& dialed() const { return dialed_; }
  // fn(conn) for every connection, dialed and accepted. fn must not change the lanes
  // (closing one may: collect them first).
  template <class F>
  void for_each_connection(F&& fn) const {
    for (const auto* lanes : {&dialed_, &accepted_}) {
      for (const auto& conn : *lanes) fn(conn);
    }
  }
  bool has_connections() const { return !dialed_.empty() || !accepted_.empty(); }
  // Why the last connection was lost; empty while connected or before any connection.
  const std::string& last_loss() const { return last_loss_; }

 private:
  void pair_with(uint64_t peer_id);
  void add_dialed(asio::ip::tcp::socket socket);

  asio::io_context& io_;
  const TcpOptions& options_;
  const uint64_t endpoint_id_;
  const std::atomic<bool>& shut_down_;
  tcp::FrameHandler& handler_;
  MessageMatcher& held_;
  OwnerRemoteRegions& remote_regions_;

  std::mutex connects_mu_;
  std::vector<std::weak_ptr<ConnectWait>> connects_;  // guarded by connects_mu_
  std::atomic<bool> connected_{false};
  std::atomic<uint16_t> lanes_up_{0};

  // ---- I/O thread only ----
  uint64_t peer_id_ = 0;           // the endpoint this one is paired with (0 = none yet)
  uint64_t previous_peer_id_ = 0;  // the last one it was paired with, even after a loss
  std::vector<std::shared_ptr<tcp::TcpConnection>> dialed_;    // by lane: our requests
  std::vector<std::shared_ptr<tcp::TcpConnection>> accepted_;  // the peer's requests
  // Answers queued to the peer on all its connections (bounded per peer, not per lane).
  std::shared_ptr<tcp::AnswerBudget> answer_budget_ = std::make_shared<tcp::AnswerBudget>();
  std::string last_loss_;  // why the last connection was lost, for NOT_CONNECTED errors
  // The peer whose connections all ended with a goodbye (it shut down in order), until
  // another peer pairs: a dial to it that fails then is no failure (dial()).
  uint64_t left_in_order_ = 0;
  // Dials that failed while their peer was still connected to us (its lanes only): it is
  // most likely shutting down, and its goodbye is on the way. Each finishes when those
  // lanes end: OK if every one said goodbye, else with the dial's own error (after
  // kDepartureGrace at the latest).
  struct ParkedDial {
    std::shared_ptr<ConnectWait> wait;
    Status failure;
  };
  std::vector<ParkedDial> parked_dials_;
  void finish_parked_dials(bool in_order);
  std::function<void()> on_dialed_;
};

}  // namespace dlslime
