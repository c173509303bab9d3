#include "bench_session.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "dlslime/errors.h"
#ifdef DLSLIME_BENCH_RDMA
#include "dlslime/rdma_endpoint.h"
#endif
#ifdef DLSLIME_BENCH_NVLINK
#include "dlslime/nvlink_endpoint.h"
#endif
#ifdef DLSLIME_BENCH_ASCEND
#include "dlslime/ascend_endpoint.h"
#endif
#include "dlslime/tcp_endpoint.h"
#include "dlslime/transport.h"
#include "gpu/device_runtime.h"

namespace dlslime::bench {

PeerLink::PeerLink(ControlChannel channel, double timeout_s, std::string peer_name)
    : channel_(std::move(channel)), timeout_(timeout_s), peer_name_(std::move(peer_name)) {}

Clock::time_point PeerLink::deadline() const {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout_);
}

nlohmann::json PeerLink::next() {
  if (!stash_.empty()) {
    auto msg = std::move(stash_.front());
    stash_.pop_front();
    return msg;
  }
  try {
    return channel_.receive(deadline());
  } catch (const ControlError& e) {
    throw BenchFailure(fmt::format("{}: {}", peer_name_, e.what()));
  }
}

void PeerLink::peer_aborted(const nlohmann::json& msg) {
  throw BenchFailure(fmt::format("the {} failed: {}", peer_name_, msg.value("reason", std::string("no reason given"))));
}

nlohmann::json PeerLink::expect(const std::string& type) {
  nlohmann::json msg = next();
  const std::string got = msg.value("type", std::string());
  if (got == "abort") peer_aborted(msg);
  if (got != type) {
    throw BenchFailure(fmt::format("protocol error: expected '{}' from the {}, got '{}'", type, peer_name_, got));
  }
  return msg;
}

nlohmann::json PeerLink::expect_any() {
  nlohmann::json msg = next();
  if (msg.value("type", std::string()) == "abort") peer_aborted(msg);
  return msg;
}

void PeerLink::check_abort() {
  std::optional<nlohmann::json> msg;
  try {
    msg = channel_.poll();
  } catch (const ControlError& e) {
    throw BenchFailure(fmt::format("{}: {}", peer_name_, e.what()));
  }
  if (!msg) return;
  if (msg->value("type", std::string()) == "abort") peer_aborted(*msg);
  stash_.push_back(std::move(*msg));
}

void PeerLink::abort(const std::string& reason) noexcept {
  try {
    channel_.send({{"type", "abort"}, {"reason", reason}});
  } catch (...) {
  }
}

void PeerLink::wait(const Future& f, const char* what) {
  // wait_for returns at once for a finished op, so the slices cost nothing on the fast path.
  const auto until = deadline();
  while (!f.wait_for(std::chrono::milliseconds(50))) {
    check_abort();
    if (Clock::now() > until) {
      throw BenchFailure(fmt::format("{} did not complete within --timeout {:.0f} s", what, timeout_.count()));
    }
  }
  if (const int st = f.status(); st != 0) {
    throw BenchFailure(fmt::format("{} failed with status {}: {}", what, st, f.message()));
  }
}

// ---------------------------------------------------------------------------------------

nlohmann::json endpoint_options(const BenchConfig& cfg, const std::string& bind_ip) {
  nlohmann::json o = nlohmann::json::object();
  if (cfg.transport == "tcp") {
    const TcpOptions defaults;  // DLSLIME_TCP_* still apply beneath these (TcpOptions::from_json)
    o["ip"] = bind_ip;
    o["port"] = 0;
    if (cfg.lanes) o["lanes"] = *cfg.lanes;
    if (cfg.chunk_size) o["chunk_size"] = *cfg.chunk_size;
    // A benchmark batch may legitimately take long on a slow link; --timeout is the guard.
    o["op_timeout_ms"] = std::max<int64_t>(1, static_cast<int64_t>(cfg.timeout_s * 1000));
    if (cfg.batch > defaults.max_batch_items) o["max_batch_items"] = cfg.batch;
    if (cfg.batch > defaults.max_inflight_ops) o["max_inflight_ops"] = cfg.batch;
  } else if (cfg.transport == "rdma" || cfg.transport == "nvlink" || cfg.transport == "ascend") {
    // As for TCP: --timeout, not the transport's 30 s default, bounds a (slow) benchmark batch.
    o["op_timeout_ms"] = std::max<int64_t>(1, static_cast<int64_t>(cfg.timeout_s * 1000));
    // The Ascend engine is named by an IPv4 address: the bind address, or loopback for a
    // wildcard (two hosts: --transport-options '{"host": "<this host>"}').
    if (cfg.transport == "ascend") {
      o["host"] = bind_ip.empty() || bind_ip == "0.0.0.0" || bind_ip == "::" ? std::string("127.0.0.1") : bind_ip;
    }
    // NVLink copies on the GPU that holds this side's buffer (--gpu).
    if (cfg.transport == "nvlink") o["device"] = gpu_of(cfg, cfg.role);
  }
  if (cfg.transport != "tcp" && (cfg.lanes || cfg.chunk_size)) {
    throw UsageError(fmt::format("--lanes and --chunk-size are TCP's; give the {} transport its options with "
                                 "--transport-options",
                                 cfg.transport));
  }
  for (const auto& [key, value] : cfg.transport_options.items()) o[key] = value;
  return o;
}

uint64_t buffer_bytes(const BenchConfig& cfg) {
  uint64_t bytes = 0;
  for (uint64_t s : cfg.sizes) bytes = std::max(bytes, SlotLayout::make(s, cfg.batch, cfg.contiguous).bytes());
  return bytes;
}

namespace {

bool is_wildcard(const std::string& ip) { return ip.empty() || ip == "0.0.0.0" || ip == "::" || ip == "[::]"; }

}  // namespace

DataPath DataPath::create(const BenchConfig& cfg) {
  DataPath d;
  d.bind_ip = !cfg.ip.empty() ? cfg.ip : cfg.control_fd >= 0 ? "127.0.0.1" : "0.0.0.0";
  if (on_device(cfg, cfg.role)) {
    const int device = gpu_of(cfg, cfg.role);
    try {
      d.buffer = BenchBuffer::device(buffer_bytes(cfg), device);
    } catch (const gpu::GpuUnavailableError& e) {
      throw UsageError(fmt::format("--device-memory needs a GPU: {}", e.what()));
    } catch (const InvalidArgumentError& e) {
      throw UsageError(fmt::format("cannot allocate the benchmark buffer on GPU {}: {}", device, e.what()));
    }
  } else {
    d.buffer = BenchBuffer::host(buffer_bytes(cfg));
  }
  try {
    d.endpoint = make_endpoint(cfg.transport, endpoint_options(cfg, d.bind_ip));
  } catch (const Error& e) {
    throw UsageError(fmt::format("cannot make the {} endpoint: {}", cfg.transport, e.what()));
  }
  try {
    d.local_handle = d.endpoint->register_memory_region("bench", d.buffer->address(), 0, d.buffer->size());
  } catch (const InvalidArgumentError& e) {  // e.g. a transport that does not take this kind of memory
    throw UsageError(fmt::format("the {} endpoint refused the benchmark buffer ({} memory): {}", cfg.transport,
                                 d.buffer->on_device() ? "GPU" : "host", e.what()));
  }
  return d;
}

nlohmann::json DataPath::describe() const {
  nlohmann::json d = endpoint->endpoint_info();
  d.erase("mr_info");
#ifdef DLSLIME_BENCH_TCP
  if (const auto* tcp = dynamic_cast<const TcpEndpoint*>(endpoint.get())) d["options"] = tcp->options().to_json();
#endif
#ifdef DLSLIME_BENCH_RDMA
  if (const auto* rdma = dynamic_cast<const RDMAEndpoint*>(endpoint.get())) d["options"] = rdma->options().to_json();
#endif
#ifdef DLSLIME_BENCH_NVLINK
  if (const auto* nv = dynamic_cast<const NVLinkEndpoint*>(endpoint.get())) d["options"] = nv->options().to_json();
#endif
#ifdef DLSLIME_BENCH_ASCEND
  if (const auto* asc = dynamic_cast<const AscendDirectEndpoint*>(endpoint.get())) d["options"] = asc->options().to_json();
#endif
  return d;
}

nlohmann::json DataPath::buffer_info() const {
  if (!buffer->on_device()) return {{"memory", "host"}};
  return {{"memory", "gpu"}, {"runtime", buffer->runtime_name()}, {"device", buffer->device()}};
}

bool DataPath::simulated_gpu() const {
  return buffer->runtime_name() == "sim" || peer_buffer.value("runtime", std::string()) == "sim";
}

bool DataPath::simulated_device() const {
  // The simulated provider's one device (src/rdma/sim_device.h, kDeviceName).
  const nlohmann::json info = endpoint->endpoint_info();
  if (info.value("transport", std::string()) == "ascend") {  // the simulated HIXL (docs/ascend.md)
    const char* sim = std::getenv("DLSLIME_ASCEND_SIM");
    return sim != nullptr && std::string(sim) == "1";
  }
  return info.value("transport", std::string()) == "rdma" && info.value("device", std::string()) == "sim_rdma0";
}

nlohmann::json DataPath::hello_payload() const {
  const nlohmann::json info = describe();
  const bool explicit_host =
      !is_wildcard(bind_ip) || !info.value("options", nlohmann::json::object()).value("advertise_host", "").empty();
  return {{"endpoint_info", endpoint->endpoint_info()}, {"host_explicit", explicit_host}, {"buffer", buffer_info()}};
}

void DataPath::connect(const nlohmann::json& peer_hello, const ControlChannel& channel) {
  peer_info = peer_hello.at("endpoint_info");
  peer_buffer = peer_hello.value("buffer", nlohmann::json::object());
  // Only TCP's endpoint_info is dialed at an address; RDMA's names QPs, NVLink's "host" is
  // the boot id that proves both run on one host.
  if (!peer_hello.value("host_explicit", true) && peer_info.value("transport", std::string()) == "tcp" &&
      peer_info.contains("host")) {
    if (const std::string seen = channel.peer_ip(); !seen.empty()) peer_info["host"] = seen;
  }
  try {
    endpoint->connect(peer_info);
    if (!peer_info.contains("mr_info") || !peer_info["mr_info"].contains("bench")) {
      throw BenchFailure("the peer's endpoint_info has no 'bench' region");
    }
    remote_handle = endpoint->register_remote_memory_region("bench", peer_info["mr_info"]["bench"]);
  } catch (const Error& e) {
    const std::string to = peer_info.contains("port") ? fmt::format(" to {}:{}", peer_info.value("host", std::string()),
                                                                    peer_info.value("port", 0))
                                                      : std::string();
    throw BenchFailure(fmt::format("connecting the data endpoint{} failed: {}", to, e.what()));
  }
}

}  // namespace dlslime::bench
