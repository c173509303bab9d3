#include "tcp/tcp_endpoint_impl.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "core/log.h"
#include "dlslime/errors.h"

// TcpEndpointImpl, part 2 of 3: preparing operations on the caller's thread (resolve
// handles, plan lanes, encode frames) and handing them to the I/O thread. Part 1
// (tcp_endpoint_impl.cpp) holds the lifecycle, connecting, deadlines and failure; part 3
// (tcp_frames.cpp) the frames from the peer and two-sided messages.
namespace dlslime {

using tcp::FrameHeader;
using tcp::FrameType;
using tcp::WriteItem;

namespace {

std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) return std::chrono::steady_clock::time_point::max();
  return std::chrono::steady_clock::now() + timeout;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Submitting operations (caller's thread)

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
  if (req.kind == OpKind::kRecv || req.kind == OpKind::kSend) {
    const Chunk& c = req.chunk;
    if (c.offset > std::numeric_limits<uintptr_t>::max() - c.addr ||
        c.length > std::numeric_limits<uintptr_t>::max() - c.addr - c.offset) {
      throw InvalidArgumentError(fmt::format("{}: addr + offset + length overflows", op_kind_name(req.kind)));
    }
  }
  if (req.kind == OpKind::kRecv) {
    PostedRecv recv;
    recv.state = std::make_shared<OpState>(OpKind::kRecv);
    recv.addr = reinterpret_cast<uint8_t*>(req.chunk.addr + req.chunk.offset);
    recv.length = req.chunk.length;
    recv.local_id = op_id;
    recv.deadline = deadline_after(options_.recv_timeout);
    Future f(recv.state);
    hand_off(std::move(recv));
    return f;
  }
  // The in-flight bound holds here, where ops enter, so the hand-off queue is bounded too.
  if (inflight_.fetch_add(1, std::memory_order_relaxed) >= options_.max_inflight_ops) {
    inflight_.fetch_sub(1, std::memory_order_relaxed);
    return fail_now(req.kind, Status(StatusCode::kBatchOverflow,
                                     fmt::format("{} ops already in flight (max_inflight_ops)", options_.max_inflight_ops)));
  }
  Submission sub;
  sub.op.slot = InflightSlot(&inflight_);
  if (req.kind == OpKind::kSend) {
    prepare_send(req, op_id, sub);
  } else if (Status error; !prepare_one_sided(req, op_id, sub, &error)) {
    return fail_now(req.kind, std::move(error));
  }
  Future f(sub.op.state);
  hand_off(std::move(sub));
  return f;
}

void TcpEndpointImpl::hand_off(Handoff h) {
  bool first = false;
  {
    std::lock_guard lock(handoff_mu_);
    first = handoffs_.empty();
    handoffs_.push_back(std::move(h));
  }
  if (first) post([](TcpEndpointImpl& self) { self.drain_handoffs(); });
}

void TcpEndpointImpl::drain_handoffs() {
  {
    std::lock_guard lock(handoff_mu_);
    draining_.swap(handoffs_);
  }
  // In submission order. A continuation run from here may submit again: that lands in
  // handoffs_ and posts its own drain.
  for (Handoff& h : draining_) {
    if (auto* sub = std::get_if<Submission>(&h)) {
      start_op(*sub);
    } else {
      post_recv(std::move(std::get<PostedRecv>(h)));
    }
  }
  draining_.clear();
}

bool TcpEndpointImpl::prepare_one_sided(const OpRequest& req, uint64_t op_id, Submission& sub, Status* error) {
  const auto& items = req.assignments;
  if (items.size() > options_.max_batch_items) {
    *error = Status(StatusCode::kBatchOverflow, fmt::format("batch of {} items exceeds max_batch_items ({})",
                                                            items.size(), options_.max_batch_items));
    return false;
  }
  const bool is_read = req.kind == OpKind::kRead;
  struct Piece {
    uint8_t* local;
    int32_t peer_handle;
    uint64_t remote_offset;
    uint64_t length;
    uint16_t lane;
  };
  std::vector<Piece> pieces;
  pieces.reserve(items.size());
  uint64_t total = 0;
  ResolveCache local_cache;
  OwnerRemoteRegions::Cache remote_cache;
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
    if (a.length > 0) sub.op.uses.hold(local_cache);  // unregister waits for this op
    for (uint64_t done = 0; done < a.length; done += options_.chunk_size) {
      const uint64_t n = std::min(options_.chunk_size, a.length - done);
      pieces.push_back({reinterpret_cast<uint8_t*>(local) + done, peer_handle, a.target_offset + done, n, 0});
    }
    total += a.length;
  }

  // Small batches stay on one lane (one acknowledgement); large ones are striped, each
  // piece going to the lane with the fewest bytes so far.
  const uint16_t lanes = std::max<uint16_t>(1, lanes_up_.load(std::memory_order_relaxed));
  const auto first_lane = static_cast<uint16_t>(op_id % lanes);
  std::vector<uint64_t> load(lanes, 0);
  std::vector<uint32_t> pieces_on(lanes, 0);
  for (Piece& p : pieces) {
    uint16_t lane = first_lane;
    if (total >= options_.chunk_size) {
      for (uint16_t k = 0; k < lanes; ++k) {
        const auto cand = static_cast<uint16_t>((first_lane + k) % lanes);
        if (load[cand] < load[lane]) lane = cand;
      }
    }
    p.lane = lane;
    load[lane] += p.length + tcp::kFrameHeaderSize;
    ++pieces_on[lane];
  }

  sub.op_id = op_id;
  sub.op.deadline = deadline_after(options_.op_timeout);
  if (is_read) {
    sub.op.reads.reserve(pieces.size());
    sub.op.read_runs.assign(pieces.size(), 0);
  }
  uint32_t next_index = 0;
  std::vector<const Piece*> run;
  uint64_t run_bytes = 0;
  for (uint16_t lane = 0; lane < lanes; ++lane) {
    if (pieces_on[lane] == 0) continue;
    sub.items.emplace_back(lane, WriteItem(op_id));
    WriteItem& item = sub.items.back().second;
    const uint64_t data = load[lane] - pieces_on[lane] * tcp::kFrameHeaderSize;
    item.reserve(pieces_on[lane], pieces_on[lane] * tcp::kPieceSize + (is_read ? 0 : data));
    // Each run of the lane's pieces (at most kMaxPieces and chunk_size bytes, or one
    // larger piece) is one frame: a write carries the run's piece list and then its bytes,
    // a read request the list, answered by one frame with the bytes. Pieces are numbered
    // in the order they are sent, so a run is an index range (for a read, of `reads`).
    const auto emit = [&](bool last) {
      FrameHeader h;
      h.op_id = op_id;
      h.index = next_index;
      const uint64_t list_bytes = run.size() * tcp::kPieceSize;
      if (is_read) {
        h.type = FrameType::kReadRequest;
        h.length = list_bytes;
        sub.op.read_runs[next_index] = static_cast<uint16_t>(run.size());  // <= kMaxPieces
      } else {
        h.type = FrameType::kWriteData;
        h.offset = run.size();
        h.length = list_bytes + run_bytes;
        if (last) h.flags |= tcp::kFlagLast;  // the target acknowledges the lane's frames after it
      }
      item.add_header(h);
      uint8_t raw[tcp::kPieceSize];
      for (const Piece* p : run) {
        tcp::encode_piece({p->peer_handle, p->remote_offset, p->length}, raw);
        item.add_copy(raw, sizeof raw);
      }
      for (const Piece* p : run) {
        if (is_read) {
          sub.op.reads.push_back({p->local, p->length});
        } else {
          item.add_payload(p->local, p->length);
        }
      }
      next_index += static_cast<uint32_t>(run.size());
      run.clear();
      run_bytes = 0;
    };
    for (const Piece& p : pieces) {
      if (p.lane != lane) continue;
      if (run.size() == tcp::kMaxPieces || (!run.empty() && run_bytes + p.length > options_.chunk_size)) emit(false);
      run.push_back(&p);
      run_bytes += p.length;
    }
    emit(true);
  }
  // A write completes once every lane has acknowledged its frames (ack_lanes, set when it
  // starts), a read once an answer has been counted for every piece (reads_left).
  sub.op.reads_left = is_read ? static_cast<uint32_t>(pieces.size()) : 0;
  sub.op.state = std::make_shared<OpState>(req.kind);
  return true;
}

void TcpEndpointImpl::prepare_send(const OpRequest& req, uint64_t op_id, Submission& sub) {
  sub.op_id = op_id;
  sub.op.deadline = deadline_after(options_.op_timeout);
  sub.op.state = std::make_shared<OpState>(OpKind::kSend);
  WriteItem item(op_id);
  const auto* data = reinterpret_cast<const uint8_t*>(req.chunk.addr + req.chunk.offset);
  const uint64_t length = req.chunk.length;
  uint64_t pos = 0;
  do {
    const uint64_t n = std::min(options_.chunk_size, length - pos);
    FrameHeader h;
    h.type = FrameType::kSendData;
    h.op_id = op_id;
    h.offset = pos;
    h.length = n;
    if (pos + n == length) h.flags |= tcp::kFlagLast;
    item.add_header(h);
    item.add_payload(data + pos, n);
    pos += n;
  } while (pos < length);
  // Messages always travel on lane 0, so they arrive in the order they were sent.
  sub.items.emplace_back(0, std::move(item));
}

}  // namespace dlslime
