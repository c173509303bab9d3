// RDMAEndpoint's two-sided messages (send/recv), built so that no size mismatch or late
// recv can ever put a QP into the error state (docs/rdma.md, "send and recv"):
//
// - Both sides keep max_recv_wr fixed receive buffers of kEagerBuffer bytes posted on lane
//   0; every SEND this endpoint posts fits one, so the NIC never sees a too-long SEND.
// - A message of at most kEagerPayload bytes travels in its EAGER SEND and is copied out;
//   a larger one sends RTS (address, rkey, length) and the receiver READs the sender's
//   buffer once a recv matches it (rendezvous).
// - Messages match posted recvs in FIFO order. One that arrives first waits, copied out
//   (eager) or as its RTS, for its recv. A sender has at most `credit_` messages that the
//   receiver has not answered, so what waits is bounded (credit x kEagerBuffer bytes).
//   Both sides use the same credit, a quarter of the smaller max_recv_wr of the two
//   (exchanged in endpoint_info), and the receiver enforces it: a peer with more unmatched
//   messages than the credit fails the connection (PROTOCOL_ERROR), never its memory.
// - The receiver answers every message with DONE(seq, status, reason): the send completes
//   with it (MESSAGE_TOO_LARGE when the recv was too short, which fails that recv alone;
//   a refusal's reason, e.g. recv(exact_size), so the sender's error names it as TCP's does).
// - shutdown() says BYE first, so the peer's posted recvs fail PEER_CLOSED.
#include <cstring>

#include <fmt/format.h>

#include "core/log.h"
#include "dlslime/errors.h"
#include "gpu/device_runtime.h"
#include "rdma/rdma_endpoint.h"

namespace dlslime {

using namespace rdma;

namespace {

// kNotify: a notification (eager, at most OpRequest::kMaxNotificationBytes), answered by a
// DONE as soon as it is held, so notifications never take the peer's message credit.
enum MsgType : uint32_t { kEager = 1, kRts = 2, kDone = 3, kBye = 4, kRevoke = 5, kRevoked = 6, kNotify = 7 };

// Why a receiver failed a message (DONE's `reason`), so the sender's status names it.
enum DoneReason : uint32_t {
  kReasonNone = 0,
  kReasonExactSize = 1,   // recv(exact_size) and a shorter message; DONE's addr: the buffer's length
  kReasonTooLarge = 2,    // longer than the recv's buffer; DONE's addr: the buffer's length
  kReasonRecvBuffer = 3,  // the receiver could not register its recv buffer
  kReasonRecvRead = 4,    // the receiver's READ of the sender's buffer (rendezvous) failed
  kReasonNotifyRefused = 5,  // a notification the receiver's full inbox refused; the DONE's payload says why
};

struct MsgHeader {
  uint32_t type;
  int32_t status;  // DONE: a StatusCode
  uint64_t seq;
  uint64_t length;
  uint64_t addr;   // RTS: the sender's buffer; DONE: the recv buffer's length (see DoneReason)
  uint32_t rkey;
  uint32_t reason;  // DONE: a DoneReason
};
constexpr uint32_t kEagerPayload = RdmaEndpointImpl::kEagerBuffer - sizeof(MsgHeader);

// The sender's status for the receiver's DONE (`text`: its payload).
Status done_status(const MsgHeader& h, std::string_view text) {
  if (h.status == 0) return Status::ok();
  switch (h.reason) {
    case kReasonNotifyRefused:
      return Status(StatusCode::kBatchOverflow, std::string(text.substr(0, 1024)));
    case kReasonTooLarge:
      return Status(StatusCode::kMessageTooLarge,
                    fmt::format("the receiver refused the message: its {} bytes are more than the {}-byte buffer of "
                                "the recv it matched",
                                h.length, h.addr));
    case kReasonExactSize: {
      const Status why = exact_size_mismatch(h.length, h.addr);
      return Status(why.code(), "the receiver refused the message: " + why.message());
    }
    case kReasonRecvBuffer:
      return Status::failed("the receiver failed the message: it could not register its recv buffer");
    case kReasonRecvRead:
      return Status::failed("the receiver failed the message: its read of this send's buffer failed");
    default:
      return Status::failed(fmt::format("the receiver failed the message (status {})", h.status));
  }
}

}  // namespace

void RdmaEndpointImpl::setup_messages() {
  credit_ = std::max<uint32_t>(1, options.max_recv_wr / 4);
  recv_pool_.assign(size_t(options.max_recv_wr) * kEagerBuffer, 0);
  recv_mr_ = device_->pd->reg_mr(recv_pool_.data(), recv_pool_.size(), kLocalWrite);
  // Our messages (<= credit) plus our DONEs for the peer's (<= its credit) plus BYE.
  const uint32_t slots = 2 * credit_ + 2;
  send_pool_.assign(size_t(slots) * kEagerBuffer, 0);
  send_mr_ = device_->pd->reg_mr(send_pool_.data(), send_pool_.size(), kLocalWrite);
  arm_messages();
}

void RdmaEndpointImpl::arm_messages() {
  // Called on fresh QPs only (construction, reopen_if_failed): every send slot is free and
  // no receive is posted on lane 0 yet.
  const size_t slots = send_pool_.size() / kEagerBuffer;
  free_slots_.clear();
  for (size_t i = slots; i-- > 0;) free_slots_.push_back(static_cast<int32_t>(i));
  for (uint32_t i = 0; i < options.max_recv_wr; ++i) post_recv_slot(i);
}

void RdmaEndpointImpl::post_recv_slot(uint32_t slot) {
  Sge sge{reinterpret_cast<uint64_t>(recv_pool_.data()) + uint64_t(slot) * kEagerBuffer, kEagerBuffer,
          recv_mr_->lkey()};
  RecvWr wr;
  wr.wr_id = kRecvWrFlag | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  const RecvWr* bad = nullptr;
  if (int rc = lanes_[0].qp->post_recv(&wr, &bad); rc != 0) {
    DLSLIME_WARN("RDMA QP {}: post_recv failed: {}", lanes_[0].qp->qp_num(), std::strerror(rc));
    return;
  }
  ++recvs_posted_;
}

std::optional<uint32_t> RdmaEndpointImpl::lkey_for(uint64_t addr, uint64_t length,
                                                   std::unique_ptr<MemoryRegion>& temp, uint32_t access,
                                                   RegionUses& uses) {
  if (auto match = regions->find_containing(addr, length)) {
    ResolveCache cache;
    uintptr_t resolved = 0;
    if (regions->resolve(match->handle, match->offset, length, &resolved, cache)) {
      if (auto key = domain_->lkey(match->handle)) {
        if ((access & kLocalWrite) && !key->writable) {
          DLSLIME_WARN("RDMA: a message cannot land in region {}: it is read-only memory", match->handle);
          return std::nullopt;
        }
        uses.hold(cache);
        return key->lkey;
      }
    }
  }
  // Not in registered memory: a registration for this op alone (costly; documented).
  try {
    temp = register_memory(*device_->pd, addr, length, memory_place_of(addr).kind, access);
  } catch (const VerbsError& e) {
    DLSLIME_WARN("RDMA: cannot register a message buffer of {} bytes: {}", length, e.what());
    return std::nullopt;
  }
  return temp->lkey();
}

bool RdmaEndpointImpl::device_buffer(uint64_t addr, uint64_t length) const {
  if (length == 0) return false;
  if (auto match = regions->find_containing(addr, length)) {
    if (auto region = regions->get(match->handle)) return region->kind == MemoryKind::kDevice;
  }
  return memory_place_of(addr).kind == MemoryKind::kDevice;
}

namespace {

// An eager message's bytes into a GPU recv buffer: host code cannot store there, the GPU
// runtime copies them (at most kEagerPayload bytes; waited for here, so the recv completes
// once they are in place). The legacy default stream: ordered after the device's other
// work, as a user's recv into that memory expects.
Status copy_into_device(uint64_t dst, const uint8_t* src, uint64_t n) {
  try {
    gpu::Runtime& rt = gpu::runtime();
    const int device = rt.pointer_info(reinterpret_cast<const void*>(dst)).device;
    gpu::Event event = rt.event_create(device);
    try {
      rt.memcpy_async(reinterpret_cast<void*>(dst), src, n, nullptr);
      rt.event_record(event, nullptr);
      rt.event_synchronize(event);
    } catch (...) {
      rt.event_destroy(event);
      throw;
    }
    rt.event_destroy(event);
    return Status::ok();
  } catch (const Error& e) {
    return Status::failed(fmt::format("recv: copying the message into GPU memory failed: {}", e.what()));
  }
}

}  // namespace

bool RdmaEndpointImpl::post_control(uint32_t type, uint32_t status, uint64_t seq, uint64_t length, uint64_t addr,
                                    uint32_t rkey, uint32_t reason, const void* payload, size_t payload_len,
                                    std::vector<Done>& done) {
  Lane& lane = lanes_[0];
  if (lane.failed) return false;
  if (free_slots_.empty()) {
    // Only a peer that ignores its credit gets here.
    fail_lane(lane, 0, Status::protocol_error("the peer sent more messages than its credit allows"), done);
    return false;
  }
  const int32_t slot = free_slots_.back();
  free_slots_.pop_back();
  uint8_t* buf = send_pool_.data() + size_t(slot) * kEagerBuffer;
  const MsgHeader h{type, static_cast<int32_t>(status), seq, length, addr, rkey, reason};
  std::memcpy(buf, &h, sizeof h);
  if (payload_len > 0) std::memcpy(buf + sizeof h, payload, payload_len);
  QueuedWr q;
  q.op_id = 0;  // control: no op ends with this WR
  q.opcode = WrOpcode::kSend;
  q.local_addr = reinterpret_cast<uint64_t>(buf);
  q.length = static_cast<uint32_t>(sizeof h + payload_len);
  q.lkey = send_mr_->lkey();
  q.last_of_op = true;
  q.slot = slot;
  lane.waiting.push_back(q);
  pump(lane, 0, done);
  return true;
}

Future RdmaEndpointImpl::submit_send(const OpRequest& request, std::shared_ptr<OpState> state,
                                     std::unique_lock<std::mutex>& lock) {
  Future future(state);
  const uint64_t op_id = next_op_id_++;
  state->set_canceller(canceller_, op_id);
  Op op;
  op.state = std::move(state);
  op.wrs_left = 1;  // the receiver's DONE
  op.nbytes = 0;
  const auto deadline = start_deadline(request, op);
  ops_.insert(op_id, std::move(op), deadline);
  pending_sends_.push_back({op_id, request.chunk, request.notification});
  std::vector<Done> done;
  start_pending_sends(done);
  lock.unlock();
  wake_for_deadline(deadline);
  complete_all(done);
  return future;
}

void RdmaEndpointImpl::start_pending_sends(std::vector<Done>& done) {
  while (!pending_sends_.empty() && awaiting_done_.size() < credit_ && !lanes_[0].failed) {
    const PendingSend ps = pending_sends_.front();
    pending_sends_.pop_front();
    Op* op = ops_.find(ps.op_id);
    if (op == nullptr) continue;  // its deadline passed while it waited
    const uint64_t seq = next_msg_seq_++;
    const uint64_t addr = ps.chunk.addr + ps.chunk.offset;
    const uint64_t len = ps.chunk.length;
    if (ps.notification) {
      // A SEND on lane 0, posted after the writes before it completed (the core's fence):
      // the peer receives it once their bytes are in place. Its bytes travel in the slot.
      const std::string& bytes = *ps.notification;
      if (!post_control(kNotify, 0, seq, bytes.size(), 0, 0, kReasonNone, bytes.data(), bytes.size(), done)) break;
    } else if (len <= kEagerPayload && !device_buffer(addr, len)) {
      // GPU memory always goes by rendezvous: the peer's NIC reads it, no CPU copies it.
      if (!post_control(kEager, 0, seq, len, 0, 0, kReasonNone, reinterpret_cast<const void*>(addr), len, done)) break;
    } else {
      // Rendezvous: the peer reads the bytes; they must stay registered until its DONE.
      std::unique_ptr<MemoryRegion> temp;
      // Remote read needs no local write (verbs requires it only with remote write), and
      // local write would refuse a read-only buffer (EFAULT on a NIC: review F8).
      auto key = lkey_for(addr, len, temp, kRemoteRead, op->uses);
      if (!key) {
        finish_wr(ps.op_id, 0, Status::invalid_argument(fmt::format("send: cannot register the {}-byte buffer", len)),
                  done);
        continue;
      }
      uint32_t rkey = 0;
      if (temp) {
        rkey = temp->rkey();
        op->temp_mr = std::move(temp);
      } else {
        auto match = regions->find_containing(addr, len);
        const auto region = match ? regions->get(match->handle) : std::nullopt;
        const nlohmann::json entry = region ? domain_->describe(match->handle, *region) : nlohmann::json();
        if (!entry.contains("rkey")) {
          finish_wr(ps.op_id, 0, Status::failed("send: the buffer's region was unregistered"), done);
          continue;
        }
        rkey = entry["rkey"].get<uint32_t>();
      }
      op->lanes = 1;  // the peer may read the buffer: a deadline must stop lane 0 first
      if (!post_control(kRts, 0, seq, len, addr, rkey, kReasonNone, nullptr, 0, done)) break;
    }
    awaiting_done_.emplace(seq, ps.op_id);
    if (Op* o = ops_.find(ps.op_id)) {
      o->msg_seq = seq;
      o->nbytes = 0;
    }
  }
}

Future RdmaEndpointImpl::submit_recv(const OpRequest& request, std::shared_ptr<OpState> state,
                                     std::unique_lock<std::mutex>& lock) {
  Future future(state);
  const Chunk& chunk = request.chunk;
  const uint64_t addr = chunk.addr + chunk.offset;
  const MessageWait wait = start_wait(request);
  state->set_canceller(canceller_, 0);  // found by its state (cancel_op)
  recvs_.push_back({std::move(state), addr, chunk.length, request.exact_size, device_buffer(addr, chunk.length), wait});
  std::vector<Done> done;
  match(done);
  lock.unlock();
  complete_all(done);
  wake_for_deadline(wait.deadline);
  return future;
}

void RdmaEndpointImpl::on_message(const uint8_t* buf, uint32_t len, std::vector<Done>& done) {
  MsgHeader h;
  if (len < sizeof h) {
    fail_lane(lanes_[0], 0, Status::protocol_error(fmt::format("a {}-byte message from the peer", len)), done);
    return;
  }
  std::memcpy(&h, buf, sizeof h);
  switch (h.type) {
    case kEager:
    case kRts: {
      if (h.type == kEager && h.length != len - sizeof h) {
        fail_lane(lanes_[0], 0, Status::protocol_error("an eager message whose length is not its payload's"), done);
        return;
      }
      // An honest sender has at most credit_ messages we have not answered; those waiting
      // for a recv are among them. Before connect() our credit is our own, never less.
      if (unexpected_.size() >= credit_) {
        fail_lane(lanes_[0], 0,
                  Status::protocol_error(fmt::format("the peer sent more unmatched messages than the credit ({}) "
                                                     "allows",
                                                     credit_)),
                  done);
        return;
      }
      Unexpected m{h.type, h.seq, h.length, h.addr, h.rkey, {}};
      if (h.type == kEager) m.payload.assign(buf + sizeof h, buf + len);
      unexpected_.push_back(std::move(m));
      match(done);
      return;
    }
    case kNotify: {
      const uint64_t payload = len - sizeof h;
      if (h.length != payload || payload > OpRequest::kMaxNotificationBytes) {
        fail_lane(lanes_[0], 0,
                  Status::protocol_error(fmt::format("a notification of {} bytes ({} in the header; at most {})",
                                                     payload, h.length, OpRequest::kMaxNotificationBytes)),
                  done);
        return;
      }
      NotificationInbox::EndedList ended;
      const Status st = notes_.deliver(std::string(reinterpret_cast<const char*>(buf) + sizeof h, payload), ended);
      take_ended(ended, done);
      const std::string& why = st.message();
      post_control(kDone, st ? 0 : static_cast<uint32_t>(st.code()), h.seq, payload, 0, 0,
                   st ? kReasonNone : kReasonNotifyRefused, why.data(), std::min<size_t>(why.size(), 1024), done);
      return;
    }
    case kDone: {
      auto it = awaiting_done_.find(h.seq);
      if (it == awaiting_done_.end()) return;  // its send already ended (deadline)
      const uint64_t op_id = it->second;
      awaiting_done_.erase(it);
      const Status st = done_status(h, std::string_view(reinterpret_cast<const char*>(buf) + sizeof h, len - sizeof h));
      if (Op* op = ops_.find(op_id); op && st.is_ok()) op->nbytes = h.length;
      finish_wr(op_id, 0, st, done);
      start_pending_sends(done);
      return;
    }
    case kRevoke:
      revoked_rkeys_.insert(h.rkey);
      owed_revokes_.push_back({h.seq, next_op_id_});
      check_revokes(done);
      return;
    case kRevoked:
      revokes_waiting_.erase(h.seq);
      revoke_cv_.notify_all();
      return;
    case kBye:
      peer_closed_ = true;
      for (size_t i = 0; i < lanes_.size(); ++i) {
        fail_lane(lanes_[i], i, Status::peer_closed("the peer shut its endpoint down"), done);
      }
      return;
    default:
      fail_lane(lanes_[0], 0, Status::protocol_error(fmt::format("a message of unknown type {}", h.type)), done);
  }
}

Future RdmaEndpointImpl::submit_recv_notify(const OpRequest& request, std::shared_ptr<OpState> state,
                                           std::unique_lock<std::mutex>& lock) {
  Future future(state);
  const MessageWait wait = start_wait(request);  // lowers wait_deadline_ for the inbox's deadline
  NotificationInbox::EndedList ended;
  state->set_canceller(canceller_, 0);  // found by its state (cancel_op)
  notes_.post(std::move(state), wait.limit, ended);
  lock.unlock();
  for (auto& e : ended) e.complete();
  wake_for_deadline(wait.deadline);
  return future;
}

void RdmaEndpointImpl::take_ended(NotificationInbox::EndedList& ended, std::vector<Done>& done) {
  for (auto& e : ended) done.push_back({std::move(e.state), std::move(e.status), 0});
  ended.clear();
}

void RdmaEndpointImpl::match(std::vector<Done>& done) {
  while (!recvs_.empty() && !unexpected_.empty()) {
    PostedRecv r = std::move(recvs_.front());
    recvs_.pop_front();
    Unexpected m = std::move(unexpected_.front());
    unexpected_.pop_front();
    deliver(std::move(r), std::move(m), done);
  }
}

void RdmaEndpointImpl::deliver(PostedRecv r, Unexpected m, std::vector<Done>& done) {
  if (m.length > r.length) {
    done.push_back({std::move(r.state),
                    Status(StatusCode::kMessageTooLarge,
                           fmt::format("a {}-byte message arrived for a {}-byte recv buffer", m.length, r.length)),
                    0});
    post_control(kDone, static_cast<uint32_t>(StatusCode::kMessageTooLarge), m.seq, m.length, r.length, 0,
                 kReasonTooLarge, nullptr, 0, done);
    return;
  }
  if (r.exact_size && m.length != r.length) {
    // Refused before a byte is copied or read; the sender's send fails the same way.
    done.push_back({std::move(r.state), exact_size_mismatch(m.length, r.length), 0});
    post_control(kDone, static_cast<uint32_t>(StatusCode::kFailed), m.seq, m.length, r.length, 0, kReasonExactSize,
                 nullptr, 0, done);
    return;
  }
  if (m.type == kEager) {
    Status copied = Status::ok();
    if (m.length > 0 && r.device) {
      copied = copy_into_device(r.addr, m.payload.data(), m.length);
    } else if (m.length > 0) {
      std::memcpy(reinterpret_cast<void*>(r.addr), m.payload.data(), m.length);
    }
    done.push_back({std::move(r.state), copied, copied ? m.length : 0});
    post_control(kDone, copied ? 0 : static_cast<uint32_t>(StatusCode::kFailed), m.seq, m.length, 0, 0,
                 copied ? kReasonNone : kReasonRecvBuffer, nullptr, 0, done);
    return;
  }
  // Rendezvous: READ the sender's buffer into the recv's, then answer DONE.
  Op op;
  op.state = std::move(r.state);
  op.is_recv = true;
  op.msg_seq = m.seq;
  auto key = lkey_for(r.addr, m.length, op.temp_mr, kLocalWrite, op.uses);
  if (!key) {
    done.push_back({std::move(op.state), Status::invalid_argument("recv: cannot register the buffer"), 0});
    post_control(kDone, static_cast<uint32_t>(StatusCode::kFailed), m.seq, m.length, 0, 0, kReasonRecvBuffer, nullptr,
                 0, done);
    return;
  }
  const uint64_t op_id = next_op_id_++;
  op.wrs_left = 0;
  op.lanes = 1;
  uint64_t pieces = 0;
  for (uint64_t off = 0; off < m.length; off += options.chunk_size) {
    const uint64_t n = std::min<uint64_t>(options.chunk_size, m.length - off);
    QueuedWr q;
    q.op_id = op_id;
    q.opcode = WrOpcode::kRdmaRead;
    q.local_addr = r.addr + off;
    q.length = static_cast<uint32_t>(n);
    q.lkey = *key;
    q.remote_addr = m.addr + off;
    q.rkey = m.rkey;
    q.last_of_op = off + n >= m.length;
    lanes_[0].waiting.push_back(q);
    ++pieces;
  }
  op.wrs_left = pieces;
  ops_.insert(op_id, std::move(op));  // no deadline: a recv waits as long as its message takes
  pump(lanes_[0], 0, done);
}

void RdmaEndpointImpl::on_recv_op_finished(Op& op, const Status& status, std::vector<Done>& done) {
  post_control(kDone, status ? 0 : static_cast<uint32_t>(StatusCode::kFailed), op.msg_seq, op.nbytes, 0, 0,
               status ? kReasonNone : kReasonRecvRead, nullptr, 0, done);
}

void RdmaEndpointImpl::fail_messages(const Status& cause, std::vector<Done>& done) {
  const Status recv_status = closed_ ? Status::cancelled("RDMAEndpoint was shut down")
                             : cause.code() == StatusCode::kPeerClosed
                                 ? cause
                                 : Status::peer_closed(fmt::format("the connection failed: {}", cause.message()));
  for (auto& r : recvs_) done.push_back({std::move(r.state), recv_status, 0});
  recvs_.clear();
  for (auto& w : imm_waiters_) done.push_back({std::move(w.state), recv_status, 0});  // review F3
  imm_waiters_.clear();
  // Held notifications were answered: they stay to be received, unless shut down.
  NotificationInbox::EndedList ended;
  notes_.gone(recv_status, closed_, ended);
  take_ended(ended, done);
  unexpected_.clear();
  const Status send_status = closed_ ? Status::cancelled("RDMAEndpoint was shut down") : cause;
  for (const auto& [seq, op_id] : awaiting_done_) finish_wr(op_id, 0, send_status, done);
  awaiting_done_.clear();
  while (!pending_sends_.empty()) {
    const uint64_t op_id = pending_sends_.front().op_id;
    pending_sends_.pop_front();
    finish_wr(op_id, 0, send_status, done);
  }
}

void RdmaEndpointImpl::revoke_remote_access(uint32_t rkey) {
  std::vector<Done> done;
  std::unique_lock lock(mu_);
  // From a completion callback nobody could process the answer: deregister at once (an op
  // of the peer's still in flight then fails with REM_ACCESS_ERR, as without this).
  if (!connected_ || closed_ || lanes_[0].failed || on_own_thread()) return;
  const uint64_t seq = next_revoke_seq_++;
  revokes_waiting_.insert(seq);
  if (post_control(kRevoke, 0, seq, 0, 0, rkey, kReasonNone, nullptr, 0, done)) {
    lock.unlock();
    complete_all(done);
    lock.lock();
    // Bounded: a live peer answers as soon as its earlier ops end.
    revoke_cv_.wait_for(lock, std::chrono::seconds(5),
                        [&] { return revokes_waiting_.count(seq) == 0 || lanes_[0].failed || closed_; });
  }
  revokes_waiting_.erase(seq);
  lock.unlock();
  complete_all(done);
}

void RdmaEndpointImpl::check_revokes(std::vector<Done>& done) {
  if (owed_revokes_.empty() || checking_revokes_) return;
  checking_revokes_ = true;
  uint64_t oldest = UINT64_MAX;  // the oldest one-sided op still running
  ops_.for_each([&](uint64_t id, const Op& op) {
    if (op.one_sided) oldest = std::min(oldest, id);
  });
  std::vector<uint64_t> answer;
  std::erase_if(owed_revokes_, [&](const OwedRevoke& r) {
    if (oldest < r.watermark) return false;
    answer.push_back(r.seq);
    return true;
  });
  for (uint64_t seq : answer) post_control(kRevoked, 0, seq, 0, 0, 0, kReasonNone, nullptr, 0, done);
  checking_revokes_ = false;
}

void RdmaEndpointImpl::say_bye() {
  if (on_own_thread()) return;  // only this thread could see the BYE acknowledged
  std::vector<Done> done;
  std::unique_lock lock(mu_);
  if (!connected_ || lanes_[0].failed || peer_closed_) return;
  const uint64_t bye_seq = lanes_[0].next_seq + lanes_[0].waiting.size();
  if (!post_control(kBye, 0, 0, 0, 0, 0, kReasonNone, nullptr, 0, done)) return;
  lock.unlock();
  complete_all(done);
  // Bounded: the BYE is acknowledged within microseconds by a live peer; a dead one is
  // about to be cut off anyway. Its completion is seen by the completion thread, which
  // notifies progress_cv_ after each turn.
  lock.lock();
  progress_cv_.wait_for(lock, std::chrono::milliseconds(500), [&] {
    const Lane& lane = lanes_[0];
    return lane.failed || (lane.waiting.empty() && (lane.posted.empty() || lane.posted.front().seq > bye_seq));
  });
}

}  // namespace dlslime
