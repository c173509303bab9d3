// Named remote regions: a peer's region name resolved to a handle in one connection's
// endpoint, from the handshake's mr_info or the peer's NanoCtrl record, cached per
// connection (PeerConnectionState::remote_handles, under the connection's mutex) and
// resolved again when the peer registered the name again.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "agent/peer_connection_state.h"
#include "core/memory_registry.h"
#include "dlslime/endpoint.h"
#include "dlslime/nanoctrl_client.h"

namespace dlslime {

class RemoteRegionsByName {
 public:
  RemoteRegionsByName(NanoCtrlClient& ctrl, std::shared_ptr<MemoryRegistry> local)
      : ctrl_(ctrl), local_(std::move(local)) {}

  // The handle of the peer's region `name` in `c`'s endpoint (cached unless `fresh`: the
  // peer registered the name again; then NanoCtrl is asked). NotFoundError for a name the
  // peer has not published.
  int32_t handle(const std::shared_ptr<PeerConnectionState>& c, const std::string& name, bool fresh);
  // A named batch as handles: local names in the agent's registry, remote ones as handle().
  std::vector<Assignment> resolve(const std::shared_ptr<PeerConnectionState>& c,
                                  const std::vector<NamedAssignment>& named, bool fresh);
  // Every region the peer has published, resolved again; their names. ConnectionError when
  // `c` is not connected.
  std::vector<std::string> sync(const std::shared_ptr<PeerConnectionState>& c);

 private:
  NanoCtrlClient& ctrl_;
  const std::shared_ptr<MemoryRegistry> local_;
};

}  // namespace dlslime
