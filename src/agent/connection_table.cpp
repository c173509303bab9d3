// ConnectionTable: a PeerAgent's connections by peer, matched to handshake messages and
// selected by NIC pair.
#include "agent/connection_table.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dlslime/errors.h"

namespace dlslime {

namespace {

std::string nic_label(const std::string& nic) { return nic.empty() ? "None" : "'" + nic + "'"; }

}  // namespace

std::string ConnectionTable::next_id(const std::string& alias, const std::string& peer) {
  std::lock_guard lock(mu_);
  return fmt::format("{}->{}#{}", alias, peer, next_conn_++);
}

std::vector<ConnectionTable::Connection> ConnectionTable::to(const std::string& peer) const {
  std::lock_guard lock(mu_);
  std::vector<Connection> out;
  for (auto [it, last] = conns_.equal_range(peer); it != last; ++it) out.push_back(it->second);
  return out;
}

std::vector<ConnectionTable::Connection> ConnectionTable::all() const {
  std::lock_guard lock(mu_);
  std::vector<Connection> out;
  for (const auto& [peer, c] : conns_) out.push_back(c);
  return out;
}

std::vector<std::string> ConnectionTable::peers() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, c] : conns_) {
    if (out.empty() || out.back() != name) out.push_back(name);
  }
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Endpoint>>> ConnectionTable::endpoints() const {
  std::vector<std::pair<std::string, std::shared_ptr<Endpoint>>> out;
  for (const auto& c : all()) {
    if (auto ep = c->ep()) out.emplace_back(c->incarnation, std::move(ep));
  }
  return out;
}

bool ConnectionTable::any_connecting() const {
  std::lock_guard lock(mu_);
  for (const auto& [peer, c] : conns_) {
    if (c->connecting()) return true;
  }
  return false;
}

ConnectionTable::Connection ConnectionTable::match(const std::string& peer, const std::string& transport,
                                                   const json& msg, const std::string& local,
                                                   const std::string& remote) const {
  std::lock_guard lock(mu_);
  return match_locked(peer, transport, msg, local, remote);
}

ConnectionTable::Connection ConnectionTable::match_locked(const std::string& peer, const std::string& transport,
                                                          const json& msg, const std::string& local,
                                                          const std::string& remote) const {
  const auto [first, last] = conns_.equal_range(peer);
  const std::string to_incarnation = msg.value("to_incarnation", "");
  const std::string incarnation = msg.value("incarnation", "");
  Connection unpaired, paired;
  for (auto it = first; it != last; ++it) {
    const auto& c = it->second;
    if (!to_incarnation.empty() && c->incarnation == to_incarnation) return c;  // it answers this one
    std::lock_guard clock(c->mu);
    if (c->peer_incarnation == incarnation) return c;  // a repeat
  }
  for (auto it = first; it != last; ++it) {
    const auto& c = it->second;
    const std::string t = c->transport_name();
    if (t != transport && t != "auto") continue;
    if (!c->could_be_on(local, remote)) continue;
    std::lock_guard clock(c->mu);
    if (c->peer_incarnation.empty()) {
      if (!unpaired) unpaired = c;
    } else if (!paired) {
      paired = c;
    }
  }
  return unpaired ? unpaired : paired;
}

ConnectionTable::Connection ConnectionTable::match_or_add(const std::string& peer, const std::string& transport,
                                                          const json& msg, const std::string& local,
                                                          const std::string& remote, const Connection& made) {
  std::lock_guard lock(mu_);
  if (closed_) return nullptr;
  if (auto c = match_locked(peer, transport, msg, local, remote)) return c;
  return conns_.emplace(peer, made)->second;
}

ConnectionTable::Connection ConnectionTable::live_or_add(const std::string& peer, const Predicate& same_link,
                                                         const Connection& made) {
  std::lock_guard lock(mu_);
  for (auto [it, last] = conns_.equal_range(peer); it != last; ++it) {
    if (same_link(it->second) && it->second->alive()) return it->second;
  }
  conns_.emplace(peer, made);
  return made;
}

ConnectionTable::Lookup ConnectionTable::lookup(const std::string& peer, const Predicate& same_link) {
  Lookup out;
  std::lock_guard lock(mu_);
  for (auto [it, last] = departed_.equal_range(peer); it != last; ++it) {
    if (same_link(it->second)) out.departed = it->second;  // the latest
  }
  for (auto [it, last] = conns_.equal_range(peer); it != last;) {
    if (!same_link(it->second)) {
      ++it;
      continue;
    }
    // A handshake that failed on the token cannot succeed on a retry: keep its reason.
    if (it->second->alive() || it->second->failed_on_auth()) {
      out.existing = it->second;
      return out;
    }
    out.stale.push_back(it->second);
    it = conns_.erase(it);
  }
  for (const auto& [name, other] : conns_) {
    if (!other->passive && other->connecting()) ++out.connecting;
  }
  return out;
}

void ConnectionTable::erase(const Connection& c) {
  std::lock_guard lock(mu_);
  erase_locked(c);
}

void ConnectionTable::erase_locked(const Connection& c) {
  for (auto [it, last] = conns_.equal_range(c->peer_alias); it != last; ++it) {
    if (it->second == c) {
      conns_.erase(it);
      return;
    }
  }
}

void ConnectionTable::drop(const Connection& c, const std::string& why) {
  erase(c);
  c->shutdown_endpoint();
  c->finish("failed", why);
}

void ConnectionTable::depart(const Connection& c, const std::string& why, std::chrono::milliseconds grace) {
  bool completed = false;
  {
    std::lock_guard clock(c->mu);
    completed = c->was_connected;
  }
  {
    std::lock_guard lock(mu_);
    erase_locked(c);
    // Its handshake completed: a connect_to() that comes after the peer left (it wrote and
    // shut down before we asked) gets this connection, not a new attempt towards an agent
    // that is gone.
    if (completed) departed_.emplace(c->peer_alias, c);
  }
  c->finish("closed", why);
  if (auto ep = c->ep()) {
    std::lock_guard lock(mu_);
    lingering_.emplace_back(std::move(ep), std::chrono::steady_clock::now() + grace);
  }
  shut_down_departed_endpoints(false);
}

void ConnectionTable::forget_departed(const std::string& peer) {
  std::lock_guard lock(mu_);
  departed_.erase(peer);
}

bool ConnectionTable::shut_down_departed_endpoints(bool all) {
  std::vector<std::shared_ptr<Endpoint>> done;
  {
    std::lock_guard lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(lingering_, [&](const auto& r) {
      if (!all && r.first->is_connected() && now < r.second) return false;
      done.push_back(r.first);
      return true;
    });
  }
  for (auto& ep : done) ep->shutdown();  // outside mu_: it waits for the I/O thread
  std::lock_guard lock(mu_);
  return !lingering_.empty();
}

std::vector<ConnectionTable::Connection> ConnectionTable::take_all() {
  std::multimap<std::string, Connection> conns;
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    conns.swap(conns_);
    departed_.clear();
  }
  std::vector<Connection> out;
  for (auto& [peer, c] : conns) out.push_back(std::move(c));
  return out;
}

ConnectionTable::Connection ConnectionTable::select(const std::string& peer, const ConnectionFilter& on) const {
  std::vector<Connection> found;
  for (auto& c : to(peer)) {
    if (c->on_nics(on.local_nic, on.remote_nic)) found.push_back(std::move(c));
  }
  if (found.size() <= 1) return found.empty() ? nullptr : found.front();
  // Several NIC pairs and nothing to choose between them: a silent pick could move the
  // bytes over a NIC the caller did not mean (or one whose peer region is another's).
  std::vector<std::string> choices;
  for (const auto& c : found) {
    std::lock_guard lock(c->mu);
    choices.push_back(fmt::format("local_nic={} remote_nic={} ({}, {})", nic_label(c->local_nic),
                                  nic_label(c->remote_nic), c->transport, c->conn_id));
  }
  throw InvalidArgumentError(fmt::format("{} connections to '{}' match; pass local_nic=/remote_nic= to choose one: {}",
                                         found.size(), peer, fmt::join(choices, "; ")));
}

ConnectionTable::Connection ConnectionTable::connected(const std::string& peer, const ConnectionFilter& on) const {
  auto c = select(peer, on);
  if (!c) {
    if (!on.local_nic.empty() || !on.remote_nic.empty()) {
      std::vector<std::string> have;
      for (const auto& other : to(peer)) {
        std::lock_guard lock(other->mu);
        have.push_back(
            fmt::format("local_nic={} remote_nic={}", nic_label(other->local_nic), nic_label(other->remote_nic)));
      }
      if (!have.empty()) {
        throw ConnectionError(fmt::format("no connection to '{}' on local_nic={} remote_nic={} (its connections: {})",
                                          peer, on.local_nic.empty() ? "any" : nic_label(on.local_nic),
                                          on.remote_nic.empty() ? "any" : nic_label(on.remote_nic),
                                          fmt::join(have, "; ")),
                              StatusCode::kNotConnected);
      }
    }
    throw ConnectionError(fmt::format("no connection to '{}'; call connect_to(\"{}\") first", peer, peer),
                          StatusCode::kNotConnected);
  }
  std::lock_guard lock(c->mu);
  if (c->state != "connected") {
    throw ConnectionError(fmt::format("the connection to '{}' is {}{}; wait() on it after connect_to()", peer,
                                      c->state, c->error.empty() ? "" : " (" + c->error + ")"),
                          StatusCode::kNotConnected);
  }
  return c;
}

}  // namespace dlslime
