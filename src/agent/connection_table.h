// ConnectionTable: a PeerAgent's connections by peer alias, with the ones whose peer has
// left (for a connect_to() that comes after) and the endpoints of connections closed by a
// peer's cleanup (until their transport has seen the loss). It matches a peer's handshake
// message to its connection and selects a connection by NIC pair for I/O. Its mutex guards
// the table only: each connection's fields are under the connection's own mutex, which
// may be taken inside the table's, never the other way round.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "agent/peer_connection_state.h"

namespace dlslime {

class ConnectionTable {
 public:
  using Connection = std::shared_ptr<PeerConnectionState>;
  using Predicate = std::function<bool(const Connection&)>;

  // "a->b#3": a new connection id, unique within this table.
  std::string next_id(const std::string& alias, const std::string& peer);

  // The connections to `peer`, in the order they were made.
  std::vector<Connection> to(const std::string& peer) const;
  std::vector<Connection> all() const;
  // The aliases with at least one connection, sorted.
  std::vector<std::string> peers() const;
  // (incarnation, endpoint) of every connection with an endpoint.
  std::vector<std::pair<std::string, std::shared_ptr<Endpoint>>> endpoints() const;
  // Whether some connection is still handshaking.
  bool any_connecting() const;

  // The connection a peer's connect message belongs to: the one it answers (to_incarnation),
  // the one with its incarnation, else one of its transport on a NIC pair it can be on
  // (unpaired first). Null when none.
  Connection match(const std::string& peer, const std::string& transport, const json& msg, const std::string& local,
                   const std::string& remote) const;
  // The connection match() finds, or `made` added as the peer's (in one step: connect_to()
  // may add one meanwhile). Null once take_all() has run (the agent is shutting down).
  Connection match_or_add(const std::string& peer, const std::string& transport, const json& msg,
                          const std::string& local, const std::string& remote, const Connection& made);
  // A live connection to `peer` that `same_link` accepts, or `made` added as the peer's.
  Connection live_or_add(const std::string& peer, const Predicate& same_link, const Connection& made);

  // What connect_to() finds for `peer` on a link `same_link` accepts.
  struct Lookup {
    Connection existing;         // alive, or failed on the token: connect_to() returns it
    std::vector<Connection> stale;  // taken out of the table: the caller closes them
    Connection departed;         // the latest completed one whose peer has left
    size_t connecting = 0;       // connect_to() attempts (not passive) handshaking now
  };
  Lookup lookup(const std::string& peer, const Predicate& same_link);

  void erase(const Connection& c);
  // Forgets a connection (a failed passive one, or one the caller gave up) and fails it.
  void drop(const Connection& c, const std::string& why);
  // The peer of `c` left: out of the table, and kept for a later connect_to() if its
  // handshake had completed. Its endpoint stays up until its transport has seen the loss
  // (or `grace` passed): what the peer answered before it left (the acknowledgement of our
  // last send) still completes those ops instead of being cancelled by our shutdown.
  void depart(const Connection& c, const std::string& why, std::chrono::milliseconds grace);
  // Forgets the departed connections to `peer` (its alias was registered again).
  void forget_departed(const std::string& peer);
  // Shuts down the endpoints depart() left whose transport has seen the loss or whose grace
  // has passed; all of them with `all`. Returns whether some are left.
  bool shut_down_departed_endpoints(bool all);
  // Empties the table (shutdown): its connections, for the caller to close.
  std::vector<Connection> take_all();

  // The one connection to `peer` that `on` selects; null for none; InvalidArgumentError
  // naming them for several.
  Connection select(const std::string& peer, const ConnectionFilter& on) const;
  // The connection `on` selects if it can take ops (connected), else the error I/O raises.
  Connection connected(const std::string& peer, const ConnectionFilter& on) const;

 private:
  void erase_locked(const Connection& c);
  Connection match_locked(const std::string& peer, const std::string& transport, const json& msg,
                          const std::string& local, const std::string& remote) const;

  mutable std::mutex mu_;
  // peer alias -> its connections (several on different NIC pairs), in the order made.
  std::multimap<std::string, Connection> conns_;
  // Connections whose handshake completed and whose peer then left (its cleanup).
  std::multimap<std::string, Connection> departed_;
  // Endpoints of connections closed by a peer's cleanup, and until when they may wait.
  std::vector<std::pair<std::shared_ptr<Endpoint>, std::chrono::steady_clock::time_point>> lingering_;
  bool closed_ = false;  // take_all() ran: nothing is added any more
  uint64_t next_conn_ = 0;
};

}  // namespace dlslime
