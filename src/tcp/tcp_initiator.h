#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/buffer_lease.h"
#include "core/copy_workers.h"
#include "core/memory_registry.h"
#include "core/op_limit.h"
#include "core/op_state.h"
#include "core/pending_ops.h"
#include "core/submission_queue.h"
#include "dlslime/tcp_endpoint.h"
#include "tcp/frame_codec.h"
#include "tcp/payload_sink.h"
#include "tcp/tcp_gpu_staging.h"
#include "tcp/tcp_connection.h"
#include "tcp/write_item.h"

namespace dlslime {

class Pairing;

// The ops this endpoint starts (read, write, send) from the moment the I/O thread takes
// them until they end: the pending-op table with its deadlines, the messages awaiting
// their acknowledgement, and the peer's answers (write and message acks, read data).
// Every way an op ends goes through end_op(). Threads: the I/O thread only.
class Initiator {
 public:
  using Clock = std::chrono::steady_clock;

  // What an op whose local memory is on a GPU needs besides the host path's state
  // (docs/tcp.md "GPU memory"): a write's frames wait here until a staging slot holds
  // their bytes (copied from the device), a read's answers land in slots and are copied
  // to the device before they count. An op that ends while copies of its memory are
  // still running completes only once they have finished (`deferred`).
  struct GpuOp {
    struct Frame {
      uint16_t lane = 0;
      tcp::FrameHeader header;
      std::vector<uint8_t> list;                  // the piece list
      std::vector<tcp::PayloadSegment> sources;   // local bytes, in payload order
      uint64_t bytes = 0;
    };
    std::deque<Frame> frames;  // not staged yet, in wire order
    // A send: its frames not handed to lane 0 yet (later messages wait behind it).
    bool message = false;
    uint32_t unsent = 0;
    uint32_t copies = 0;       // slots whose copies have not finished
    bool ended = false;
    // The completion of an op that ended while `copies` > 0.
    std::shared_ptr<OpState> state;
    Status status;
    uint64_t nbytes = 0;
    RegionUses uses;
    InflightLimiter::Slot slot;
  };

  // An initiated op waiting for its acknowledgements or data (its deadline is kept by
  // pending_). Everything it references (frames queued on lanes, sinks into its buffers,
  // its regions) is released by end_op(), the one way an op ends, before its future
  // completes.
  struct PendingOp {
    std::shared_ptr<OpState> state;
    RegionUses uses;             // the local regions its frames and sinks point into
    InflightLimiter::Slot slot;  // counted against max_inflight_ops until it ends
    // Parts not reported done yet, over every data mover that claimed some of the op
    // (core/data_mover.h): the lanes' acknowledgements of a write, the pieces of a read
    // not answered yet. The op completes when it reaches 0.
    uint32_t parts_left = 0;
    uint64_t ack_lanes = 0;  // write: bit per dialed lane whose acknowledgement is due
    std::vector<tcp::PayloadSegment> reads;  // read: destination of each piece, by index
    // read, or pulled write: at the first piece of each request not answered yet, its
    // piece count (an answer must match one exactly, once)
    std::vector<uint16_t> read_runs;
    uint64_t nbytes = 0;      // read: bytes placed so far; write: the batch's bytes
    Status error;             // the first error an answer reported
    OpLimit limit;  // its deadline's source, for the timeout's message
    std::shared_ptr<GpuOp> gpu;  // local memory on a GPU (null: the host path)
    // On the same-host path (docs/tcp.md "Same-host path"), one part per request, each
    // answered by kPullDone: a write's requests once the peer has copied their bytes out of
    // our memory, a read's once we have copied them out of the peer's (granted) and
    // released the grant.
    bool pulled = false;
    // A pulled read: our copy workers' jobs still writing its memory (end_op waits for them).
    std::shared_ptr<std::atomic<uint32_t>> copying;
    // A pulled message: its buffer is lent to the receiver, which copies it out itself and
    // checks the lease afterwards; ended before the op completes, however it ends.
    BufferLease lease;
  };
  // How pulled reads copy: on `workers`, reporting back through `post` (runs its function
  // on the I/O thread while the endpoint lives), out of process `peer_pid()` (0: the path
  // is not established).
  struct PullRunner {
    CopyWorkers* workers = nullptr;
    std::function<void(std::function<void()>)> post;
    std::function<uint32_t()> peer_pid;
    std::atomic<uint64_t>* copied_bytes = nullptr;  // counts what the copies moved
  };
  // read_runs marks a pulled read's request granted (its copy done or running) with this.
  static constexpr uint16_t kGranted = 0x8000;  // > kMaxPieces
  // A prepared op on its way from the submitting thread to the I/O thread.
  struct Submission {
    uint64_t op_id = 0;
    Clock::time_point deadline = Clock::time_point::max();
    PendingOp op;
    std::vector<std::pair<uint16_t, tcp::WriteItem>> items;  // (lane, frames)
  };
  // What drop_all() took out of the table, to be failed once the bookkeeping is done.
  struct Dropped {
    PendingOps<PendingOp, Clock> ops;
    void fail(const Status& why);
  };

  Initiator(const TcpOptions& options, Pairing& pairing, tcp::GpuPath& gpu);

  // Queues the op's frames on its lanes and adds it to the table, or completes it at once
  // (not connected, nothing to move). Returns the deadline it now waits for (max: none),
  // for the endpoint's sweeper.
  Clock::time_point start_op(Submission& sub);

  // The peer's answers to our ops.
  void on_write_ack(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view text);
  void on_send_ack(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view text);
  // The receiver copied a pulled message out of our memory (or refused it): its own answer,
  // never covered by on_send_ack's cumulative ones.
  void on_send_copied(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view text);
  // A notification's own acknowledgement (not cumulative: notifications are answered
  // as they arrive, messages possibly later).
  void on_notify_ack(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view text);
  // The answer to one pull request of a same-host write or read (docs/tcp.md "Same-host path").
  void on_pull_done(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view text);
  // The grant of one pull-read request: our copy workers copy its pieces out of the peer,
  // then the grant is released.
  void on_read_grant(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view payload);
  void set_pull_runner(PullRunner runner) { pull_ = std::move(runner); }
  tcp::RxAction on_read_header(tcp::TcpConnection& conn, const tcp::FrameHeader& h, tcp::PayloadSink& sink);
  void on_read_frame(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view text);
  // Stages the next frames of device-memory writes while staging slots are free.
  void pump_gpu();

  // Future::cancel (docs/api.md "Cancellation"): ends op `op_id` with the user's
  // cancellation if that touches no connection: its frames not yet written are dropped,
  // a read answer arriving for it is drained, late answers are ignored. False (nothing
  // changed) if it has ended, or if bytes of its memory are being moved right now (a
  // frame half on the wire, an answer read straight into it, a GPU copy), or if it is a
  // message that went out in part (the receiver must see it whole or not at all).
  bool cancel(uint64_t op_id);
  // Ends the ops that hold `lifetime`'s region (it is being unregistered).
  void revoke(const RegionLifetime& lifetime);
  // Ends the ops past their deadline (O(log n) per op: no scan).
  void expire(Clock::time_point now);
  Clock::time_point next_deadline() { return pending_.next_deadline(); }
  // The peer is gone (its lanes are closed already): takes every op out.
  Dropped drop_all();

 private:
  // Ends op `op_id` if it is still pending (a late answer to an op that already ended is
  // dropped): end_op().
  void finish_op(uint64_t op_id, Status status, uint64_t nbytes = 0);
  // The one way an initiated op ends (answered, refused, expired, revoked), once it is out
  // of pending_ (`op` is what pending_ handed out, destroyed by the caller after):
  // releases its queued frames, sinks and regions, closes a lane still moving its bytes,
  // then completes the future. True if this completed it (false: it waits for GPU copies
  // of its memory, or it had completed).
  bool end_op(uint64_t op_id, PendingOp& op, Status status, uint64_t nbytes = 0);
  // Counts an answered read request (its bytes are in local memory).
  void count_read(uint64_t op_id, const tcp::FrameHeader& h, std::string_view text, const Status& copied);
  // A write frame's bytes are in slot `slot`: sends the frame (or drops it: the op ended).
  void on_frame_staged(uint64_t op_id, const std::shared_ptr<GpuOp>& gpu, tcp::GpuStaging::Slot* slot,
                       GpuOp::Frame& frame, const Status& copied);
  // Hands the messages at the front of outbox_ to lane 0, up to the first GPU message
  // whose frames are still being staged.
  void advance_outbox();
  // A copy of an op's memory finished: completes it if it ended meanwhile.
  static void copy_finished(GpuOp& gpu);
  // A pulled read's copy of one request finished (or failed): the grant is released, and
  // the bytes counted.
  void read_pulled(const std::weak_ptr<tcp::TcpConnection>& conn, uint64_t op_id, uint32_t index, uint32_t count,
                   uint64_t bytes, const Status& copied);
  static void release_grant(tcp::TcpConnection& conn, uint64_t op_id, uint32_t index, uint32_t count,
                            const Status& copied);
  // Blocks until no copy job writes `op`'s memory any more (bounded: one request's copy).
  static void wait_for_copies(const PendingOp& op);
  // Fails the connection: a frame that contradicts the state of its op.
  void violation(tcp::TcpConnection& conn, std::string what);

  const TcpOptions& options_;
  Pairing& pairing_;
  PendingOps<PendingOp, Clock> pending_;
  // Messages sent, in the order they went out on lane 0, until acknowledged (on_send_ack).
  // Expired ones stay until a later acknowledgement passes them (bounded: start_op drops
  // expired ones from the front).
  std::deque<uint64_t> sends_;
  tcp::GpuPath& gpu_;
  // Device-memory writes and sends with frames waiting for a staging slot, in submission
  // order.
  std::deque<std::pair<uint64_t, std::shared_ptr<GpuOp>>> gpu_queue_;
  // Messages behind a GPU message whose frames are still being staged: they go out on
  // lane 0 in submission order (the receiver matches, and acknowledges, in that order).
  // A host message goes straight out while this is empty.
  struct Outgoing {
    uint64_t op_id = 0;
    tcp::WriteItem item;          // a host message's frames
    std::shared_ptr<GpuOp> gpu;   // or a GPU message, staged through gpu_queue_
  };
  std::deque<Outgoing> outbox_;
  // Same-host writes that ended (expired, revoked) while the peer may still be copying out
  // of their memory: their regions stay held until each request is answered, so that
  // unregister waits for those copies as it waits for frames. Emptied when the peer is lost.
  struct Lingering {
    uint32_t parts = 0;
    RegionUses uses;
  };
  std::unordered_map<uint64_t, Lingering> lingering_;
  PullRunner pull_;
};

}  // namespace dlslime
