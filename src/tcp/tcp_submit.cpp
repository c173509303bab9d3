#include "tcp/tcp_endpoint_impl.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <span>

#include <fmt/format.h>

#include "core/batch_planner.h"
#include "core/data_mover.h"
#include "core/log.h"
#include "dlslime/errors.h"
#include "tcp/wire.h"

// TcpEndpointImpl's submission path: preparing operations on the caller's thread
// (resolve handles, plan lanes, encode frames) and handing them to the I/O thread, where
// the Initiator starts them and the MessageMatcher takes the recvs.
namespace dlslime {

using tcp::FrameHeader;
using tcp::FrameType;
using tcp::WriteItem;

namespace {

// What preparing a batch needs per item and per piece, kept per submitting thread and
// reused: a batch allocates none of it once these have grown to its size.
struct PrepareScratch {
  std::vector<uint8_t*> local;        // by item: its first local byte
  std::vector<int32_t> peer_handles;  // by item: its region on the peer
  BatchPlan plan;
  // An unusually large batch does not pin its memory on the thread for good.
  static constexpr size_t kKeepPieces = 16384;
  void trim() {
    if (local.capacity() > kKeepPieces) {
      std::vector<uint8_t*>().swap(local);
      std::vector<int32_t>().swap(peer_handles);
    }
    plan.trim(kKeepPieces);
  }
};
thread_local PrepareScratch t_prepare;

// Whether a write's items are large enough for the same-host path to beat the sockets.
// process_vm_readv pins the pages of every remote piece, so many tiny pieces cost more
// there than their bytes cost through loopback TCP: measured on this project's 2-core
// machines (docs/performance.md), 256 items of 8 B take ~2x longer pulled, 4 KiB items
// break even and 16 KiB items are ~1.6x faster. Below this average item size a write
// goes as frames.
constexpr uint64_t kPullMinAverageItem = 8192;
bool worth_pulling(uint64_t nonempty_items, uint64_t bytes) {
  return nonempty_items > 0 && bytes >= kPullMinAverageItem * nonempty_items;
}

// A message at least this large goes to a receiver on the same-host path as one kPullSend
// request, which the receiver copies out of our memory itself: below it, the request's
// round trip through a copy worker costs more than the bytes through the socket.
constexpr uint64_t kPullMinMessage = 64 << 10;

// Cuts a lane's pieces into the runs that one frame each carries: at most kMaxPieces
// pieces and chunk_size bytes (a larger piece is a run of its own). emit(run, bytes, last).
template <class Emit>
void for_each_run(std::span<const PlannedPiece> pieces, uint64_t chunk_size, Emit&& emit) {
  size_t begin = 0;
  uint64_t run_bytes = 0;
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (k - begin == tcp::kMaxPieces || (k > begin && run_bytes + pieces[k].length > chunk_size)) {
      emit(pieces.subspan(begin, k - begin), run_bytes, false);
      begin = k;
      run_bytes = 0;
    }
    run_bytes += pieces[k].length;
  }
  emit(pieces.subspan(begin), run_bytes, true);
}

// Appends a run's piece list to `item`: each piece as the target names it (its region's
// handle there, offset, length), kPieceSize bytes.
void add_piece_list(WriteItem& item, const PlannedOp& op, std::span<const PlannedPiece> run,
                    std::span<const int32_t> peer_handles) {
  uint8_t raw[tcp::kPieceSize];
  for (const PlannedPiece& p : run) {
    tcp::encode_piece({peer_handles[p.item], op.items[p.item].target_offset + p.offset, p.length}, raw);
    item.add_copy(raw, sizeof raw);
  }
}

// TCP's data mover: a lane's pieces go out as frames on that lane, into the op's
// Submission. Each run of the lane's pieces (at most kMaxPieces and chunk_size bytes, or
// one larger piece) is one frame: a write carries the run's piece list and then its
// bytes, a read request the list, answered by one frame with the bytes. Pieces are
// numbered in the order they are claimed, so a run is an index range (for a read, of
// PendingOp::reads). A write lane is one part (its acknowledgement), a read piece one
// part (its share of an answer).
class LaneWriter final : public DataMover {
 public:
  // `staged`: the op's local memory is on a GPU. Its write frames are kept for the
  // Initiator to stage (their bytes are copied off the device into a pinned slot before
  // they are sent: Initiator::pump_gpu); a read's requests go out as usual.
  LaneWriter(Initiator::Submission& sub, std::span<const int32_t> peer_handles, uint64_t chunk_size,
             Initiator::GpuOp* staged)
      : sub_(sub), peer_handles_(peer_handles), chunk_size_(chunk_size), staged_(staged) {}

  uint32_t claim(const PlannedOp& op, uint16_t lane) override {
    const std::span<const PlannedPiece> pieces = op.plan.lane(lane);
    const bool is_read = op.kind == OpKind::kRead;
    lane_ = lane;
    WriteItem unused;
    WriteItem* item_ptr = &unused;
    if (is_read || !staged_) {
      sub_.items.emplace_back(lane, WriteItem(op.op_id));
      item_ptr = &sub_.items.back().second;
      item_ptr->reserve(pieces.size(), pieces.size() * tcp::kPieceSize + (is_read ? 0 : op.plan.lanes[lane].bytes));
    }
    WriteItem& item = *item_ptr;
    for_each_run(pieces, chunk_size_, [&](std::span<const PlannedPiece> run, uint64_t run_bytes, bool last) {
      emit(op, item, run, run_bytes, last);
    });
    return is_read ? static_cast<uint32_t>(pieces.size()) : 1;
  }

 private:
  void emit(const PlannedOp& op, WriteItem& item, std::span<const PlannedPiece> run, uint64_t run_bytes, bool last) {
    const bool is_read = op.kind == OpKind::kRead;
    FrameHeader h;
    h.op_id = op.op_id;
    h.index = next_index_;
    const uint64_t list_bytes = run.size() * tcp::kPieceSize;
    if (is_read) {
      h.type = FrameType::kReadRequest;
      h.length = list_bytes;
      sub_.op.read_runs[next_index_] = static_cast<uint16_t>(run.size());  // <= kMaxPieces
    } else {
      h.type = FrameType::kWriteData;
      h.offset = run.size();
      h.length = list_bytes + run_bytes;
      if (last) h.flags |= tcp::kFlagLast;  // the target acknowledges the lane's frames after it
    }
    if (staged_ && !is_read) return stage(op, h, run, run_bytes);
    item.add_header(h);
    add_piece_list(item, op, run, peer_handles_);
    for (const PlannedPiece& p : run) {
      uint8_t* local = op.local[p.item] + p.offset;
      if (is_read) {
        sub_.op.reads.push_back({local, p.length});
      } else {
        item.add_payload(local, p.length);
      }
    }
    next_index_ += static_cast<uint32_t>(run.size());
  }

  void stage(const PlannedOp& op, const FrameHeader& h, std::span<const PlannedPiece> run, uint64_t run_bytes) {
    Initiator::GpuOp::Frame& f = staged_->frames.emplace_back();
    f.lane = lane_;
    f.header = h;
    f.bytes = run_bytes;
    f.list.resize(run.size() * tcp::kPieceSize);
    f.sources.reserve(run.size());
    for (size_t k = 0; k < run.size(); ++k) {
      const PlannedPiece& p = run[k];
      tcp::encode_piece({peer_handles_[p.item], op.items[p.item].target_offset + p.offset, p.length},
                        f.list.data() + k * tcp::kPieceSize);
      f.sources.push_back({op.local[p.item] + p.offset, p.length});
    }
    next_index_ += static_cast<uint32_t>(run.size());
  }

  Initiator::Submission& sub_;
  const std::span<const int32_t> peer_handles_;
  const uint64_t chunk_size_;
  Initiator::GpuOp* const staged_;
  uint16_t lane_ = 0;
  uint32_t next_index_ = 0;
};

// The same-host path's mover (docs/tcp.md "Same-host path"): a write's pieces go out as
// pull requests, each run of a lane's pieces one kPullWrite frame naming the target's
// pieces and where their bytes are in our memory. The target copies them itself and
// answers each request (one part each); no payload crosses the socket.
class PullWriter final : public DataMover {
 public:
  PullWriter(Initiator::Submission& sub, std::span<const int32_t> peer_handles, uint64_t chunk_size)
      : sub_(sub), peer_handles_(peer_handles), chunk_size_(chunk_size) {}

  uint32_t claim(const PlannedOp& op, uint16_t lane) override {
    const std::span<const PlannedPiece> pieces = op.plan.lane(lane);
    // Every request goes on lane 0, the connection whose probe the target trusts
    // (SameHostPath::trusted_pid): the requests are small, and the copies run in parallel
    // on the target's workers whatever lane carried them.
    WriteItem& item = sub_.items.emplace_back(0, WriteItem(op.op_id)).second;
    item.reserve(pieces.size() / tcp::kMaxPieces + 1, pieces.size() * tcp::kPullPieceSize);
    uint32_t requests = 0;
    for_each_run(pieces, chunk_size_, [&](std::span<const PlannedPiece> run, uint64_t, bool) {
      FrameHeader h;
      h.type = FrameType::kPullWrite;
      h.op_id = op.op_id;
      h.index = next_index_;
      h.offset = run.size();
      h.length = run.size() * tcp::kPullPieceSize;
      item.add_header(h);
      add_piece_list(item, op, run, peer_handles_);
      sub_.op.read_runs[next_index_] = static_cast<uint16_t>(run.size());  // answered once (on_pull_done)
      for (const PlannedPiece& p : run) {
        uint8_t source[8];
        tcp::WireWriter(source).u64(reinterpret_cast<uintptr_t>(op.local[p.item] + p.offset));
        item.add_copy(source, sizeof source);
      }
      next_index_ += static_cast<uint32_t>(run.size());
      ++requests;
    });
    return requests;
  }

 private:
  Initiator::Submission& sub_;
  const std::span<const int32_t> peer_handles_;
  const uint64_t chunk_size_;
  uint32_t next_index_ = 0;
};

// The same-host path's mover for reads: a read's pieces go out as pull-read requests, each
// run of a lane's pieces one kPullRead frame naming the target's pieces. The target grants
// them (their addresses), our copy workers copy them out of the target into our memory,
// and the grant is released (Initiator::on_read_grant); one part per request.
class PullReader final : public DataMover {
 public:
  PullReader(Initiator::Submission& sub, std::span<const int32_t> peer_handles, uint64_t chunk_size)
      : sub_(sub), peer_handles_(peer_handles), chunk_size_(chunk_size) {}

  uint32_t claim(const PlannedOp& op, uint16_t lane) override {
    const std::span<const PlannedPiece> pieces = op.plan.lane(lane);
    // On lane 0, as PullWriter's requests: the connection the target's probe trusts.
    WriteItem& item = sub_.items.emplace_back(0, WriteItem(op.op_id)).second;
    item.reserve(pieces.size() / tcp::kMaxPieces + 1, pieces.size() * tcp::kPieceSize);
    uint32_t requests = 0;
    for_each_run(pieces, chunk_size_, [&](std::span<const PlannedPiece> run, uint64_t, bool) {
      FrameHeader h;
      h.type = FrameType::kPullRead;
      h.op_id = op.op_id;
      h.index = next_index_;
      h.offset = run.size();
      h.length = run.size() * tcp::kPieceSize;
      item.add_header(h);
      add_piece_list(item, op, run, peer_handles_);
      sub_.op.read_runs[next_index_] = static_cast<uint16_t>(run.size());
      for (const PlannedPiece& p : run) sub_.op.reads.push_back({op.local[p.item] + p.offset, p.length});
      next_index_ += static_cast<uint32_t>(run.size());
      ++requests;
    });
    return requests;
  }

 private:
  Initiator::Submission& sub_;
  const std::span<const int32_t> peer_handles_;
  const uint64_t chunk_size_;
  uint32_t next_index_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------
// Submitting operations (caller's thread)

template <class Work>
void TcpEndpointImpl::hand_off(Work&& work) {
  if (handoffs_.push(std::forward<Work>(work))) post([](TcpEndpointImpl& self) { self.drain_handoffs(); });
}

Future TcpEndpointImpl::fail_now(OpKind kind, Status status) const {
  auto state = std::make_shared<OpState>(kind);
  state->complete(std::move(status));
  return Future(std::move(state));
}

Future TcpEndpointImpl::submit(OpRequest req) {
  if (shut_down_) return fail_now(req.kind, Status::cancelled("the endpoint is shut down"));
  if (inherited()) {
    return fail_now(req.kind, Status::failed("the endpoint was created before fork(); create a new one in the child"));
  }
  const uint64_t op_id = next_op_id_.fetch_add(1, std::memory_order_relaxed);
  int device = -1;
  if (req.kind == OpKind::kRecv || req.kind == OpKind::kSend) {
    const Chunk& c = req.chunk;
    if (c.offset > std::numeric_limits<uintptr_t>::max() - c.addr ||
        c.length > std::numeric_limits<uintptr_t>::max() - c.addr - c.offset) {
      throw InvalidArgumentError(fmt::format("{}: addr + offset + length overflows", op_kind_name(req.kind)));
    }
    // A GPU buffer is staged like a region's memory (docs/tcp.md "GPU memory"): a send's
    // frames are copied off the device before they go out, a recv's copied onto it.
    device = message_device(c, req.kind);
  }
  if (req.kind == OpKind::kRecvNotify) {
    NotifyWait wait;
    wait.state = std::make_shared<OpState>(OpKind::kRecvNotify);
    wait.state->set_canceller(canceller_, op_id);
    wait.limit = OpLimit::of(req.timeout, options_.recv_timeout, "recv_timeout");
    Future f(wait.state);
    hand_off(std::move(wait));
    return f;
  }
  if (req.kind == OpKind::kRecv) {
    PostedRecv recv;
    recv.state = std::make_shared<OpState>(OpKind::kRecv);
    recv.addr = reinterpret_cast<uint8_t*>(req.chunk.addr + req.chunk.offset);
    recv.length = req.chunk.length;
    recv.local_id = op_id;
    recv.exact_size = req.exact_size;
    recv.device = device >= 0;
    recv.limit = OpLimit::of(req.timeout, options_.recv_timeout, "recv_timeout");
    recv.state->set_canceller(canceller_, op_id);
    Future f(recv.state);
    hand_off(std::move(recv));
    return f;
  }
  // The in-flight bound holds here, where ops enter, so the hand-off queue is bounded too.
  InflightLimiter::Slot slot = inflight_.acquire();
  if (!slot) {
    return fail_now(req.kind, Status(StatusCode::kBatchOverflow,
                                     fmt::format("{} ops already in flight (max_inflight_ops)", options_.max_inflight_ops)));
  }
  Submission sub;
  sub.op.slot = std::move(slot);
  if (req.kind == OpKind::kSend) {
    prepare_send(req, op_id, device, sub);
  } else if (req.kind == OpKind::kSendNotify) {
    prepare_notify(req, op_id, sub);
  } else if (Status error; !prepare_one_sided(req, op_id, sub, &error)) {
    return fail_now(req.kind, std::move(error));
  }
  sub.op.state->set_canceller(canceller_, op_id);
  Future f(sub.op.state);
  hand_off(std::move(sub));
  return f;
}

void TcpEndpointImpl::drain_handoffs() {
  // In submission order. A continuation run from here may submit again: a later round
  // takes it, or the drain posted once this one has run its rounds.
  if (draining_) return;  // cancel_op from a continuation run inside this drain
  draining_ = true;
  struct Done {
    bool& flag;
    ~Done() { flag = false; }
  } done{draining_};
  handoffs_.drain(
      [this](Handoff& h) {
    auto* sub = std::get_if<Submission>(&h);
    auto* wait = std::get_if<NotifyWait>(&h);
    if (shut_down_) {
      (sub ? sub->op.state : wait ? wait->state : std::get<PostedRecv>(h).state)
          ->complete(Status::cancelled("the endpoint is shut down"));
      return;
    }
    if (sub) {
      arm_sweeper(initiator_.start_op(*sub));
    } else if (wait) {
      arm_sweeper(matcher_.post_notify(std::move(wait->state), wait->limit));
    } else {
      auto& recv = std::get<PostedRecv>(h);
      const auto deadline = recv.limit.deadline();
      arm_sweeper(matcher_.post_recv(std::move(recv), deadline));
    }
      },
      [this] { post([](TcpEndpointImpl& self) { self.drain_handoffs(); }); });
}

bool TcpEndpointImpl::cancel_op(OpState& op, uint64_t op_id) {
  if (shut_down_ || inherited()) return false;  // shutdown ends every op (kCancelled) itself
  const OpKind kind = op.kind();
  bool withdrawn = false;
  try {
    // The fence unregister uses: the op's memory is only touched on the I/O thread, so
    // once this has run there and dropped the op, nothing touches it any more.
    run_on_io([&] {
      if (failing_ || shut_down_) return;
      drain_handoffs();  // the op may still be on its way to this thread
      withdrawn = kind == OpKind::kRecv         ? matcher_.withdraw_recv(op_id)
                  : kind == OpKind::kRecvNotify ? matcher_.withdraw_notify(op)
                                                : initiator_.cancel(op_id);
    });
  } catch (const std::exception& e) {
    // The I/O thread did not take the hop in time (a continuation blocks it): the op was
    // not withdrawn, and it ends as it would have.
    DLSLIME_WARN("TcpEndpoint {:#x}: cancel of {} op {} not done: {}", endpoint_id_, op_kind_name(op.kind()), op_id,
                 e.what());
    return false;
  }
  return withdrawn;
}

bool TcpEndpointImpl::prepare_one_sided(const OpRequest& req, uint64_t op_id, Submission& sub, Status* error) {
  const auto& items = req.assignments;
  if (items.size() > options_.max_batch_items) {
    *error = Status(StatusCode::kBatchOverflow, fmt::format("batch of {} items exceeds max_batch_items ({})",
                                                            items.size(), options_.max_batch_items));
    return false;
  }
  const bool is_read = req.kind == OpKind::kRead;
  PrepareScratch& scratch = t_prepare;
  struct Trim {
    PrepareScratch& s;
    ~Trim() { s.trim(); }
  } trim{scratch};
  scratch.local.resize(items.size());
  scratch.peer_handles.resize(items.size());
  ResolveCache local_cache;
  OwnerRemoteRegions::Cache remote_cache;
  // Device memory is decided per region (one lookup per distinct region, and none at all
  // while the endpoint has no device region), never per byte.
  const bool any_device = gpu_.regions.any();
  bool device = false;
  int32_t checked = -1;
  uint64_t nonempty = 0;  // items with bytes, for worth_pulling
  for (size_t i = 0; i < items.size(); ++i) {
    const Assignment& a = items[i];
    uintptr_t local = 0;
    int32_t peer_handle = -1;
    Status st = local_regions->resolve(a.local_handle, a.source_offset, a.length, &local, local_cache);
    if (st) st = remote_regions.resolve(a.remote_handle, a.target_offset, a.length, &peer_handle, remote_cache);
    if (!st) {
      *error = Status(st.code(), fmt::format("{} item {}: {}", op_kind_name(req.kind), i, st.message()));
      return false;
    }
    if (a.length > 0) {
      sub.op.uses.hold(local_cache);  // unregister waits for this op
      ++nonempty;
    }
    if (any_device && a.length > 0 && a.local_handle != checked) {
      checked = a.local_handle;
      device = device || gpu_.regions.device_of(a.local_handle) >= 0;
    }
    scratch.local[i] = reinterpret_cast<uint8_t*>(local);
    scratch.peer_handles[i] = peer_handle;
  }

  // Pieces of at most chunk_size. Small batches stay on one lane (one acknowledgement);
  // large ones are striped, each piece going to the lane with the fewest bytes so far.
  const uint16_t lanes = std::max<uint16_t>(1, pairing_.lanes_up());
  BatchPlan& plan = scratch.plan;
  plan_batch(items,
             BatchPlanConfig{.chunk_size = options_.chunk_size,
                             .lanes = lanes,
                             .first_lane = static_cast<uint16_t>(op_id % lanes),
                             .piece_overhead = tcp::kFrameHeaderSize,
                             .stripe_min_bytes = options_.chunk_size},
             plan);

  sub.op_id = op_id;
  sub.op.limit = OpLimit::of(req.timeout, options_.op_timeout, "op_timeout");
  sub.deadline = sub.op.limit.deadline();
  uint64_t bytes = 0;
  for (const Assignment& a : items) bytes += a.length;
  if (is_read) {
    sub.op.reads.reserve(plan.pieces.size());
    sub.op.read_runs.assign(plan.pieces.size(), 0);
  } else {
    sub.op.nbytes = bytes;  // what the write reports moved
  }
  // The op completes once each part its mover claimed is done.
  const PlannedOp planned{.op_id = op_id, .kind = req.kind, .items = items, .local = scratch.local, .plan = plan};
  if (device) sub.op.gpu = std::make_shared<Initiator::GpuOp>();
  // Host-memory writes to a peer on this host that proved it can copy out of our memory go
  // as pull requests, and so do reads from a peer we proved we can copy out of (docs/tcp.md
  // "Same-host path"); everything else as frames.
  const bool pull_kind = req.kind == OpKind::kWrite || (is_read && same_host_.proven_peer_pid() != 0);
  sub.op.pulled = pull_kind && !device && same_host_.active() && worth_pulling(nonempty, bytes);
  if (sub.op.pulled && any_remote_device_.load(std::memory_order_acquire)) {
    // Into the peer's device memory: the peer stages the bytes from frames.
    std::lock_guard lock(remote_device_mu_);
    for (const Assignment& a : items) {
      if (a.length > 0 && remote_device_.count(a.remote_handle)) {
        sub.op.pulled = false;
        break;
      }
    }
  }
  if (sub.op.pulled) sub.op.read_runs.assign(plan.pieces.size(), 0);  // its requests, by first piece
  if (sub.op.pulled && is_read) sub.op.copying = std::make_shared<std::atomic<uint32_t>>(0);
  LaneWriter lane_writer(sub, scratch.peer_handles, options_.chunk_size, sub.op.gpu.get());
  PullWriter pull_writer(sub, scratch.peer_handles, options_.chunk_size);
  PullReader pull_reader(sub, scratch.peer_handles, options_.chunk_size);
  DataMover& mover = !sub.op.pulled ? static_cast<DataMover&>(lane_writer)
                     : is_read      ? static_cast<DataMover&>(pull_reader)
                                    : pull_writer;
  for (uint16_t lane = 0; lane < lanes; ++lane) {
    if (plan.lanes[lane].count > 0) sub.op.parts_left += mover.claim(planned, lane);
  }
  sub.op.state = std::make_shared<OpState>(req.kind);
  return true;
}

void TcpEndpointImpl::prepare_notify(const OpRequest& req, uint64_t op_id, Submission& sub) {
  // One frame on lane 0, its bytes copied into it: the caller's string may go at once.
  // The core's fence (Endpoint::order_notifications) submits it once the writes before it
  // have completed, so the peer has their bytes in place when it arrives.
  sub.op_id = op_id;
  sub.op.limit = OpLimit::of(req.timeout, options_.op_timeout, "op_timeout");
  sub.deadline = sub.op.limit.deadline();
  sub.op.state = std::make_shared<OpState>(OpKind::kSendNotify);
  const std::string& bytes = *req.notification;
  WriteItem item(op_id);
  FrameHeader h;
  h.type = FrameType::kNotify;
  h.op_id = op_id;
  h.length = bytes.size();
  h.flags = tcp::kFlagLast;
  item.add_header(h);
  item.add_copy(bytes.data(), bytes.size());
  sub.items.emplace_back(0, std::move(item));
}

void TcpEndpointImpl::prepare_send(const OpRequest& req, uint64_t op_id, int device, Submission& sub) {
  sub.op_id = op_id;
  sub.op.limit = OpLimit::of(req.timeout, options_.op_timeout, "op_timeout");
  sub.deadline = sub.op.limit.deadline();
  sub.op.state = std::make_shared<OpState>(OpKind::kSend);
  const auto* data = reinterpret_cast<const uint8_t*>(req.chunk.addr + req.chunk.offset);
  const uint64_t length = req.chunk.length;
  // Messages always travel on lane 0, so they arrive in the order they were sent. A GPU
  // buffer's frames wait in the op for the Initiator to stage them (as a write's do).
  WriteItem item(op_id);
  if (device < 0 && length >= kPullMinMessage && same_host_.active()) {
    // To a receiver on this host that proved it can copy out of our memory: the buffer is
    // lent (docs/tcp.md "Same-host path"), and the receiver answers with kSendCopied.
    sub.op.pulled = true;
    sub.op.lease = BufferLease::take();
    FrameHeader h;
    h.type = FrameType::kPullSend;
    h.op_id = op_id;
    h.offset = length;
    h.length = tcp::kPulledMessageSize;
    uint8_t payload[tcp::kPulledMessageSize];
    tcp::WireWriter w(payload);
    w.u64(reinterpret_cast<uintptr_t>(data));
    w.u64(sub.op.lease.address());
    w.u64(sub.op.lease.value());
    item.add_header(h);
    item.add_copy(payload, sizeof payload);
    sub.items.emplace_back(0, std::move(item));
    return;
  }
  if (device >= 0) {
    sub.op.gpu = std::make_shared<Initiator::GpuOp>();
  } else {
    item.reserve(std::max<uint64_t>(1, (length + options_.chunk_size - 1) / options_.chunk_size), length);
  }
  uint64_t pos = 0;
  do {
    const uint64_t n = std::min(options_.chunk_size, length - pos);
    FrameHeader h;
    h.type = FrameType::kSendData;
    h.op_id = op_id;
    h.offset = pos;
    h.length = n;
    if (pos + n == length) h.flags |= tcp::kFlagLast;
    if (sub.op.gpu) {
      Initiator::GpuOp::Frame& f = sub.op.gpu->frames.emplace_back();
      f.header = h;
      f.bytes = n;
      f.sources.push_back({const_cast<uint8_t*>(data + pos), n});
    } else {
      item.add_header(h);
      item.add_payload(data + pos, n);
    }
    pos += n;
  } while (pos < length);
  if (!sub.op.gpu) sub.items.emplace_back(0, std::move(item));
}

}  // namespace dlslime
