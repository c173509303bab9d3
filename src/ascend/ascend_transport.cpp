// The Ascend transport's entry in the transport registry (core/transport_registry.h): the
// probe is the vendor seam's (available with the CANN library and an NPU, or with
// DLSLIME_ASCEND_SIM=1; else its reason, which names both); the factory builds an
// AscendDirectEndpoint from AscendOptions' keys; PeerAgent reaches it through the hooks
// below alone.
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ascend/hixl_engine.h"
#include "ascend/npu_memory.h"
#include "core/record_fields.h"
#include "core/transport_registry.h"
#include "dlslime/ascend_endpoint.h"
#include "dlslime/errors.h"

namespace dlslime {

struct AscendTransport {
  static std::shared_ptr<Endpoint> make(const nlohmann::json& options, std::shared_ptr<MemoryRegistry> memory) {
    return std::shared_ptr<Endpoint>(new AscendDirectEndpoint(AscendOptions::from_json(options), std::move(memory)));
  }
};

namespace {

TransportProbe probe_ascend() {
  TransportProbe probe;
  probe.reason = ascend::unavailable_reason();
  if (probe.reason.empty()) {
    try {
      ascend::NpuMemory& npu = ascend::npu_memory();
      for (int d = 0; d < npu.device_count(); ++d) probe.devices.push_back(fmt::format("{}:{}", npu.name(), d));
    } catch (const std::exception& e) {
      probe.reason = e.what();
    }
  }
  probe.available = probe.reason.empty();
  return probe;
}

std::string host_boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

// The agent's Ascend settings: AscendOptions' keys, with the device the agent was given
// where the settings name none.
nlohmann::json ascend_settings(const nlohmann::json& settings, const std::string& device) {
  nlohmann::json s = settings.is_null() ? nlohmann::json::object() : settings;
  if (!s.contains("device") && !device.empty() && device.find_first_not_of("0123456789") == std::string::npos) {
    s["device"] = std::stoi(device);
  }
  const AscendOptions o = AscendOptions::from_json(s);
  if (o.device >= ascend::npu_memory().device_count()) {
    throw InvalidArgumentError(fmt::format("ascend device {} is not an NPU of this process (the {} runtime has {})",
                                           o.device, ascend::npu_memory().name(), ascend::npu_memory().device_count()));
  }
  nlohmann::json j = o.to_json();
  j.erase("port");  // each endpoint picks its own
  return j;
}

// What "auto" compares: the runtime ("acl" or "sim": the two cannot reach each other) and,
// for the simulation (which moves bytes between processes of one host), the host's boot id.
nlohmann::json ascend_advertise(const nlohmann::json& settings) {
  return {{"runtime", ascend::npu_memory().name()}, {"host", host_boot_id()}, {"device", settings.at("device")}};
}

TransportReach ascend_reach(const ReachQuery& q) {
  TransportReach r{false, "", true, q.request};
  if (!q.theirs.is_object()) {
    r.reason = fmt::format("the peer agent '{}' does not serve it", q.peer);
    return r;
  }
  const std::string runtime = text_field(q.mine, "runtime");
  if (text_field(q.theirs, "runtime") != runtime) {
    const std::string other = text_field(q.theirs, "runtime");
    r.reason = fmt::format("the peer agent '{}' uses the {} NPU runtime, this agent the {} one", q.peer,
                           other.empty() ? "unknown" : other, runtime);
    return r;
  }
  if (runtime == "sim" && text_field(q.theirs, "host") != text_field(q.mine, "host")) {
    r.reason = fmt::format("the peer agent '{}' is on another host, and the simulated HIXL links processes of one host",
                           q.peer);
    return r;
  }
  r.ok = true;
  r.reason = fmt::format("both agents serve it ({} HIXL, NPU {})", runtime == "sim" ? "the simulated" : "CANN's",
                         int_field(q.mine, "device").value_or(0));
  return r;
}

// NPU memory, for the registry (TransportEntry::device_memory): only where an NPU runtime is
// usable, and cheaply (a send asks it per buffer): the simulation is chosen per call by its
// variable, the CANN runtime's availability is settled once.
std::optional<MemoryPlace> npu_memory_place(uintptr_t start, uint64_t length) {
  if (!ascend::sim_selected()) {
    static const bool usable = ascend::library_unavailable_reason().empty();
    if (!usable) return std::nullopt;
  }
  if (ascend::npu_memory().classify(start, length) != ascend::MemType::kDevice) return std::nullopt;
  return MemoryPlace{MemoryKind::kNpu, 0};
}

nlohmann::json ascend_endpoint_options(const nlohmann::json& settings, const nlohmann::json&) { return settings; }

}  // namespace

void register_ascend_transport(TransportRegistry& registry) {
  TransportEntry entry;
  entry.name = "ascend";
  entry.probe = &probe_ascend;
  entry.make = &AscendTransport::make;
  entry.agent.rank = 250;  // NPU memory without a host copy; below NVLink, which is GPU-only
  entry.agent.configure = &ascend_settings;
  entry.agent.advertise = &ascend_advertise;
  entry.agent.reach = &ascend_reach;
  entry.agent.active_options = &ascend_endpoint_options;
  entry.agent.passive_options = &ascend_endpoint_options;
  entry.device_memory = &npu_memory_place;
  registry.add(std::move(entry));
}

}  // namespace dlslime
