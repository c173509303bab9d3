#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dlslime::bench {

enum class Op { kWrite, kRead, kSend };
enum class Role { kLoopbackPair, kInitiator, kTarget };
enum class Progress { kAuto, kBar, kLines, kNone };
// Which side's benchmark buffer is GPU memory (--device-memory); kNone: both in host memory.
enum class DeviceMemory { kNone, kInitiator, kTarget, kBoth };

const char* op_name(Op op) noexcept;
const char* device_memory_name(DeviceMemory d) noexcept;  // "none", "initiator", "target", "both"

// A bad command line. main() prints the message and the usage hint and exits with 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Everything one dlslime-bench process was asked to do. The initiator owns the run
// parameters (op, sizes, batch, ...) and sends them to the target (run_params_to_json), so a
// target needs only its role and its bootstrap address.
struct BenchConfig {
  // Run parameters (shared with the target).
  std::string transport = "tcp";
  Op op = Op::kWrite;
  std::vector<uint64_t> sizes;  // message sizes in bytes, ascending as given
  uint32_t batch = 256;
  uint32_t iters = 128;
  uint32_t warmup = 8;
  std::optional<uint32_t> lanes;       // unset: TcpOptions default / DLSLIME_TCP_LANES
  std::optional<uint64_t> chunk_size;  // unset: TcpOptions default / DLSLIME_TCP_CHUNK_SIZE
  // --transport-options: the transport's own options (JSON object), over the bench's.
  nlohmann::json transport_options = nlohmann::json::object();
  bool contiguous = false;             // default: strided slots with a guard gap between items
  // Every item moves the first slot to the first slot: a working set of one item, which
  // stays in the CPU caches as iperf3's single reused buffer does (a baseline comparison;
  // the bytes cannot be verified; write and read only).
  bool one_slot = false;
  bool verify = true;
  bool inject_corruption = false;  // self-test of the checker: corrupt one byte before verifying
  double timeout_s = 300.0;        // deadline for every control-channel wait and every op
  uint64_t seed = 0;               // per run; makes every run's pattern different
  // --device-memory: the buffers allocated through the device runtime (gpu::runtime(): CUDA,
  // or the simulated GPU with DLSLIME_GPU_SIM=1). NVLink implies kBoth.
  DeviceMemory device_memory = DeviceMemory::kNone;
  int gpu_initiator = 0;  // --gpu I[,T]: the device of each side's GPU buffer (and NVLink endpoint)
  int gpu_target = 0;

  // Process-local settings.
  Role role = Role::kLoopbackPair;
  std::string peer;    // initiator: HOST:PORT of the target's bootstrap listener
  std::string listen;  // target: [HOST:]PORT to accept the initiator's bootstrap connection
  std::string ip;      // bind address of the data endpoint; empty: per role default
  int control_fd = -1;  // loopback pair: inherited socket to the other process (internal)
  std::string json_path;
  std::string plot_path;
  Progress progress = Progress::kAuto;
  bool quiet = false;  // no configuration block (the table is still printed)
  bool list_transports = false;  // --list-transports: print available_transports() and exit
};

// "strided", "contiguous" or "one-slot".
std::string layout_name(const BenchConfig& c);
// Whether the buffer of `side` (kInitiator or kTarget) is GPU memory.
bool on_device(const BenchConfig& c, Role side);
// The GPU of `side`'s buffer and endpoint.
int gpu_of(const BenchConfig& c, Role side);

// Parses argv. Throws UsageError. Sets `help` instead of parsing further on -h/--help.
BenchConfig parse_command_line(int argc, char** argv, bool* help);
std::string usage_text();

// "8..1048576" (doubling), "4K..1M", "8,64,4096" or a single size; K/M/G suffixes are
// binary. Throws UsageError.
std::vector<uint64_t> parse_sizes(const std::string& text);
uint64_t parse_size(const std::string& text);

nlohmann::json run_params_to_json(const BenchConfig& c);
// Applies the run parameters an initiator sent; throws UsageError if they are malformed.
void apply_run_params(const nlohmann::json& j, BenchConfig* c);

// The argv of a child of the loopback pair: the parent's arguments minus the ones that only
// the parent may handle, plus the child's role and control socket.
std::vector<std::string> child_arguments(int argc, char** argv, Role role, int control_fd);

}  // namespace dlslime::bench
