// The shared state behind a PeerConnection handle, and the small helpers the agent's
// files share about ids and endpoint_info. The ConnectionTable's mutex guards the table;
// each connection's own mutex guards its fields.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dlslime/endpoint.h"
#include "dlslime/peer_agent.h"

namespace dlslime {

using nlohmann::json;

// 64 random bits as 16 hex digits: an agent's instance id, an endpoint's incarnation.
inline std::string random_id() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

// What random_id() makes. A connect message's incarnation must look like one: it is the
// only thing that tells a peer's endpoints apart, so a missing or malformed one is refused.
inline bool is_random_id(const json& v) {
  if (!v.is_string()) return false;
  const auto& s = v.get_ref<const std::string&>();
  return s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// The instance id in an agent record from NanoCtrl ("" for none or no record).
inline std::string instance_of(const std::optional<json>& record) {
  if (!record || !record->contains("metadata") || !(*record)["metadata"].is_object()) return "";
  const json& meta = (*record)["metadata"];
  return meta.contains("instance") && meta["instance"].is_string() ? meta["instance"].get<std::string>() : "";
}

// The "device" an endpoint_info names (RDMA's; "" for a transport without devices).
inline std::string device_of(const json& info) {
  if (!info.is_object()) return "";
  return info.contains("device") && info["device"].is_string() ? info["device"].get<std::string>() : "";
}

class PeerAgentImpl;

class PeerConnectionState {
 public:
  PeerConnectionState(std::string peer, std::string conn_id, ConnectOptions requested, bool passive)
      : peer_alias(std::move(peer)),
        conn_id(std::move(conn_id)),
        requested(std::move(requested)),
        request(this->requested.to_json()),
        passive(passive) {}

  const std::string peer_alias;
  const std::string conn_id;
  // What connect_to() asked for (a passive side's: the defaults, with the transport the
  // peer's message names). transport "auto" is decided once the peer's record is known.
  const ConnectOptions requested;
  const json request;  // requested.to_json(): what the transports' hooks read
  // Random per endpoint made here, sent in every connect message: the peer tells a new
  // endpoint of ours (a reconnect) from a repeat of the same handshake by it.
  const std::string incarnation = random_id();
  // Made for a peer's connect message, not by connect_to(): nobody here asked for it, so
  // it counts against the bound on passive handshakes and is dropped when it fails.
  const bool passive;
  // The agent, for sync_memory_regions() on a handle that may outlive it.
  std::weak_ptr<PeerAgentImpl> agent;

  mutable std::mutex mu;
  std::condition_variable cv;
  // The transport, the reason it was chosen, what the peer needs to make its side (the
  // connect message's "transport_options"; never a secret: it travels through NanoCtrl)
  // and the endpoint: set together, once (decide()), and never changed after; until then
  // transport is "auto" and endpoint null.
  std::string transport = "auto";
  std::string selection_reason;
  json peer_options = json::object();
  std::shared_ptr<Endpoint> endpoint;
  std::string state = "connecting";  // connecting | connected | failed | closed
  std::string error;
  std::string peer_instance;    // the peer agent's instance id, from its first connect message
  bool auth_failed = false;     // failed because the tokens differ (wait() raises AuthenticationError)
  json peer_info;               // the peer's endpoint_info, once known (never parsed here)
  std::string peer_incarnation;  // the peer endpoint's incarnation; "" until its first message
  // The NIC pair the connection is on (the devices endpoint_info() names; "" for a transport
  // without devices, or not known yet): local_nic once the endpoint is made, remote_nic the
  // requested peer_device until the peer's endpoint_info names its device. Several
  // connections to one peer are told apart by it.
  std::string local_nic;
  std::string remote_nic;
  bool info_sent = false;       // our endpoint_info was posted to the peer (it had registered)
  bool dialing = false;         // endpoint->connect() runs on a handshake thread
  // Both directions: the connection is up once this side's connect() returned (`dialed`)
  // and, for a peer that confirms its own (`confirms_dial` in its connect message), once its
  // "dialed" message came (`peer_dialed`). Otherwise an agent that connected, wrote and left
  // at once would close its listener under its peer's dial, failing the peer's wait().
  bool dialed = false;
  bool peer_confirms = false;
  bool peer_dialed = false;
  bool was_connected = false;  // the handshake completed (state may be "closed" since)
  std::chrono::steady_clock::time_point last_post;  // when, for re-posting
  std::map<std::string, int32_t> remote_handles;  // remote region name -> handle

  void finish(const std::string& new_state, const std::string& why, bool auth = false) {
    {
      std::lock_guard lock(mu);
      if (state == "closed") return;
      if (new_state == "connected") was_connected = true;
      state = new_state;
      error = why;
      auth_failed = auth;
    }
    cv.notify_all();
  }
  bool failed_on_auth() const {
    std::lock_guard lock(mu);
    return state == "failed" && auth_failed;
  }
  // Usable for new ops: handshake done and the endpoint still has its peer.
  bool alive() const {
    std::lock_guard lock(mu);
    if (state == "connecting") return true;
    return state == "connected" && endpoint && endpoint->is_connected();
  }
  bool connecting() const {
    std::lock_guard lock(mu);
    return state == "connecting";
  }
  std::shared_ptr<Endpoint> ep() const {
    std::lock_guard lock(mu);
    return endpoint;
  }
  std::string transport_name() const {
    std::lock_guard lock(mu);
    return transport;
  }
  // Shuts the endpoint down, if one was made.
  void shutdown_endpoint() const {
    if (auto e = ep()) e->shutdown();
  }
  // Ends it here: the endpoint shut down, and the handle says why.
  void close(const std::string& why) {
    shutdown_endpoint();
    finish("closed", why);
  }
  // Whether this connection can be the one on NICs (local, remote): "" on either side of a
  // comparison is "any" (not asked for, or not known yet). For matching handshakes and
  // connect_to() calls to a connection; I/O filters use on_nics().
  bool could_be_on(const std::string& local, const std::string& remote) const {
    std::lock_guard lock(mu);
    return (local.empty() || local_nic.empty() || local == local_nic) &&
           (remote.empty() || remote_nic.empty() || remote == remote_nic);
  }
  // Whether it is on those NICs ("" in the filter: any), as the I/O filters select.
  bool on_nics(const std::string& local, const std::string& remote) const {
    std::lock_guard lock(mu);
    return (local.empty() || local == local_nic) && (remote.empty() || remote == remote_nic);
  }
};

}  // namespace dlslime
