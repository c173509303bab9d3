#pragma once

#include <functional>
#include <memory>
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

  // Used by the generated list only.
  void add(TransportEntry entry);
  void add_not_built(std::string name, std::string reason);

 private:
  TransportRegistry();
  struct NotBuilt {
    std::string name;
    std::string reason;
  };
  std::vector<TransportEntry> entries_;
  std::vector<NotBuilt> not_built_;
  std::vector<std::string> order_;
};

}  // namespace dlslime
