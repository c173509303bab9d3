#pragma once

#include <deque>
#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "bench_buffer.h"
#include "bench_config.h"
#include "control_channel.h"
#include "dlslime/future.h"
#include "dlslime/endpoint.h"

namespace dlslime::bench {

// A failure that ends the run: an op with a non-zero status, a peer that aborted, a
// broken control connection. Verification mismatches are not thrown: they are reported
// per size and make the exit status non-zero at the end.
class BenchFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The control link to the other process, with the message kinds of the bench protocol:
//   initiator -> target: hello {params, endpoint_info}, connected, size {index, size},
//                        finish {last_iter}, bye, abort {reason}
//   target -> initiator: hello {endpoint_info}, connected, ready, result {...}, bye {...},
//                        abort {reason}
// A message that arrives while the side is busy waiting for ops is kept for later.
class PeerLink {
 public:
  PeerLink(ControlChannel channel, double timeout_s, std::string peer_name);

  void send(const nlohmann::json& msg) { channel_.send(msg); }
  // The next message, which must be of `type`. Throws BenchFailure on abort, EOF, timeout
  // or an unexpected message.
  nlohmann::json expect(const std::string& type);
  // The next message of any type but abort.
  nlohmann::json expect_any();
  // Throws BenchFailure if the peer has sent an abort; keeps any other message.
  void check_abort();
  // Best effort: tells the peer this side is failing.
  void abort(const std::string& reason) noexcept;

  // Waits for an op with the run's deadline while watching for an abort from the peer.
  // Throws BenchFailure if the op fails or times out.
  void wait(const Future& f, const char* what);

  const ControlChannel& channel() const { return channel_; }
  Clock::time_point deadline() const;

 private:
  nlohmann::json next();
  [[noreturn]] void peer_aborted(const nlohmann::json& msg);

  ControlChannel channel_;
  std::deque<nlohmann::json> stash_;
  std::chrono::duration<double> timeout_;
  std::string peer_name_;
};

// The data-path setup both roles share: buffer, endpoint, registered region, connection.
struct DataPath {
  std::unique_ptr<BenchBuffer> buffer;
  std::shared_ptr<Endpoint> endpoint;  // made by the transport registry (--transport)
  int32_t local_handle = -1;
  int32_t remote_handle = -1;
  std::string bind_ip;
  nlohmann::json peer_info;
  // The peer's buffer as its hello described it: {"memory": "host"|"gpu", "runtime", "device"}.
  nlohmann::json peer_buffer = nlohmann::json::object();

  // Allocates the buffer for the largest size (in GPU memory where --device-memory asks for
  // this side's), binds the endpoint, registers the buffer.
  static DataPath create(const BenchConfig& cfg);
  // This side's buffer: {"memory": "host"|"gpu", "runtime": "cuda"|"sim", "device": N}.
  nlohmann::json buffer_info() const;
  // What to send in hello: endpoint_info and whether its host is meant to be dialed as is.
  nlohmann::json hello_payload() const;
  // The transport's resolved options and addresses, for the report: endpoint_info() minus
  // its regions, and (TCP) the options the endpoint runs with.
  nlohmann::json describe() const;
  // Connects to the peer's hello. When the peer bound a wildcard address without an
  // advertise host, its host is replaced by the address seen on the control connection,
  // which is known to route to it.
  void connect(const nlohmann::json& peer_hello, const ControlChannel& channel);
  // Whether the endpoint runs on the simulated RDMA device (DLSLIME_RDMA_SIM=1), whose
  // figures measure this library's code paths in software, not a NIC.
  bool simulated_device() const;
  // Whether either side's buffer is on the simulated GPU (DLSLIME_GPU_SIM=1): its "device
  // memory" is host memory the simulated runtime copies in software.
  bool simulated_gpu() const;
};

// Printed with every result on the simulated RDMA device or the simulated HIXL (docs/bench.md).
inline constexpr const char* kSimulatedDeviceNote =
    "note: simulated RDMA device (DLSLIME_RDMA_SIM=1): the bytes move in software, so these figures measure the "
    "code, not RDMA hardware";
inline constexpr const char* kSimulatedHixlNote =
    "note: simulated HIXL (DLSLIME_ASCEND_SIM=1): the bytes move in software between processes, so these figures "
    "measure the code, not an NPU";
inline const char* simulated_device_note(const std::string& transport) {
  return transport == "ascend" ? kSimulatedHixlNote : kSimulatedDeviceNote;
}

// Printed with every result that moved simulated GPU memory (docs/bench.md).
inline constexpr const char* kSimulatedGpuNote =
    "note: simulated GPU (DLSLIME_GPU_SIM=1): its device memory is host memory copied in software, so these figures "
    "measure the code, not a GPU";

// The options the data endpoint is made with: the bench's defaults for the transport,
// then --lanes/--chunk-size, then --transport-options.
nlohmann::json endpoint_options(const BenchConfig& cfg, const std::string& bind_ip);
uint64_t buffer_bytes(const BenchConfig& cfg);

int run_initiator(BenchConfig cfg);
int run_target(BenchConfig cfg);

}  // namespace dlslime::bench
