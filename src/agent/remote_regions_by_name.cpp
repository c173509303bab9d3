#include "agent/remote_regions_by_name.h"

#include <map>

#include <fmt/format.h>

#include "dlslime/errors.h"

namespace dlslime {

int32_t RemoteRegionsByName::handle(const std::shared_ptr<PeerConnectionState>& c, const std::string& name,
                                   bool fresh) {
  json entry, handshake_entry;
  std::string peer_incarnation;
  {
    std::lock_guard lock(c->mu);
    peer_incarnation = c->peer_incarnation;
    if (c->peer_info.contains("mr_info") && c->peer_info["mr_info"].contains(name)) {
      handshake_entry = c->peer_info["mr_info"][name];
    }
    if (!fresh) {
      if (auto it = c->remote_handles.find(name); it != c->remote_handles.end()) return it->second;
      if (c->peer_info.contains("mr_info") && c->peer_info["mr_info"].contains(name)) entry = c->peer_info["mr_info"][name];
    }
  }
  if (entry.is_null()) {
    // Registered after the handshake (or again): NanoCtrl has the peer's current record.
    auto record = ctrl_.get_mr_info(c->peer_alias, name);
    if (!record) {
      throw NotFoundError(fmt::format("peer '{}' has no memory region named '{}' (not registered, or not yet "
                                      "published)",
                                      c->peer_alias, name));
    }
    entry = *record;
    // The entry of the peer endpoint we are connected to, where it has its own (RDMA: its rkey).
    if (entry.is_object() && entry.contains("endpoints")) {
      const json own = entry["endpoints"].is_object() && entry["endpoints"].contains(peer_incarnation)
                           ? entry["endpoints"][peer_incarnation]
                           : json();
      entry.erase("endpoints");
      if (!own.is_null()) entry = own;
    }
    // A region registered before our endpoint existed has no entry of its own for it in
    // the record; the handshake's mr_info has it, for the same registration (handle).
    if (handshake_entry.is_object() && entry.is_object() &&
        handshake_entry.value("handle", -1) == entry.value("handle", -2)) {
      entry = handshake_entry;
    }
  }
  // Registering a known name again updates that handle's entry in place.
  const int32_t remote = c->ep()->register_remote_memory_region(name, entry);
  std::lock_guard lock(c->mu);
  c->remote_handles[name] = remote;
  return remote;
}

std::vector<Assignment> RemoteRegionsByName::resolve(const std::shared_ptr<PeerConnectionState>& c,
                                                     const std::vector<NamedAssignment>& named, bool fresh) {
  std::vector<Assignment> out;
  out.reserve(named.size());
  std::map<std::string, int32_t> refreshed;  // fresh: each name asked of NanoCtrl once per batch
  for (const auto& n : named) {
    auto local = local_->find(n.local_name);
    if (!local) throw NotFoundError(fmt::format("no local memory region named '{}'", n.local_name));
    int32_t remote = -1;
    if (auto it = refreshed.find(n.remote_name); it != refreshed.end()) {
      remote = it->second;
    } else {
      remote = handle(c, n.remote_name, fresh);
      if (fresh) refreshed[n.remote_name] = remote;
    }
    out.push_back({*local, remote, n.remote_offset, n.local_offset, n.length});
  }
  return out;
}

std::vector<std::string> RemoteRegionsByName::sync(const std::shared_ptr<PeerConnectionState>& c) {
  {
    std::lock_guard lock(c->mu);
    if (c->state != "connected") {
      throw ConnectionError(fmt::format("the connection to '{}' is {}; sync_memory_regions() needs a connected one",
                                        c->peer_alias, c->state),
                            StatusCode::kNotConnected);
    }
  }
  std::vector<std::string> names;
  if (auto record = ctrl_.get_peer_agent(c->peer_alias); record && record->contains("memory_keys")) {
    for (const auto& k : (*record)["memory_keys"]) {
      if (k.is_string()) names.push_back(k.get<std::string>());
    }
  }
  for (const auto& n : names) handle(c, n, /*fresh=*/true);
  return names;
}

}  // namespace dlslime
