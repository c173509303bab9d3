#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

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
#include "tcp/tcp_socket.h"

namespace dlslime {

// The state behind a TcpEndpoint (tcp_endpoint_impl.cpp: lifecycle, connecting,
// deadlines, failure; tcp_submit.cpp: preparing ops; tcp_inbound.cpp: handling the peer's frames).
// Region tables are thread-safe and used from any thread; everything else (connections, pending ops, posted receives) is owned by the
// endpoint's I/O thread and touched only there. User threads prepare an op (resolve
// handles, build frames) and post it to that thread.
class TcpEndpointImpl final : public tcp::FrameHandler,
                              public RegionRevoker,
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
  bool is_connected() const { return connected_.load(std::memory_order_acquire); }
  Future submit(OpRequest request);
  void shutdown();

  const std::string& host() const { return advertised_host_; }
  uint16_t port() const { return listener_->port(); }
  const TcpOptions& options() const { return options_; }

  const std::shared_ptr<MemoryRegistry> local_regions;  // may be shared (PeerAgent)
  OwnerRemoteRegions remote_regions;

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

 private:
  // An initiated op waiting for its acknowledgements or data (its deadline is kept by
  // pending_). Everything it references (frames queued on lanes, sinks into its buffers,
  // its regions) is released by end_op(), the one way an op ends, before its future
  // completes.
  struct PendingOp {
    std::shared_ptr<OpState> state;
    RegionUses uses;      // the local regions its frames and sinks point into
    InflightLimiter::Slot slot;  // counted against max_inflight_ops until it ends
    uint64_t ack_lanes = 0;  // write: bit per dialed lane whose acknowledgement is due
    std::vector<tcp::PayloadSegment> reads;  // read: destination of each piece, by index
    // read: at the first piece of each request not answered yet, its piece count (an
    // answer must match one exactly, once)
    std::vector<uint16_t> read_runs;
    uint32_t reads_left = 0;                 // read: pieces not answered yet
    uint64_t nbytes = 0;          // read: bytes placed so far
    Status error;                 // the first error an answer reported
  };
  // A prepared op on its way from the submitting thread to the I/O thread.
  struct Submission {
    uint64_t op_id = 0;
    Clock::time_point deadline = Clock::time_point::max();
    PendingOp op;
    std::vector<std::pair<uint16_t, tcp::WriteItem>> items;  // (lane, frames)
  };
  struct PostedRecv {
    std::shared_ptr<OpState> state;
    uint8_t* addr = nullptr;
    uint64_t length = 0;
    uint64_t local_id = 0;
    // Set on the I/O thread when it is posted (post_recv), so that recvs_, in posting
    // order, is in deadline order too.
    Clock::time_point deadline = Clock::time_point::max();
  };
  // A submitted op or recv on its way to the I/O thread (by value: no allocation of its own).
  using Handoff = std::variant<Submission, PostedRecv>;
  // A message from the peer, matched to a posted recv or held until one is posted.
  struct InboundMessage {
    uint64_t op_id = 0;  // the sender's op id, echoed in its ack
    std::weak_ptr<tcp::TcpConnection> conn;
    bool matched = false;
    PostedRecv recv;               // when matched (recv.state reset once it has completed)
    std::vector<uint8_t> buffered;  // when unmatched
    uint64_t received = 0;
    bool complete = false;
    bool too_large = false;  // longer than the posted receive buffer
    bool acked = false;      // the sender has been told the message arrived
  };
  // The first error of the write frames of one op arriving on one connection (they are
  // contiguous); no entry while they all succeed.
  struct InboundWrite {
    uint64_t op_id = 0;
    Status status;
  };

  // Now + timeout, or no deadline for a timeout <= 0.
  static Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
    return timeout.count() <= 0 ? Clock::time_point::max() : Clock::now() + timeout;
  }
  Future fail_now(OpKind kind, Status status) const;
  // False (and *error) if the op is invalid.
  bool prepare_one_sided(const OpRequest& req, uint64_t op_id, Submission& sub, Status* error);
  void prepare_send(const OpRequest& req, uint64_t op_id, Submission& sub);
  void hand_off(Handoff h);
  void drain_handoffs();
  void start_op(Submission& sub);
  void post_recv(PostedRecv recv);
  tcp::RxAction on_message_header(tcp::TcpConnection& conn, const tcp::FrameHeader& h, tcp::PayloadSink& sink);
  void attach(InboundMessage& msg, PostedRecv recv);
  void finish_message(InboundMessage& msg);
  void resume_paused();
  void ack(tcp::TcpConnection& conn, tcp::FrameType type, uint64_t op_id, const Status& status);
  void answer_read(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view list);
  template <class OverLimit>
  Status resolve_pieces(std::string_view list, uint64_t first, uint64_t limit,
                        std::vector<tcp::PayloadSegment>& segments, RegionUses& uses, uint64_t* total,
                        OverLimit over_limit) const;
  void on_send_ack(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view text);
  void on_write_ack(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view text);
  // Ends op `op_id` if it is still pending (a late answer to an op that already ended is
  // dropped): end_op().
  void finish_op(uint64_t op_id, Status status, uint64_t nbytes = 0);
  // The one way an initiated op ends (answered, refused, expired, revoked), once it is out
  // of pending_: releases its queued frames, sinks and regions, closes a lane still moving
  // its bytes, then completes the future.
  void end_op(uint64_t op_id, PendingOp op, Status status, uint64_t nbytes = 0);
  // Fails the connection: a frame that contradicts the state of its op.
  void violation(tcp::TcpConnection& conn, std::string what);
  // Messages held before a recv was posted: each costs its bytes plus this much.
  static constexpr uint64_t kHeldMessageOverhead = 256;
  void forget_held(const InboundMessage& msg);
  std::shared_ptr<InboundMessage> take_held_front();
  // Makes sweep() run at `deadline` (or a little later), unless it is due earlier already.
  void arm_sweeper(Clock::time_point deadline);
  // Ends what is past its deadline (O(log n) per op: no scan) and re-arms for the next.
  void sweep();
  // The sweeper wakes at most this often, however close together the deadlines are.
  static constexpr std::chrono::milliseconds kSweepGranularity{1};
  void fail_all(const Status& why);
  Status decide_hello(const tcp::Hello& hello);
  void pair_with(uint64_t peer_id);
  void adopt_accepted(asio::ip::tcp::socket socket, const tcp::Hello& hello);
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
  std::atomic<bool> connected_{false};
  std::atomic<bool> shut_down_{false};
  std::atomic<uint64_t> next_op_id_{1};
  InflightLimiter inflight_;  // read/write/send ops from submit() until they end
  std::atomic<uint16_t> lanes_up_{0};
  // connect() calls waiting for their dial, so that shutdown() can end them at once.
  struct ConnectWait {
    std::promise<Status> promise;
    std::atomic<bool> finished{false};
    void finish(Status st) {  // the first outcome wins: the dial's, or shutdown's
      if (!finished.exchange(true)) promise.set_value(std::move(st));
    }
  };
  std::mutex connects_mu_;
  std::vector<std::weak_ptr<ConnectWait>> connects_;  // guarded by connects_mu_
  // Submitted ops and recvs not yet taken by the I/O thread: a burst costs one post, and
  // the ops drained in one turn leave in one write per lane.
  SubmissionQueue<Handoff> handoffs_;

  // ---- I/O thread only ----
  uint64_t peer_id_ = 0;  // the endpoint this one is paired with (0 = none yet)
  uint64_t previous_peer_id_ = 0;  // the last one it was paired with, even after a loss
  std::vector<std::shared_ptr<tcp::TcpConnection>> dialed_;    // by lane: our requests
  std::vector<std::shared_ptr<tcp::TcpConnection>> accepted_;  // the peer's requests
  // Answers queued to the peer on all its connections (bounded per peer, not per lane).
  std::shared_ptr<tcp::AnswerBudget> answer_budget_ = std::make_shared<tcp::AnswerBudget>();
  PendingOps<PendingOp, Clock> pending_;
  // Messages sent, in the order they went out on lane 0, until acknowledged (on_send_ack).
  // Expired ones stay until a later acknowledgement passes them (bounded: start_op drops
  // expired ones from the front).
  std::deque<uint64_t> sends_;
  std::deque<PostedRecv> recvs_;  // posting order = deadline order (PostedRecv::deadline)
  std::deque<std::shared_ptr<InboundMessage>> unexpected_;
  std::shared_ptr<InboundMessage> current_msg_;  // message whose frames are arriving
  uint64_t unexpected_bytes_ = 0;
  std::weak_ptr<tcp::TcpConnection> paused_conn_;
  std::unordered_map<const tcp::TcpConnection*, InboundWrite> inbound_writes_;
  std::vector<tcp::PayloadSegment> read_scratch_;  // answer_read's resolved pieces (capacity reused)
  std::string last_loss_;  // why the last connection was lost, for NOT_CONNECTED errors
  asio::steady_timer sweep_timer_;
  Clock::time_point sweep_at_ = Clock::time_point::max();  // when the armed sweep runs (max: none)
  uint64_t sweep_generation_ = 0;  // a re-armed timer's earlier wait is ignored
  bool failing_ = false;
};

}  // namespace dlslime
