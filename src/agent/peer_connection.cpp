// PeerConnection, the handle connect_to() returns, over its PeerConnectionState; and
// ConnectOptions as the transports' hooks read it.
#include <fmt/format.h>

#include "agent/peer_connection_state.h"
#include "dlslime/errors.h"

namespace dlslime {

json ConnectOptions::to_json() const {
  json j = {{"local_host", local_host}, {"local_port", local_port}, {"ib_port", ib_port},
            {"qp_num", qp_num}, {"local_device", local_device}, {"peer_device", peer_device}};
  if (extra.is_object()) j.update(extra);
  return j;
}

void PeerConnection::wait(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(state_->mu);
  if (!state_->cv.wait_for(lock, timeout, [&] { return state_->state != "connecting"; })) {
    if (!state_->info_sent) {
      throw TimeoutError(fmt::format("connection to '{}' not established within {} ms: no agent '{}' has "
                                     "registered with NanoCtrl (same scope?)",
                                     state_->peer_alias, timeout.count(), state_->peer_alias));
    }
    throw TimeoutError(fmt::format("connection to '{}' not established within {} ms (the peer agent is "
                                   "registered but did not answer the handshake)",
                                   state_->peer_alias, timeout.count()));
  }
  if (state_->auth_failed) {
    throw AuthenticationError(fmt::format("connection to '{}' failed: {}", state_->peer_alias, state_->error));
  }
  // A handshake that completed is what wait() reports, even when the peer has left since
  // (it wrote and shut down at once): state() and the next op say that it is closed now.
  if (state_->state != "connected" && !state_->was_connected) {
    throw ConnectionError(fmt::format("connection to '{}' {}: {}", state_->peer_alias, state_->state, state_->error));
  }
}

bool PeerConnection::is_connected() const {
  std::lock_guard lock(state_->mu);
  return state_->state == "connected" && state_->endpoint && state_->endpoint->is_connected();
}

std::string PeerConnection::state() const {
  std::lock_guard lock(state_->mu);
  if (state_->state == "connected" && !(state_->endpoint && state_->endpoint->is_connected())) return "closed";
  return state_->state;
}

std::string PeerConnection::error() const {
  std::lock_guard lock(state_->mu);
  return state_->error;
}

std::string PeerConnection::conn_id() const { return state_->conn_id; }
std::string PeerConnection::peer_alias() const { return state_->peer_alias; }
std::string PeerConnection::transport() const { return state_->transport_name(); }
std::shared_ptr<Endpoint> PeerConnection::endpoint() const { return state_->ep(); }

std::string PeerConnection::selection_reason() const {
  std::lock_guard lock(state_->mu);
  return state_->selection_reason;
}



std::string PeerConnection::local_nic() const {
  std::lock_guard lock(state_->mu);
  return state_->local_nic;
}

std::string PeerConnection::remote_nic() const {
  std::lock_guard lock(state_->mu);
  return state_->remote_nic;
}

json PeerConnection::peer_endpoint_info() const {
  std::lock_guard lock(state_->mu);
  return state_->state == "connected" ? state_->peer_info : json(nullptr);
}

}  // namespace dlslime
