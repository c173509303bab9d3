#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/copy_workers.h"
#include "core/memory_registry.h"
#include "dlslime/status.h"
#include "tcp/frame_codec.h"
#include "tcp/payload_sink.h"
#include "tcp/tcp_connection.h"
#include "tcp/tcp_gpu_staging.h"

namespace dlslime {

// The target side of the peer's one-sided ops: places its write frames into local
// regions and acknowledges each lane's frames of an op once, and answers its read
// requests from local regions. Every piece is checked against the local region table
// first; a bad one fails its frame alone (the op's acknowledgement or answer reports
// the error) and nothing of that frame is placed. Threads: the I/O thread only.
class TargetServer {
 public:
  TargetServer(const MemoryRegistry& regions, tcp::GpuPath& gpu) : regions_(regions), gpu_(gpu) {}

  // Device regions are registered: a write frame may need an incoming staging slot
  // (docs/tcp.md "GPU memory"). Reserves one for `conn`'s frame, or pauses the
  // connection until one is free (kPause: asked again then).
  tcp::RxAction reserve_staging(tcp::TcpConnection& conn, const tcp::FrameHeader& h);
  // A read request's header: kPause only while more than kMaxDeferredPieces pieces of
  // device-memory reads wait for an outgoing slot (resumed by serve_deferred).
  tcp::RxAction admit_read(tcp::TcpConnection& conn);
  // An outgoing staging slot was released: the deferred read answers take the free ones.
  void serve_deferred();

  // A write frame's piece list arrived (sink.prefix bytes): sets `sink` for its data.
  void on_write_prefix(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view list,
                       tcp::PayloadSink& sink);
  // A write frame was placed (or drained): the lane's last one is acknowledged.
  void on_write_frame(tcp::TcpConnection& conn, const tcp::FrameHeader& h);
  // Answers a read request (its piece list): one frame with all pieces' bytes, or the
  // first bad piece's error.
  void answer_read(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view list);
  // The peer is gone: forgets the errors of its writes and frees the staging it held.
  void clear();

  // The same-host path (docs/tcp.md "Same-host path"): the peer's pull requests are
  // copied by `workers`, never on the I/O thread, and each copy reports back through
  // `post` (which runs its function on the I/O thread while the endpoint lives).
  struct PullRunner {
    CopyWorkers* workers = nullptr;
    std::function<void(std::function<void()>)> post;
    std::atomic<uint64_t>* copied_bytes = nullptr;  // counts what the copies moved
  };
  void set_pull_runner(PullRunner runner) { pull_ = std::move(runner); }
  // A pull request's header: kPause while kMaxPullsInFlight requests are being copied
  // (resumed as they finish), so a peer cannot queue unbounded copies.
  tcp::RxAction admit_pull(tcp::TcpConnection& conn);
  // A pull request of the peer process `pid` (proved by SameHostPath): its pieces are
  // checked against the local regions exactly as a write frame's, held, and copied from
  // the peer's memory by a worker; kPullDone reports the outcome. A bad piece fails the
  // request alone and nothing of it is copied.
  void serve_pull(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view payload, uint32_t pid);
  // Shutdown: waits (until `deadline`) for the pull requests being copied and queues their
  // answers, so a peer whose bytes arrived learns so before the connections close (the
  // bytes are in place once the copy ends, and an application may see them and shut down
  // before the worker's report reached the I/O thread).
  void settle_pulls(std::chrono::steady_clock::time_point deadline);
  // A pull-read request (same-host reads: the peer copies out of our regions itself): its
  // pieces are checked as a read request's, their addresses go back in kReadGrant, and
  // their regions stay held until the peer releases the grant (release_read, answered by
  // kPullDone) or the connection ends. A bad piece fails the request alone.
  void grant_read(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view list);
  void release_read(tcp::TcpConnection& conn, const tcp::FrameHeader& h);
  // Whether a grant to `conn` holds `lifetime`'s region: unregister closes that connection,
  // the one way to end the peer's copies (docs/tcp.md "Same-host path").
  bool grants_hold(const tcp::TcpConnection* conn, const RegionLifetime* lifetime) const;

  // Appends answer `r` to `item` carrying `st`: its code, and its message (cut to
  // kMaxErrorText) as the payload; an OK status carries none.
  static void add_status(tcp::WriteItem& item, tcp::FrameHeader r, const Status& st);

  // Queues an acknowledgement (kWriteAck, kSendAck) of the peer's op `op_id` on `conn`.
  // A successful message acknowledgement still queued is superseded by the next one
  // (they are cumulative), so a burst of messages costs one frame.
  static void ack(tcp::TcpConnection& conn, tcp::FrameType type, uint64_t op_id, const Status& status);

 private:
  // A write op of the peer on one connection: the first error of its frames there, and for
  // frames staged into device memory the copies still running (its acknowledgement waits
  // for them). No entry while its frames all succeed on the host path. Its frames may be
  // interleaved with other ops' (a device-memory write's frames leave as they are staged),
  // hence the key.
  struct WriteKey {
    const tcp::TcpConnection* conn;
    uint64_t op_id;
    bool operator==(const WriteKey&) const = default;
  };
  struct WriteKeyHash {
    size_t operator()(const WriteKey& k) const noexcept {
      return std::hash<const void*>()(k.conn) ^ (std::hash<uint64_t>()(k.op_id) * 0x9E3779B97F4A7C15ull);
    }
  };
  struct InboundWrite {
    Status status;
    uint32_t copies = 0;   // staged frames whose device copies have not finished
    bool last = false;     // the lane's last frame arrived: acknowledge once copies == 0
    std::shared_ptr<tcp::TcpConnection> conn;  // while copies run
  };
  // Writes with an entry per connection at most: a peer that opens more without ending
  // them is closed (the table is bounded).
  static constexpr size_t kMaxOpenWrites = 65536;
  // The staging slot reserved for the frame a connection is reading, and for a write
  // frame into device memory, its destinations.
  struct StagedFrame {
    tcp::GpuStaging::Slot* slot = nullptr;
    Status error;  // why no slot could be had (the frame's op fails alone)
    std::vector<tcp::PayloadSegment> segments;
    RegionUses uses;
  };
  template <class OverLimit>
  Status resolve_pieces(std::string_view list, uint64_t first, uint64_t limit,
                        std::vector<tcp::PayloadSegment>& segments, RegionUses& uses, uint64_t* total,
                        bool* device, OverLimit over_limit) const;
  void record_error(tcp::TcpConnection& conn, uint64_t op_id, Status st);
  void place_staged(tcp::TcpConnection& conn, const tcp::FrameHeader& h, StagedFrame frame);
  void answer_device(tcp::TcpConnection& conn, const tcp::FrameHeader& r, uint64_t total, RegionUses uses);
  // An outgoing slot for a read answer; nullptr when none is free, or with *error set when
  // none can be had (the read then fails alone).
  tcp::GpuStaging::Slot* acquire_answer_slot(uint64_t total, Status* error);
  void answer_staged(tcp::TcpConnection& conn, const tcp::FrameHeader& r, tcp::GpuStaging::Slot* slot, uint64_t total,
                     const std::vector<tcp::PayloadSegment>& pieces, RegionUses uses);
  static void answer_error(tcp::TcpConnection& conn, const tcp::FrameHeader& r, const Status& st) {
    add_status(conn.control(), r, st);
  }
  tcp::GpuStaging::Slot* take_reserved(const tcp::TcpConnection* conn);
  void pull_finished(const std::weak_ptr<tcp::TcpConnection>& conn, const tcp::FrameHeader& r, const Status& copied);
  // The copies' outcomes, handed from the copy workers to the I/O thread.
  void answer_copied_pulls();
  // A pull's copy ended: connections paused by admit_pull read on once half are free.
  void pull_slot_freed();

  const MemoryRegistry& regions_;
  tcp::GpuPath& gpu_;
  std::unordered_map<WriteKey, InboundWrite, WriteKeyHash> inbound_writes_;
  std::unordered_map<const tcp::TcpConnection*, StagedFrame> staged_;
  std::vector<tcp::PayloadSegment> read_scratch_;  // answer_read's resolved pieces (capacity reused)

  // Read requests of device memory waiting for an outgoing slot, oldest first, with their
  // resolved pieces and the regions they hold. Bounded by the peer's reads in flight; a
  // peer past kMaxDeferredPieces pieces (tens of MiB of this table) is paused instead.
  struct DeferredRead {
    std::weak_ptr<tcp::TcpConnection> conn;
    tcp::FrameHeader header;  // the answer's
    uint64_t total = 0;
    std::vector<tcp::PayloadSegment> pieces;
    RegionUses uses;
  };
  static constexpr size_t kMaxDeferredPieces = size_t{1} << 20;
  std::deque<DeferredRead> deferred_;
  size_t deferred_pieces_ = 0;
  std::vector<std::weak_ptr<tcp::TcpConnection>> deferred_waiting_;

  PullRunner pull_;
  // Pull requests being copied (their regions are held by the copy): at most this many,
  // 64 MiB at the default chunk size; connections past it wait in pull_waiting_.
  static constexpr size_t kMaxPullsInFlight = 64;
  size_t pulls_in_flight_ = 0;
  std::vector<std::weak_ptr<tcp::TcpConnection>> pull_waiting_;
  // Shared with the copy workers (a copy may outlive a shutdown that stopped waiting).
  struct CopiedPull {
    std::weak_ptr<tcp::TcpConnection> conn;
    tcp::FrameHeader answer;
    Status copied;
  };
  struct PullOutcomes {
    std::mutex mu;
    std::condition_variable cv;
    size_t copying = 0;             // copies submitted and not yet ended
    std::vector<CopiedPull> ended;  // not yet answered
  };
  std::shared_ptr<PullOutcomes> outcomes_ = std::make_shared<PullOutcomes>();
  // Read grants held for the peer, by request. Bounded by refusing more (not by pausing:
  // the releases that free them arrive on the same connection).
  static constexpr size_t kMaxGrants = 65536;
  struct GrantKey {
    const tcp::TcpConnection* conn;
    uint64_t op_id;
    uint32_t index;
    bool operator==(const GrantKey&) const = default;
  };
  struct GrantKeyHash {
    size_t operator()(const GrantKey& k) const noexcept {
      return std::hash<const void*>()(k.conn) ^ (std::hash<uint64_t>()(k.op_id) * 0x9E3779B97F4A7C15ull) ^ k.index;
    }
  };
  std::unordered_map<GrantKey, RegionUses, GrantKeyHash> grants_;
};

}  // namespace dlslime
