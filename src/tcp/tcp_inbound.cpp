#include "tcp/tcp_endpoint_impl.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "core/log.h"
#include "dlslime/errors.h"

// TcpEndpointImpl, part 3 of 3: the frames from the peer (targets of reads and writes,
// acknowledgements) and two-sided messages, on the I/O thread. Part 1
// (tcp_endpoint_impl.cpp) holds the lifecycle, connecting, deadlines and failure; part 2
// (tcp_submit.cpp) prepares operations.
namespace dlslime {

using tcp::FrameHeader;
using tcp::FrameType;
using tcp::PayloadSink;
using tcp::RxAction;
using tcp::TcpConnection;
using tcp::WriteItem;

namespace {

Status remote_status(const FrameHeader& h, std::string_view text) {
  return Status(static_cast<StatusCode>(h.status), fmt::format("the peer reported: {}", text));
}

}  // namespace

// ---------------------------------------------------------------------------------------
// I/O thread: frames from the peer

void TcpEndpointImpl::ack(TcpConnection& conn, FrameType type, uint64_t op_id, const Status& status) {
  FrameHeader h;
  h.type = type;
  h.op_id = op_id;
  h.status = status.raw_code();
  const std::string_view text = std::string_view(status.message()).substr(0, tcp::kMaxErrorText);
  h.length = text.size();
  WriteItem& item = conn.control();
  // Message acknowledgements are cumulative (see on_send_ack): a successful one that has
  // not left yet is superseded by the next, so a burst of messages costs one frame.
  const auto superseded = [](const FrameHeader& old) { return old.type == FrameType::kSendAck && old.status == 0; };
  if (type != FrameType::kSendAck || !item.replace_tail_header(h, superseded)) item.add_header(h);
  item.add_copy(text.data(), text.size());
}

void TcpEndpointImpl::on_send_ack(TcpConnection& conn, const FrameHeader& h, std::string_view text) {
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
  std::vector<uint64_t> done(sends_.begin(), it + 1);
  sends_.erase(sends_.begin(), it + 1);
  for (uint64_t id : done) finish_op(id, id == h.op_id ? status : Status::ok());  // no-op for expired ones
}

void TcpEndpointImpl::on_write_ack(TcpConnection& conn, const FrameHeader& h, std::string_view text) {
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
  if (op.ack_lanes == 0) finish_op(h.op_id, std::move(op.error));
}

RxAction TcpEndpointImpl::on_header(TcpConnection& conn, const FrameHeader& h, PayloadSink& sink) {
  switch (h.type) {
    case FrameType::kWriteData: sink.prefix = h.offset * tcp::kPieceSize; return RxAction::kContinue;  // the list
    case FrameType::kWriteAck:
    case FrameType::kSendAck:
    case FrameType::kReadRequest: sink.collect = true; return RxAction::kContinue;
    case FrameType::kReadData: {
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
      op.read_runs[first] = 0;  // answered: a second answer is refused
      if (h.status != 0) {
        sink.collect = true;
        return RxAction::kContinue;
      }
      uint64_t expected = 0;
      for (uint64_t i = first; i < first + count; ++i) expected += op.reads[i].length;
      if (expected != h.length) {
        violation(conn, fmt::format("a read answer of {} bytes for pieces {}..{} of op {}, expected {}", h.length,
                                    first, first + count, h.op_id, expected));
        return RxAction::kContinue;
      }
      sink.scatter(op.reads.data() + first, count);
      sink.op_id = h.op_id;
      return RxAction::kContinue;
    }
    case FrameType::kSendData: return on_message_header(conn, h, sink);
    case FrameType::kGoodbye: return RxAction::kContinue;
  }
  return RxAction::kContinue;
}

template <class OverLimit>
Status TcpEndpointImpl::resolve_pieces(std::string_view list, uint64_t first, uint64_t limit,
                                       std::vector<tcp::PayloadSegment>& segments, RegionUses& uses,
                                       uint64_t* total, OverLimit over_limit) const {
  // A piece list from the wire (its size was checked by the parser) resolved against the
  // local regions: the destinations of its non-empty pieces in order, with a use of each
  // region they point into (unregister waits for it), or the first bad piece's error
  // (numbered from `first`), or over_limit(i) once they pass `limit` bytes.
  segments.clear();
  uses.clear();
  *total = 0;
  ResolveCache cache;
  for (size_t i = 0; i < list.size() / tcp::kPieceSize; ++i) {
    const tcp::Piece p = tcp::parse_piece(reinterpret_cast<const uint8_t*>(list.data()) + i * tcp::kPieceSize);
    uintptr_t addr = 0;
    if (Status r = local_regions->resolve(p.handle, p.offset, p.length, &addr, cache); !r) {
      return Status(r.code(), fmt::format("piece {}: {}", first + i, r.message()));
    }
    if (p.length > limit - *total) return over_limit(i);
    *total += p.length;
    if (p.length > 0) {
      segments.push_back({reinterpret_cast<uint8_t*>(addr), p.length});
      uses.hold(cache);
    }
  }
  return Status::ok();
}

void TcpEndpointImpl::on_prefix(TcpConnection& conn, const FrameHeader& h, std::string_view list,
                                PayloadSink& sink) {
  // A write frame's piece list arrived; its data follows, the pieces back to back. Either
  // every piece is valid and the data is placed, or none of it is (drained) and the op's
  // acknowledgement reports the first error.
  const uint64_t data = h.length - list.size();  // the parser checked h.length >= the list
  std::vector<tcp::PayloadSegment>& segments = conn.segments();
  uint64_t total = 0;
  Status st = resolve_pieces(list, h.index, data, segments, conn.segment_uses(), &total, [&](size_t) {
    return Status::protocol_error(
        fmt::format("the write frame's pieces add up to more than the {} bytes it carries", data));
  });
  if (st && total != data) {
    st = Status::protocol_error(
        fmt::format("the write frame's pieces add up to {} bytes, but it carries {}", total, data));
  }
  if (!st) {
    conn.segment_uses().clear();  // nothing of it is placed
    InboundWrite& acc = inbound_writes_[&conn];
    if (acc.op_id != h.op_id || acc.status.is_ok()) acc = {h.op_id, std::move(st)};  // the op's first error
    return;  // drained
  }
  if (!segments.empty()) sink.scatter(segments.data(), segments.size());
}

void TcpEndpointImpl::on_frame(TcpConnection& conn, const FrameHeader& h, const PayloadSink& /*sink*/,
                               std::string_view text) {
  switch (h.type) {
    case FrameType::kWriteData: {
      if (!h.last()) return;
      Status st = Status::ok();
      if (auto it = inbound_writes_.find(&conn); it != inbound_writes_.end()) {
        // An entry of another op is stale: that op's frames on this lane are over.
        if (it->second.op_id == h.op_id) st = std::move(it->second.status);
        inbound_writes_.erase(it);
      }
      ack(conn, FrameType::kWriteAck, h.op_id, st);
      return;
    }
    case FrameType::kReadRequest:
      answer_read(conn, h, text);
      return;
    case FrameType::kWriteAck: on_write_ack(conn, h, text); return;
    case FrameType::kReadData: {
      // Counted here, on the I/O thread, and completed once: no atomic per piece.
      PendingOp* found = pending_.find(h.op_id);
      if (!found) return;  // it expired; the bytes were drained
      PendingOp& op = *found;
      if (h.status != 0) {
        if (op.error.is_ok()) op.error = remote_status(h, text);
      } else {
        op.nbytes += h.length;
      }
      op.reads_left -= static_cast<uint32_t>(h.offset);  // on_header checked it against reads_left
      if (op.reads_left > 0) return;
      const uint64_t nbytes = op.error.is_ok() ? op.nbytes : 0;
      finish_op(h.op_id, std::move(op.error), nbytes);
      return;
    }
    case FrameType::kSendAck: on_send_ack(conn, h, text); return;
    case FrameType::kSendData: {
      auto msg = current_msg_;
      if (!msg) return;
      msg->received = h.offset + h.length;
      if (!h.last()) return;
      current_msg_.reset();
      msg->complete = true;
      if (!msg->matched && !recvs_.empty() && !unexpected_.empty() && unexpected_.front() == msg) {
        take_held_front();
        PostedRecv recv = std::move(recvs_.front());
        recvs_.pop_front();
        attach(*msg, std::move(recv));
      }
      if (msg->matched) {
        finish_message(*msg);
      } else {
        // Eager completion: the whole message is held here, so the sender's buffer is
        // free again (the seed contract: a send completes without a posted recv).
        ack(conn, FrameType::kSendAck, msg->op_id, Status::ok());
        msg->acked = true;
      }
      return;
    }
    case FrameType::kGoodbye: {
      // The peer sends nothing more on this connection, but what it sent earlier on its
      // other connections (the acknowledgement of a message, say) may still be unread
      // there. Its ops fail only once every connection has said goodbye or closed.
      const auto closing = conn.shared_from_this();
      std::erase(dialed_, closing);
      std::erase(accepted_, closing);
      conn.close_quietly();
      if (dialed_.empty() && accepted_.empty()) on_closed(conn, Status::peer_closed("the peer endpoint shut down"));
      return;
    }
  }
}

void TcpEndpointImpl::answer_read(TcpConnection& conn, const FrameHeader& h, std::string_view list) {
  // One answer per request: all pieces' bytes in one frame, or the first piece's error.
  const size_t count = list.size() / tcp::kPieceSize;  // the parser checked the size
  uint64_t total = 0;
  RegionUses uses;  // held by the answer until it is written or dropped
  const Status st = resolve_pieces(list, 0, tcp::kMaxDataPayload, read_scratch_, uses, &total, [](size_t i) {
    return Status(StatusCode::kBatchOverflow,
                  fmt::format("the pieces up to {} ask for more than {} bytes in one answer", i, tcp::kMaxDataPayload));
  });
  FrameHeader r;
  r.type = FrameType::kReadData;
  r.op_id = h.op_id;
  r.index = h.index;
  r.offset = count;
  r.status = st.raw_code();
  // All answers to the requests in one read from the socket share one item.
  WriteItem& item = conn.control();
  if (st) {
    r.length = total;
    item.add_header(r);
    for (const tcp::PayloadSegment& piece : read_scratch_) item.add_payload(piece.addr, piece.length);
    item.hold(std::move(uses));
  } else {
    const std::string_view reason = std::string_view(st.message()).substr(0, tcp::kMaxErrorText);
    r.length = reason.size();
    item.add_header(r);
    item.add_copy(reason.data(), reason.size());
  }
}

// ---------------------------------------------------------------------------------------
// I/O thread: two-sided messages. The sender's lane 0 carries them in order; each is
// matched FIFO to a posted recv, or held (bounded) until one is posted. The sender's
// future completes once the whole message is here: placed, refused (too large), or held.

RxAction TcpEndpointImpl::on_message_header(TcpConnection& conn, const FrameHeader& h, PayloadSink& sink) {
  if (current_msg_ && current_msg_->op_id != h.op_id) {
    // The sender gave up on the previous message half-way (its send timed out).
    auto old = std::move(current_msg_);
    if (old->matched && old->recv.state) {
      old->recv.state->complete(Status::failed(
          fmt::format("the sender abandoned the message after {} bytes", old->received)));
    } else if (!old->matched) {
      forget_held(*old);
      unexpected_.erase(std::remove(unexpected_.begin(), unexpected_.end(), old), unexpected_.end());
    }
  }
  if (!current_msg_) {
    if (h.offset != 0) {
      conn.close(Status::protocol_error(fmt::format("message frame at offset {} without its start", h.offset)));
      return RxAction::kContinue;
    }
    // A held message costs its bytes plus kHeldMessageOverhead, so that empty or tiny
    // messages are bounded by unexpected_buffer_bytes too (their count at most
    // unexpected_buffer_bytes / kHeldMessageOverhead).
    if (recvs_.empty() && unexpected_bytes_ + kHeldMessageOverhead + h.length > options_.unexpected_buffer_bytes) {
      paused_conn_ = conn.shared_from_this();  // flow control: wait for a recv
      return RxAction::kPause;
    }
    auto msg = std::make_shared<InboundMessage>();
    msg->op_id = h.op_id;
    msg->conn = conn.shared_from_this();
    if (!recvs_.empty()) {
      msg->matched = true;
      msg->recv = std::move(recvs_.front());
      recvs_.pop_front();
    } else {
      unexpected_.push_back(msg);
      unexpected_bytes_ += kHeldMessageOverhead;
    }
    current_msg_ = std::move(msg);
  }
  InboundMessage& m = *current_msg_;
  if (h.offset != m.received) {
    conn.close(Status::protocol_error(
        fmt::format("message frame at offset {}, expected {}", h.offset, m.received)));
    return RxAction::kContinue;
  }
  if (!m.matched && !recvs_.empty() && !unexpected_.empty() && unexpected_.front() == current_msg_) {
    // A recv was posted while this held message was arriving: the rest goes straight in.
    take_held_front();
    PostedRecv recv = std::move(recvs_.front());
    recvs_.pop_front();
    attach(m, std::move(recv));
  }
  if (m.matched) {
    if (!m.recv.state || m.too_large) return RxAction::kContinue;  // drain
    if (!range_within(m.recv.length, h.offset, h.length)) {
      m.too_large = true;  // nothing is written past the posted buffer
      return RxAction::kContinue;
    }
    sink.place(m.recv.addr + h.offset, h.length);
    sink.op_id = m.recv.local_id;
    return RxAction::kContinue;
  }
  // A hard bound: even a single frame larger than the whole budget waits for a recv.
  if (unexpected_bytes_ + h.length > options_.unexpected_buffer_bytes) {
    paused_conn_ = conn.shared_from_this();  // flow control: wait for a recv
    return RxAction::kPause;
  }
  m.buffered.resize(h.offset + h.length);
  unexpected_bytes_ += h.length;
  sink.place(m.buffered.data() + h.offset, h.length);
  return RxAction::kContinue;
}

void TcpEndpointImpl::finish_message(InboundMessage& m) {
  Status st = Status::ok();
  if (m.too_large) {
    st = Status(StatusCode::kMessageTooLarge,
                fmt::format("a message of {} bytes does not fit the posted receive buffer of {} bytes", m.received,
                            m.recv.length));
  } else if (!m.recv.state) {
    st = Status::timeout("the receiver's recv timed out before the message arrived");
  }
  if (m.recv.state) m.recv.state->complete(st, st.is_ok() ? m.received : 0);
  m.recv.state.reset();
  if (m.acked) return;
  m.acked = true;
  if (auto conn = m.conn.lock()) ack(*conn, FrameType::kSendAck, m.op_id, st);
}

void TcpEndpointImpl::forget_held(const InboundMessage& msg) {
  unexpected_bytes_ -= msg.buffered.size() + kHeldMessageOverhead;
}

std::shared_ptr<TcpEndpointImpl::InboundMessage> TcpEndpointImpl::take_held_front() {
  auto msg = std::move(unexpected_.front());
  unexpected_.pop_front();
  forget_held(*msg);
  return msg;
}

void TcpEndpointImpl::resume_paused() {
  if (auto conn = paused_conn_.lock()) conn->resume_reading();
  paused_conn_.reset();
}

void TcpEndpointImpl::attach(InboundMessage& m, PostedRecv recv) {
  // Only at a frame boundary of m's connection (or once m is complete): no payload of m
  // is in flight into `buffered` then, and it holds exactly m.received bytes.
  m.matched = true;
  m.recv = std::move(recv);
  if (m.received > m.recv.length) {
    m.too_large = true;
  } else if (m.received > 0) {
    std::memcpy(m.recv.addr, m.buffered.data(), m.received);
  }
  std::vector<uint8_t>().swap(m.buffered);
}

void TcpEndpointImpl::post_recv(PostedRecv recv) {
  if (shut_down_) {
    recv.state->complete(Status::cancelled("the endpoint is shut down"));
    return;
  }
  if (!unexpected_.empty() && unexpected_.front()->complete) {
    auto msg = take_held_front();
    attach(*msg, std::move(recv));
    finish_message(*msg);
    resume_paused();
    return;
  }
  if (unexpected_.empty() && dialed_.empty() && accepted_.empty() && !last_loss_.empty()) {
    // The peer is gone and nothing will ever arrive; a recv posted before any peer
    // connected, by contrast, waits for one.
    recv.state->complete(Status::peer_closed(fmt::format("the connection to the peer was lost: {}", last_loss_)));
    return;
  }
  // Either nothing is here yet, or the oldest held message is still arriving: it takes
  // this recv at its next frame boundary (on_message_header) or when it completes.
  // Its deadline starts here, on this thread, so recvs_ stays in deadline order (sweep()).
  recv.deadline = deadline_after(options_.recv_timeout);
  const auto deadline = recv.deadline;
  recvs_.push_back(std::move(recv));
  arm_sweeper(deadline);
  resume_paused();
}

}  // namespace dlslime
