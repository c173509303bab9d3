#include "tcp/tcp_target_server.h"

#include <fmt/format.h>

namespace dlslime {

using tcp::FrameHeader;
using tcp::FrameType;
using tcp::PayloadSink;
using tcp::TcpConnection;
using tcp::WriteItem;

void TargetServer::ack(TcpConnection& conn, FrameType type, uint64_t op_id, const Status& status) {
  FrameHeader h;
  h.type = type;
  h.op_id = op_id;
  h.status = status.raw_code();
  const std::string_view text = std::string_view(status.message()).substr(0, tcp::kMaxErrorText);
  h.length = text.size();
  WriteItem& item = conn.control();
  // Message acknowledgements are cumulative (see Initiator::on_send_ack): a successful
  // one that has not left yet is superseded by the next.
  const auto superseded = [](const FrameHeader& old) { return old.type == FrameType::kSendAck && old.status == 0; };
  if (type != FrameType::kSendAck || !item.replace_tail_header(h, superseded)) item.add_header(h);
  item.add_copy(text.data(), text.size());
}

template <class OverLimit>
Status TargetServer::resolve_pieces(std::string_view list, uint64_t first, uint64_t limit,
                                    std::vector<tcp::PayloadSegment>& segments, RegionUses& uses, uint64_t* total,
                                    OverLimit over_limit) const {
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
    if (Status r = regions_.resolve(p.handle, p.offset, p.length, &addr, cache); !r) {
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

void TargetServer::on_write_prefix(TcpConnection& conn, const FrameHeader& h, std::string_view list,
                                   PayloadSink& sink) {
  // The data follows the list, the pieces back to back. Either every piece is valid and
  // the data is placed, or none of it is (drained) and the op's acknowledgement reports
  // the first error.
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

void TargetServer::on_write_frame(TcpConnection& conn, const FrameHeader& h) {
  if (!h.last()) return;
  Status st = Status::ok();
  if (auto it = inbound_writes_.find(&conn); it != inbound_writes_.end()) {
    // An entry of another op is stale: that op's frames on this lane are over.
    if (it->second.op_id == h.op_id) st = std::move(it->second.status);
    inbound_writes_.erase(it);
  }
  ack(conn, FrameType::kWriteAck, h.op_id, st);
}

void TargetServer::answer_read(TcpConnection& conn, const FrameHeader& h, std::string_view list) {
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

}  // namespace dlslime
