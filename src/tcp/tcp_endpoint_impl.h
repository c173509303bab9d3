#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <variant>

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include "core/io_runtime.h"
#include "core/memory_registry.h"
#include "core/op_state.h"
#include "core/pending_ops.h"
#include "core/remote_regions.h"
#include "core/submission_queue.h"
#include "dlslime/tcp_endpoint.h"
#include "tcp/tcp_connection.h"
#include "tcp/tcp_gpu_staging.h"
#include "tcp/tcp_initiator.h"
#include "tcp/tcp_message_matcher.h"
#include "tcp/same_host_path.h"
#include "tcp/tcp_pairing.h"
#include "tcp/tcp_socket.h"
#include "tcp/tcp_target_server.h"

namespace dlslime {

// The state behind a TcpEndpoint: the front of four parts, each owning its own state
// (docs/tcp.md "Inside TcpEndpoint"):
//   Pairing         the peer, its lanes, hellos, connect waits   (tcp_pairing.h)
//   Initiator       the ops this endpoint starts, their answers  (tcp_initiator.h)
//   MessageMatcher  posted recvs and the peer's messages         (tcp_message_matcher.h)
//   TargetServer    the peer's reads and writes into our regions (tcp_target_server.h)
// The front keeps what spans them: the io_context, the lifecycle (start, connect,
// shutdown), the submission path (tcp_submit.cpp: user threads resolve handles, plan
// and encode an op, and hand it to the I/O thread), the frame dispatch to the parts
// (tcp_inbound.cpp), the one deadline timer, and fail_all(). Region tables are
// thread-safe and used from any thread; the parts' state is owned by the endpoint's I/O
// thread and touched only there.
class TcpEndpointImpl final : public tcp::FrameHandler,
                              public RegionRevoker,
                              public MemoryDomain,
                              public OpCanceller,
                              public std::enable_shared_from_this<TcpEndpointImpl> {
 public:
  using Clock = std::chrono::steady_clock;

  TcpEndpointImpl(const std::string& ip, uint16_t port, TcpOptions options,
                  std::shared_ptr<MemoryRegistry> regions);
  // Tests and fuzzers: an endpoint on the caller's io_context, which the caller drives
  // (poll/run) on its own thread; blocking calls that hop to the I/O thread run inline.
  // It listens on 127.0.0.1 (port chosen by the OS) once start() is called.
  TcpEndpointImpl(asio::io_context& io, TcpOptions options, std::shared_ptr<MemoryRegistry> regions);
  ~TcpEndpointImpl() override;

  // Tests and fuzzers, on the I/O thread: adopts `socket` (whose handshake is assumed
  // done) as the next dialed lane of a connection to peer `peer_id`, as connect() would.
  std::shared_ptr<tcp::TcpConnection> adopt_dialed_for_test(asio::ip::tcp::socket socket, uint64_t peer_id);

  void start();
  nlohmann::json endpoint_info() const;
  void connect(const nlohmann::json& peer_info);
  bool is_connected() const { return pairing_.connected(); }
  bool is_shut_down() const { return shut_down_.load(); }
  Future submit(OpRequest request);
  void shutdown();

  const std::string& host() const { return advertised_host_; }
  uint16_t port() const { return listener_->port(); }
  tcp::TcpListener::Stats listener_stats() const { return listener_->stats(); }
  const TcpOptions& options() const { return options_; }
  // {"path": "cma" | "tcp", "reason": ...}: SameHostPath::describe(). A fork() child
  // does not inherit the path (nor any use of this endpoint).
  nlohmann::json same_host() const {
    if (inherited()) {
      return {{"path", "tcp"}, {"reason", "this endpoint was created before fork(); create a new one in the child"}};
    }
    return same_host_.describe();
  }

  const std::shared_ptr<MemoryRegistry> local_regions;  // may be shared (PeerAgent)
  OwnerRemoteRegions remote_regions;
  // Adds a peer's region (its mr_info entry) to remote_regions, noting whether its memory
  // is not host memory (the entry's "memory"): writes to such a region stay off the
  // same-host path, which cannot place bytes in device memory.
  int32_t add_remote_region(const std::string& name, const nlohmann::json& entry);

  // Device memory in local_regions (the registry asks the device runtime) crosses TCP
  // through the staging (docs/tcp.md "GPU memory"), whoever registered it: the endpoint,
  // or a PeerAgent or pool sharing the registry (region_added below). Staging bytes in
  // use and their high-water mark (zeros before any device region):
  tcp::GpuStaging::Stats gpu_staging_stats() const;

  // tcp::FrameHandler
  tcp::RxAction on_header(tcp::TcpConnection& conn, const tcp::FrameHeader& h, tcp::PayloadSink& sink) override;
  void on_prefix(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view list,
                 tcp::PayloadSink& sink) override;
  void on_frame(tcp::TcpConnection& conn, const tcp::FrameHeader& h, const tcp::PayloadSink& sink,
                std::string_view text) override;
  void on_closed(tcp::TcpConnection& conn, const Status& why) override;

  // RegionRevoker
  void revoke_region(const RegionLifetime& lifetime) override;
  bool on_own_thread() const override {
    return io_.get_executor().running_in_this_thread() || IoRuntime::current_context() == &io_;
  }

  // OpCanceller (Future::cancel): hops to the I/O thread as unregister does (inline when
  // called there, from a continuation) and withdraws the op there, if it still can:
  // Initiator::cancel, MessageMatcher::withdraw_recv.
  bool cancel_op(OpState& op, uint64_t op_id) override;

  // MemoryDomain (attached at start()): notes the device regions, and makes the staging
  // at the first one. A peer names regions by handle, as OwnerResolvedDomain describes.
  void region_added(int32_t handle, const LocalRegion& region) override;
  void region_removed(int32_t handle, const LocalRegion& region) override;
  nlohmann::json describe(int32_t handle, const LocalRegion& region) const override {
    return OwnerResolvedDomain::instance().describe(handle, region);
  }

 private:
  using Submission = Initiator::Submission;
  using PostedRecv = MessageMatcher::PostedRecv;
  // A recv_notify on its way to the I/O thread.
  struct NotifyWait {
    std::shared_ptr<OpState> state;
    OpLimit limit;
  };
  // A submitted op or recv on its way to the I/O thread (by value: no allocation of its own).
  using Handoff = std::variant<Submission, PostedRecv, NotifyWait>;

  Future fail_now(OpKind kind, Status status) const;
  // False (and *error) if the op is invalid.
  bool prepare_one_sided(const OpRequest& req, uint64_t op_id, Submission& sub, Status* error);
  // `device`: the GPU of the message's buffer (-1: host memory), see message_device().
  void prepare_send(const OpRequest& req, uint64_t op_id, int device, Submission& sub);
  void prepare_notify(const OpRequest& req, uint64_t op_id, Submission& sub);
  // The GPU whose memory holds a send/recv buffer (-1: host memory). Asks the device
  // runtime only where one is present (found out once per endpoint), so a host without a
  // GPU runtime pays nothing per message. Makes the staging for a GPU buffer.
  int message_device(const Chunk& chunk, OpKind kind);
  // The staging (made at the first device region or GPU message buffer, on `device`).
  tcp::GpuStaging& make_staging(int device);
  // Queues a Submission or PostedRecv for the I/O thread (built in place in the queue).
  template <class Work>
  void hand_off(Work&& work);
  // Also called by cancel_op (an op may still be on its way to the I/O thread): an extra
  // drain is harmless, the one posted for those items finds fewer or none.
  void drain_handoffs();
  // Makes sweep() run at `deadline` (or a little later), unless it is due earlier already.
  void arm_sweeper(Clock::time_point deadline);
  // Ends what is past its deadline (O(log n) per op: no scan) and re-arms for the next.
  void sweep();
  // The sweeper wakes at most this often, however close together the deadlines are.
  static constexpr std::chrono::milliseconds kSweepGranularity{1};
  void fail_all(const Status& why);
  // This endpoint was made before fork() and this is the child: its I/O thread does not
  // exist here, and its asio state shares the parent's epoll instance.
  bool inherited() const noexcept { return runtime_ && !runtime_->usable(); }
  [[noreturn]] void throw_inherited() const;
  // Runs fn on the I/O thread and waits (at most kIoHopTimeout: TimeoutError).
  void run_on_io(std::function<void()> fn);
  static constexpr std::chrono::seconds kIoHopTimeout{10};
  // Runs fn(*this) on the I/O thread; the endpoint stays alive until it has run.
  template <class F>
  void post(F&& fn) {
    asio::post(io_, [self = shared_from_this(), fn = std::forward<F>(fn)]() mutable { fn(*self); });
  }

  TcpOptions options_;
  std::shared_ptr<IoRuntime> runtime_;
  asio::io_context& io_;
  const uint64_t endpoint_id_;
  std::string advertised_host_;
  std::shared_ptr<tcp::TcpListener> listener_;
  std::atomic<bool> shut_down_{false};
  std::atomic<uint64_t> next_op_id_{1};
  InflightLimiter inflight_;  // read/write/send ops from submit() until they end
  // Whether a GPU runtime is present, for message_device(): 0 not asked yet, 1 yes, 2 no.
  std::atomic<uint8_t> gpu_runtime_{0};
  // Submitted ops and recvs not yet taken by the I/O thread: a burst costs one post, and
  // the ops drained in one turn leave in one write per lane.
  SubmissionQueue<Handoff> handoffs_;
  bool draining_ = false;  // I/O thread only: drain_handoffs() is running
  // This endpoint as its ops' canceller (set at start(); weak: ops must not keep it alive).
  std::weak_ptr<OpCanceller> canceller_;

  // ---- I/O thread only (Pairing: also the connect waits and lane counts) ----
  // Device regions and their staging: read by the parts below, so declared before them.
  tcp::GpuPath gpu_;
  // The same-host path's negotiation and state (read by submitting threads: active()).
  SameHostPath same_host_{options_};
  // Remote regions whose memory is not host memory (add_remote_region), by local handle.
  mutable std::mutex remote_device_mu_;
  std::unordered_set<int32_t> remote_device_;  // guarded by remote_device_mu_
  std::atomic<bool> any_remote_device_{false};
  // Declared in this order: the parts refer to one another (see each), and to the
  // options and flags above.
  Pairing pairing_;
  Initiator initiator_;
  MessageMatcher matcher_;
  TargetServer target_;
  asio::steady_timer sweep_timer_;
  Clock::time_point sweep_at_ = Clock::time_point::max();  // when the armed sweep runs (max: none)
  uint64_t sweep_generation_ = 0;  // a re-armed timer's earlier wait is ignored
  bool failing_ = false;
};

}  // namespace dlslime
