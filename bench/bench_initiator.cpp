// The initiator: drives the run, times every batch, prints the table and writes the report.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "bench_report.h"
#include "bench_session.h"
#include "dlslime/tcp_endpoint.h"
#include "dlslime/version.h"

namespace dlslime::bench {

namespace {

struct SizeOutcome {
  ResultRow row;
  VerifyResult verify;
};

std::string sizes_text(const std::vector<uint64_t>& sizes) {
  if (sizes.size() == 1) return fmt::format("{}", sizes[0]);
  return fmt::format("{}..{} ({} sizes)", sizes.front(), sizes.back(), sizes.size());
}

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

class Initiator {
 public:
  Initiator(BenchConfig cfg, PeerLink& link, DataPath& data) : cfg_(std::move(cfg)), link_(link), data_(data) {}

  int run();

 private:
  SizeOutcome run_size(size_t index, ProgressReporter& progress);
  std::vector<double> time_one_sided(const SlotLayout& layout, ProgressReporter& progress);
  std::vector<double> time_send(const SlotLayout& layout, ProgressReporter& progress);
  nlohmann::json config_json(bool all_verified, double cpu_target_total) const;
  // --json, or the file --plot draws from; empty if neither was asked for.
  std::string report_path() const {
    if (!cfg_.json_path.empty() || cfg_.plot_path.empty()) return cfg_.json_path;
    return cfg_.plot_path + ".json";
  }
  void print_configuration() const;
  // The lane count the endpoint runs with, if its transport has lanes ("" otherwise).
  std::string self_lanes() const {
    const nlohmann::json options = data_.describe().value("options", nlohmann::json::object());
    return options.contains("lanes") ? options["lanes"].dump() : std::string();
  }

  BenchConfig cfg_;
  PeerLink& link_;
  DataPath& data_;
};

// The table title's name of a transport: "TCP", "RDMA"; others as registered.
std::string transport_title(const std::string& transport) {
  if (transport == "tcp") return "TCP";
  if (transport == "rdma") return "RDMA";
  if (transport == "nvlink") return "NVLink";
  if (transport == "ascend") return "Ascend";
  return transport;
}

// "host", "GPU 0 (sim)": where one side's buffer lives, from its buffer_info().
std::string memory_text(const nlohmann::json& buffer) {
  if (buffer.value("memory", std::string("host")) != "gpu") return "host";
  return fmt::format("GPU {} ({})", buffer.value("device", 0), buffer.value("runtime", std::string("?")));
}

// host:port of an endpoint_info, for transports that have one.
std::string address_of(const nlohmann::json& info) {
  if (!info.contains("host") || !info.contains("port")) return "-";
  return fmt::format("{}:{}", info.value("host", std::string("?")), info.value("port", 0));
}

void Initiator::print_configuration() const {
  const nlohmann::json self = data_.describe();
  const nlohmann::json options = self.value("options", nlohmann::json::object());
  std::string out = "DLSlime Benchmark Configurations:\n";
  out += fmt::format("  transport: {}\n  op: {}\n", cfg_.transport, op_name(cfg_.op));
  out += fmt::format("  mode: {}\n", cfg_.control_fd >= 0 ? "loopback pair (two processes, 127.0.0.1)"
                                                          : fmt::format("two hosts (target {})", cfg_.peer));
  out += fmt::format("  initiator: {}\n  target: {}\n", address_of(self), address_of(data_.peer_info));
  if (options.contains("lanes")) {
    out += fmt::format("  lanes: {}\n  chunk_size: {} B\n", options["lanes"].dump(), options["chunk_size"].dump());
  }
  if (cfg_.transport == "rdma" && self.contains("device")) {
    out += fmt::format("  device: {} port {} ({}), num_qp: {}\n", self.value("device", std::string()),
                       self.value("ib_port", 0), self.value("link_layer", std::string()), self.value("num_qp", 0));
  }
  if (data_.simulated_device()) out += fmt::format("  {}\n", simulated_device_note(cfg_.transport));
  out += fmt::format("  memory: initiator {}, target {}\n", memory_text(data_.buffer_info()),
                     memory_text(data_.peer_buffer));
  if (data_.simulated_gpu()) out += fmt::format("  {}\n", kSimulatedGpuNote);
  if (!cfg_.transport_options.empty()) out += fmt::format("  transport options: {}\n", cfg_.transport_options.dump());
  out += fmt::format("  batch: {}\n  layout: {}\n", cfg_.batch, layout_name(cfg_));
  out += fmt::format("  sizes: {}\n  warmup: {}\n  iters: {}\n", sizes_text(cfg_.sizes), cfg_.warmup, cfg_.iters);
  out += fmt::format("  verify: {}\n  buffer: {:.1f} MiB per process{}\n\n", cfg_.verify ? "on" : "off",
                     static_cast<double>(data_.buffer->size()) / (1 << 20),
                     cfg_.device_memory != DeviceMemory::kNone ? " (a GPU buffer has a pinned host copy as large, "
                                                                 "for the pattern and the check)"
                                                               : "");
  std::fputs(out.c_str(), stdout);
}

std::vector<double> Initiator::time_one_sided(const SlotLayout& layout, ProgressReporter& progress) {
  // One prepared batch per rotation; each iteration hands the endpoint a fresh copy (made
  // before the clock starts), as an application building its batch would.
  std::vector<std::vector<Assignment>> batches(layout.rotations);
  const bool is_write = cfg_.op == Op::kWrite;
  for (uint32_t r = 0; r < layout.rotations; ++r) {
    batches[r].reserve(layout.batch);
    for (uint32_t i = 0; i < layout.batch; ++i) {
      const uint64_t src = cfg_.one_slot ? 0 : layout.offset(layout.source_slot(i, r));
      const uint64_t dst = cfg_.one_slot ? 0 : layout.offset(i);
      // target_offset is the remote offset, source_offset the local one, for read and write.
      batches[r].push_back(Assignment{data_.local_handle, data_.remote_handle, is_write ? dst : src,
                                      is_write ? src : dst, layout.size});
    }
  }
  const uint32_t total = cfg_.warmup + cfg_.iters;
  std::vector<double> latencies;
  latencies.reserve(cfg_.iters);
  const char* what = is_write ? "write" : "read";
  for (uint32_t k = 0; k < total; ++k) {
    std::vector<Assignment> items = batches[k % layout.rotations];
    const auto t0 = Clock::now();
    Future f = is_write ? data_.endpoint->write(std::move(items)) : data_.endpoint->read(std::move(items));
    link_.wait(f, what);
    const auto t1 = Clock::now();
    if (k >= cfg_.warmup) latencies.push_back(std::chrono::duration<double>(t1 - t0).count());
    progress.update(k + 1);
  }
  return latencies;
}

std::vector<double> Initiator::time_send(const SlotLayout& layout, ProgressReporter& progress) {
  const uint32_t total = cfg_.warmup + cfg_.iters;
  std::vector<double> latencies;
  latencies.reserve(cfg_.iters);
  std::vector<Future> sends(layout.batch);
  const uintptr_t base = data_.buffer->address();
  for (uint32_t k = 0; k < total; ++k) {
    const auto t0 = Clock::now();
    for (uint32_t i = 0; i < layout.batch; ++i) {
      sends[i] = data_.endpoint->send(Chunk{base, layout.offset(layout.source_slot(i, k)), layout.size});
    }
    for (const Future& f : sends) link_.wait(f, "send");
    const auto t1 = Clock::now();
    if (k >= cfg_.warmup) latencies.push_back(std::chrono::duration<double>(t1 - t0).count());
    progress.update(k + 1);
  }
  return latencies;
}

SizeOutcome Initiator::run_size(size_t index, ProgressReporter& progress) {
  const uint64_t size = cfg_.sizes[index];
  const SlotLayout layout = SlotLayout::make(size, cfg_.batch, cfg_.contiguous);
  const uint64_t seed = pattern_seed(cfg_.seed, index);
  const uint8_t poison = poison_byte(index);
  const bool local_is_destination = cfg_.op == Op::kRead;
  if (local_is_destination) {
    fill_poison(*data_.buffer, poison);
  } else {
    fill_source(*data_.buffer, layout, seed);
  }
  link_.send({{"type", "size"}, {"index", index}, {"size", size}});
  link_.expect("ready");

  const uint32_t total = cfg_.warmup + cfg_.iters;
  progress.begin_size(index, cfg_.sizes.size(), size, cfg_.batch, total);
  const double cpu0 = process_cpu_seconds();
  std::vector<double> latencies =
      cfg_.op == Op::kSend ? time_send(layout, progress) : time_one_sided(layout, progress);
  const double cpu1 = process_cpu_seconds();
  link_.send({{"type", "finish"}, {"last_iter", total - 1}});
  const nlohmann::json result = link_.expect("result");

  SizeOutcome out;
  out.row.msg_size = size;
  out.row.batch = cfg_.batch;
  out.row.set_latencies(std::move(latencies));
  out.row.cpu_initiator_s = cpu1 - cpu0;
  out.row.cpu_target_s = result.value("cpu_s", 0.0);
  if (const double recv_s = result.value("recv_s", 0.0); cfg_.op == Op::kSend && recv_s > 0) {
    out.row.recv_msgs_per_s = static_cast<double>(cfg_.batch) * cfg_.iters / recv_s;
  }
  const double cpu = out.row.cpu_initiator_s + out.row.cpu_target_s;
  out.row.bytes_per_cpu_s = cpu > 0 ? static_cast<double>(size) * cfg_.batch * total / cpu : 0;
  if (cfg_.verify) {
    if (local_is_destination) {
      out.verify = verify_destination(*data_.buffer, layout, seed, poison, total - 1, cfg_.inject_corruption);
    } else {
      out.verify.ok = result.value("ok", false);
      out.verify.bad_items = result.value("bad_items", uint64_t{0});
      out.verify.first_error = result.value("error", std::string());
    }
  }
  out.row.verified = cfg_.verify && out.verify.ok;
  return out;
}

nlohmann::json Initiator::config_json(bool all_verified, double cpu_target_total) const {
  const nlohmann::json self = data_.describe();
  const nlohmann::json options = self.value("options", nlohmann::json::object());
  char when[64] = {};
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  nlohmann::json c = run_params_to_json(cfg_);
  c["lanes"] = options.value("lanes", nlohmann::json());
  c["chunk_size"] = options.value("chunk_size", nlohmann::json());
  c["mode"] = cfg_.control_fd >= 0 ? "loopback" : "two-host";
  c["initiator"] = address_of(self);
  c["target"] = address_of(data_.peer_info);
  c["endpoint"] = self;  // the transport's endpoint_info (regions left out) and options
  if (cfg_.transport == "tcp") c["tcp_options"] = options;
  if (cfg_.transport == "rdma") c["rdma_options"] = options;
  if (cfg_.transport == "nvlink") c["nvlink_options"] = options;
  if (cfg_.transport == "ascend") c["ascend_options"] = options;
  c["simulated_device"] = data_.simulated_device();
  c["memory"] = {{"initiator", data_.buffer_info()}, {"target", data_.peer_buffer}};
  c["simulated_gpu"] = data_.simulated_gpu();
  c["verified"] = all_verified;
  c["buffer_bytes"] = data_.buffer->size();
  c["version"] = kVersion;
  c["hostname"] = host_name();
  c["cpus"] = std::thread::hardware_concurrency();
  c["date"] = when;
  c["units"] = {{"total_mb", "1e6 bytes per batch"},
                {"bw_gbps", "1e9 bytes per second"},
                {"lat_us", "microseconds per batch (submit to completion of all items)"},
                {"msgs_per_s", "items (messages for send) per second at the mean latency"},
                {"recv_msgs_per_s", "send: messages the target received per second over the timed batches"},
                {"bytes_per_cpu_s", "bytes moved in warmup + timed batches per CPU-second of both processes"}};
  c["cpu"] = {{"initiator_s", process_cpu_seconds()}, {"target_s", cpu_target_total}};
  return c;
}

int Initiator::run() {
  if (!cfg_.quiet) print_configuration();
  // lanes, layout, and where the buffers are when not both in host memory.
  std::string details = self_lanes().empty() ? std::string() : fmt::format("lanes {}, ", self_lanes());
  details += layout_name(cfg_);
  if (cfg_.transport != "nvlink" && cfg_.device_memory != DeviceMemory::kNone) {  // NVLink: GPU memory always
    details += cfg_.device_memory == DeviceMemory::kBoth
                   ? ", GPU memory both sides"
                   : fmt::format(", GPU memory on the {}", device_memory_name(cfg_.device_memory));
  }
  if (data_.simulated_gpu()) details += ", simulated GPU";
  const std::string title =
      fmt::format("DLSlime {} Benchmark: {} ({})", transport_title(cfg_.transport), op_name(cfg_.op), details);
  TablePrinter table(title, cfg_.op == Op::kSend);
  ProgressReporter progress(cfg_.progress);
  std::vector<ResultRow> rows;
  std::vector<std::string> failures;
  table.header();
  for (size_t i = 0; i < cfg_.sizes.size(); ++i) {
    SizeOutcome out;
    try {
      out = run_size(i, progress);
    } catch (const std::exception& e) {
      progress.clear();
      table.footer();
      // Keep what was measured: the report says where and why the run stopped.
      if (const std::string path = report_path(); !path.empty()) {
        nlohmann::json config = config_json(false, 0.0);
        config["error"] = fmt::format("stopped at {} B: {}", cfg_.sizes[i], e.what());
        write_json_report(path, config, rows);
      }
      throw;
    }
    progress.clear();
    table.row(out.row);
    rows.push_back(out.row);
    if (!out.verify.ok) {
      failures.push_back(fmt::format("{} B: {} item(s) differ; {}", out.row.msg_size, out.verify.bad_items,
                                     out.verify.first_error));
    }
  }
  table.footer();
  link_.send({{"type", "bye"}});
  const nlohmann::json bye = link_.expect("bye");

  const bool all_verified = cfg_.verify && failures.empty();
  if (cfg_.verify) {
    if (failures.empty()) {
      std::printf("verify: all bytes of the last batch of every size matched\n");
    } else {
      for (const auto& f : failures) std::fprintf(stderr, "dlslime-bench: VERIFY FAILED at %s\n", f.c_str());
    }
  }
  if (!rows.empty()) {
    const ResultRow& last = rows.back();
    std::printf("cpu: %.2f GB moved per CPU-second at %llu B (initiator %.3f s, target %.3f s)\n",
                last.bytes_per_cpu_s / 1e9, static_cast<unsigned long long>(last.msg_size), last.cpu_initiator_s,
                last.cpu_target_s);
  }
  if (data_.simulated_device()) std::printf("%s\n", simulated_device_note(cfg_.transport));
  if (data_.simulated_gpu()) std::printf("%s\n", kSimulatedGpuNote);
  std::fflush(stdout);

  const std::string json_path = report_path();
  if (!json_path.empty()) {
    nlohmann::json config = config_json(all_verified, bye.value("cpu_total_s", 0.0));
    if (!failures.empty()) config["verify_errors"] = failures;
    write_json_report(json_path, config, rows);
  }
  if (!cfg_.plot_path.empty()) run_plot(json_path, cfg_.plot_path);
  return failures.empty() ? 0 : 1;
}

}  // namespace

int run_initiator(BenchConfig cfg) {
  if (cfg.seed == 0) cfg.seed = std::random_device{}() | (static_cast<uint64_t>(std::random_device{}()) << 32) | 1;
  const auto connect_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(cfg.timeout_s));
  ControlChannel channel = cfg.control_fd >= 0 ? ControlChannel(cfg.control_fd)
                                               : ControlChannel::dial(cfg.peer, connect_deadline);
  PeerLink link(std::move(channel), cfg.timeout_s, "target");
  try {
    DataPath data = DataPath::create(cfg);
    nlohmann::json hello = data.hello_payload();
    hello["type"] = "hello";
    hello["params"] = run_params_to_json(cfg);
    link.send(hello);
    data.connect(link.expect("hello"), link.channel());
#if DLSLIME_BENCH_TCP
    if (const auto* tcp = dynamic_cast<const TcpEndpoint*>(data.endpoint.get())) {
      // Which path the writes take (docs/tcp.md "Same-host path"): --same-host on|off.
      const nlohmann::json path = tcp->same_host();
      fmt::print(stderr, "dlslime-bench: writes take the {} path: {}\n", path.value("path", "?"),
                 path.value("reason", ""));
    }
#endif
    link.send({{"type", "connected"}});
    link.expect("connected");
    return Initiator(cfg, link, data).run();
  } catch (const std::exception& e) {
    link.abort(e.what());
    throw;
  }
}

}  // namespace dlslime::bench
