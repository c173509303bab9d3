#include "bench_config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dlslime/transport.h"
#include "gpu/device_runtime.h"

namespace dlslime::bench {

const char* op_name(Op op) noexcept {
  switch (op) {
    case Op::kWrite: return "write";
    case Op::kRead: return "read";
    case Op::kSend: return "send";
  }
  return "?";
}

const char* device_memory_name(DeviceMemory d) noexcept {
  switch (d) {
    case DeviceMemory::kNone: return "none";
    case DeviceMemory::kInitiator: return "initiator";
    case DeviceMemory::kTarget: return "target";
    case DeviceMemory::kBoth: return "both";
  }
  return "?";
}

namespace {

// --transport: one of the registry's transports that can run here (the reason otherwise).
void check_transport(const std::string& name) {
  std::vector<std::string> known;
  for (const TransportInfo& t : available_transports()) {
    if (t.name == name) {
      if (!t.available) throw UsageError(fmt::format("--transport {}: not available here: {}", name, t.reason));
      return;
    }
    known.push_back(t.name);
  }
  throw UsageError(fmt::format("--transport {}: unknown transport (known: {})", name, fmt::join(known, ", ")));
}

nlohmann::json parse_transport_options(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    throw UsageError(fmt::format("--transport-options must be a JSON object, e.g. '{{\"lanes\": 4}}' (got {})", text));
  }
  return j;
}

Op parse_op(const std::string& s) {
  if (s == "write") return Op::kWrite;
  if (s == "read") return Op::kRead;
  if (s == "send") return Op::kSend;
  throw UsageError(fmt::format("--op must be read, write or send, not '{}'", s));
}

DeviceMemory parse_device_memory(const std::string& s) {
  if (s == "none") return DeviceMemory::kNone;
  if (s == "initiator") return DeviceMemory::kInitiator;
  if (s == "target") return DeviceMemory::kTarget;
  if (s == "both") return DeviceMemory::kBoth;
  throw UsageError(fmt::format("--device-memory must be initiator, target or both, not '{}'", s));
}

uint64_t parse_uint(const std::string& text, const char* what) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end || text.empty()) {
    throw UsageError(fmt::format("{} must be a non-negative integer, not '{}'", what, text));
  }
  return v;
}

uint32_t parse_count(const std::string& text, const char* what, uint32_t min) {
  const uint64_t v = parse_uint(text, what);
  if (v < min || v > std::numeric_limits<uint32_t>::max()) {
    throw UsageError(fmt::format("{} must be in {}..{}, not {}", what, min, std::numeric_limits<uint32_t>::max(), v));
  }
  return static_cast<uint32_t>(v);
}

// A device number; the runtime refuses one it does not have, naming it.
int parse_gpu(const std::string& text) {
  const uint64_t v = parse_uint(text, "--gpu");
  if (v > 1024) throw UsageError(fmt::format("--gpu {}: not a device number", text));
  return static_cast<int>(v);
}

}  // namespace

uint64_t parse_size(const std::string& text) {
  std::string digits = text;
  uint64_t mult = 1;
  if (!digits.empty()) {
    const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(digits.back())));
    const int shift = last == 'K' ? 10 : last == 'M' ? 20 : last == 'G' ? 30 : 0;
    if (shift != 0) {
      mult = uint64_t{1} << shift;
      digits.pop_back();
    }
  }
  const uint64_t v = parse_uint(digits, "a message size");
  if (v == 0) throw UsageError("a message size must be at least 1 byte");
  if (v > (uint64_t{1} << 40) / mult) throw UsageError(fmt::format("message size '{}' is too large", text));
  return v * mult;
}

std::vector<uint64_t> parse_sizes(const std::string& text) {
  std::vector<uint64_t> out;
  if (const auto dots = text.find(".."); dots != std::string::npos) {
    const uint64_t lo = parse_size(text.substr(0, dots));
    const uint64_t hi = parse_size(text.substr(dots + 2));
    if (lo > hi) throw UsageError(fmt::format("--sizes {}: the first size is larger than the last", text));
    for (uint64_t s = lo; s <= hi; s *= 2) out.push_back(s);
    if (out.back() != hi) out.push_back(hi);  // e.g. 3..20 ends with 20
    return out;
  }
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string part = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    out.push_back(parse_size(part));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string usage_text() {
  return R"(usage: dlslime-bench [options]

Measures DLSlime transfers in MORI-IO's table format. Without --role it runs an initiator
and a target as two processes on loopback (127.0.0.1). Across two hosts:
  host A:  dlslime-bench --role target --listen 0.0.0.0:18515
  host B:  dlslime-bench --role initiator --peer HOST_A:18515 --op write ...

Run parameters (the initiator sends them to the target):
  --transport NAME           transport (default tcp; --list-transports shows them)
  --transport-options JSON   the transport's own options, e.g. '{"lanes": 4}'
  --list-transports          print each transport and whether it can run here, then exit
  --op write|read|send       operation (default write)
  --size N                   one message size (K/M/G suffixes are binary)
  --sizes LO..HI | A,B,C     doubling sweep or list (default 8..1048576)
  --batch N                  items per batch (default 256)
  --iters N                  timed batches per size (default 128)
  --warmup N                 untimed batches per size (default 8)
  --lanes N                  TCP connections per direction (default: library default)
  --chunk-size N             TCP striping unit (default: library default)
  --same-host on|off         TCP: let a peer on this host copy the writes itself (cross-
                             memory attach; default on), or keep them on the sockets
  --contiguous               items back to back in the buffer
  --strided                  items in separate slots with a guard gap (default)
  --one-slot                 every item moves the first slot onto the first slot: a
                             cache-resident working set, like iperf3's one reused buffer
                             (for comparisons; implies --no-verify; write and read only)
  --no-verify                do not check the transferred bytes
  --timeout SECONDS          deadline for every wait (default 300)

GPU memory (the CUDA runtime, or the simulated GPU with DLSLIME_GPU_SIM=1):
  --device-memory [initiator|target|both]
                             allocate that side's buffer (default: both) in GPU memory;
                             write, read and send. --transport nvlink implies both
  --gpu I[,T]                the GPU of the initiator's [and the target's] buffer
                             (default 0; one number: both sides)

Roles and addresses:
  --role initiator|target    run one side only (two hosts)
  --peer HOST:PORT           initiator: the target's bootstrap address
  --listen [HOST:]PORT       target: where to wait for the initiator (default 0.0.0.0:18515)
  --ip ADDR                  bind address of the data endpoint (default 127.0.0.1 for the
                             loopback pair, 0.0.0.0 with --role)

Output:
  --json FILE                write {"config": {...}, "rows": [...]}
  --plot FILE.png            plot bandwidth and latency against size (python3 + matplotlib)
  --progress auto|bar|lines|none   progress on stderr (auto: a bar on a terminal, else lines)
  --quiet                    no configuration block
  -h, --help                 this text
)";
}

BenchConfig parse_command_line(int argc, char** argv, bool* help) {
  BenchConfig c;
  *help = false;
  bool sizes_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_inline_value = false;
    if (arg.rfind("--", 0) == 0) {
      if (const auto eq = arg.find('='); eq != std::string::npos) {
        value = arg.substr(eq + 1);
        arg.resize(eq);
        has_inline_value = true;
      }
    }
    auto next = [&]() -> std::string {
      if (has_inline_value) return value;
      if (i + 1 >= argc) throw UsageError(fmt::format("{} needs a value", arg));
      return argv[++i];
    };
    auto flag = [&] {
      if (has_inline_value) throw UsageError(fmt::format("{} takes no value", arg));
    };
    if (arg == "-h" || arg == "--help") {
      *help = true;
      return c;
    } else if (arg == "--transport") {
      c.transport = next();
      check_transport(c.transport);
    } else if (arg == "--transport-options") {
      c.transport_options = parse_transport_options(next());
    } else if (arg == "--list-transports") {
      flag();
      c.list_transports = true;
      return c;
    } else if (arg == "--op") {
      c.op = parse_op(next());
    } else if (arg == "--size") {
      c.sizes = {parse_size(next())};
      sizes_given = true;
    } else if (arg == "--sizes") {
      c.sizes = parse_sizes(next());
      sizes_given = true;
    } else if (arg == "--batch") {
      c.batch = parse_count(next(), "--batch", 1);
    } else if (arg == "--iters") {
      c.iters = parse_count(next(), "--iters", 1);
    } else if (arg == "--warmup") {
      c.warmup = parse_count(next(), "--warmup", 0);
    } else if (arg == "--lanes") {
      c.lanes = parse_count(next(), "--lanes", 1);
    } else if (arg == "--same-host") {
      const std::string v = next();
      if (v != "on" && v != "off") throw UsageError(fmt::format("--same-host takes on or off, not '{}'", v));
      c.transport_options["same_host"] = v == "on";
    } else if (arg == "--chunk-size") {
      c.chunk_size = parse_size(next());
    } else if (arg == "--contiguous") {
      flag();
      c.contiguous = true;
    } else if (arg == "--strided") {
      flag();
      c.contiguous = false;
    } else if (arg == "--one-slot") {
      flag();
      c.one_slot = true;
    } else if (arg == "--device-memory") {
      // The side is optional: a following word that names one is taken as the value.
      if (has_inline_value) {
        c.device_memory = parse_device_memory(value);
      } else if (i + 1 < argc && (std::string(argv[i + 1]) == "initiator" || std::string(argv[i + 1]) == "target" ||
                                  std::string(argv[i + 1]) == "both")) {
        c.device_memory = parse_device_memory(argv[++i]);
      } else {
        c.device_memory = DeviceMemory::kBoth;
      }
      if (c.device_memory == DeviceMemory::kNone) {
        throw UsageError("--device-memory must be initiator, target or both, not 'none'");
      }
    } else if (arg == "--gpu") {
      const std::string v = next();
      const auto comma = v.find(',');
      c.gpu_initiator = parse_gpu(v.substr(0, comma));
      c.gpu_target = comma == std::string::npos ? c.gpu_initiator : parse_gpu(v.substr(comma + 1));
    } else if (arg == "--no-verify") {
      flag();
      c.verify = false;
    } else if (arg == "--inject-corruption") {
      flag();
      c.inject_corruption = true;
    } else if (arg == "--timeout") {
      const std::string v = next();
      try {
        size_t used = 0;
        c.timeout_s = std::stod(v, &used);
        if (used != v.size() || !(c.timeout_s > 0)) throw std::invalid_argument(v);
      } catch (const std::exception&) {
        throw UsageError(fmt::format("--timeout must be a positive number of seconds, not '{}'", v));
      }
    } else if (arg == "--role") {
      const std::string r = next();
      if (r == "initiator") c.role = Role::kInitiator;
      else if (r == "target") c.role = Role::kTarget;
      else throw UsageError(fmt::format("--role must be initiator or target, not '{}'", r));
    } else if (arg == "--peer") {
      c.peer = next();
    } else if (arg == "--listen") {
      c.listen = next();
    } else if (arg == "--ip") {
      c.ip = next();
    } else if (arg == "--control-fd") {
      c.control_fd = static_cast<int>(parse_count(next(), "--control-fd", 0));
    } else if (arg == "--json") {
      c.json_path = next();
    } else if (arg == "--plot") {
      c.plot_path = next();
    } else if (arg == "--progress") {
      const std::string p = next();
      if (p == "auto") c.progress = Progress::kAuto;
      else if (p == "bar") c.progress = Progress::kBar;
      else if (p == "lines") c.progress = Progress::kLines;
      else if (p == "none") c.progress = Progress::kNone;
      else throw UsageError(fmt::format("--progress must be auto, bar, lines or none, not '{}'", p));
    } else if (arg == "--quiet" || arg == "-q") {
      flag();
      c.quiet = true;
    } else {
      throw UsageError(fmt::format("unknown option '{}'", argv[i]));
    }
  }
  if (!sizes_given) c.sizes = parse_sizes("8..1048576");
  if (c.one_slot) {
    if (c.op == Op::kSend) throw UsageError("--one-slot applies to --op write and read, not send");
    if (c.inject_corruption) throw UsageError("--one-slot cannot verify, so it cannot take --inject-corruption");
    c.verify = false;  // every item lands on the same bytes
  }
  if (c.transport == "nvlink") {
    // NVLinkEndpoint registers GPU memory only (docs/nvlink.md), so both buffers are.
    if (c.device_memory != DeviceMemory::kNone && c.device_memory != DeviceMemory::kBoth) {
      throw UsageError(fmt::format("--transport nvlink moves GPU memory on both sides, not --device-memory {}",
                                   device_memory_name(c.device_memory)));
    }
    c.device_memory = DeviceMemory::kBoth;
  }
  if (c.transport == "nvlink" && c.op == Op::kSend) {
    throw UsageError("--op send: NVLinkEndpoint has no send/recv (it reads and writes)");
  }
  if (c.transport == "ascend" && c.op == Op::kSend) {
    throw UsageError("--op send: AscendDirectEndpoint has no send/recv (it reads and writes)");
  }
  // Refused here, before any process starts, when this process (or, for the loopback pair,
  // one of its children) would allocate GPU memory; a target learns its side from the run
  // parameters and refuses then (DataPath::create).
  const bool needs_gpu_here = c.role == Role::kLoopbackPair ? c.device_memory != DeviceMemory::kNone
                                                            : c.role == Role::kInitiator && on_device(c, Role::kInitiator);
  if (needs_gpu_here && c.transport != "nvlink") {  // --transport nvlink was checked by the registry's probe
    if (const std::string reason = gpu::unavailable_reason(); !reason.empty()) {
      throw UsageError(fmt::format("--device-memory needs a GPU: {}", reason));
    }
  }
  if (c.control_fd >= 0 && c.role == Role::kLoopbackPair) {
    throw UsageError("--control-fd is internal to the loopback pair and needs --role");
  }
  if (c.control_fd < 0) {
    if (c.role == Role::kInitiator && c.peer.empty()) {
      throw UsageError("--role initiator needs --peer HOST:PORT (the target's --listen address)");
    }
    if (c.role == Role::kTarget && c.listen.empty()) c.listen = "0.0.0.0:18515";
    if (c.role == Role::kLoopbackPair && (!c.peer.empty() || !c.listen.empty())) {
      throw UsageError("--peer and --listen need --role initiator or --role target");
    }
  }
  return c;
}

bool on_device(const BenchConfig& c, Role side) {
  switch (c.device_memory) {
    case DeviceMemory::kNone: return false;
    case DeviceMemory::kBoth: return true;
    case DeviceMemory::kInitiator: return side == Role::kInitiator;
    case DeviceMemory::kTarget: return side == Role::kTarget;
  }
  return false;
}

int gpu_of(const BenchConfig& c, Role side) { return side == Role::kTarget ? c.gpu_target : c.gpu_initiator; }

std::string layout_name(const BenchConfig& c) {
  if (c.one_slot) return "one-slot";
  return c.contiguous ? "contiguous" : "strided";
}

nlohmann::json run_params_to_json(const BenchConfig& c) {
  nlohmann::json j = {{"transport", c.transport},
                      {"op", op_name(c.op)},
                      {"sizes", c.sizes},
                      {"batch", c.batch},
                      {"iters", c.iters},
                      {"warmup", c.warmup},
                      {"layout", layout_name(c)},
                      {"verify", c.verify},
                      {"inject_corruption", c.inject_corruption},
                      {"timeout_s", c.timeout_s},
                      {"seed", c.seed},
                      {"device_memory", device_memory_name(c.device_memory)},
                      {"gpu", {{"initiator", c.gpu_initiator}, {"target", c.gpu_target}}}};
  j["transport_options"] = c.transport_options;
  j["lanes"] = c.lanes ? nlohmann::json(*c.lanes) : nlohmann::json(nullptr);
  j["chunk_size"] = c.chunk_size ? nlohmann::json(*c.chunk_size) : nlohmann::json(nullptr);
  return j;
}

void apply_run_params(const nlohmann::json& j, BenchConfig* c) {
  try {
    c->transport = j.at("transport").get<std::string>();
    c->transport_options = j.value("transport_options", nlohmann::json::object());
    if (!c->transport_options.is_object()) throw UsageError("the initiator sent transport options that are not an object");
    c->op = parse_op(j.at("op").get<std::string>());
    c->sizes = j.at("sizes").get<std::vector<uint64_t>>();
    c->batch = j.at("batch").get<uint32_t>();
    c->iters = j.at("iters").get<uint32_t>();
    c->warmup = j.at("warmup").get<uint32_t>();
    const auto layout = j.at("layout").get<std::string>();
    c->contiguous = layout == "contiguous";
    c->one_slot = layout == "one-slot";
    c->verify = j.at("verify").get<bool>();
    c->inject_corruption = j.at("inject_corruption").get<bool>();
    c->timeout_s = j.at("timeout_s").get<double>();
    c->seed = j.at("seed").get<uint64_t>();
    c->lanes = j.at("lanes").is_null() ? std::nullopt : std::optional<uint32_t>(j.at("lanes").get<uint32_t>());
    c->chunk_size =
        j.at("chunk_size").is_null() ? std::nullopt : std::optional<uint64_t>(j.at("chunk_size").get<uint64_t>());
    // Absent from an initiator that predates --device-memory: host memory.
    c->device_memory = parse_device_memory(j.value("device_memory", std::string("none")));
    const nlohmann::json gpu = j.value("gpu", nlohmann::json::object());
    c->gpu_initiator = gpu.value("initiator", 0);
    c->gpu_target = gpu.value("target", 0);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("the initiator sent malformed run parameters: {}", e.what()));
  }
  if (c->sizes.empty() || c->batch == 0 || c->iters == 0 ||
      std::any_of(c->sizes.begin(), c->sizes.end(), [](uint64_t s) { return s == 0; })) {
    throw UsageError("the initiator sent empty sizes, a zero size, batch or iteration count");
  }
}

std::vector<std::string> child_arguments(int argc, char** argv, Role role, int control_fd) {
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) out.emplace_back(argv[i]);
  out.emplace_back("--role");
  out.emplace_back(role == Role::kTarget ? "target" : "initiator");
  out.emplace_back("--control-fd");
  out.emplace_back(std::to_string(control_fd));
  return out;
}

}  // namespace dlslime::bench
