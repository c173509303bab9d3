#include "tcp/tcp_initiator.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/log.h"
#include "core/same_host.h"
#include "tcp/tcp_pairing.h"
#include "tcp/wire.h"

namespace dlslime {

using tcp::FrameHeader;
using tcp::PayloadSink;
using tcp::RxAction;
using tcp::TcpConnection;

namespace {

Status remote_status(const FrameHeader& h, std::string_view text) {
  return Status(static_cast<StatusCode>(h.status), fmt::format("the peer reported: {}", text));
}

}  // namespace

Initiator::Initiator(const TcpOptions& options, Pairing& pairing, tcp::GpuPath& gpu)
    : options_(options), pairing_(pairing), gpu_(gpu) {}

Initiator::Clock::time_point Initiator::start_op(Submission& sub) {
  auto& state = sub.op.state;
  const auto& dialed = pairing_.dialed();
  if (dialed.empty()) {
    const std::string& loss = pairing_.last_loss();
    state->complete(Status::not_connected(
        loss.empty() ? "the endpoint is not connected; call connect(peer_info) first"
                     : fmt::format("the endpoint is not connected (the connection was lost: {}); call "
                                   "connect() again",
                                   loss)));
    return Clock::time_point::max();
  }
  GpuOp* gpu = sub.op.gpu.get();
  const bool staged_frames = gpu && !gpu->frames.empty();
  if (sub.items.empty() && !staged_frames) {  // only zero-length items
    state->complete(Status::ok());
    return Clock::time_point::max();
  }
  // Notifications leave on lane 0 in their turn among messages, but are acknowledged
  // apart from them (on_notify_ack).
  const bool is_message = state->kind() == OpKind::kSend;
  const bool is_send = is_message || state->kind() == OpKind::kSendNotify;
  if ((state->kind() == OpKind::kWrite || state->kind() == OpKind::kWriteWithImm) && !sub.op.pulled) {
    // Each lane's frames end in one acknowledgement, on that lane (on_write_ack).
    for (const auto& [lane, item] : sub.items) {
      const uint64_t bit = uint64_t{1} << dialed[lane % dialed.size()]->lane();
      if (sub.op.ack_lanes & bit) {  // fewer lanes than when it was planned: a reconnect in between
        state->complete(Status::not_connected("the connection changed while the op was submitted; submit it again"));
        return Clock::time_point::max();
      }
      sub.op.ack_lanes |= bit;
    }
    if (staged_frames) {  // a device-memory write: its frames leave as they are staged
      for (const GpuOp::Frame& f : gpu->frames) {
        if (!f.header.last()) continue;
        const uint64_t bit = uint64_t{1} << dialed[f.lane % dialed.size()]->lane();
        if (sub.op.ack_lanes & bit) {
          state->complete(Status::not_connected("the connection changed while the op was submitted; submit it again"));
          return Clock::time_point::max();
        }
        sub.op.ack_lanes |= bit;
      }
    }
  }
  std::shared_ptr<GpuOp> staged = staged_frames ? sub.op.gpu : nullptr;
  const bool pulled = sub.op.pulled;
  pending_.insert(sub.op_id, std::move(sub.op), sub.deadline);
  if (is_send && (staged || !outbox_.empty())) {
    // Behind (or itself) a GPU message still being staged: it leaves in its turn.
    Outgoing& out = outbox_.emplace_back();
    out.op_id = sub.op_id;
    if (staged) {
      staged->message = true;
      staged->unsent = static_cast<uint32_t>(staged->frames.size());
      out.gpu = staged;
    } else {
      out.item = std::move(sub.items.front().second);
    }
    sub.items.clear();
  }
  for (auto& [lane, item] : sub.items) dialed[lane % dialed.size()]->send(std::move(item));
  if (staged) {
    gpu_queue_.emplace_back(sub.op_id, std::move(staged));
    pump_gpu();
  }
  if (is_message && !pulled) {  // a pulled message is answered on its own (on_send_copied)
    sends_.push_back(sub.op_id);
    // Messages that expired unacknowledged need no acknowledgement any more.
    while (sends_.size() > options_.max_inflight_ops && !pending_.contains(sends_.front())) sends_.pop_front();
  }
  return sub.deadline;
}

void Initiator::finish_op(uint64_t op_id, Status status, uint64_t nbytes) {
  if (auto op = pending_.take(op_id)) end_op(op_id, *op, std::move(status), nbytes);
}

bool Initiator::cancel(uint64_t op_id) {
  PendingOp* op = pending_.find(op_id);
  if (!op) return false;  // ended, or waiting for copies of its memory to finish
  // A same-host write's requests were handed to the lanes at once, and the peer copies as
  // each arrives: withdrawing one would not stop a copy already started. A same-host read
  // is withdrawn unless our workers are copying into it right now (its grants that come
  // later are released unused, on_read_grant).
  // A pulled message is never withdrawn: the receiver may be copying it at any moment, and
  // ending it then would fail the receiver's recv, where a withdrawn message never arrives.
  if (op->lease.held()) return false;
  if (op->pulled && (!op->copying || op->copying->load(std::memory_order_acquire) > 0)) return false;
  if (const GpuOp* gpu = op->gpu.get()) {
    if (gpu->copies > 0) return false;  // a stream is copying its memory: end_op would wait
    if (gpu->message) {
      // Its frames leave one by one as they are staged: withdrawn before the first is
      // staged, or once the last has left lane 0's queue; in between it would be torn.
      const bool none_out = gpu->frames.size() == gpu->unsent;
      bool all_out = gpu->unsent == 0;
      pairing_.for_each_connection([&](const std::shared_ptr<TcpConnection>& conn) {
        if (conn->has_queued(op_id)) all_out = false;
      });
      if (!none_out && !all_out) return false;
    }
  }
  // A host message is one item on lane 0: queued whole (dropped whole), being written
  // (moving: refused), or written whole (the receiver gets it whole; its ack is ignored).
  bool moving = false;
  pairing_.for_each_connection([&](const std::shared_ptr<TcpConnection>& conn) {
    if (conn->moving(op_id)) moving = true;
  });
  if (moving) return false;
  auto taken = pending_.take(op_id);
  return end_op(op_id, *taken, OpState::cancelled_by_user());
}

bool Initiator::end_op(uint64_t op_id, PendingOp& op, Status status, uint64_t nbytes) {
  // The op's memory must not be touched once its future completes. Queued frames are
  // dropped and sinks released; bytes already being written or read can only be stopped
  // by closing that connection (which fails the endpoint's other ops the same way).
  std::vector<std::shared_ptr<TcpConnection>> stuck;
  pairing_.for_each_connection([&](const std::shared_ptr<TcpConnection>& conn) {
    if (!conn->release(op_id) || !conn->abandon(op_id)) stuck.push_back(conn);
  });
  for (auto& conn : stuck) {
    conn->close(Status::peer_closed(fmt::format("lane {} was closed: {} op {} ended ({}) while its bytes were in transit",
                                                conn->lane(), op_kind_name(op.state->kind()), op_id,
                                                status_code_name(status.code()))));
  }
  if (op.gpu) {
    GpuOp& gpu = *op.gpu;
    gpu.ended = true;  // frames not staged yet are never sent; staged ones are dropped
    gpu.frames.clear();
    // The messages behind it go now (a half-sent one is abandoned: the receiver drops
    // it at the next message's first frame).
    if (gpu.message) advance_outbox();
    if (gpu.copies > 0) {
      // Copies still read or write the op's memory: it completes once they have finished
      // (copy_finished), with its regions held until then.
      gpu.state = std::move(op.state);
      gpu.status = std::move(status);
      gpu.nbytes = nbytes;
      gpu.uses = std::move(op.uses);
      gpu.slot = std::move(op.slot);
      return false;
    }
  }
  if (op.copying) wait_for_copies(op);  // our workers are writing its memory
  if (op.pulled && op.parts_left > 0 && !op.uses.empty() && !op.copying) {
    // The peer may be copying out of its memory right now: the regions stay held until
    // the requests are answered (on_pull_done) or the peer is lost.
    lingering_[op_id] = Lingering{op.parts_left, std::move(op.uses)};
  }
  std::shared_ptr<OpState> state = std::move(op.state);
  // Its regions, its lease and its in-flight slot go before the future completes (the op
  // itself goes with its table node, after).
  op.uses.clear();
  op.lease.end();
  op.slot = InflightLimiter::Slot();
  return state->complete(std::move(status), nbytes);
}

void Initiator::copy_finished(GpuOp& gpu) {
  if (--gpu.copies > 0 || !gpu.ended || !gpu.state) return;
  std::shared_ptr<OpState> state = std::move(gpu.state);
  gpu.uses.clear();
  gpu.slot = InflightLimiter::Slot();
  state->complete(std::move(gpu.status), gpu.nbytes);
}

void Initiator::advance_outbox() {
  const auto& dialed = pairing_.dialed();
  while (!outbox_.empty()) {
    Outgoing& out = outbox_.front();
    if (out.gpu) {
      if (!out.gpu->ended && out.gpu->unsent > 0) return;  // still being staged
    } else if (pending_.contains(out.op_id) && !dialed.empty()) {
      dialed[0]->send(std::move(out.item));  // not ended while it waited
    }
    outbox_.pop_front();
  }
}

void Initiator::pump_gpu() {
  tcp::GpuStaging* staging = gpu_.staging();
  while (staging && !gpu_queue_.empty()) {
    const uint64_t op_id = gpu_queue_.front().first;
    std::shared_ptr<GpuOp> gpu = gpu_queue_.front().second;
    if (gpu->ended || gpu->frames.empty()) {
      gpu_queue_.pop_front();
      continue;
    }
    tcp::GpuStaging::Slot* slot = nullptr;
    try {
      slot = staging->acquire(tcp::GpuStaging::kOut, gpu->frames.front().bytes);
      if (!slot) return;  // resumed when a slot is released (Impl: on_free)
      GpuOp::Frame frame = std::move(gpu->frames.front());
      gpu->frames.pop_front();
      uint64_t at = 0;
      for (const tcp::PayloadSegment& src : frame.sources) {
        staging->copy(tcp::GpuStaging::kOut, slot->data + at, src.addr, src.length);
        at += src.length;
      }
      ++gpu->copies;
      staging->when_copied(slot, [this, op_id, gpu, slot, frame = std::move(frame)](Status copied) mutable {
        on_frame_staged(op_id, gpu, slot, frame, copied);
      });
    } catch (const std::exception& e) {
      if (slot) staging->release(slot);
      finish_op(op_id, Status::failed(fmt::format("staging device memory for op {} failed: {}", op_id, e.what())));
    }
  }
}

void Initiator::on_frame_staged(uint64_t op_id, const std::shared_ptr<GpuOp>& gpu, tcp::GpuStaging::Slot* slot,
                                GpuOp::Frame& frame, const Status& copied) {
  tcp::GpuStaging& staging = *gpu_.staging();
  const bool ended = gpu->ended;
  copy_finished(*gpu);
  const auto& dialed = pairing_.dialed();
  if (ended || !copied || dialed.empty()) {
    staging.release(slot);
    if (!ended && !copied) finish_op(op_id, copied);
    return;  // lost lanes: fail_all ends the op
  }
  tcp::WriteItem item(op_id);
  item.reserve(1, frame.bytes);
  item.add_header(frame.header);
  if (!frame.list.empty()) item.add_copy(frame.list.data(), frame.list.size());  // a message has none
  item.add_payload(slot->data, frame.bytes);
  item.keep(staging.lease(slot));  // the slot is free again once the frame is written or dropped
  dialed[frame.lane % dialed.size()]->send(std::move(item));
  if (gpu->message && --gpu->unsent == 0) advance_outbox();  // its last frame is out
}

void Initiator::violation(TcpConnection& conn, std::string what) {
  DLSLIME_WARN("peer {:#x}, lane {}: {}", pairing_.peer_id(), conn.lane(), what);
  conn.close(Status::protocol_error(std::move(what)));
}

void Initiator::on_send_ack(TcpConnection& conn, const FrameHeader& h, std::string_view text) {
  // The receiver acknowledges messages in the order they arrived, and one acknowledgement
  // stands for its message and every earlier one not acknowledged yet (those arrived
  // whole and were accepted: a refused one gets its own acknowledgement). sends_ holds the
  // messages in the order they went out on lane 0.
  if (const PendingOp* op = pending_.find(h.op_id); op && op->state->kind() != OpKind::kSend) {
    return violation(conn, fmt::format("a message acknowledgement for op {}, which is a {}", h.op_id,
                                       op_kind_name(op->state->kind())));
  }
  const auto it = std::find(sends_.begin(), sends_.end(), h.op_id);
  if (it == sends_.end()) return;  // not a message of ours (stray, or dropped long ago)
  const Status status = h.status == 0 ? Status::ok() : remote_status(h, text);
  // One at a time from the front: ending an op may close a lane, and a lost peer empties
  // sends_ (drop_all) under this loop.
  while (!sends_.empty()) {
    const uint64_t id = sends_.front();
    sends_.pop_front();
    finish_op(id, id == h.op_id ? status : Status::ok());  // no-op for expired ones
    if (id == h.op_id) break;
  }
}

void Initiator::on_send_copied(TcpConnection& conn, const FrameHeader& h, std::string_view text) {
  PendingOp* op = pending_.find(h.op_id);
  if (!op) return;  // it ended (its lease with it): the receiver's check fails its copy
  if (!op->lease.held() || conn.role() != TcpConnection::Role::kDialed || conn.lane() != 0) {
    return violation(conn, fmt::format("a copy report for op {} ({}), which is no pulled message of ours", h.op_id,
                                       op_kind_name(op->state->kind())));
  }
  finish_op(h.op_id, h.status == 0 ? Status::ok() : remote_status(h, text));
}

void Initiator::on_notify_ack(TcpConnection& conn, const FrameHeader& h, std::string_view text) {
  const PendingOp* op = pending_.find(h.op_id);
  if (!op) return;  // it already ended (expired); a late answer
  if (op->state->kind() != OpKind::kSendNotify) {
    return violation(conn, fmt::format("a notification acknowledgement for op {}, which is a {}", h.op_id,
                                       op_kind_name(op->state->kind())));
  }
  finish_op(h.op_id, h.status == 0 ? Status::ok() : remote_status(h, text));
}

void Initiator::on_write_ack(TcpConnection& conn, const FrameHeader& h, std::string_view text) {
  // One acknowledgement per lane that carried the op's frames, on that lane: anything
  // else (an ack for a read or a message, a second one, one on another lane) is a peer
  // claiming bytes arrived that it never received, and fails the connection.
  PendingOp* found = pending_.find(h.op_id);
  if (!found) return;  // it already ended (expired); a late answer
  PendingOp& op = *found;
  const OpKind kind = op.state->kind();
  const uint64_t bit = conn.lane() < 64 ? uint64_t{1} << conn.lane() : 0;
  if (kind != OpKind::kWrite && kind != OpKind::kWriteWithImm) {
    return violation(conn, fmt::format("a write acknowledgement for op {}, which is a {}", h.op_id, op_kind_name(kind)));
  }
  if (conn.role() != TcpConnection::Role::kDialed || (op.ack_lanes & bit) == 0) {
    return violation(conn, fmt::format("a write acknowledgement for op {} on lane {}, which owes it none", h.op_id,
                                       conn.lane()));
  }
  op.ack_lanes &= ~bit;
  if (h.status != 0 && op.error.is_ok()) op.error = remote_status(h, text);
  if (--op.parts_left == 0) {
    const uint64_t nbytes = op.error.is_ok() ? op.nbytes : 0;
    finish_op(h.op_id, std::move(op.error), nbytes);
  }
}

void Initiator::on_pull_done(TcpConnection& conn, const FrameHeader& h, std::string_view text) {
  PendingOp* found = pending_.find(h.op_id);
  if (!found) {
    // It ended early; its regions are released once the last request is answered.
    if (auto it = lingering_.find(h.op_id); it != lingering_.end() && --it->second.parts == 0) lingering_.erase(it);
    return;
  }
  PendingOp& op = *found;
  // One answer per request, naming it exactly (its first piece and piece count), on one of
  // our connections: anything else is a peer claiming bytes it never copied. A read's
  // request is answered after its grant was released.
  const uint16_t expected = static_cast<uint16_t>(h.offset | (op.copying ? kGranted : 0));
  if (!op.pulled || conn.role() != TcpConnection::Role::kDialed || h.index >= op.read_runs.size() ||
      h.offset == 0 || h.offset > tcp::kMaxPieces || op.read_runs[h.index] != expected) {
    return violation(conn, fmt::format("a pull answer for pieces {}..{} of op {} ({}) that answers no outstanding "
                                       "request",
                                       h.index, h.index + h.offset, h.op_id, op_kind_name(op.state->kind())));
  }
  op.read_runs[h.index] = 0;
  if (h.status != 0 && op.error.is_ok()) op.error = remote_status(h, text);
  if (--op.parts_left == 0) {
    const uint64_t nbytes = op.error.is_ok() ? op.nbytes : 0;
    finish_op(h.op_id, std::move(op.error), nbytes);
  }
}

void Initiator::on_read_grant(TcpConnection& conn, const FrameHeader& h, std::string_view payload) {
  PendingOp* found = pending_.find(h.op_id);
  if (!found) {
    // It ended before its grant came: the peer holds its region for it until released.
    if (h.status == 0) release_grant(conn, h.op_id, h.index, static_cast<uint32_t>(h.offset), OpState::cancelled_by_user());
    return;
  }
  PendingOp& op = *found;
  if (!op.pulled || !op.copying || conn.role() != TcpConnection::Role::kDialed || h.index >= op.read_runs.size() ||
      op.read_runs[h.index] != h.offset) {
    return violation(conn, fmt::format("a read grant for pieces {}..{} of op {} ({}) that answers no outstanding request",
                                       h.index, h.index + h.offset, h.op_id, op_kind_name(op.state->kind())));
  }
  if (h.status != 0) {  // refused: the peer holds nothing, and the request is answered
    op.read_runs[h.index] = 0;
    if (op.error.is_ok()) op.error = remote_status(h, payload);
    if (--op.parts_left == 0) finish_op(h.op_id, std::move(op.error), 0);
    return;
  }
  const auto count = static_cast<uint32_t>(h.offset);
  std::vector<CrossCopy> pieces;
  pieces.reserve(count);
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < count; ++i) {
    const tcp::PayloadSegment& dst = op.reads[h.index + i];
    const uint64_t source = tcp::WireReader(reinterpret_cast<const uint8_t*>(payload.data()) + 8 * i).u64();
    if (dst.length == 0) continue;
    if (source == 0 || dst.length > UINT64_MAX - source) {
      return violation(conn, fmt::format("a read grant of op {} names no memory for piece {}", h.op_id, h.index + i));
    }
    pieces.push_back({dst.addr, source, dst.length});
    bytes += dst.length;
  }
  op.read_runs[h.index] = static_cast<uint16_t>(count | kGranted);
  const uint32_t pid = pull_.peer_pid ? pull_.peer_pid() : 0;
  if (pid == 0 || !pull_.workers) {  // the path ended since the read was planned
    if (op.error.is_ok()) op.error = Status::not_connected("the same-host path ended while the read was in flight; read again");
    return release_grant(conn, h.op_id, h.index, count, op.error);
  }
  op.copying->fetch_add(1, std::memory_order_acq_rel);
  pull_.workers->submit([pieces = std::move(pieces), pid, copying = op.copying, post = pull_.post, this,
                         weak = conn.weak_from_this(), op_id = h.op_id, index = h.index, count, bytes,
                         counter = pull_.copied_bytes]() mutable {
    Status copied = cross_copy(static_cast<int>(pid), pieces, true);
    if (copied && counter) counter->fetch_add(bytes, std::memory_order_relaxed);
    copying->fetch_sub(1, std::memory_order_acq_rel);
    copying->notify_all();
    post([this, weak, op_id, index, count, bytes, copied = std::move(copied)] {
      read_pulled(weak, op_id, index, count, bytes, copied);
    });
  });
}

void Initiator::read_pulled(const std::weak_ptr<TcpConnection>& weak, uint64_t op_id, uint32_t index, uint32_t count,
                            uint64_t bytes, const Status& copied) {
  if (auto conn = weak.lock(); conn && conn->is_open()) release_grant(*conn, op_id, index, count, copied);
  PendingOp* op = pending_.find(op_id);
  if (!op) return;  // it ended; its memory was left alone once this copy finished (end_op waited)
  if (!copied) {
    if (op->error.is_ok()) op->error = copied;
  } else {
    op->nbytes += bytes;
  }
}

void Initiator::release_grant(TcpConnection& conn, uint64_t op_id, uint32_t index, uint32_t count, const Status& copied) {
  FrameHeader r;
  r.type = tcp::FrameType::kReadRelease;
  r.op_id = op_id;
  r.index = index;
  r.offset = count;
  r.status = copied.raw_code();
  tcp::WriteItem item(0);
  item.add_header(r);
  conn.send(std::move(item));
}

void Initiator::wait_for_copies(const PendingOp& op) {
  for (uint32_t n = op.copying->load(std::memory_order_acquire); n != 0; n = op.copying->load(std::memory_order_acquire)) {
    op.copying->wait(n, std::memory_order_acquire);
  }
}

RxAction Initiator::on_read_header(TcpConnection& conn, const FrameHeader& h, PayloadSink& sink) {
  PendingOp* found = pending_.find(h.op_id);
  if (!found) return RxAction::kContinue;  // expired: drain
  PendingOp& op = *found;
  // The answer to one request: pieces [index, index + offset) of the op, exactly one
  // of its requests not answered yet, on one of our own connections.
  const uint64_t first = h.index, count = h.offset;
  if (op.state->kind() != OpKind::kRead || conn.role() != TcpConnection::Role::kDialed ||
      first >= op.read_runs.size() || count == 0 || op.read_runs[first] != count) {
    violation(conn, fmt::format("a read answer for pieces {}..{} of op {} ({}) that answers no outstanding request",
                                first, first + count, h.op_id, op_kind_name(op.state->kind())));
    return RxAction::kContinue;
  }
  if (h.status != 0) {
    op.read_runs[first] = 0;  // answered: a second answer is refused
    sink.collect = true;
    return RxAction::kContinue;
  }
  uint64_t expected = 0;
  for (uint64_t i = first; i < first + count; ++i) expected += op.reads[i].length;
  if (expected != h.length) {
    violation(conn, fmt::format("a read answer of {} bytes for pieces {}..{} of op {}, expected {}", h.length, first,
                                first + count, h.op_id, expected));
    return RxAction::kContinue;
  }
  if (op.gpu && h.length > 0) {
    // Local memory on a GPU: the answer lands in a staging slot and is copied to the
    // device when it is complete (on_read_frame). No slot free: read on once one is.
    tcp::GpuStaging::Slot* slot = nullptr;
    Status error;
    const RxAction a = gpu_.staging()->stage_frame(conn, h.length, "a read answer", &slot, &error);
    if (a == RxAction::kPause) return a;
    op.read_runs[first] = 0;  // answered: a second answer is refused
    if (!slot) {  // no staging: the op fails alone, the answer is drained and still counted
      if (op.error.is_ok()) op.error = std::move(error);
      return RxAction::kContinue;
    }
    sink.place(slot->data, h.length);
    sink.op_id = h.op_id;
    return RxAction::kContinue;
  }
  op.read_runs[first] = 0;  // answered: a second answer is refused
  sink.scatter(op.reads.data() + first, count);
  sink.op_id = h.op_id;
  return RxAction::kContinue;
}

void Initiator::on_read_frame(TcpConnection& conn, const FrameHeader& h, std::string_view text) {
  tcp::GpuStaging* staging = gpu_.staging();
  tcp::GpuStaging::Slot* slot = staging ? staging->take_frame_slot(&conn) : nullptr;
  if (!slot) return count_read(h.op_id, h, text, Status::ok());
  PendingOp* found = pending_.find(h.op_id);
  if (!found) {  // it ended while the answer arrived; nothing was copied
    staging->release(slot);
    return;
  }
  // The answer is in the slot: copy each piece to its place in device memory, and count
  // the pieces once the copies have finished.
  std::shared_ptr<GpuOp> gpu = found->gpu;
  uint64_t at = 0;
  try {
    for (uint64_t i = h.index; i < h.index + h.offset; ++i) {
      const tcp::PayloadSegment& dst = found->reads[i];
      staging->copy(tcp::GpuStaging::kIn, dst.addr, slot->data + at, dst.length);
      at += dst.length;
    }
    ++gpu->copies;
    staging->when_copied(slot, [this, gpu, slot, h](Status copied) {
      gpu_.staging()->release(slot);
      const bool ended = gpu->ended;
      copy_finished(*gpu);
      if (!ended) count_read(h.op_id, h, {}, copied);
    });
  } catch (const std::exception& e) {
    staging->release(slot);
    count_read(h.op_id, h, {}, Status::failed(fmt::format("copying a read answer to the GPU failed: {}", e.what())));
  }
}

void Initiator::count_read(uint64_t op_id, const FrameHeader& h, std::string_view text, const Status& copied) {
  // Counted here, on the I/O thread, and completed once: no atomic per piece.
  PendingOp* found = pending_.find(op_id);
  if (!found) return;  // it expired; the bytes were drained
  PendingOp& op = *found;
  if (!copied) {
    if (op.error.is_ok()) op.error = copied;
  } else if (h.status != 0) {
    if (op.error.is_ok()) op.error = remote_status(h, text);
  } else {
    op.nbytes += h.length;
  }
  op.parts_left -= static_cast<uint32_t>(h.offset);  // on_read_header checked it against read_runs
  if (op.parts_left > 0) return;
  const uint64_t nbytes = op.error.is_ok() ? op.nbytes : 0;
  finish_op(op_id, std::move(op.error), nbytes);
}

void Initiator::revoke(const RegionLifetime& lifetime) {
  std::vector<uint64_t> ops;
  pending_.for_each([&](uint64_t id, const PendingOp& op) {
    if (op.uses.holds(&lifetime)) ops.push_back(id);
  });
  for (uint64_t id : ops) {
    finish_op(id, Status(StatusCode::kUnknownHandle,
                         fmt::format("local region '{}' was unregistered while the op was in flight", lifetime.name())));
  }
}

void Initiator::expire(Clock::time_point now) {
  // Ops by their deadline heap: only those due are touched. Each is out of pending_
  // before it ends, so ending it may end others (a lane it closes) without confusion.
  pending_.expire(now, [&](uint64_t id, PendingOp&& op) {
    const OpKind kind = op.state->kind();
    end_op(id, op,
           Status::timeout(fmt::format("{} did not complete within {}", op_kind_name(kind), op.limit.describe())));
  });
}

Initiator::Dropped Initiator::drop_all() {
  Dropped dropped{std::move(pending_)};
  pending_.clear();  // a moved-from table is emptied explicitly
  lingering_.clear();  // the peer is gone: no answer will come
  sends_.clear();
  gpu_queue_.clear();
  outbox_.clear();
  if (tcp::GpuStaging* staging = gpu_.staging()) {
    // The ops fail at once (Dropped::fail): first every staging copy of their memory
    // must have finished. Bounded: the copies are queued already.
    staging->drain();
    staging->drop_frame_slots();
    dropped.ops.for_each([](uint64_t, PendingOp& op) {
      if (op.gpu) op.gpu->ended = true;
    });
  }
  return dropped;
}

void Initiator::Dropped::fail(const Status& why) {
  // The lanes are closed: nothing touches the ops' memory any more, once our own copy
  // workers are done with it.
  ops.for_each([&](uint64_t, PendingOp& op) {
    if (op.copying) wait_for_copies(op);
    op.uses.clear();
    op.lease.end();
    op.state->complete(why);
  });
}

}  // namespace dlslime
