#include "tcp/tcp_message_matcher.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>

#include <fmt/format.h>

#include "core/memory_registry.h"
#include "core/same_host.h"
#include "core/buffer_lease.h"
#include "tcp/same_host_path.h"
#include "tcp/tcp_pairing.h"
#include "tcp/tcp_target_server.h"
#include "tcp/wire.h"

namespace dlslime {

using tcp::FrameHeader;
using tcp::PayloadSink;
using tcp::RxAction;
using tcp::TcpConnection;

MessageMatcher::MessageMatcher(const TcpOptions& options, const Pairing& pairing, tcp::GpuPath& gpu)
    : options_(options),
      pairing_(pairing),
      gpu_(gpu),
      notes_(options.unexpected_buffer_bytes, "TcpOptions::unexpected_buffer_bytes") {}

namespace {
void complete_all(NotificationInbox::EndedList& ended) {
  for (auto& e : ended) e.complete();
}
}  // namespace

void MessageMatcher::on_notification(TcpConnection& conn, const FrameHeader& h, std::string_view bytes) {
  NotificationInbox::EndedList ended;
  const Status st = notes_.deliver(std::string(bytes), ended);
  TargetServer::ack(conn, tcp::FrameType::kNotifyAck, h.op_id, st);
  complete_all(ended);
}

MessageMatcher::Clock::time_point MessageMatcher::post_notify(std::shared_ptr<OpState> state, const OpLimit& limit) {
  NotificationInbox::EndedList ended;
  const auto deadline = notes_.post(std::move(state), limit, ended);
  complete_all(ended);
  return deadline;
}

void MessageMatcher::paired(bool new_peer) {
  if (new_peer) {
    unexpected_.clear();
    unexpected_bytes_ = 0;
  }
  notes_.connected(/*drop_held=*/new_peer);
}

void MessageMatcher::abandon_current() {
  // The sender gave up on the message half-way (its send timed out) and started another.
  auto old = std::move(current_msg_);
  if (old->matched) {
    end_recv(*old, Status::failed(fmt::format("the sender abandoned the message after {} bytes", old->received)));
  } else {
    forget_held(*old);
    unexpected_.erase(std::remove(unexpected_.begin(), unexpected_.end(), old), unexpected_.end());
  }
}

RxAction MessageMatcher::on_header(TcpConnection& conn, const FrameHeader& h, PayloadSink& sink) {
  if (current_msg_ && current_msg_->op_id != h.op_id) abandon_current();
  if (!current_msg_) {
    // A posted recv takes it unless held messages (pulled ones still being copied) are
    // ahead of it: they take the recvs first.
    const bool matchable = !recvs_.empty() && unexpected_.empty();
    if (h.offset != 0) {
      conn.close(Status::protocol_error(fmt::format("message frame at offset {} without its start", h.offset)));
      return RxAction::kContinue;
    }
    // A held message costs its bytes plus kHeldMessageOverhead, so that empty or tiny
    // messages are bounded by unexpected_buffer_bytes too (their count at most
    // unexpected_buffer_bytes / kHeldMessageOverhead).
    if (!matchable && unexpected_bytes_ + kHeldMessageOverhead + h.length > options_.unexpected_buffer_bytes) {
      paused_conn_ = conn.shared_from_this();  // flow control: wait for a recv
      return RxAction::kPause;
    }
    auto msg = std::make_shared<InboundMessage>();
    msg->op_id = h.op_id;
    msg->conn = conn.shared_from_this();
    if (matchable) {
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
  // A recv posted while this held message was arriving: the rest goes straight in.
  match_held_front(current_msg_);
  if (m.matched) {
    if (!m.recv.state || m.too_large) return RxAction::kContinue;  // drain
    if (!range_within(m.recv.length, h.offset, h.length)) {
      m.too_large = true;  // nothing is written past the posted buffer
      return RxAction::kContinue;
    }
    if (m.recv.device && h.length > 0) {
      // GPU memory: the frame lands in a staging slot, copied to the device at its end
      // (on_frame). No slot free: read on once one is (on_header is asked again).
      tcp::GpuStaging::Slot* slot = nullptr;
      Status error;
      const RxAction a = gpu_.staging()->stage_frame(conn, h.length, "a message", &slot, &error);
      if (a == RxAction::kPause) return a;
      if (!slot) {  // no staging: the recv fails alone, the frame is drained
        if (m.copy_error.is_ok()) m.copy_error = std::move(error);
        return RxAction::kContinue;
      }
      sink.place(slot->data, h.length);  // not the recv's memory: nothing to release()
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

void MessageMatcher::on_frame(TcpConnection& conn, const FrameHeader& h) {
  auto msg = current_msg_;
  // Only a GPU recv's frames have a slot (on_header): host messages pay no lookup.
  tcp::GpuStaging* staging = msg && msg->recv.device ? gpu_.staging() : nullptr;
  if (tcp::GpuStaging::Slot* slot = staging ? staging->take_frame_slot(&conn) : nullptr) {
    // The frame is in the slot: copied to its place unless the recv ended.
    if (msg->recv.state && !msg->too_large) {
      try {
        staging->copy(tcp::GpuStaging::kIn, msg->recv.addr + h.offset, slot->data, h.length);
        track_copy(msg, slot);
      } catch (const std::exception& e) {
        staging->release(slot);
        if (msg->copy_error.is_ok()) {
          msg->copy_error = Status::failed(fmt::format("copying a message to the GPU failed: {}", e.what()));
        }
      }
    } else {
      staging->release(slot);
    }
  }
  if (!msg) return;
  msg->received = h.offset + h.length;
  if (!h.last()) return;
  current_msg_.reset();
  msg->complete = true;
  match_held_front(msg);
  if (msg->matched) {
    finish_message(*msg);
  } else {
    // Eager completion: the whole message is held here, so the sender's buffer is
    // free again (the seed contract: a send completes without a posted recv).
    TargetServer::ack(conn, tcp::FrameType::kSendAck, msg->op_id, Status::ok());
    msg->acked = true;
  }
}

bool MessageMatcher::withdraw_recv(uint64_t local_id) {
  const auto it =
      std::find_if(recvs_.begin(), recvs_.end(), [&](const PostedRecv& r) { return r.local_id == local_id; });
  if (it == recvs_.end()) return false;
  std::shared_ptr<OpState> state = std::move(it->state);
  recvs_.erase(it);
  return state->complete(OpState::cancelled_by_user());
}

bool MessageMatcher::withdraw_notify(const OpState& state) {
  NotificationInbox::EndedList ended;
  if (!notes_.withdraw(state, ended)) return false;
  return ended.front().state->complete(std::move(ended.front().status));
}

void MessageMatcher::match_held_front(const std::shared_ptr<InboundMessage>& msg) {
  // Only at a frame boundary of msg's connection (or once it is complete): attach().
  if (msg->matched || recvs_.empty() || unexpected_.empty() || unexpected_.front() != msg) return;
  take_held_front();
  PostedRecv recv = std::move(recvs_.front());
  recvs_.pop_front();
  attach(msg, std::move(recv));
}

void MessageMatcher::finish_message(InboundMessage& m) {
  if (m.copies > 0) {  // a GPU recv: once its bytes are on the device (copied())
    m.finish_due = true;
    return;
  }
  Status st = Status::ok();
  if (!m.copy_error.is_ok()) {
    st = m.copy_error;
  } else if (m.too_large) {
    st = Status(StatusCode::kMessageTooLarge,
                fmt::format("a message of {} bytes does not fit the posted receive buffer of {} bytes", m.received,
                            m.recv.length));
  } else if (!m.recv.state) {
    st = Status::timeout("the receiver's recv timed out before the message arrived");
  } else if (m.recv.exact_size && m.received != m.recv.length) {
    // Known only now (a frame does not carry the message's length): its bytes may be in
    // the buffer already, but the recv fails and the sender learns it was refused.
    st = exact_size_mismatch(m.received, m.recv.length);
  }
  if (m.recv.state) m.recv.state->complete(st, st.is_ok() ? m.received : 0);
  m.recv.state.reset();
  if (m.acked) return;
  m.acked = true;
  if (auto conn = m.conn.lock()) {
    TargetServer::ack(*conn, m.pulled ? tcp::FrameType::kSendCopied : tcp::FrameType::kSendAck, m.op_id, st);
  }
}

void MessageMatcher::forget_held(const InboundMessage& msg) {
  unexpected_bytes_ -= msg.buffered.size() + kHeldMessageOverhead;
}

std::shared_ptr<MessageMatcher::InboundMessage> MessageMatcher::take_held_front() {
  auto msg = std::move(unexpected_.front());
  unexpected_.pop_front();
  forget_held(*msg);
  return msg;
}

void MessageMatcher::resume_paused() {
  if (auto conn = paused_conn_.lock()) conn->resume_reading();
  paused_conn_.reset();
}

void MessageMatcher::attach(const std::shared_ptr<InboundMessage>& msg, PostedRecv recv) {
  // Only at a frame boundary of m's connection (or once m is complete): no payload of m
  // is in flight into `buffered` then, and it holds exactly m.received bytes.
  InboundMessage& m = *msg;
  m.matched = true;
  m.recv = std::move(recv);
  if (m.received > m.recv.length) {
    m.too_large = true;
  } else if (m.received > 0 && m.recv.device) {
    // Held bytes into GPU memory: copied by the runtime, the buffer kept until then.
    tcp::GpuStaging& staging = *gpu_.staging();
    auto held = std::make_shared<std::vector<uint8_t>>(std::move(m.buffered));
    try {
      staging.copy(tcp::GpuStaging::kIn, m.recv.addr, held->data(), m.received);
      track_copy(msg, nullptr, std::move(held));
    } catch (const std::exception& e) {
      m.copy_error = Status::failed(fmt::format("copying a held message to the GPU failed: {}", e.what()));
    }
  } else if (m.received > 0) {
    std::memcpy(m.recv.addr, m.buffered.data(), m.received);
  }
  std::vector<uint8_t>().swap(m.buffered);
}

void MessageMatcher::track_copy(const std::shared_ptr<InboundMessage>& msg, tcp::GpuStaging::Slot* slot,
                                std::shared_ptr<void> keep) {
  tcp::GpuStaging& staging = *gpu_.staging();
  auto done = [this, msg, slot, keep = std::move(keep)](Status st) {
    if (slot) gpu_.staging()->release(slot);
    copied(msg, st);
  };
  if (slot) {
    staging.when_copied(slot, std::move(done));
  } else {
    staging.when_copied(tcp::GpuStaging::kIn, std::move(done));
  }
  // Counted once the wait is queued (a throw above counts nothing); `done` runs later, on
  // this thread.
  if (++msg->copies == 1) copying_.push_back(msg);
}

void MessageMatcher::copied(const std::shared_ptr<InboundMessage>& msg, const Status& st) {
  InboundMessage& m = *msg;
  if (m.copies == 0) return;  // dropped with the peer (drop_all)
  if (!st && m.copy_error.is_ok()) m.copy_error = st;
  if (--m.copies > 0) return;
  std::erase(copying_, msg);
  if (m.ended) {
    std::shared_ptr<OpState> state = std::move(m.ended);
    state->complete(std::move(m.ended_status));
  }
  if (m.finish_due) {
    m.finish_due = false;
    finish_message(m);
  }
}

void MessageMatcher::end_recv(InboundMessage& m, Status why) {
  std::shared_ptr<OpState> state = std::move(m.recv.state);
  if (!state) return;
  if (m.copies > 0 || m.pulling > 0) {  // its memory is still being written: completes after
    m.ended = std::move(state);
    m.ended_status = std::move(why);
    return;
  }
  state->complete(std::move(why));
}

MessageMatcher::Clock::time_point MessageMatcher::post_recv(PostedRecv recv, Clock::time_point deadline) {
  if (!unexpected_.empty() && unexpected_.front()->complete) {
    auto msg = take_held_front();
    attach(msg, std::move(recv));
    finish_message(*msg);
    resume_paused();
    return Clock::time_point::max();
  }
  if (unexpected_.empty() && !pairing_.has_connections() && !pairing_.last_loss().empty()) {
    // The peer is gone and nothing will ever arrive; a recv posted before any peer
    // connected, by contrast, waits for one.
    recv.state->complete(
        Status::peer_closed(fmt::format("the connection to the peer was lost: {}", pairing_.last_loss())));
    return Clock::time_point::max();
  }
  // Either nothing is here yet, or the oldest held message is still arriving: it takes
  // this recv at its next frame boundary (on_header) or when it completes. A pulled one
  // whose bytes still wait in the sender takes it now (match_held).
  recv.deadline = deadline;
  recvs_.push_back(std::move(recv));
  match_held();
  return deadline;
}

void MessageMatcher::expire(Clock::time_point now) {
  const auto timeout = [](const PostedRecv& r) {
    return Status::timeout(fmt::format("recv: no message arrived within {}", r.limit.describe()));
  };
  // Taken out first, completed after: a continuation may post another recv.
  std::vector<std::pair<std::shared_ptr<OpState>, Status>> expired;
  for (auto it = recvs_.begin(); it != recvs_.end();) {
    if (it->deadline > now) {
      ++it;
      continue;
    }
    expired.emplace_back(std::move(it->state), timeout(*it));
    it = recvs_.erase(it);
  }
  for (auto& [state, why] : expired) state->complete(std::move(why));
  NotificationInbox::EndedList ended;
  notes_.expire(now, ended);
  complete_all(ended);
  for (const auto& msg : pulling_) {  // being copied into: completes once the copies end
    if (msg->matched && msg->recv.state && msg->recv.deadline <= now) end_recv(*msg, timeout(msg->recv));
  }
  if (auto msg = current_msg_; msg && msg->matched && msg->recv.state && msg->recv.deadline <= now) {
    auto conn = msg->conn.lock();
    end_recv(*msg, timeout(msg->recv));
    // Bytes still streaming into the buffer: only closing the connection stops them (a
    // GPU recv's stream into a staging slot, and no copy follows once it ended).
    if (conn && !msg->recv.device && !conn->release(msg->recv.local_id)) {
      conn->close(Status::peer_closed("a recv timed out while its message was arriving"));
    }
  }
}

MessageMatcher::Clock::time_point MessageMatcher::next_deadline() const {
  Clock::time_point next = notes_.next_deadline();
  for (const PostedRecv& r : recvs_) next = std::min(next, r.deadline);
  if (current_msg_ && current_msg_->matched && current_msg_->recv.state) {
    next = std::min(next, current_msg_->recv.deadline);
  }
  for (const auto& msg : pulling_) {
    if (msg->matched && msg->recv.state) next = std::min(next, msg->recv.deadline);
  }
  return next;
}

MessageMatcher::Dropped MessageMatcher::drop_all(bool shutting_down) {
  Dropped dropped;
  dropped.recvs = std::move(recvs_);
  recvs_.clear();
  if (auto current = std::move(current_msg_); current && current->matched && current->copies == 0) {
    dropped.arriving = std::move(current->recv.state);
  }
  current_msg_.reset();
  // GPU recvs whose copies were pending: the Initiator drained the staging before this
  // (fail_all), so their memory is no longer written; their copies' callbacks do nothing.
  for (auto& m : copying_) {
    m->copies = 0;
    m->finish_due = false;
    if (m->recv.state) dropped.copying.emplace_back(std::move(m->recv.state), Status::ok());
    if (m->ended) dropped.copying.emplace_back(std::move(m->ended), std::move(m->ended_status));
  }
  copying_.clear();
  // Pulled messages being copied: our workers may be writing a recv's memory, which the
  // recv's failure gives back to the user, so they finish first (bounded: a chunk each).
  // Their late reports find them dropped (pulling == 0).
  for (auto& m : pulling_) {
    for (uint32_t n = m->writing->load(std::memory_order_acquire); n != 0;
         n = m->writing->load(std::memory_order_acquire)) {
      m->writing->wait(n, std::memory_order_acquire);
    }
    m->pulling = 0;
    if (m->recv.state) dropped.copying.emplace_back(std::move(m->recv.state), Status::ok());
    if (m->ended) dropped.copying.emplace_back(std::move(m->ended), std::move(m->ended_status));
  }
  pulling_.clear();
  // Messages that arrived whole were acknowledged to the sender: they stay deliverable
  // to later recvs even though the peer is gone (but not past shutdown()).
  std::erase_if(unexpected_, [&](const auto& m) { return shutting_down || !m->complete; });
  unexpected_bytes_ = 0;
  for (const auto& m : unexpected_) unexpected_bytes_ += m->buffered.size() + kHeldMessageOverhead;
  paused_conn_.reset();
  // Notifications that arrived were acknowledged: they stay to be received, as messages.
  notes_.gone(Status::peer_closed("the connection to the peer was lost"), shutting_down, dropped.notify_waits);
  return dropped;
}

RxAction MessageMatcher::admit_pulled(TcpConnection& conn) {
  // Messages are sent one at a time on this lane: one whose frames were arriving was
  // abandoned by the sender (and frees its share of the budget now).
  if (current_msg_) abandon_current();
  const bool matchable = !recvs_.empty() && unexpected_.empty();
  if (!matchable && unexpected_bytes_ + kHeldMessageOverhead > options_.unexpected_buffer_bytes) {
    paused_conn_ = conn.shared_from_this();  // flow control: wait for a recv (match_held resumes it)
    return RxAction::kPause;
  }
  return RxAction::kContinue;
}

void MessageMatcher::on_pulled(TcpConnection& conn, const FrameHeader& h, std::string_view payload, uint32_t pid) {
  tcp::WireReader r(reinterpret_cast<const uint8_t*>(payload.data()));  // the parser checked its size
  auto msg = std::make_shared<InboundMessage>();
  msg->op_id = h.op_id;
  msg->conn = conn.shared_from_this();
  msg->pulled = true;
  msg->pid = pid;
  msg->length = h.offset;
  msg->source = r.u64();
  msg->lease_address = r.u64();
  msg->lease_value = r.u64();
  if (msg->length > 0 && (msg->source == 0 || msg->length > std::numeric_limits<uint64_t>::max() - msg->source)) {
    return TargetServer::ack(conn, tcp::FrameType::kSendCopied, h.op_id,
                             Status::invalid_argument(fmt::format("a message of {} bytes at {:#x} is not a range",
                                                                  msg->length, msg->source)));
  }
  if (!recvs_.empty() && unexpected_.empty()) {
    msg->matched = true;
    msg->recv = std::move(recvs_.front());
    recvs_.pop_front();
    return start_pull(msg);
  }
  // Held (admit_pulled made room for its overhead): its bytes are copied now only if the
  // budget has room for them too; otherwise they wait in the sender (whose send waits as
  // well) until a recv takes the message.
  unexpected_.push_back(msg);
  unexpected_bytes_ += kHeldMessageOverhead;
  if (unexpected_bytes_ <= options_.unexpected_buffer_bytes &&
      msg->length <= options_.unexpected_buffer_bytes - unexpected_bytes_) {  // no overflow: length is the peer's
    msg->buffered.resize(msg->length);
    unexpected_bytes_ += msg->length;
    start_pull(msg);
  }
}

void MessageMatcher::start_pull(const std::shared_ptr<InboundMessage>& msg) {
  InboundMessage& m = *msg;
  m.writing = std::make_shared<std::atomic<uint32_t>>(0);
  if (m.matched) {
    // Known before any byte moves, unlike a frame message's length.
    if (m.length > m.recv.length) {
      m.too_large = true;
    } else if (m.recv.exact_size && m.length != m.recv.length) {
      m.copy_error = exact_size_mismatch(m.length, m.recv.length);
    }
    if (m.too_large || !m.copy_error.is_ok()) {
      m.received = m.length;
      m.complete = true;
      return finish_message(m);
    }
  }
  pulling_.push_back(msg);
  pull_chunks(msg);
  if (m.pulling == 0) pull_finished(msg);  // nothing to copy
}

void MessageMatcher::pull_chunks(const std::shared_ptr<InboundMessage>& msg) {
  InboundMessage& m = *msg;
  if (!m.pull_error.is_ok() || (m.matched && !m.recv.state)) return;  // failed, or its recv ended
  const uint64_t chunk = options_.chunk_size;
  while (m.pulling < kPullChunksInFlight && m.next < m.length) {
    const uint64_t pos = m.next, n = std::min(chunk, m.length - pos);
    m.next += n;
    // GPU memory cannot be copied into from another process: each chunk lands in host
    // memory first and goes to the device through the staging (pull_reported).
    std::shared_ptr<std::vector<uint8_t>> bounce;
    uint8_t* dest = nullptr;
    if (!m.matched) {
      dest = m.buffered.data() + pos;
    } else if (m.recv.device) {
      bounce = std::make_shared<std::vector<uint8_t>>(n);
      dest = bounce->data();
    } else {
      dest = m.recv.addr + pos;
    }
    ++m.pulling;
    m.writing->fetch_add(1, std::memory_order_acq_rel);
    pull_.workers->submit([this, msg, piece = CrossCopy{dest, m.source + pos, n}, pos, bounce, pid = m.pid,
                           writing = m.writing, post = pull_.post] {
      Status st = cross_copy(static_cast<int>(pid), {&piece, 1}, true);
      if (same_host_fault("slow_report")) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      writing->fetch_sub(1, std::memory_order_acq_rel);
      writing->notify_all();
      post([this, msg, pos, n = piece.length, bounce, st = std::move(st)] { pull_reported(msg, pos, n, bounce, st); });
    });
  }
}

void MessageMatcher::pull_reported(const std::shared_ptr<InboundMessage>& msg, uint64_t pos, uint64_t n,
                                   const std::shared_ptr<std::vector<uint8_t>>& bounce, const Status& st) {
  InboundMessage& m = *msg;
  if (m.pulling == 0) return;  // dropped with the peer (drop_all)
  --m.pulling;
  if (!st) {
    if (m.pull_error.is_ok()) m.pull_error = st;
  } else if (bounce && m.recv.state && m.copy_error.is_ok()) {
    tcp::GpuStaging& staging = *gpu_.staging();
    try {
      staging.copy(tcp::GpuStaging::kIn, m.recv.addr + pos, bounce->data(), n);
      track_copy(msg, nullptr, bounce);
    } catch (const std::exception& e) {
      m.copy_error = Status::failed(fmt::format("copying a message to the GPU failed: {}", e.what()));
    }
  }
  pull_chunks(msg);
  if (m.pulling == 0) pull_finished(msg);
}

void MessageMatcher::pull_finished(const std::shared_ptr<InboundMessage>& msg) {
  InboundMessage& m = *msg;
  std::erase(pulling_, msg);
  // The bytes are here (or a copy failed, or the recv ended and the rest was not copied).
  // They are the message only if the sender's buffer was still lent to us throughout: its
  // lease says so.
  Status pulled = m.pull_error;
  const bool whole = pulled.is_ok() && m.next == m.length;
  if (whole && m.length > 0) pulled = check_lease(static_cast<int>(m.pid), m.lease_address, m.lease_value);
  if (whole && pulled.is_ok() && pull_.copied_bytes) pull_.copied_bytes->fetch_add(m.length, std::memory_order_relaxed);
  m.received = m.length;
  m.complete = true;
  if (!m.matched) {
    if (!pulled.is_ok()) {  // never deliverable
      forget_held(m);
      unexpected_.erase(std::remove(unexpected_.begin(), unexpected_.end(), msg), unexpected_.end());
    }
    m.acked = true;  // held whole: the sender's buffer is free again (as for a frame message)
    if (auto conn = m.conn.lock()) TargetServer::ack(*conn, tcp::FrameType::kSendCopied, m.op_id, pulled);
    return match_held();
  }
  if (!pulled.is_ok() && m.copy_error.is_ok()) m.copy_error = pulled;
  if (m.ended) {
    // The recv ended (its deadline) while its memory was being written: it completes now.
    std::shared_ptr<OpState> state = std::move(m.ended);
    state->complete(std::move(m.ended_status));
  }
  finish_message(m);  // after the GPU copies still running, if any (finish_due)
}

void MessageMatcher::match_held() {
  while (!recvs_.empty() && !unexpected_.empty()) {
    InboundMessage& front = *unexpected_.front();
    if (front.complete) {
      auto msg = take_held_front();
      PostedRecv recv = std::move(recvs_.front());
      recvs_.pop_front();
      attach(msg, std::move(recv));
      finish_message(*msg);
    } else if (front.pulled && !front.writing) {
      // Its bytes wait in the sender: straight into the recv, unless the sender's send
      // ended meanwhile (its deadline), in which case it never arrives, as a frame message
      // dropped from the sender's queue, and the recv takes the next one.
      auto msg = take_held_front();
      if (Status lent = check_lease(static_cast<int>(msg->pid), msg->lease_address, msg->lease_value); !lent) {
        if (auto conn = msg->conn.lock()) TargetServer::ack(*conn, tcp::FrameType::kSendCopied, msg->op_id, lent);
        continue;
      }
      msg->matched = true;
      msg->recv = std::move(recvs_.front());
      recvs_.pop_front();
      start_pull(msg);
    } else {
      break;  // still arriving, or being copied
    }
  }
  resume_paused();
}

void MessageMatcher::Dropped::fail(const Status& why) {
  for (auto& r : recvs) r.state->complete(why);
  if (arriving) arriving->complete(why);
  for (auto& [state, own] : copying) state->complete(own.is_ok() ? why : own);
  for (auto& e : notify_waits) e.state->complete(why);
}

}  // namespace dlslime
