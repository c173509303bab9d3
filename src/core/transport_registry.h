#pragma once

#include <deque>
#include <functional>
#include <shared_mutex>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/memory_registry.h"
#include "dlslime/endpoint.h"
#include "dlslime/export.h"
#include "dlslime/transport.h"

namespace dlslime {

// What a transport's probe reports: whether it can run here, and why not.
struct TransportProbe {
  bool available = false;
  std::string reason;                // empty when available
  std::vector<std::string> devices;  // the devices it would use
};

// One usable port of a transport's device (what PeerAgents publish, and compare for
// transport="auto"): the device, its port number and its link layer ("Ethernet",
// "InfiniBand").
struct TransportPort {
  std::string device;
  int port = 1;
  std::string link_layer;
  bool operator==(const TransportPort&) const = default;
};

// What a transport tells PeerAgent (src/agent/), so that the agent needs no transport's name:
// what to publish about this host, whether it reaches a peer, and the options of the
// endpoints it makes on each side. Every hook is optional; an entry without them is served
// with its factory's defaults, reaches every peer that serves it, and ranks lowest.
//
// `settings` are the transport's agent-wide options (PeerAgentOptions::transport_options
// under its name, after configure()); `request` is connect_to()'s options as JSON
// (ConnectOptions::to_json(): local_host, local_port, ib_port, qp_num, local_device,
// peer_device), each transport reading the keys it knows.
struct TransportReach {
  bool ok = false;
  std::string reason;  // ok: how ("both agents serve RoCE (...)"); not ok: why not
  // False where the peer's record does not say (an agent from before this was published): an
  // explicit connect_to tries it, "auto" does not take it.
  bool checked = true;
  nlohmann::json request;  // the request with what the transport chose in it (its devices)
};

// What reach() compares: this agent's settings and published entry (`mine`), the peer's
// published entry (`theirs`: null when its record does not list its transports), and the
// request. `peer` and `host` (this agent's address) are for the reason's words.
struct ReachQuery {
  const nlohmann::json& settings;
  const nlohmann::json& mine;
  const nlohmann::json& theirs;
  const nlohmann::json& request;
  const std::string& peer;
  const std::string& host;
};

struct AgentHooks {
  // transport="auto" takes the reaching transport of highest rank.
  int rank = 0;
  // Validates the settings and returns them complete (defaults filled in); `device` is the
  // agent's PeerAgentOptions::device. Throws InvalidArgumentError naming what is wrong.
  std::function<nlohmann::json(const nlohmann::json& settings, const std::string& device)> configure;
  // What this agent publishes for the transport besides "name" and "devices".
  std::function<nlohmann::json(const nlohmann::json& settings)> advertise;
  // Whether the transport connects this agent to the peer for `request` (ReachQuery).
  std::function<TransportReach(const ReachQuery& query)> reach;
  // The factory options of connect_to's endpoint.
  std::function<nlohmann::json(const nlohmann::json& settings, const nlohmann::json& request)> active_options;
  // What the peer is told to make its side with (the connection's shape).
  std::function<nlohmann::json(const nlohmann::json& settings, const nlohmann::json& request)> peer_options;
  // The factory options of the endpoint made for a peer's connect message, from what it sent
  // (peer_options() of its side: anyone may post a message, so only those keys are taken).
  std::function<nlohmann::json(const nlohmann::json& settings, const nlohmann::json& from_peer)> passive_options;
  // The address this agent publishes in its NanoCtrl record, where the transport has one.
  std::function<std::string(const nlohmann::json& settings)> address;
};

// What each transport registers from its own folder (src/<name>/<name>_transport.cpp):
// its name, a probe, and a factory. The factory builds an endpoint from the transport's
// options (JSON; unknown keys rejected) over `memory`, the agent-wide registry of named
// memory its regions are shared with (a fresh one for a standalone endpoint). `ports`, for
// a transport whose devices have ports (RDMA), lists every active one without making an
// endpoint (no PD, CQ or QP); empty for the others.
struct TransportEntry {
  std::string name;
  std::function<TransportProbe()> probe;
  std::function<std::shared_ptr<Endpoint>(const nlohmann::json& options, std::shared_ptr<MemoryRegistry> memory)>
      make;
  std::function<std::vector<TransportPort>()> ports;
  AgentHooks agent;
  // For a transport with device memory of its own, outside the GPU runtime (an NPU's): where
  // [start, +length) lives when it is that memory (kDevice, its device), nullopt when none of
  // it is; InvalidArgumentError when part of it is, or it runs past its allocation. The
  // registry asks it for every region, as it asks the GPU runtime (memory_place_of), so no
  // transport mistakes such memory for host memory (add_device_memory_probe, done when the
  // entry is added). Must be cheap: sends ask it per buffer.
  std::function<std::optional<MemoryPlace>(uintptr_t start, uint64_t length)> device_memory;
};

// The transports of this build. Filled once, before first use, from the list CMake
// generates (transports_builtin.cpp: one call per built transport, and a "not built"
// entry for the others), so no static-initialisation order or linker dead-stripping can
// lose one. Thread-safe (read-only after construction).
class DLSLIME_API TransportRegistry {
 public:
  static const TransportRegistry& instance();

  // Built or not, in registration order.
  std::vector<TransportInfo> list() const;
  // nullptr if `name` is not a built transport.
  const TransportEntry* find(const std::string& name) const;
  // Throws InvalidArgumentError (unknown name: lists the known ones) or
  // NotImplementedError (not built, or its probe says unavailable: gives the reason).
  const TransportEntry& require(const std::string& name) const;
  std::shared_ptr<Endpoint> make(const std::string& name, const nlohmann::json& options,
                                 std::shared_ptr<MemoryRegistry> memory) const;
  // The active ports of `name`'s devices (TransportEntry::ports); empty for a transport
  // without ports, one that is not built or not available here. Never throws: a port
  // listing that fails is logged and lists nothing.
  std::vector<TransportPort> ports(const std::string& name) const;

  // Adds a transport at run time (a plug-in, or one a test defines), after the built-in
  // ones; PeerAgents made afterwards serve it where its probe says it is available.
  // InvalidArgumentError for a name that is taken or an entry without a probe or factory.
  static void register_transport(TransportEntry entry);

  // Used by the generated list only.
  void add(TransportEntry entry);
  void add_not_built(std::string name, std::string reason);

 private:
  TransportRegistry();
  static TransportRegistry& mutable_instance();
  struct NotBuilt {
    std::string name;
    std::string reason;
  };
  // Entries are never removed or moved (a deque): find()'s pointers stay valid while
  // register_transport() adds more. mu_ guards the containers, not the entries.
  mutable std::shared_mutex mu_;
  std::deque<TransportEntry> entries_;
  std::vector<NotBuilt> not_built_;
  std::vector<std::string> order_;
};

}  // namespace dlslime
