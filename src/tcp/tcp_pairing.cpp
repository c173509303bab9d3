#include "tcp/tcp_pairing.h"

#include <algorithm>
#include <chrono>

#include <asio/steady_timer.hpp>

#include <fmt/format.h>

#include "core/log.h"
#include "tcp/tcp_message_matcher.h"

namespace dlslime {

using tcp::TcpConnection;

Pairing::Pairing(asio::io_context& io, const TcpOptions& options, uint64_t endpoint_id,
                 const std::atomic<bool>& shut_down, tcp::FrameHandler& handler, MessageMatcher& held, OwnerRemoteRegions& remote_regions)
    : io_(io),
      options_(options),
      endpoint_id_(endpoint_id),
      shut_down_(shut_down),
      handler_(handler),
      held_(held),
      remote_regions_(remote_regions) {}

std::shared_ptr<Pairing::ConnectWait> Pairing::add_connect_wait() {
  auto wait = std::make_shared<ConnectWait>();
  std::lock_guard lock(connects_mu_);
  std::erase_if(connects_, [](const auto& w) { return w.expired(); });
  connects_.push_back(wait);
  return wait;
}

void Pairing::finish_connect_waits(const Status& why) {
  std::lock_guard lock(connects_mu_);
  for (auto& w : connects_) {
    if (auto wait = w.lock()) wait->finish(why);
  }
  connects_.clear();
}

Status Pairing::decide_hello(const tcp::Hello& hello) const {
  constexpr size_t kMaxAcceptedLanes = 64;
  if (shut_down_) return Status(StatusCode::kAccessDenied, "the endpoint is shutting down");
  if (hello.target_id != 0 && hello.target_id != endpoint_id_) {
    return Status::protocol_error(fmt::format(
        "this port belongs to endpoint {:#x}, not {:#x} (is the peer_info stale?)", endpoint_id_, hello.target_id));
  }
  if (peer_id_ != 0 && hello.sender_id != peer_id_) {
    return Status(StatusCode::kAccessDenied,
                  fmt::format("the endpoint is already connected to peer {:#x}; a TcpEndpoint serves one peer", peer_id_));
  }
  if (accepted_.size() >= kMaxAcceptedLanes) {
    return Status(StatusCode::kAccessDenied, fmt::format("too many connections (limit {})", kMaxAcceptedLanes));
  }
  return Status::ok();
}

void Pairing::adopt_accepted(asio::ip::tcp::socket socket, const tcp::Hello& hello) {
  if (Status verdict = decide_hello(hello); !verdict) {
    DLSLIME_WARN("dropping a connection accepted before a conflicting one: {}", verdict.message());
    return;
  }
  pair_with(hello.sender_id);
  last_loss_.clear();
  auto conn = std::make_shared<TcpConnection>(std::move(socket), &handler_, TcpConnection::Role::kAccepted,
                                              hello.lane_index, answer_budget_);
  DLSLIME_DEBUG("accepted lane {} from peer {:#x} at {}", hello.lane_index, hello.sender_id, conn->peer_address());
  accepted_.push_back(conn);
  conn->start();
}

std::shared_ptr<TcpConnection> Pairing::adopt_dialed_for_test(asio::ip::tcp::socket socket, uint64_t peer_id) {
  pair_with(peer_id);
  add_dialed(std::move(socket));
  connected_ = true;
  return dialed_.back();
}

void Pairing::add_dialed(asio::ip::tcp::socket socket) {
  auto conn = std::make_shared<TcpConnection>(std::move(socket), &handler_, TcpConnection::Role::kDialed,
                                              static_cast<uint16_t>(dialed_.size()), answer_budget_);
  dialed_.push_back(conn);
  lanes_up_ = static_cast<uint16_t>(dialed_.size());
  conn->start();
}

void Pairing::pair_with(uint64_t peer_id) {
  // Messages held from an earlier peer stay deliverable after it left (its sends were
  // acknowledged), but not to the recvs of a different peer's conversation.
  const bool new_peer = previous_peer_id_ != 0 && previous_peer_id_ != peer_id;
  held_.paired(new_peer);
  if (new_peer) {
    remote_regions_.drop_all(
        fmt::format("was dropped: it was peer {:#x}'s, and peer {:#x} is connected now; register the new peer's "
                    "region again",
                    previous_peer_id_, peer_id));
  }
  peer_id_ = previous_peer_id_ = peer_id;
  left_in_order_ = 0;
}

namespace {
// How long a dial refused by a peer still connected to us waits for that peer's lanes to
// end (its goodbye arrives within a round trip of its shutdown).
constexpr auto kDepartureGrace = std::chrono::seconds(2);
}  // namespace

void Pairing::dial(tcp::DialRequest request, std::shared_ptr<ConnectWait> wait, std::weak_ptr<void> owner) {
  if (!dialed_.empty()) {
    if (request.target_id == 0 || request.target_id == peer_id_) return wait->finish(Status::ok());
    return wait->finish(Status(StatusCode::kAccessDenied,
                               fmt::format("already connected to peer {:#x}; a TcpEndpoint serves one peer", peer_id_)));
  }
  const std::string label = request.peer_label;
  const uint64_t request_target = request.target_id;
  tcp::dial_lanes(io_, std::move(request), options_,
                  [this, owner = std::move(owner), wait, label, request_target](tcp::DialResult r) {
                    const auto alive = owner.lock();
                    if (!alive) return wait->finish(Status::cancelled("the endpoint is gone"));
                    if (!r.status && request_target != 0 && request_target == left_in_order_) {
                      // The peer connected to us, did its work and shut down in order before
                      // our side of a symmetric pair dialed back (a receiver slower than its
                      // sender): nothing failed, and what it sent is here.
                      DLSLIME_INFO("connect() to {}: peer {:#x} already connected to this endpoint and shut down "
                                   "in order; nothing to connect to ({})",
                                   label, request_target, r.status.message());
                      return wait->finish(Status::ok());
                    }
                    if (!r.status && request_target != 0 && request_target == peer_id_ && dialed_.empty() &&
                        !accepted_.empty()) {
                      // Refused by a peer still connected to us: it is shutting down, and
                      // whether in order is known when its lanes end (remove_lane).
                      parked_dials_.push_back({wait, r.status});
                      auto grace = std::make_shared<asio::steady_timer>(io_, kDepartureGrace);
                      grace->async_wait([grace, wait, failure = r.status](std::error_code) { wait->finish(failure); });
                      return;
                    }
                    if (!r.status) return wait->finish(r.status);
                    Status verdict = Status::ok();
                    if (shut_down_) {
                      verdict = Status::cancelled("the endpoint was shut down during connect()");
                    } else if (peer_id_ != 0 && peer_id_ != r.peer_id) {
                      verdict = Status(StatusCode::kAccessDenied,
                                       fmt::format("{} is endpoint {:#x}, but this endpoint is already paired "
                                                   "with peer {:#x}",
                                                   label, r.peer_id, peer_id_));
                    }
                    if (!verdict || !dialed_.empty()) {
                      for (auto& s : r.sockets) {
                        std::error_code ignored;
                        s.close(ignored);
                      }
                      return wait->finish(verdict);  // a concurrent connect() won
                    }
                    pair_with(r.peer_id);
                    last_loss_.clear();
                    for (auto& socket : r.sockets) add_dialed(std::move(socket));
                    connected_ = true;
                    DLSLIME_INFO("connected to {} (peer {:#x}) over {} lane(s)", label, r.peer_id, dialed_.size());
                    if (on_dialed_) on_dialed_();
                    wait->finish(Status::ok());
                  });
}

bool Pairing::remove_lane(TcpConnection& conn) {
  const auto closing = conn.shared_from_this();
  std::erase(dialed_, closing);
  std::erase(accepted_, closing);
  conn.close_quietly();
  if (has_connections()) return false;
  left_in_order_ = peer_id_;
  finish_parked_dials(/*in_order=*/true);
  return true;
}

void Pairing::finish_parked_dials(bool in_order) {
  auto parked = std::move(parked_dials_);
  parked_dials_.clear();
  for (auto& p : parked) p.wait->finish(in_order ? Status::ok() : std::move(p.failure));
}

void Pairing::drop_lanes() {
  auto dialed = std::move(dialed_);
  auto accepted = std::move(accepted_);
  dialed_.clear();
  accepted_.clear();
  connected_ = false;
  lanes_up_ = 0;
  peer_id_ = 0;  // a new peer may connect now
  finish_parked_dials(/*in_order=*/false);
  for (auto& c : dialed) c->close_quietly();
  for (auto& c : accepted) c->close_quietly();
}

}  // namespace dlslime
