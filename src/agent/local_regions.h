// The agent's own regions: registered in the memory registry every connection's endpoint
// shares, and published to NanoCtrl so peers can resolve them by name. A region's record is
// the owner-resolved entry, plus each endpoint's own entry where it differs (an RDMA
// endpoint's rkey is its own PD's), keyed by the endpoint's incarnation, so a peer resolves
// the name for the endpoint it is connected to. Publishing is per region: one name's entries
// only (O(connections x log regions)).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/memory_registry.h"
#include "dlslime/endpoint.h"
#include "dlslime/nanoctrl_client.h"

namespace dlslime {

class LocalRegions {
 public:
  // (incarnation, endpoint) of each connection of the agent that has an endpoint.
  using Endpoints = std::function<std::vector<std::pair<std::string, std::shared_ptr<Endpoint>>>()>;

  // `owner`: the agent's alias, set before the first call here.
  LocalRegions(NanoCtrlClient& ctrl, const std::string& owner, std::shared_ptr<MemoryRegistry> regions,
               Endpoints endpoints)
      : ctrl_(ctrl), owner_(owner), regions_(std::move(regions)), endpoints_(std::move(endpoints)) {}

  // Registers and publishes; a region NanoCtrl refused is not kept.
  int32_t add(const std::string& name, uintptr_t addr, uint64_t offset, uint64_t length);
  void remove(const std::string& name);
  // Every region again (after NanoCtrl forgot the agent).
  void publish_all();
  std::vector<std::string> names() const;

 private:
  nlohmann::json record(const std::string& name) const;

  NanoCtrlClient& ctrl_;
  const std::string& owner_;
  const std::shared_ptr<MemoryRegistry> regions_;
  const Endpoints endpoints_;
};

}  // namespace dlslime
