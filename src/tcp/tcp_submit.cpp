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
    hand_off({nullptr, std::move(recv)});
    return f;
  }
  std::shared_ptr<Submission> sub;
  if (req.kind == OpKind::kSend) {
    sub = prepare_send(req, op_id);
  } else {
    Status error;
    sub = prepare_one_sided(req, op_id, &error);
    if (!sub) return fail_now(req.kind, std::move(error));
  }
  Future f(sub->op.state);
  hand_off({std::move(sub), {}});
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
    if (h.op) {
      start_op(std::move(h.op));
    } else {
      post_recv(std::move(h.recv));
    }
  }
  draining_.clear();
}

std::shared_ptr<TcpEndpointImpl::Submission> TcpEndpointImpl::prepare_one_sided(const OpRequest& req, uint64_t op_id,
                                                                                Status* error) {
  const auto& items = req.assignments;
  if (items.size() > options_.max_batch_items) {
    *error = Status(StatusCode::kBatchOverflow, fmt::format("batch of {} items exceeds max_batch_items ({})",
                                                            items.size(), options_.max_batch_items));
    return nullptr;
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
  for (size_t i = 0; i < items.size(); ++i) {
    const Assignment& a = items[i];
    uintptr_t local = 0;
    int32_t peer_handle = -1;
    Status st = local_regions->resolve(a.local_handle, a.source_offset, a.length, &local);
    if (st) st = remote_regions.resolve(a.remote_handle, a.target_offset, a.length, &peer_handle);
    if (!st) {
      *error = Status(st.code(), fmt::format("{} item {}: {}", op_kind_name(req.kind), i, st.message()));
      return nullptr;
    }
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
  std::vector<uint32_t> frames_on(lanes, 0);
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
    ++frames_on[lane];
  }

  auto sub = std::make_shared<Submission>();
  sub->op_id = op_id;
  sub->op.deadline = deadline_after(options_.op_timeout);
  std::vector<int> item_of_lane(lanes, -1);
  uint32_t lanes_used = 0;
  for (uint16_t lane = 0; lane < lanes; ++lane) {
    if (frames_on[lane] == 0) continue;
    item_of_lane[lane] = static_cast<int>(sub->items.size());
    sub->items.emplace_back(lane, WriteItem(op_id));
    // A read asks with 24 bytes per piece (and far fewer headers); a write may copy payloads.
    sub->items.back().second.reserve(frames_on[lane], is_read ? frames_on[lane] * tcp::kReadPieceSize
                                                              : load[lane] - frames_on[lane] * tcp::kFrameHeaderSize);
    ++lanes_used;
  }
  if (is_read) {
    // Per lane, each run of consecutive pieces (at most kMaxReadPieces of them and
    // chunk_size bytes, or one larger piece) is one request, answered by one frame. A
    // piece's index is its position in `reads`, so a run is an index range.
    sub->op.reads.reserve(pieces.size());
    std::vector<uint8_t> list;
    list.reserve(std::min(pieces.size(), tcp::kMaxReadPieces) * tcp::kReadPieceSize);
    for (uint16_t lane = 0; lane < lanes; ++lane) {
      if (frames_on[lane] == 0) continue;
      WriteItem& item = sub->items[item_of_lane[lane]].second;
      size_t run_start = sub->op.reads.size();
      uint64_t run_bytes = 0;
      const auto close_run = [&] {
        FrameHeader h;
        h.type = FrameType::kReadRequest;
        h.op_id = op_id;
        h.index = static_cast<uint32_t>(run_start);
        h.length = list.size();
        item.add_header(h);
        item.add_copy(list.data(), list.size());
        list.clear();
        run_start = sub->op.reads.size();
        run_bytes = 0;
      };
      for (const Piece& p : pieces) {
        if (p.lane != lane) continue;
        const size_t in_run = sub->op.reads.size() - run_start;
        if (in_run == tcp::kMaxReadPieces || (in_run > 0 && run_bytes + p.length > options_.chunk_size)) close_run();
        list.resize(list.size() + tcp::kReadPieceSize);
        tcp::encode_read_piece({p.peer_handle, p.remote_offset, p.length}, list.data() + list.size() - tcp::kReadPieceSize);
        sub->op.reads.push_back({p.local, p.length});
        run_bytes += p.length;
      }
      close_run();
    }
  } else {
    for (size_t idx = 0; idx < pieces.size(); ++idx) {
      const Piece& p = pieces[idx];
      FrameHeader h;
      h.type = FrameType::kWriteData;
      h.op_id = op_id;
      h.handle = p.peer_handle;
      h.index = static_cast<uint32_t>(idx);
      h.offset = p.remote_offset;
      h.length = p.length;
      if (--frames_on[p.lane] == 0) h.flags |= tcp::kFlagLast;
      WriteItem& item = sub->items[item_of_lane[p.lane]].second;
      item.add_header(h);
      item.add_payload(p.local, p.length);
    }
  }
  // Parts: one acknowledgement per lane for a write. A read completes once, when the
  // I/O thread has counted an answer for every piece (reads_left).
  sub->op.reads_left = is_read ? static_cast<uint32_t>(pieces.size()) : 0;
  sub->op.state = std::make_shared<OpState>(req.kind, is_read ? 1 : lanes_used);
  return sub;
}

std::shared_ptr<TcpEndpointImpl::Submission> TcpEndpointImpl::prepare_send(const OpRequest& req, uint64_t op_id) {
  auto sub = std::make_shared<Submission>();
  sub->op_id = op_id;
  sub->op.deadline = deadline_after(options_.op_timeout);
  sub->op.state = std::make_shared<OpState>(OpKind::kSend);
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
  sub->items.emplace_back(0, std::move(item));
  return sub;
}

}  // namespace dlslime
