// RDMAEndpoint's implementation (docs/rdma.md): RC queue pairs over the verbs seam, one CQ
// polled by the endpoint's completion thread, software send queues, and the op table.
//
// Threads: any thread submits (under mu_); the completion thread polls the CQ, posts what
// waits in the software queues, and expires deadlines. Futures complete outside mu_, inside
// a CompletionScope, after the op's region uses are dropped.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <condition_variable>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/batch_planner.h"
#include "core/completion_thread.h"
#include "core/memory_registry.h"
#include "core/notification_inbox.h"
#include "core/op_limit.h"
#include "core/op_state.h"
#include "core/pending_ops.h"
#include "core/remote_regions.h"
#include "dlslime/rdma_endpoint.h"
#include "rdma/rdma_device.h"
#include "rdma/verbs.h"

namespace dlslime {

// How an initiator addresses a peer's region: the peer's virtual address and rkey.
struct RdmaRemoteKey {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  bool writable = true;  // false: the owner published it read-only ("access": "read")
};

class RdmaEndpointImpl final : public RegionRevoker,
                               public OpCanceller,
                               public std::enable_shared_from_this<RdmaEndpointImpl> {
 public:
  RdmaEndpointImpl(RdmaOptions options, std::shared_ptr<MemoryRegistry> regions);
  ~RdmaEndpointImpl() override;
  void start();  // attaches the memory domain and starts the completion thread

  // Both reopen a failed connection first (reopen_if_failed): the info names fresh QPs.
  nlohmann::json endpoint_info();
  void connect(const nlohmann::json& peer_info);
  bool is_connected() const;
  // shutdown() has run.
  bool is_shut_down() const {
    std::lock_guard lock(mu_);
    return closed_;
  }
  int32_t register_remote(const std::string& name, const nlohmann::json& entry);
  nlohmann::json mr_info() const;
  nlohmann::json mr_info_of(const std::string& name) const;
  Future submit(OpRequest request);
  void shutdown();
  void join_thread() { thread_.join(); }  // after shutdown(): the completion thread ends
  std::vector<uint32_t> qp_nums() const;

  const RdmaOptions options;
  // Receive WRs carry this bit and their buffer slot; send WRs count up from 1.
  static constexpr uint64_t kRecvWrFlag = uint64_t(1) << 63;
  // The size of each eager receive buffer; every SEND this endpoint posts fits one.
  static constexpr uint32_t kEagerBuffer = 8192;
  const std::shared_ptr<MemoryRegistry> regions;

  // RegionRevoker
  void revoke_region(const RegionLifetime& lifetime) override;
  bool on_own_thread() const override;

  // OpCanceller (Future::cancel, docs/api.md "Cancellation"): under mu_, withdraws what the
  // NIC has not seen: a posted recv or imm_recv still waiting, a send still behind the
  // credit, a one-sided op none of whose WRs has been posted (all of them beyond the send
  // queue's depth). A WR posted to a QP cannot be taken back: false for those.
  bool cancel_op(OpState& op, uint64_t op_id) override;

 private:
  // One work request waiting for a send-queue slot.
  struct QueuedWr {
    uint64_t op_id = 0;
    rdma::WrOpcode opcode = rdma::WrOpcode::kRdmaWrite;
    uint64_t local_addr = 0;
    uint32_t length = 0;
    uint32_t lkey = 0;
    uint64_t remote_addr = 0;
    uint32_t rkey = 0;
    uint32_t imm = 0;
    bool last_of_op = false;  // the op's last WR on this lane: always signaled
    int32_t slot = -1;        // a control message's send slot, freed when the WR completes
    bool device = false;      // the local buffer is GPU memory: never posted inline
  };
  // A posted WR not yet known to be complete (wr_id = seq).
  struct PostedWr {
    uint64_t seq = 0;
    uint64_t op_id = 0;
    uint32_t length = 0;
    int32_t slot = -1;
  };
  struct Lane {
    std::unique_ptr<rdma::QueuePair> qp;
    uint32_t psn = 0;
    uint64_t next_seq = 1;
    std::deque<PostedWr> posted;   // in the send queue, oldest first
    std::deque<QueuedWr> waiting;  // the software queue: beyond the send queue's depth
    uint32_t since_signal = 0;     // unsignaled WRs posted since the last signaled one
    bool failed = false;
    Status cause;  // why the QP went to error; its flushed WRs fail with this code
  };
  struct Op {
    std::shared_ptr<OpState> state;
    RegionUses uses;
    uint64_t wrs_left = 0;
    uint64_t nbytes = 0;
    uint64_t lanes = 0;  // bitmask of the lanes carrying its WRs
    Status error;
    // Two-sided (rdma_messages.cpp): a send waiting for the receiver's DONE, or a recv
    // reading a rendezvous message, which answers DONE(seq) when it ends.
    bool is_recv = false;
    bool one_sided = false;  // read, write, write_with_imm: it reaches the peer's regions
    uint64_t msg_seq = 0;
    std::unique_ptr<rdma::MemoryRegion> temp_mr;  // a buffer outside registered memory
    OpLimit limit;  // its deadline's source (start_deadline), for the timeout's message
  };
  struct Done {
    std::shared_ptr<OpState> state;
    Status status;
    uint64_t nbytes = 0;
  };
  struct ImmEvent {
    uint32_t imm = 0;
    uint32_t byte_len = 0;
  };

  // A QP in INIT on the endpoint's port (lane `index`, for errors).
  std::unique_ptr<rdma::QueuePair> new_qp(size_t index);
  // Reconnection (docs/rdma.md): once any lane has failed, moves the others to ERR, waits
  // (bounded by drain_bound(); released while waiting) until every WR of the old QPs has
  // come back, then replaces them with fresh QPs in INIT (new QPNs and PSNs) and re-arms
  // the message buffers. Regions and their rkeys stay. Throws ConnectionError if the old
  // work does not come back in time or a new QP cannot be made (the endpoint stays failed).
  void reopen_if_failed(std::unique_lock<std::mutex>& lock);
  bool failed_work_drained() const;
  std::chrono::milliseconds drain_bound() const;
  // connect() failed half-way through the transitions: fails every lane, then throws.
  [[noreturn]] void abandon_connect(std::unique_lock<std::mutex>& lock, const std::string& why);
  void run();
  void poll_cq(std::vector<Done>& done);
  void on_send_completion(Lane& lane, size_t index, const rdma::WorkCompletion& wc, std::vector<Done>& done);
  void on_recv_completion(const rdma::WorkCompletion& wc, std::vector<Done>& done);
  void finish_wr(uint64_t op_id, uint32_t length, const Status& status, std::vector<Done>& done);
  void pump(Lane& lane, size_t index, std::vector<Done>& done);
  // Moves the lane's QP to ERR (its posted WRs come back flushed) and fails what waits.
  void fail_lane(Lane& lane, size_t index, Status cause, std::vector<Done>& done);
  void expire(std::vector<Done>& done);
  void post_recv_slot(uint32_t slot);

  // --- two-sided messages (rdma_messages.cpp) ---
  // Eager messages are copied through fixed receive buffers; larger ones are read by the
  // receiver from the sender's buffer (rendezvous). All of it travels on lane 0 as SENDs.
  // How long a recv or imm_recv waits for its message (review F11): its own timeout, else
  // recv_timeout; kNever for none. Once a message is matched, the recv's reading of it
  // is an op with the op deadline (it has posted work).
  struct MessageWait {
    PendingOps<Op>::TimePoint deadline = PendingOps<Op>::kNever;
    OpLimit limit;
    Status expired(OpKind kind) const;
  };
  struct PostedRecv {
    std::shared_ptr<OpState> state;
    uint64_t addr = 0;
    uint64_t length = 0;
    bool exact_size = false;  // OpRequest::exact_size: a shorter message fails it
    bool device = false;      // GPU memory: an eager message is copied in by the GPU runtime
    MessageWait wait;
  };
  struct Unexpected {
    uint32_t type = 0;
    uint64_t seq = 0;
    uint64_t length = 0;
    uint64_t addr = 0;  // rendezvous: the sender's buffer
    uint32_t rkey = 0;
    std::vector<uint8_t> payload;  // eager: the bytes, copied out of the receive buffer
  };
  void setup_messages();
  void arm_messages();  // frees every send slot and posts every receive buffer on lane 0
  Future submit_send(const OpRequest& request, std::shared_ptr<OpState> state, std::unique_lock<std::mutex>& lock);
  Future submit_recv(const OpRequest& request, std::shared_ptr<OpState> state, std::unique_lock<std::mutex>& lock);
  Future submit_recv_notify(const OpRequest& request, std::shared_ptr<OpState> state,
                            std::unique_lock<std::mutex>& lock);
  // Moves what the inbox ended into `done` (completed once mu_ is released).
  static void take_ended(NotificationInbox::EndedList& ended, std::vector<Done>& done);
  // Queues a control message on lane 0 (header + payload copied into a send slot).
  // `reason`: a DONE's DoneReason (rdma_messages.cpp), 0 for other messages.
  bool post_control(uint32_t type, uint32_t status, uint64_t seq, uint64_t length, uint64_t addr, uint32_t rkey,
                    uint32_t reason, const void* payload, size_t payload_len, std::vector<Done>& done);
  void start_pending_sends(std::vector<Done>& done);
  void on_message(const uint8_t* buf, uint32_t len, std::vector<Done>& done);
  // Matches the oldest unexpected message with the oldest posted recv while both exist.
  void match(std::vector<Done>& done);
  void deliver(PostedRecv recv, Unexpected msg, std::vector<Done>& done);
  void fail_messages(const Status& cause, std::vector<Done>& done);
  void on_recv_op_finished(Op& op, const Status& status, std::vector<Done>& done);
  std::optional<uint32_t> lkey_for(uint64_t addr, uint64_t length, std::unique_ptr<rdma::MemoryRegion>& temp,
                                   uint32_t access, RegionUses& uses);
  // Whether a message buffer is GPU memory: its region's kind, or the GPU runtime's answer
  // for memory outside registered regions.
  bool device_buffer(uint64_t addr, uint64_t length) const;
  void say_bye();
  // Unregistration at the owner (docs/rdma.md): REVOKE(rkey) to the peer, which stops new
  // ops on it and answers REVOKED once its earlier one-sided ops have ended; only then is
  // the MR deregistered, so an op in flight never meets a dead rkey (a QP error).
  void revoke_remote_access(uint32_t rkey);
  void check_revokes(std::vector<Done>& done);

  std::unique_ptr<rdma::MemoryRegion> recv_mr_, send_mr_;
  std::vector<uint8_t> recv_pool_, send_pool_;
  std::vector<int32_t> free_slots_;
  uint32_t credit_ = 0;                   // most of our messages the peer has not answered yet
  uint64_t next_msg_seq_ = 1;
  std::unordered_map<uint64_t, uint64_t> awaiting_done_;  // message seq -> send op id
  struct PendingSend {
    uint64_t op_id = 0;
    Chunk chunk;
    std::optional<std::string> notification;  // send_notify: an eager NOTIFY instead of a message
  };
  std::deque<PendingSend> pending_sends_;  // beyond the credit
  std::deque<PostedRecv> recvs_;
  std::deque<Unexpected> unexpected_;
  // The peer's notifications, answered DONE as they arrive (so they take no credit) and
  // held within credit x kEagerBuffer bytes: the budget its unmatched messages have.
  NotificationInbox notes_;
  bool peer_closed_ = false;
  uint32_t recvs_posted_ = 0;  // receive WRs on lane 0 not yet completed (or flushed)
  Status previous_failure_;    // why the last connection failed, for NOT_CONNECTED's message
  // Owner side: REVOKEs sent and not yet answered; revoke_cv_ wakes their waiters.
  uint64_t next_revoke_seq_ = 1;
  std::unordered_set<uint64_t> revokes_waiting_;
  std::condition_variable revoke_cv_;
  // Initiator side: rkeys the peer revoked, and the answers owed once every op older than
  // the watermark (an op id) has ended.
  std::unordered_set<uint32_t> revoked_rkeys_;
  struct OwedRevoke {
    uint64_t seq = 0;
    uint64_t watermark = 0;
  };
  std::vector<OwedRevoke> owed_revokes_;
  bool checking_revokes_ = false;
  Status wc_status(const Lane& lane, size_t index, const rdma::WorkCompletion& wc) const;
  Status lane_failed_status(const Lane& lane, size_t index) const;
  Status flushed_status(const Lane& lane, size_t index) const;
  void wake();
  // The deadline of an op starting now: its own timeout (OpRequest::timeout) or the
  // endpoint's op_timeout, recorded in `op` for the timeout's message. kNever: none.
  PendingOps<Op>::TimePoint start_deadline(const OpRequest& request, Op& op) const;
  // The wait of a recv or imm_recv submitted now; lowers wait_deadline_ to its deadline.
  MessageWait start_wait(const OpRequest& request);
  // Fails the recvs and imm_recvs whose wait has passed (under mu_); called by expire().
  void expire_waits(PendingOps<Op>::TimePoint now, std::vector<Done>& done);
  // Liveness (RdmaOptions::keepalive): whether probing applies now, and the probe itself,
  // a zero-length RDMA write on lane 0 when nothing else is there (under mu_).
  bool keepalive_applies() const;
  void keep_alive(PendingOps<Op>::TimePoint now, std::vector<Done>& done);
  // Called once an op with `deadline` is in ops_ (with or without mu_): wakes the
  // completion thread if it sleeps past that deadline, so that it is not missed.
  void wake_for_deadline(PendingOps<Op>::TimePoint deadline);
  static void complete_all(std::vector<Done>& done);

  std::shared_ptr<rdma::Device> device_;
  std::shared_ptr<rdma::RdmaMemoryDomain> domain_;
  std::unique_ptr<rdma::CompletionQueue> cq_;
  std::vector<Lane> lanes_;  // fixed size; guarded by mu_ (the QPs themselves are thread-safe)
  uint32_t max_inline_ = 0;
  int wake_fd_ = -1;

  mutable std::mutex mu_;
  bool connected_ = false;
  bool closed_ = false;
  bool closing_ = false;  // shutdown() began (it says BYE before closing)
  uint64_t next_op_id_ = 1;
  PendingOps<Op> ops_;
  std::deque<ImmEvent> imm_events_;                  // arrived, no imm_recv yet
  struct ImmWaiter {
    std::shared_ptr<OpState> state;
    MessageWait wait;
  };
  std::deque<ImmWaiter> imm_waiters_;  // imm_recv ops, no event yet
  // At most the earliest MessageWait::deadline in recvs_ and imm_waiters_ (one matched
  // early leaves it early: expire_waits() then recomputes it).
  PendingOps<Op>::TimePoint wait_deadline_ = PendingOps<Op>::kNever;
  // A completion of this connection came back (the peer has connected back): from then on
  // it is probed. Set by the completion thread; cleared when a connection starts.
  bool peer_answered_ = false;
  PendingOps<Op>::TimePoint probe_at_ = PendingOps<Op>::kNever;  // the next keepalive probe
  BatchPlan plan_;
  std::atomic<int64_t> sleep_until_ns_{INT64_MAX};  // the completion thread's wake-up time
  // Notified (with mu_ not held) by the completion thread after each turn and when it
  // ends: shutdown() waits on it for its flushed ops, say_bye() for its BYE's completion.
  std::condition_variable progress_cv_;

  RemoteRegions<RdmaRemoteKey> remote_;
  std::atomic<bool> stop_{false};
  std::weak_ptr<OpCanceller> canceller_;  // this endpoint, for its ops (set at start())
  CompletionThread thread_;
};

}  // namespace dlslime
