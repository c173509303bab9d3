#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "dlslime/endpoint.h"
#include "dlslime/export.h"

namespace dlslime {

// One transport this library knows, and whether it can be used on this host now.
// Every transport the project has is listed, built or not, so a user learns why one is
// missing ("not built: configure with -DBUILD_RDMA=ON", "no RDMA device found").
struct DLSLIME_API TransportInfo {
  std::string name;        // "tcp", "rdma", "nvlink", "ascend"
  bool built = false;      // compiled into this library
  bool available = false;  // built and its probe found what it needs
  std::string reason;      // why it is not available; empty when it is
  std::vector<std::string> devices;  // what it would use (NICs, GPUs); empty for tcp
};

// Every transport, in a fixed order (tcp first), with its probe's result. Probes are cheap
// and side-effect free (no device is opened for longer than the query).
DLSLIME_API std::vector<TransportInfo> available_transports();

// Makes an endpoint of `transport` from its options as JSON (the keys of the transport's
// options struct, e.g. TcpOptions::to_json(); unknown keys are rejected). Throws
// InvalidArgumentError for an unknown transport or a bad option, and NotImplementedError
// naming the reason for a transport that is not built or not available here.
DLSLIME_API std::shared_ptr<Endpoint> make_endpoint(const std::string& transport, const nlohmann::json& options);

}  // namespace dlslime
