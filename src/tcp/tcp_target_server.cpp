#include "tcp/tcp_target_server.h"

#include <limits>
#include <thread>

#include <fmt/format.h>

#include "core/same_host.h"
#include "tcp/same_host_path.h"
#include "tcp/wire.h"

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
                                    bool* device, OverLimit over_limit) const {
  // A piece list from the wire (its size was checked by the parser) resolved against the
  // local regions: the destinations of its non-empty pieces in order, with a use of each
  // region they point into (unregister waits for it), or the first bad piece's error
  // (numbered from `first`), or over_limit(i) once they pass `limit` bytes.
  segments.clear();
  uses.clear();
  *total = 0;
  *device = false;
  const bool any_device = gpu_.regions.any();  // the host path asks nothing more
  int32_t checked = -1;
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
      if (any_device && p.handle != checked) {
        checked = p.handle;
        *device = *device || gpu_.regions.device_of(p.handle) >= 0;
      }
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
  bool device = false;
  Status st = resolve_pieces(list, h.index, data, segments, conn.segment_uses(), &total, &device, [&](size_t) {
    return Status::protocol_error(
        fmt::format("the write frame's pieces add up to more than the {} bytes it carries", data));
  });
  if (st && total != data) {
    st = Status::protocol_error(
        fmt::format("the write frame's pieces add up to {} bytes, but it carries {}", total, data));
  }
  // Frames are staged only once a device region exists: the host path asks no table.
  auto staged = gpu_.staging() ? staged_.find(&conn) : staged_.end();
  if (!st) {
    conn.segment_uses().clear();  // nothing of it is placed
    if (staged != staged_.end()) gpu_.staging()->release(take_reserved(&conn));
    record_error(conn, h.op_id, std::move(st));
    return;  // drained
  }
  if (device && staged != staged_.end() && staged->second.slot) {
    // Device memory: the payload lands in the reserved slot, contiguous, and is copied to
    // its places when complete (on_write_frame). The destinations and their regions are
    // kept until the copies have finished.
    StagedFrame& f = staged->second;
    try {
      gpu_.staging()->ensure(f.slot, data);
    } catch (const std::exception& e) {
      gpu_.staging()->release(take_reserved(&conn));
      conn.segment_uses().clear();
      record_error(conn, h.op_id, Status::failed(fmt::format("no GPU staging memory for a write: {}", e.what())));
      return;  // drained
    }
    f.segments.assign(segments.begin(), segments.end());
    f.uses = conn.segment_uses();
    sink.place(f.slot->data, data);
    return;
  }
  if (device) {
    // No slot: none was reserved at its header (the region was registered in between), or
    // none could be had. The bytes are refused rather than placed by host code, and the op
    // fails alone.
    Status why = Status::failed("no GPU staging slot was reserved for the frame; write again");
    if (staged != staged_.end() && !staged->second.error.is_ok()) why = staged->second.error;
    take_reserved(&conn);
    conn.segment_uses().clear();
    record_error(conn, h.op_id, std::move(why));
    return;
  }
  if (staged != staged_.end()) gpu_.staging()->release(take_reserved(&conn));  // host memory after all
  if (!segments.empty()) sink.scatter(segments.data(), segments.size());
}

tcp::RxAction TargetServer::reserve_staging(TcpConnection& conn, const FrameHeader& h) {
  tcp::GpuStaging* staging = gpu_.staging();
  if (!staging || staged_.count(&conn)) return tcp::RxAction::kContinue;
  const uint64_t list = h.offset * tcp::kPieceSize;
  if (list == 0 || h.length <= list) return tcp::RxAction::kContinue;  // no bytes to place
  tcp::GpuStaging::Slot* slot = nullptr;
  try {
    slot = staging->acquire(tcp::GpuStaging::kIn, h.length - list);
  } catch (const std::exception& e) {  // on_write_prefix fails the op and drains its bytes
    staged_[&conn].error = Status::failed(fmt::format("no GPU staging memory for a write: {}", e.what()));
    return tcp::RxAction::kContinue;
  }
  if (!slot) {
    // Safe to wait: an incoming slot frees without the peer (its device copy finishes).
    staging->wait_for_slot(tcp::GpuStaging::kIn, conn.shared_from_this());
    return tcp::RxAction::kPause;
  }
  staged_[&conn].slot = slot;
  return tcp::RxAction::kContinue;
}

tcp::RxAction TargetServer::admit_read(TcpConnection& conn) {
  // Read requests are never paused for an outgoing slot (answer_read defers them), only
  // when a peer has more pieces waiting than any sane one does.
  if (deferred_pieces_ <= kMaxDeferredPieces) return tcp::RxAction::kContinue;
  deferred_waiting_.push_back(conn.weak_from_this());
  return tcp::RxAction::kPause;
}

tcp::GpuStaging::Slot* TargetServer::take_reserved(const TcpConnection* conn) {
  auto it = staged_.find(conn);
  if (it == staged_.end()) return nullptr;
  tcp::GpuStaging::Slot* slot = it->second.slot;
  staged_.erase(it);
  return slot;
}

void TargetServer::record_error(TcpConnection& conn, uint64_t op_id, Status st) {
  auto [it, added] = inbound_writes_.try_emplace(WriteKey{&conn, op_id});
  if (added && inbound_writes_.size() > kMaxOpenWrites) {
    inbound_writes_.erase(it);
    return conn.close(Status::protocol_error(
        fmt::format("the peer has more than {} write ops open with errors or copies pending", kMaxOpenWrites)));
  }
  if (it->second.status.is_ok()) it->second.status = std::move(st);  // the op's first error
}

void TargetServer::place_staged(TcpConnection& conn, const FrameHeader& h, StagedFrame frame) {
  tcp::GpuStaging& staging = *gpu_.staging();
  tcp::GpuStaging::Slot* slot = frame.slot;
  const WriteKey key{&conn, h.op_id};
  auto [it, added] = inbound_writes_.try_emplace(key);
  InboundWrite& w = it->second;
  try {
    uint64_t at = 0;
    for (const tcp::PayloadSegment& dst : frame.segments) {
      staging.copy(tcp::GpuStaging::kIn, dst.addr, slot->data + at, dst.length);
      at += dst.length;
    }
    if (!w.conn) w.conn = conn.shared_from_this();
    ++w.copies;
    auto uses = std::make_shared<RegionUses>(std::move(frame.uses));  // until the copies have finished
    staging.when_copied(slot, [this, key, slot, uses](Status copied) {
      gpu_.staging()->release(slot);
      auto it = inbound_writes_.find(key);
      if (it == inbound_writes_.end()) return;  // the peer is gone (clear)
      InboundWrite& w = it->second;
      if (!copied && w.status.is_ok()) w.status = copied;
      if (--w.copies > 0 || !w.last) return;
      std::shared_ptr<TcpConnection> conn = std::move(w.conn);
      const Status st = std::move(w.status);
      inbound_writes_.erase(it);
      if (conn->is_open()) ack(*conn, FrameType::kWriteAck, key.op_id, st);
    });
  } catch (const std::exception& e) {
    staging.release(slot);
    if (w.status.is_ok()) w.status = Status::failed(fmt::format("copying a write to the GPU failed: {}", e.what()));
  }
}

void TargetServer::clear() {
  inbound_writes_.clear();
  grants_.clear();  // the peer is gone: it copies nothing more
  if (tcp::GpuStaging* staging = gpu_.staging()) {
    for (auto& [conn, f] : staged_) staging->release(f.slot);
  }
  staged_.clear();
  deferred_.clear();
  deferred_pieces_ = 0;
  deferred_waiting_.clear();
}

void TargetServer::on_write_frame(TcpConnection& conn, const FrameHeader& h) {
  if (!staged_.empty()) {
    if (auto f = staged_.find(&conn); f != staged_.end()) {
      StagedFrame frame = std::move(f->second);
      staged_.erase(f);
      if (!frame.segments.empty()) {
        place_staged(conn, h, std::move(frame));
      } else if (frame.slot) {
        gpu_.staging()->release(frame.slot);
      }
    }
  }
  if (!h.last()) return;
  Status st = Status::ok();
  if (!inbound_writes_.empty()) {
    if (auto it = inbound_writes_.find(WriteKey{&conn, h.op_id}); it != inbound_writes_.end()) {
      if (it->second.copies > 0) {  // acknowledged once its copies to the device have finished
        it->second.last = true;
        return;
      }
      st = std::move(it->second.status);
      inbound_writes_.erase(it);
    }
  }
  ack(conn, FrameType::kWriteAck, h.op_id, st);
}

void TargetServer::answer_read(TcpConnection& conn, const FrameHeader& h, std::string_view list) {
  const size_t count = list.size() / tcp::kPieceSize;  // the parser checked the size
  uint64_t total = 0;
  bool device = false;
  RegionUses uses;  // held by the answer until it is written or dropped
  const Status st = resolve_pieces(list, 0, tcp::kMaxDataPayload, read_scratch_, uses, &total, &device, [](size_t i) {
    return Status(StatusCode::kBatchOverflow,
                  fmt::format("the pieces up to {} ask for more than {} bytes in one answer", i, tcp::kMaxDataPayload));
  });
  FrameHeader r;
  r.type = FrameType::kReadData;
  r.op_id = h.op_id;
  r.index = h.index;
  r.offset = count;
  r.status = st.raw_code();
  if (st && device && total > 0) return answer_device(conn, r, total, std::move(uses));
  if (!st) return answer_error(conn, r, st);
  // All answers to the requests in one read from the socket share one item.
  WriteItem& item = conn.control();
  r.length = total;
  item.add_header(r);
  for (const tcp::PayloadSegment& piece : read_scratch_) item.add_payload(piece.addr, piece.length);
  item.hold(std::move(uses));
}

}  // namespace dlslime

namespace dlslime {

void TargetServer::answer_device(TcpConnection& conn, const FrameHeader& r, uint64_t total, RegionUses uses) {
  // A read of device memory needs an outgoing staging slot. With none free it waits in
  // deferred_ instead of pausing the connection: the frames behind this request may be the
  // peer's writes, whose own outgoing slots free only once we read them, and the peer may
  // be waiting likewise for ours. Pausing here was the deadlock of issue 21 (N3).
  if (deferred_.empty()) {
    Status error;
    if (tcp::GpuStaging::Slot* slot = acquire_answer_slot(total, &error)) {
      return answer_staged(conn, r, slot, total, read_scratch_, std::move(uses));
    }
    if (!error.is_ok()) return answer_error(conn, r, error);
  }
  deferred_pieces_ += read_scratch_.size();
  deferred_.push_back({conn.weak_from_this(), r, total, read_scratch_, std::move(uses)});
}

tcp::GpuStaging::Slot* TargetServer::acquire_answer_slot(uint64_t total, Status* error) {
  try {
    return gpu_.staging()->acquire(tcp::GpuStaging::kOut, total);
  } catch (const std::exception& e) {  // no pinned memory, or a failed device: this read fails
    *error = Status::failed(fmt::format("no GPU staging memory for a read answer: {}", e.what()));
    return nullptr;
  }
}

void TargetServer::serve_deferred() {
  // An outgoing slot was released: deferred answers take it before our own ops' frames do
  // (Impl's on_free calls this first), oldest first.
  while (!deferred_.empty()) {
    DeferredRead& d = deferred_.front();
    std::shared_ptr<TcpConnection> conn = d.conn.lock();
    tcp::GpuStaging::Slot* slot = nullptr;
    Status error;
    if (conn && conn->is_open()) {
      slot = acquire_answer_slot(d.total, &error);
      if (!slot && error.is_ok()) break;  // none free yet
    }
    DeferredRead taken = std::move(d);
    deferred_.pop_front();
    deferred_pieces_ -= taken.pieces.size();
    if (slot) answer_staged(*conn, taken.header, slot, taken.total, taken.pieces, std::move(taken.uses));
    if (!error.is_ok()) answer_error(*conn, taken.header, error);
  }
  if (deferred_pieces_ <= kMaxDeferredPieces / 2 && !deferred_waiting_.empty()) {
    auto waiting = std::move(deferred_waiting_);
    deferred_waiting_.clear();
    for (auto& w : waiting) {
      if (auto conn = w.lock()) conn->resume_reading();
    }
  }
}

void TargetServer::add_status(WriteItem& item, FrameHeader r, const Status& st) {
  const std::string_view reason = std::string_view(st.message()).substr(0, tcp::kMaxErrorText);
  r.status = st.raw_code();
  r.length = reason.size();
  item.add_header(r);
  item.add_copy(reason.data(), reason.size());
}

void TargetServer::answer_staged(TcpConnection& conn, const FrameHeader& r, tcp::GpuStaging::Slot* slot,
                                 uint64_t total, const std::vector<tcp::PayloadSegment>& pieces, RegionUses uses) {
  // A read of device memory: the pieces are copied into the slot, and the answer leaves
  // once the copies have finished (the regions are held until then).
  tcp::GpuStaging& staging = *gpu_.staging();
  try {
    staging.ensure(slot, total);
    uint64_t at = 0;
    for (const tcp::PayloadSegment& src : pieces) {
      staging.copy(tcp::GpuStaging::kOut, slot->data + at, src.addr, src.length);
      at += src.length;
    }
    auto held = std::make_shared<RegionUses>(std::move(uses));
    FrameHeader answer = r;
    staging.when_copied(slot, [this, conn = conn.shared_from_this(), r = answer, slot, total, held](Status copied) mutable {
      held->clear();
      tcp::GpuStaging& staging = *gpu_.staging();
      if (!conn->is_open()) return staging.release(slot);
      WriteItem item(0);
      if (copied) {
        r.length = total;
        item.reserve(1, total);
        item.add_header(r);
        item.add_payload(slot->data, total);
        item.keep(staging.lease(slot));
      } else {
        staging.release(slot);
        const std::string_view reason = std::string_view(copied.message()).substr(0, tcp::kMaxErrorText);
        r.status = copied.raw_code();
        r.length = reason.size();
        item.add_header(r);
        item.add_copy(reason.data(), reason.size());
      }
      conn->send(std::move(item));
    });
  } catch (const std::exception& e) {
    staging.release(slot);
    answer_error(conn, r, Status::failed(fmt::format("copying a read of GPU memory failed: {}", e.what())));
  }
}

}  // namespace dlslime

namespace dlslime {

tcp::RxAction TargetServer::admit_pull(TcpConnection& conn) {
  if (pulls_in_flight_ < kMaxPullsInFlight) return tcp::RxAction::kContinue;
  pull_waiting_.push_back(conn.weak_from_this());
  return tcp::RxAction::kPause;
}

void TargetServer::serve_pull(TcpConnection& conn, const FrameHeader& h, std::string_view payload, uint32_t pid) {
  const size_t count = h.offset;  // the parser checked payload = count pull pieces
  const std::string_view list = payload.substr(0, count * tcp::kPieceSize);
  const auto* sources = reinterpret_cast<const uint8_t*>(payload.data()) + list.size();
  uint64_t total = 0;
  bool device = false;
  RegionUses uses;  // held by the copy until it has finished
  Status st = resolve_pieces(list, h.index, tcp::kMaxDataPayload, read_scratch_, uses, &total, &device, [](size_t i) {
    return Status(StatusCode::kBatchOverflow,
                  fmt::format("the pieces up to {} ask for more than {} bytes in one request", i, tcp::kMaxDataPayload));
  });
  if (st && device) {
    st = Status::invalid_argument("the same-host path cannot place bytes in device memory; the writer must stage them");
  }
  FrameHeader r;
  r.type = FrameType::kPullDone;
  r.op_id = h.op_id;
  r.index = h.index;
  r.offset = count;
  // Each non-empty piece (resolve_pieces kept those, in order) with its source in the peer.
  std::vector<CrossCopy> copies;
  copies.reserve(read_scratch_.size());
  for (size_t i = 0, k = 0; st && i < count; ++i) {
    const tcp::Piece p = tcp::parse_piece(reinterpret_cast<const uint8_t*>(list.data()) + i * tcp::kPieceSize);
    const uint64_t source = tcp::WireReader(sources + i * 8).u64();
    if (p.length == 0) continue;
    if (source == 0 || p.length > std::numeric_limits<uint64_t>::max() - source) {
      st = Status::invalid_argument(fmt::format("piece {}: source address {:#x} + {} bytes is not a range", h.index + i,
                                                source, p.length));
      break;
    }
    copies.push_back({read_scratch_[k++].addr, source, p.length});
  }
  if (!st) return answer_error(conn, r, st);
  if (copies.empty()) return answer_error(conn, r, Status::ok());  // nothing to move
  ++pulls_in_flight_;
  {
    std::lock_guard lock(outcomes_->mu);
    ++outcomes_->copying;
  }
  pull_.workers->submit([copies = std::move(copies), uses = std::move(uses), pid, post = pull_.post, this,
                         outcomes = outcomes_, conn = conn.weak_from_this(), r, total,
                         counter = pull_.copied_bytes]() mutable {
    Status copied = cross_copy(static_cast<int>(pid), copies, true);
    if (copied && counter) counter->fetch_add(total, std::memory_order_relaxed);
    uses.clear();  // the bytes are in place (or not): the regions are free for unregister
    if (same_host_fault("slow_report")) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    {
      std::lock_guard lock(outcomes->mu);
      outcomes->ended.push_back({std::move(conn), r, std::move(copied)});
      --outcomes->copying;
    }
    outcomes->cv.notify_all();
    post([this] { answer_copied_pulls(); });
  });
}

void TargetServer::answer_copied_pulls() {
  std::vector<CopiedPull> ended;
  {
    std::lock_guard lock(outcomes_->mu);
    ended.swap(outcomes_->ended);
  }
  for (const CopiedPull& c : ended) pull_finished(c.conn, c.answer, c.copied);
}

void TargetServer::settle_pulls(std::chrono::steady_clock::time_point deadline) {
  {
    std::unique_lock lock(outcomes_->mu);
    outcomes_->cv.wait_until(lock, deadline, [&] { return outcomes_->copying == 0; });
  }
  answer_copied_pulls();
}

void TargetServer::pull_finished(const std::weak_ptr<TcpConnection>& weak, const FrameHeader& r, const Status& copied) {
  if (auto conn = weak.lock(); conn && conn->is_open()) {
    WriteItem item(0);  // not conn.control(): this runs outside a frame handler
    add_status(item, r, copied);
    conn->send(std::move(item));
  }
  pull_slot_freed();
}

void TargetServer::pull_slot_freed() {
  --pulls_in_flight_;
  if (pulls_in_flight_ <= kMaxPullsInFlight / 2 && !pull_waiting_.empty()) {
    auto waiting = std::move(pull_waiting_);
    pull_waiting_.clear();
    for (auto& w : waiting) {
      if (auto conn = w.lock()) conn->resume_reading();
    }
  }
}

void TargetServer::grant_read(TcpConnection& conn, const FrameHeader& h, std::string_view list) {
  const size_t count = h.offset;  // the parser checked the list's size
  uint64_t total = 0;
  bool device = false;
  RegionUses uses;
  Status st = resolve_pieces(list, h.index, tcp::kMaxDataPayload, read_scratch_, uses, &total, &device, [](size_t i) {
    return Status(StatusCode::kBatchOverflow,
                  fmt::format("the pieces up to {} ask for more than {} bytes in one request", i, tcp::kMaxDataPayload));
  });
  if (st && device) {
    st = Status::invalid_argument("the same-host path cannot copy out of device memory; the reader must use frames");
  }
  FrameHeader r;
  r.type = FrameType::kReadGrant;
  r.op_id = h.op_id;
  r.index = h.index;
  r.offset = count;
  const GrantKey key{&conn, h.op_id, h.index};
  if (st && grants_.count(key)) st = Status::protocol_error(fmt::format("request {} of op {} is granted already", h.index, h.op_id));
  if (st && grants_.size() >= kMaxGrants) {
    // Refused, not paused: the releases that would free grants arrive on this connection.
    st = Status(StatusCode::kBatchOverflow, fmt::format("{} read grants are outstanding already", kMaxGrants));
  }
  if (!st) return answer_error(conn, r, st);
  // Each piece's address (0 for an empty one: resolve_pieces kept only the others, in order).
  WriteItem& item = conn.control();
  r.length = count * 8;
  item.add_header(r);
  for (size_t i = 0, k = 0; i < count; ++i) {
    const tcp::Piece p = tcp::parse_piece(reinterpret_cast<const uint8_t*>(list.data()) + i * tcp::kPieceSize);
    uint8_t addr[8];
    tcp::WireWriter(addr).u64(p.length == 0 ? 0 : reinterpret_cast<uintptr_t>(read_scratch_[k++].addr));
    item.add_copy(addr, sizeof addr);
  }
  grants_.emplace(key, std::move(uses));
}

void TargetServer::release_read(TcpConnection& conn, const FrameHeader& h) {
  FrameHeader r;
  r.type = FrameType::kPullDone;
  r.op_id = h.op_id;
  r.index = h.index;
  r.offset = h.offset;
  auto it = grants_.find(GrantKey{&conn, h.op_id, h.index});
  if (it == grants_.end()) {
    return answer_error(conn, r, Status::protocol_error(fmt::format(
                                     "request {} of op {} holds no grant here to release", h.index, h.op_id)));
  }
  grants_.erase(it);  // the regions are free for unregister
  answer_error(conn, r, Status::ok());  // the region was held throughout the peer's copy
}

bool TargetServer::grants_hold(const TcpConnection* conn, const RegionLifetime* lifetime) const {
  for (const auto& [key, uses] : grants_) {
    if (key.conn == conn && uses.holds(lifetime)) return true;
  }
  return false;
}

}  // namespace dlslime
