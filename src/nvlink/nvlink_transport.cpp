// The NVLink transport's entry in the transport registry (core/transport_registry.h). The
// probe is the device runtime's: available with a GPU (or DLSLIME_GPU_SIM=1), else the
// runtime's reason, which names the GPU and DLSLIME_GPU_SIM; the factory builds an
// NVLinkEndpoint from NvlinkOptions' keys.
#include <fstream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/record_fields.h"
#include "core/transport_registry.h"
#include "dlslime/errors.h"
#include "dlslime/nvlink_endpoint.h"
#include "gpu/device_runtime.h"

namespace dlslime {

struct NvlinkTransport {
  static std::shared_ptr<Endpoint> make(const nlohmann::json& options, std::shared_ptr<MemoryRegistry> memory) {
    return std::shared_ptr<Endpoint>(new NVLinkEndpoint(NvlinkOptions::from_json(options), std::move(memory)));
  }
};

namespace {

TransportProbe probe_nvlink() {
  TransportProbe probe;
  probe.reason = gpu::unavailable_reason();
  probe.available = probe.reason.empty();
  if (probe.available) {
    gpu::Runtime& rt = gpu::runtime();
    for (int d = 0; d < rt.device_count(); ++d) probe.devices.push_back(fmt::format("{}:{}", rt.name(), d));
  }
  return probe;
}

// --- what PeerAgent needs (core/transport_registry.h, AgentHooks) --------------------------

// The GPU (an ordinal of this process's runtime) the agent's NVLink endpoints copy with and
// map peers' memory on, connect_to's and the passive side's alike: {"device": 0} by default.
nlohmann::json nvlink_settings(const nlohmann::json& settings, const std::string&) {
  for (const auto& [key, value] : settings.items()) {
    if (key != "device") throw InvalidArgumentError(fmt::format("unknown nvlink agent option '{}' (known: device)", key));
  }
  const nlohmann::json device = settings.value("device", nlohmann::json(0));
  gpu::Runtime& rt = gpu::runtime();  // available: the agent configures served transports only
  if (!device.is_number_integer() || device.get<int64_t>() < 0 || device.get<int64_t>() >= rt.device_count()) {
    throw InvalidArgumentError(fmt::format("nvlink device {} is not a GPU of this process (the {} runtime has {})",
                                           device.dump(), rt.name(), rt.device_count()));
  }
  return {{"device", device}};
}

// The same file NVLinkEndpoint::connect compares ("the same host"); "" where it cannot be read.
std::string host_boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

// What "auto" compares: the host's boot id, the GPU runtime ("cuda" or "sim": the two cannot
// open each other's handles), the agent's GPU, its UUID and the UUIDs of the GPUs it can
// access (peer access; itself included). UUIDs, not device numbers, because two processes
// may number one GPU differently (CUDA_VISIBLE_DEVICES); a GPU this process cannot see is
// not in `reaches`, as CUDA IPC cannot open its memory here either.
nlohmann::json nvlink_advertise(const nlohmann::json& settings) {
  gpu::Runtime& rt = gpu::runtime();
  const int device = settings.at("device").get<int>();
  nlohmann::json reaches = nlohmann::json::array();
  for (int d = 0; d < rt.device_count(); ++d) {
    if (rt.can_access_peer(device, d)) reaches.push_back(rt.device_uuid(d));
  }
  return {{"host", host_boot_id()},
          {"runtime", rt.name()},
          {"device", device},
          {"uuid", rt.device_uuid(device)},
          {"reaches", std::move(reaches)}};
}

// Reaches a peer on this host (the boot id) with the same GPU runtime, when each GPU's UUID
// is in the other's `reaches` (peer access both ways: each side opens the other's memory).
// Both sides compare the same two entries, so they agree. A peer entry without `uuid` and
// `reaches` (an agent from before they were published) is taken to reach, unchecked.
TransportReach nvlink_reach(const ReachQuery& q) {
  const nlohmann::json& mine = q.mine;
  const nlohmann::json& theirs = q.theirs;
  const std::string& peer = q.peer;
  TransportReach r{false, "", true, q.request};
  if (!theirs.is_object()) {
    r.reason = fmt::format("the peer agent '{}' does not serve it", peer);
    return r;
  }
  const std::string boot = text_field(mine, "host");
  if (boot.empty() || text_field(theirs, "host") != boot) {
    r.reason = fmt::format("the peer agent '{}' is on another host", peer);
    return r;
  }
  const std::string runtime = text_field(mine, "runtime");
  if (text_field(theirs, "runtime") != runtime) {
    const std::string other = text_field(theirs, "runtime");
    r.reason = fmt::format("the peer agent '{}' uses the {} GPU runtime, this agent the {} one", peer,
                           other.empty() ? "unknown" : other, runtime);
    return r;
  }
  const bool checked = theirs.contains("uuid") || theirs.contains("reaches");
  if (checked) {
    auto reaches = [](const nlohmann::json& entry, const std::string& uuid) {
      if (!entry.contains("reaches") || !entry["reaches"].is_array()) return false;
      for (const auto& u : entry["reaches"]) {
        if (u.is_string() && u.get<std::string>() == uuid) return true;
      }
      return false;
    };
    const std::string my_uuid = text_field(mine, "uuid");
    const std::string their_uuid = text_field(theirs, "uuid");
    if (their_uuid.empty() || !theirs.contains("reaches") || !theirs["reaches"].is_array()) {
      r.reason = fmt::format("the peer agent '{}' publishes no valid GPU uuid and reaches", peer);
      return r;
    }
    auto short_id = [](const std::string& uuid) { return uuid.substr(0, 8); };
    if (!reaches(mine, their_uuid)) {
      r.reason = fmt::format("GPU {} cannot access GPU {} of '{}'", short_id(my_uuid), short_id(their_uuid), peer);
      return r;
    }
    if (!reaches(theirs, my_uuid)) {
      r.reason = fmt::format("GPU {} of '{}' cannot access GPU {}", short_id(their_uuid), peer, short_id(my_uuid));
      return r;
    }
  }
  const int64_t here = int_field(mine, "device").value_or(0);
  const std::optional<int64_t> there = int_field(theirs, "device");
  r.ok = true;
  r.reason = fmt::format("both agents on host {}, GPU {} -> GPU {} via {}{}", q.host, here,
                         there ? std::to_string(*there) : "?",
                         runtime == "sim" ? "the simulated GPU's IPC" : "CUDA IPC",
                         checked || there == here ? "" : " (peer access between the GPUs is not checked)");
  return r;
}

nlohmann::json nvlink_endpoint_options(const nlohmann::json& settings, const nlohmann::json&) { return settings; }

}  // namespace

void register_nvlink_transport(TransportRegistry& registry) {
  TransportEntry entry;
  entry.name = "nvlink";
  entry.probe = &probe_nvlink;
  entry.make = &NvlinkTransport::make;
  entry.agent.rank = 300;  // GPU to GPU on one host, no NIC or host memory in the way
  entry.agent.configure = &nvlink_settings;
  entry.agent.advertise = &nvlink_advertise;
  entry.agent.reach = &nvlink_reach;
  entry.agent.active_options = &nvlink_endpoint_options;
  entry.agent.passive_options = &nvlink_endpoint_options;
  registry.add(std::move(entry));
}

}  // namespace dlslime
