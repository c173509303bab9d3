#include "dlslime/peer_agent.h"

#include <algorithm>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "agent/connection_table.h"
#include "agent/control_session.h"
#include "agent/local_regions.h"
#include "agent/peer_connection_state.h"
#include "agent/remote_regions_by_name.h"
#include "agent/rendezvous.h"
#include "agent/task_threads.h"
#include "agent/transport_choice.h"
#include "core/log.h"
#include "core/memory_registry.h"
#include "core/op_state.h"
#include "core/transport_registry.h"
#include "dlslime/errors.h"
#include "dlslime/nanoctrl_client.h"

namespace dlslime {

using nlohmann::json;


class PeerAgentImpl : public std::enable_shared_from_this<PeerAgentImpl> {
 public:
  explicit PeerAgentImpl(PeerAgentOptions options);
  ~PeerAgentImpl() { shutdown(); }

  void start();
  void shutdown();
  PeerConnection connect_to(const std::string& peer, const ConnectOptions& options);
  // read/write by region names: resolves and submits on one lookup of the connection.
  // `notification`: a write's (Endpoint::write), sent with whichever attempt succeeds.
  Future named_op(const std::string& peer, const std::vector<NamedAssignment>& named, OpKind kind,
                  const ConnectionFilter& on, std::chrono::milliseconds timeout,
                  std::optional<std::string> notification = std::nullopt);
  int32_t register_region(const std::string& name, uintptr_t addr, uint64_t offset, uint64_t length) {
    return local_.add(name, addr, offset, length);
  }
  void unregister_region(const std::string& name) { local_.remove(name); }
  std::vector<std::string> sync_regions(const std::shared_ptr<PeerConnectionState>& c) { return by_name_.sync(c); }
  std::vector<std::string> local_region_names() const { return local_.names(); }
  // Set once by start(), before any thread of the agent runs; never changed after.
  const std::string& alias() const { return alias_; }
  // The endpoint of the connection `on` selects, if connected; else the error I/O raises.
  std::shared_ptr<Endpoint> endpoint_for_io(const std::string& peer, const ConnectionFilter& on) const {
    return table.connected(peer, on)->ep();
  }

  PeerAgentOptions options;
  NanoCtrlClient ctrl;
  ConnectionTable table;

 private:
  // A named op that failed with an unknown handle, resolved again and submitted once more
  // on the same connection; `outer` completes with that attempt.
  void retry_named(const std::shared_ptr<PeerConnectionState>& c, const std::vector<NamedAssignment>& named,
                   OpKind kind, std::chrono::milliseconds timeout, const std::optional<std::string>& notification,
                   const std::shared_ptr<OpState>& outer, const Status& first);
  // Makes an endpoint through the transport registry (and wrap_endpoint).
  std::shared_ptr<Endpoint> make_endpoint(const std::string& transport, const json& endpoint_options);
  // Closes every connection (shutdown).
  void close_all();

  std::string alias_;
  // What this agent serves and publishes, and how it chooses a transport for a peer.
  const TransportChoice transports_;
  std::shared_ptr<MemoryRegistry> regions_ = std::make_shared<MemoryRegistry>();
  // This agent's regions, published to NanoCtrl.
  LocalRegions local_{ctrl, alias_, regions_, [this] { return table.endpoints(); }};
  // The peers' regions by name, resolved per connection.
  RemoteRegionsByName by_name_{ctrl, regions_};
  // The registration with NanoCtrl and its heartbeat (made by start()).
  std::unique_ptr<ControlSession> session_;
  std::shared_ptr<TaskThreads> tasks_ = std::make_shared<TaskThreads>();
  // The handshakes with peers, over the mailbox.
  Rendezvous rendezvous_{ctrl, table, transports_,
                         [this](const std::string& t, const json& o) { return make_endpoint(t, o); }, tasks_};
};

namespace {

// How long shutdown() waits for peers whose dial to this agent is in flight.
constexpr auto kPeerDialGrace = std::chrono::milliseconds(3000);

// Checked before the control-plane client is made with it: a deadline of 0 or less would
// fail every request at once (the Python binding refuses it too).
std::chrono::milliseconds positive_ctrl_timeout(std::chrono::milliseconds t) {
  if (t.count() <= 0) {
    throw InvalidArgumentError(fmt::format("ctrl_timeout must be positive, not {} ms", t.count()));
  }
  return t;
}

}  // namespace

PeerAgentImpl::PeerAgentImpl(PeerAgentOptions opts)
    : options(std::move(opts)),
      ctrl(options.ctrl_url, options.scope, positive_ctrl_timeout(options.ctrl_timeout), options.ctrl_token),
      transports_(options.transport_options, options.device) {
  if (options.heartbeat_interval.count() < 0) throw InvalidArgumentError("heartbeat_interval must be >= 0");
  if (options.max_connecting == 0) throw InvalidArgumentError("max_connecting must be >= 1");
}

void PeerAgentImpl::start() {
  // What this agent registers with NanoCtrl (its ControlSession adds the alias).
  json body = {{"address", transports_.address()},
               {"metadata", {{"transports", transports_.served()}, {"instance", rendezvous_.instance()}}}};
  session_ = std::make_unique<ControlSession>(
      ctrl, options.heartbeat_interval, [body] { return body; }, [this] { local_.publish_all(); });
  alias_ = session_->start(options.alias);  // a refused registration throws: nothing to clean up
  session_->start_heartbeat();              // its thread may read alias_ (publishing again)
  rendezvous_.start(alias_, weak_from_this());
  DLSLIME_INFO("PeerAgent '{}' registered with {} (scope '{}')", alias_, ctrl.url(), options.scope);
}

std::shared_ptr<Endpoint> PeerAgentImpl::make_endpoint(const std::string& transport, const json& endpoint_options) {
  std::shared_ptr<Endpoint> made = TransportRegistry::instance().make(transport, endpoint_options, regions_);
  std::shared_ptr<Endpoint> ep = made;
  if (options.wrap_endpoint) {
    try {
      ep = options.wrap_endpoint(made);
    } catch (...) {
      made->shutdown();
      throw;
    }
    if (!ep) {
      made->shutdown();
      throw InvalidArgumentError("PeerAgentOptions::wrap_endpoint returned no endpoint");
    }
  }
  return ep;
}

PeerConnection PeerAgentImpl::connect_to(const std::string& peer, const ConnectOptions& o) {
  if (rendezvous_.stopping()) {
    throw ConnectionError("connect_to() on a PeerAgent that was shut down", StatusCode::kCancelled);
  }
  if (peer.empty()) throw InvalidArgumentError("peer alias must be a non-empty string");
  if (peer == alias_) throw InvalidArgumentError(fmt::format("an agent cannot connect to itself ('{}')", peer));
  if (o.transport != "auto") {
    try {
      TransportRegistry::instance().require(o.transport);  // unknown: InvalidArgumentError naming the known ones
    } catch (const NotImplementedError& e) {
      throw NotImplementedError(fmt::format("{}; available here: {}", e.what(), transports_.names()));
    } catch (const InvalidArgumentError& e) {
      throw InvalidArgumentError(fmt::format("{} (or \"auto\")", e.what()));
    }
    if (!transports_.serves(o.transport)) {  // available now, but not when this agent was made (a plug-in)
      throw NotImplementedError(fmt::format("PeerAgent '{}' does not serve transport \"{}\" (it was not available "
                                            "when the agent was made); it serves: {}",
                                            alias_, o.transport, transports_.names()));
    }
  }
  return PeerConnection(rendezvous_.connect(peer, o, options.device, options.max_connecting));
}

namespace {

Future submit_named(Endpoint& ep, std::vector<Assignment> resolved, OpKind kind, std::chrono::milliseconds timeout,
                    const std::optional<std::string>& notification) {
  return kind == OpKind::kRead ? ep.read(std::move(resolved), timeout)
                               : ep.write(std::move(resolved), timeout, notification);
}

}  // namespace

Future PeerAgentImpl::named_op(const std::string& peer, const std::vector<NamedAssignment>& named, OpKind kind,
                               const ConnectionFilter& on, std::chrono::milliseconds timeout,
                               std::optional<std::string> notification) {
  // One lookup: the handles are resolved in this connection's remote table, so they must
  // be submitted on this connection's endpoint, even if a reconnect replaces it meanwhile.
  auto c = table.connected(peer, on);
  // A failed write sends no notification (the fence drops it): the retry sends it.
  Future first = submit_named(*c->ep(), by_name_.resolve(c, named, /*fresh=*/false), kind, timeout, notification);
  // An unknown handle means the peer registered a name again (a new buffer, a new handle)
  // since we cached it: resolve once more from NanoCtrl and retry once, off the I/O thread
  // that completes `first` (resolving is an HTTP call).
  auto outer = std::make_shared<OpState>(kind);
  std::weak_ptr<PeerAgentImpl> weak = weak_from_this();
  std::shared_ptr<TaskThreads> tasks = tasks_;
  // Future::cancel cancels the op on the endpoint (the retry's, once there is one).
  auto cancel = forward_cancel(*outer, first.state());
  first.state()->on_complete([weak, tasks, c, named, kind, timeout, outer, cancel,
                              notification = std::move(notification)](const OpState& done) {
    const Status status = done.status();
    if (status.code() != StatusCode::kUnknownHandle) {
      outer->complete(status, done.nbytes());
      return;
    }
    const bool spawned = tasks->spawn([weak, c, named, kind, timeout, outer, status, notification] {
      if (auto self = weak.lock()) {
        self->retry_named(c, named, kind, timeout, notification, outer, status);
      } else {
        outer->complete(status);
      }
    });
    if (!spawned) outer->complete(status);  // the agent is shutting down
  });
  return Future(outer);
}

void PeerAgentImpl::retry_named(const std::shared_ptr<PeerConnectionState>& c,
                                const std::vector<NamedAssignment>& named, OpKind kind,
                                std::chrono::milliseconds timeout, const std::optional<std::string>& notification,
                                const std::shared_ptr<OpState>& outer, const Status& first) {
  try {
    Future again =
        submit_named(*c->ep(), by_name_.resolve(c, named, /*fresh=*/true), kind, timeout, notification);
    auto cancel = forward_cancel(*outer, again.state());
    again.state()->on_complete(
        [outer, cancel](const OpState& done) { outer->complete(done.status(), done.nbytes()); });
  } catch (const Error& e) {
    outer->complete(Status(e.code(), fmt::format("{} (resolving again after: {})", e.what(), first.message())));
  } catch (const std::exception& e) {
    outer->complete(Status::failed(fmt::format("{} (resolving again after: {})", e.what(), first.message())));
  }
}

void PeerAgentImpl::close_all() {
  for (const auto& c : table.take_all()) c->close("this agent shut down");
}

void PeerAgentImpl::shutdown() {
  if (rendezvous_.stopping()) return;
  rendezvous_.wait_for_peer_dials(kPeerDialGrace);
  if (!rendezvous_.stop()) return;
  // The heartbeat first: one still running could register us again after cleanup.
  if (session_) session_->stop();
  // Endpoints first: the peers see the goodbye and fail their pending ops at once (and
  // handshakes dialling now end).
  close_all();
  if (session_) session_->leave();  // only a registration of ours
  rendezvous_.join();
  tasks_->close();
  close_all();  // any the mailbox thread made while stopping
  table.shut_down_departed_endpoints(true);
}

// ---------------------------------------------------------------------------------------

PeerAgent::PeerAgent(PeerAgentOptions options) : impl_(std::make_shared<PeerAgentImpl>(std::move(options))) {
  impl_->start();
}

PeerAgent::~PeerAgent() { impl_->shutdown(); }

const std::string& PeerAgent::alias() const { return impl_->alias(); }
const std::string& PeerAgent::scope() const { return impl_->options.scope; }
const std::string& PeerAgent::ctrl_url() const { return impl_->ctrl.url(); }

int32_t PeerAgent::register_memory_region(const std::string& name, uintptr_t addr, uint64_t offset,
                                          uint64_t length) {
  return impl_->register_region(name, addr, offset, length);
}

void PeerAgent::unregister_memory_region(const std::string& name) { impl_->unregister_region(name); }

PeerConnection PeerAgent::connect_to(const std::string& peer_alias, const ConnectOptions& options) {
  return impl_->connect_to(peer_alias, options);
}

std::optional<PeerConnection> PeerAgent::connection(const std::string& peer_alias, const ConnectionFilter& on) const {
  auto c = impl_->table.select(peer_alias, on);
  if (!c) return std::nullopt;
  return PeerConnection(c);
}

std::vector<PeerConnection> PeerAgent::connections(const std::string& peer_alias) const {
  std::vector<PeerConnection> out;
  for (auto& c : impl_->table.to(peer_alias)) out.emplace_back(std::move(c));
  return out;
}

std::vector<std::string> PeerAgent::peers() const { return impl_->table.peers(); }

std::vector<std::string> PeerConnection::sync_memory_regions() const {
  auto agent = state_->agent.lock();
  if (!agent) throw ConnectionError("sync_memory_regions(): the agent of this connection is gone", StatusCode::kNotConnected);
  return agent->sync_regions(state_);
}

std::vector<std::string> PeerAgent::list_agents() const {
  std::vector<std::string> out;
  for (const auto& a : impl_->ctrl.query()) {
    if (a.is_object() && a.contains("name") && a["name"].is_string()) out.push_back(a["name"].get<std::string>());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<nlohmann::json> PeerAgent::agent_record(const std::string& alias) const {
  return impl_->ctrl.get_peer_agent(alias);
}

std::optional<nlohmann::json> PeerAgent::get_mr_info(const std::string& peer, const std::string& name) const {
  return impl_->ctrl.get_mr_info(peer, name);
}

std::vector<std::string> PeerAgent::local_region_names() const { return impl_->local_region_names(); }

std::vector<std::string> PeerAgent::sync_memory_regions(const std::string& peer, const ConnectionFilter& on) {
  return impl_->sync_regions(impl_->table.connected(peer, on));
}

Future PeerAgent::send(const std::string& peer, const Chunk& chunk, const ConnectionFilter& on,
                       std::chrono::milliseconds timeout) {
  return impl_->endpoint_for_io(peer, on)->send(chunk, timeout);
}

Future PeerAgent::recv(const std::string& peer, const Chunk& chunk, const ConnectionFilter& on, bool exact_size,
                       std::chrono::milliseconds timeout) {
  return impl_->endpoint_for_io(peer, on)->recv(chunk, exact_size, timeout);
}

Future PeerAgent::read(const std::string& peer, std::vector<Assignment> assignments, const ConnectionFilter& on,
                       std::chrono::milliseconds timeout) {
  return impl_->endpoint_for_io(peer, on)->read(std::move(assignments), timeout);
}

Future PeerAgent::write(const std::string& peer, std::vector<Assignment> assignments, const ConnectionFilter& on,
                        std::chrono::milliseconds timeout, std::optional<std::string> notification) {
  return impl_->endpoint_for_io(peer, on)->write(std::move(assignments), timeout, std::move(notification));
}

Future PeerAgent::read(const std::string& peer, const std::vector<NamedAssignment>& assignments,
                       const ConnectionFilter& on, std::chrono::milliseconds timeout) {
  return impl_->named_op(peer, assignments, OpKind::kRead, on, timeout);
}

Future PeerAgent::write(const std::string& peer, const std::vector<NamedAssignment>& assignments,
                        const ConnectionFilter& on, std::chrono::milliseconds timeout,
                        std::optional<std::string> notification) {
  return impl_->named_op(peer, assignments, OpKind::kWrite, on, timeout, std::move(notification));
}

Future PeerAgent::write_with_imm(const std::string& peer, std::vector<Assignment> assignments, uint32_t imm_data,
                                 const ConnectionFilter& on, std::chrono::milliseconds timeout) {
  return impl_->endpoint_for_io(peer, on)->write_with_imm(std::move(assignments), imm_data, timeout);
}

Future PeerAgent::imm_recv(const std::string& peer, const ConnectionFilter& on, std::chrono::milliseconds timeout) {
  return impl_->endpoint_for_io(peer, on)->imm_recv(timeout);
}

Future PeerAgent::send_notify(const std::string& peer, std::string notification, const ConnectionFilter& on,
                              std::chrono::milliseconds timeout) {
  return impl_->endpoint_for_io(peer, on)->send_notify(std::move(notification), timeout);
}

Future PeerAgent::recv_notify(const std::string& peer, const ConnectionFilter& on, std::chrono::milliseconds timeout) {
  return impl_->endpoint_for_io(peer, on)->recv_notify(timeout);
}

void PeerAgent::shutdown() { impl_->shutdown(); }

}  // namespace dlslime
