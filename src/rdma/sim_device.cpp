// The simulated RDMA device's engine (sim_device.h): it executes posted work requests on
// its own thread with the checks a real RC NIC makes, in the order a NIC would make them,
// and reports every failure the way verbs does: as a work completion, with the QP moved
// to the error state and its remaining work flushed.
#include "rdma/sim_device.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <optional>
#include <random>

#include <fmt/format.h>

#include "rdma/sim_link.h"

namespace dlslime::rdma::sim {

GidBytes device_gid() {
  const auto pid = static_cast<uint32_t>(::getpid());
  return GidBytes{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, static_cast<uint8_t>(pid >> 16),
                  static_cast<uint8_t>(pid >> 8), static_cast<uint8_t>(pid)};
}

pid_t gid_pid(const GidBytes& gid) {
  static const GidBytes prefix{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 0};
  if (!std::equal(gid.begin(), gid.begin() + 13, prefix.begin())) return 0;
  return static_cast<pid_t>((uint32_t{gid[13]} << 16) | (uint32_t{gid[14]} << 8) | gid[15]);
}

namespace {

// The IB RNR timer encoding (min_rnr_timer), in microseconds.
constexpr uint32_t kRnrTimerUs[32] = {655360, 10,    20,    30,    40,    60,     80,     120,
                                      160,    240,   320,   480,   640,   960,    1280,   1920,
                                      2560,   3840,  5120,  7680,  10240, 15360,  20480,  30720,
                                      40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};

std::chrono::nanoseconds rnr_delay(uint8_t min_rnr_timer) {
  return std::chrono::microseconds(kRnrTimerUs[min_rnr_timer & 31]);
}

// Local ACK timeout: 4.096 us * 2^timeout. 0 means "wait forever" on hardware; the
// simulated device then retries every 67 ms without ever giving up, which is the same.
std::chrono::nanoseconds ack_timeout(uint8_t timeout) {
  return std::chrono::nanoseconds(4096LL << (timeout == 0 ? 14 : std::min<int>(timeout, 31)));
}

bool in_range(const Mr& mr, uint64_t addr, uint64_t length) {
  return addr >= mr.addr && addr - mr.addr <= mr.length && length <= mr.length - (addr - mr.addr);
}

bool needs_recv(WrOpcode op) {
  return op == WrOpcode::kSend || op == WrOpcode::kSendWithImm || op == WrOpcode::kRdmaWriteWithImm;
}

WcOpcode send_wc_opcode(WrOpcode op) {
  switch (op) {
    case WrOpcode::kRdmaWrite:
    case WrOpcode::kRdmaWriteWithImm: return WcOpcode::kRdmaWrite;
    case WrOpcode::kRdmaRead: return WcOpcode::kRdmaRead;
    case WrOpcode::kSend:
    case WrOpcode::kSendWithImm: return WcOpcode::kSend;
  }
  return WcOpcode::kSend;
}

uint64_t sge_total(const std::vector<Sge>& sges) {
  uint64_t total = 0;
  for (const Sge& s : sges) total += s.length;
  return total;
}

// The process's fabric. Never destroyed: the last endpoint may let go of the fabric on a
// detached completion thread while the process exits, after static destructors have run
// (TSan saw ~Fabric notify a condition variable that exit had already destroyed).
struct FabricSlot {
  std::mutex mu;
  std::weak_ptr<Fabric> fabric;
  // Fabrics constructed and not yet fully destroyed. A new one waits for the old one's
  // destructor to finish: its socket name (the pid) is only free once that has closed it.
  int live = 0;
  std::condition_variable gone;
};
FabricSlot* g_slot = new FabricSlot;

// A fork() child has none of the parent fabric's threads (its engine, its link's), and its
// mutexes may have been held when the parent forked: the child starts from a fresh slot,
// so its first context makes a fabric of its own, with its own GID (the child's pid) and
// its own link socket. What the parent's fabric held is left alone (never destroyed here).
void register_fork_handler() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, [] { g_slot = new FabricSlot; }); });
}

FabricSlot& slot() {
  register_fork_handler();
  return *g_slot;
}

}  // namespace

std::shared_ptr<Fabric> Fabric::acquire() {
  FabricSlot& g = slot();
  std::unique_lock<std::mutex> lock(g.mu);
  if (std::shared_ptr<Fabric> fabric = g.fabric.lock()) return fabric;
  // The last user may have just let go of the previous fabric, whose destructor is still
  // running (its weak_ptr has expired already): wait for it to finish.
  g.gone.wait(lock, [&g] { return g.live == 0 || !g.fabric.expired(); });
  if (std::shared_ptr<Fabric> fabric = g.fabric.lock()) return fabric;
  auto fabric = std::make_shared<Fabric>();
  ++g.live;
  g.fabric = fabric;
  return fabric;
}

std::shared_ptr<Fabric> Fabric::current() {
  FabricSlot& g = slot();
  std::lock_guard<std::mutex> lock(g.mu);
  return g.fabric.lock();
}

Fabric::Fabric() : next_key_(static_cast<uint32_t>(std::random_device{}()) | 1u), gid_(device_gid()) {
  engine_ = std::thread([this] { run(); });
  try {
    link_ = std::make_unique<Link>(*this);
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop_ = true;
    }
    cv_.notify_all();
    engine_.join();
    throw;
  }
}

Fabric::~Fabric() {
  {
    std::lock_guard<std::mutex> lock(mu);
    stop_ = true;
  }
  cv_.notify_all();
  engine_.join();
  link_.reset();  // closes the socket (peers see a dead host) and frees its name
  FabricSlot& g = slot();
  std::lock_guard<std::mutex> lock(g.mu);
  --g.live;
  g.gone.notify_all();
}

uint32_t Fabric::new_pd() { return next_pd_++; }

DeviceMemorySupport device_memory_support() {
  const char* value = std::getenv("DLSLIME_RDMA_SIM_DEVICE_MEMORY");
  if (value == nullptr || *value == '\0') return {};
  DeviceMemorySupport out{false, false};
  const std::string text(value);
  if (text == "none") return out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string word = text.substr(at, comma - at);
    if (word == "dmabuf") {
      out.dmabuf = true;
    } else if (word == "peermem") {
      out.peermem = true;
    } else {
      throw InvalidArgumentError(fmt::format(
          "DLSLIME_RDMA_SIM_DEVICE_MEMORY='{}': expected dmabuf, peermem, both comma-separated, or none", text));
    }
    at = comma + 1;
  }
  return out;
}

Mr& Fabric::add_mr(uint64_t addr, size_t length, uint32_t access, uint32_t pd, uint8_t* nic,
                   std::shared_ptr<const void> keep) {
  // Keys are never reused, and an lkey is never valid as an rkey (or the reverse).
  uint32_t lkey = next_key_ == 0 ? ++next_key_ : next_key_;
  uint32_t rkey = lkey + 1 == 0 ? 1 : lkey + 1;
  next_key_ = rkey + 1;
  Mr& mr = mrs_[lkey];
  mr = Mr{addr, length, access, pd, lkey, rkey, nic, std::move(keep)};
  rkey_to_lkey_[rkey] = lkey;
  return mr;
}

void Fabric::remove_mr(uint32_t lkey) {
  auto it = mrs_.find(lkey);
  if (it == mrs_.end()) return;
  rkey_to_lkey_.erase(it->second.rkey);
  mrs_.erase(it);
}

const Mr* Fabric::find_key(uint32_t key, bool remote) const {
  if (remote) {
    auto r = rkey_to_lkey_.find(key);
    if (r == rkey_to_lkey_.end()) return nullptr;
    key = r->second;
  }
  auto it = mrs_.find(key);
  return it == mrs_.end() ? nullptr : &it->second;
}

std::shared_ptr<Qp> Fabric::add_qp(uint32_t pd, std::shared_ptr<Cq> send_cq, std::shared_ptr<Cq> recv_cq,
                                   const QpCaps& caps) {
  auto qp = std::make_shared<Qp>();
  qp->qpn = next_qpn_++ & 0xffffff;
  qp->pd = pd;
  qp->send_cq = std::move(send_cq);
  qp->recv_cq = std::move(recv_cq);
  qp->caps = caps;
  qps_[qp->qpn] = qp;
  return qp;
}

void Fabric::remove_qp(uint32_t qpn) { qps_.erase(qpn); }

Qp* Fabric::find_qp(uint32_t qpn) {
  auto it = qps_.find(qpn);
  return it == qps_.end() ? nullptr : it->second.get();
}

Qp& Fabric::require_qp(uint32_t qpn) {
  Qp* qp = find_qp(qpn);
  if (!qp) throw NotFoundError(fmt::format("sim_rdma0 has no QP {:#x}", qpn));
  return *qp;
}

int Fabric::modify(Qp& qp, QpState to, const RcInitAttr* init, const RcRtrAttr* rtr, const RcRtsAttr* rts) {
  switch (to) {
    case QpState::kInit:
      if (qp.state != QpState::kReset || init->port != kPort || init->pkey_index != 0) return EINVAL;
      if ((init->access & ~(kLocalWrite | kRemoteWrite | kRemoteRead)) != 0) return EINVAL;
      qp.init = *init;
      break;
    case QpState::kRtr:
      // RoCE needs a GRH (use_gid) and a path MTU the port can carry; the one GID is index 0.
      if (qp.state != QpState::kInit || !rtr->use_gid || rtr->sgid_index != 0) return EINVAL;
      if (static_cast<int>(rtr->path_mtu) < 1 || rtr->path_mtu > kActiveMtu) return EINVAL;
      if (rtr->remote_qpn > 0xffffff || rtr->rq_psn > 0xffffff || rtr->min_rnr_timer > 31) return EINVAL;
      qp.rtr = *rtr;
      qp.expected_psn = rtr->rq_psn;
      break;
    case QpState::kRts:
      if (qp.state != QpState::kRtr || rts->sq_psn > 0xffffff || rts->timeout > 31 || rts->retry_cnt > 7 ||
          rts->rnr_retry > 7) {
        return EINVAL;
      }
      qp.rts = *rts;
      qp.next_send_psn = rts->sq_psn;
      break;
    case QpState::kErr:
      qp.state = QpState::kErr;
      // The flush happens on the engine, like the NIC's, not in the caller's thread.
      schedule_progress(qp, Clock::now());
      return 0;
    case QpState::kReset:
      return EINVAL;
  }
  qp.state = to;
  return 0;
}

int Fabric::post_send(Qp& qp, const SendWr* wr, const SendWr** bad_wr) {
  if (bad_wr) *bad_wr = nullptr;
  int posted = 0;
  for (const SendWr* w = wr; w != nullptr; w = w->next) {
    int err = 0;
    uint64_t total = 0;
    for (int i = 0; i < w->num_sge && w->sg_list; ++i) total += w->sg_list[i].length;
    if (qp.state != QpState::kRts && qp.state != QpState::kErr) {
      err = EINVAL;  // a send queue accepts work only in RTS (and ERR, where it is flushed)
    } else if (w->num_sge < 0 || static_cast<uint32_t>(w->num_sge) > qp.caps.max_send_sge ||
               (w->num_sge > 0 && w->sg_list == nullptr)) {
      err = EINVAL;
    } else if (w->inline_data && (w->opcode == WrOpcode::kRdmaRead || total > qp.caps.max_inline_data)) {
      err = EINVAL;
    } else if (qp.sq_posted - qp.sq_freed >= qp.caps.max_send_wr) {
      err = ENOMEM;
    }
    if (err) {
      if (bad_wr) *bad_wr = w;
      if (posted) schedule_progress(qp, Clock::now());
      return err;
    }
    PostedSend ps;
    ps.wr = *w;
    ps.wr.next = nullptr;
    ps.wr.sg_list = nullptr;
    if (w->inline_data) {
      // Inline data is copied at post time; the buffer may be reused as soon as this returns.
      ps.inline_bytes.resize(total);
      size_t at = 0;
      for (int i = 0; i < w->num_sge; ++i) {
        std::memcpy(ps.inline_bytes.data() + at, reinterpret_cast<const void*>(w->sg_list[i].addr),
                    w->sg_list[i].length);
        at += w->sg_list[i].length;
      }
    } else {
      ps.sges.assign(w->sg_list, w->sg_list + w->num_sge);
    }
    ps.seq = qp.sq_posted++;
    qp.sq.push_back(std::move(ps));
    ++posted;
  }
  schedule_progress(qp, Clock::now());
  return 0;
}

int Fabric::post_recv(Qp& qp, const RecvWr* wr, const RecvWr** bad_wr) {
  if (bad_wr) *bad_wr = nullptr;
  for (const RecvWr* w = wr; w != nullptr; w = w->next) {
    int err = 0;
    if (qp.state == QpState::kReset) {
      err = EINVAL;
    } else if (w->num_sge < 0 || static_cast<uint32_t>(w->num_sge) > qp.caps.max_recv_sge ||
               (w->num_sge > 0 && w->sg_list == nullptr)) {
      err = EINVAL;
    } else if (qp.rq_posted - qp.rq_freed >= qp.caps.max_recv_wr) {
      err = ENOMEM;
    }
    if (err) {
      if (bad_wr) *bad_wr = w;
      return err;
    }
    PostedRecv pr;
    pr.wr_id = w->wr_id;
    pr.sges.assign(w->sg_list, w->sg_list + w->num_sge);
    pr.seq = qp.rq_posted++;
    qp.rq.push_back(std::move(pr));
  }
  if (qp.state == QpState::kErr) schedule_progress(qp, Clock::now());  // flushed there
  return 0;
}

int Fabric::poll(Cq& cq, int max, WorkCompletion* out) {
  if (cq.overrun) return -EOVERFLOW;
  if (max < 0 || (max > 0 && out == nullptr)) return -EINVAL;
  int n = 0;
  while (n < max && !cq.entries.empty()) {
    Cq::Entry& e = cq.entries.front();
    out[n++] = e.wc;
    if (Qp* qp = find_qp(e.qpn)) {
      uint64_t& freed = e.send_queue ? qp->sq_freed : qp->rq_freed;
      freed = std::max(freed, e.seq + 1);
    }
    cq.entries.pop_front();
  }
  return n;
}

void Fabric::schedule_progress(Qp& qp, Clock::time_point at) {
  events_.push(Event{at, next_order_++, qp.qpn, false, nullptr, {}});
  cv_.notify_one();
}

void Fabric::run() {
  std::unique_lock<std::mutex> lock(mu);
  while (!stop_) {
    if (events_.empty()) {
      cv_.wait(lock);
      continue;
    }
    Clock::time_point at = events_.top().at;
    if (Clock::now() < at) {
      cv_.wait_until(lock, at);
      continue;
    }
    Event ev = events_.top();
    events_.pop();
    if (ev.deliver) {
      if (Qp* qp = find_qp(ev.qpn)) --qp->delayed_in_flight;
      deliver(*ev.cq, ev.entry);
    } else if (Qp* qp = find_qp(ev.qpn)) {
      progress(*qp);
    }
  }
}

// Several progress events may be pending for one QP (one per post); each starts at most
// the head WR, so work stays in order, and a WR waiting for an RNR or ACK retry is only
// retried by the event scheduled for that time.
void Fabric::progress(Qp& qp) {
  const Clock::time_point now = Clock::now();
  if (qp.inflight_token != 0) {
    // The head WR awaits another process's answer. Each ACK timeout without one is a
    // retry (retransmissions that went unanswered too); after retry_cnt, RETRY_EXC_ERR.
    // A QP in ERR keeps waiting the same bound before it flushes the WR: the responder
    // may still be copying into its buffers until it answers.
    if (now < qp.inflight_deadline) return;
    PostedSend& ps = qp.sq.front();
    ++ps.retry_tries;
    if (qp.rts.timeout == 0 || ps.retry_tries <= qp.rts.retry_cnt) {
      qp.inflight_deadline = now + ack_timeout(qp.rts.timeout);
      schedule_progress(qp, qp.inflight_deadline);
      return;
    }
    qp.inflight_token = 0;
    if (qp.state == QpState::kErr) {
      flush(qp);
    } else {
      fail_head(qp, WcStatus::kRetryExcErr);
    }
    return;
  }
  if (qp.state == QpState::kErr) {
    flush(qp);
    return;
  }
  if (qp.state != QpState::kRts || qp.sq.empty()) return;
  if (now < qp.last_retry_at) return;
  execute(qp);
  if (qp.state == QpState::kRts && !qp.sq.empty() && qp.inflight_token == 0 && qp.last_retry_at <= now) {
    schedule_progress(qp, now);
  }
}

void Fabric::fail_head(Qp& qp, WcStatus status) {
  PostedSend ps = std::move(qp.sq.front());
  qp.sq.pop_front();
  WorkCompletion wc;
  wc.wr_id = ps.wr.wr_id;
  wc.opcode = send_wc_opcode(ps.wr.opcode);
  wc.qp_num = qp.qpn;
  wc.status = status;
  complete(qp, true, ps.seq, wc);
  to_error(qp);
}

void Fabric::execute(Qp& qp) {
  PostedSend& ps = qp.sq.front();
  const SendWr& wr = ps.wr;
  const bool is_read = wr.opcode == WrOpcode::kRdmaRead;

  // Requester: the local buffers must be registered in this QP's PD (a READ writes them).
  const uint64_t total = wr.inline_data ? ps.inline_bytes.size() : sge_total(ps.sges);
  if (!wr.inline_data) {
    for (const Sge& s : ps.sges) {
      const Mr* mr = find_key(s.lkey, false);
      if (!mr || mr->pd != qp.pd || !in_range(*mr, s.addr, s.length) || (is_read && !(mr->access & kLocalWrite))) {
        fail_head(qp, WcStatus::kLocProtErr);
        return;
      }
    }
  }

  Request rq;
  rq.h.token = ++next_token_;
  rq.h.src_gid = gid_;
  rq.h.src_qpn = qp.qpn;
  rq.h.dst_qpn = qp.rtr.remote_qpn;
  rq.h.psn = qp.next_send_psn;
  // Each WR takes ceil(bytes / path MTU) PSNs (at least one) on both sides.
  const uint64_t mtu = static_cast<uint64_t>(mtu_bytes(qp.rtr.path_mtu));
  rq.h.packets = static_cast<uint32_t>(std::max<uint64_t>(1, (total + mtu - 1) / mtu));
  rq.h.opcode = wr.opcode;
  rq.h.rkey = wr.rkey;
  rq.h.remote_addr = wr.remote_addr;
  rq.h.imm_data = wr.imm_data;
  rq.h.total = total;
  rq.h.inline_data = wr.inline_data;
  if (wr.inline_data) {
    rq.inline_bytes = ps.inline_bytes;
  } else {
    // The responder moves the bytes at the addresses the NIC uses: for device memory its
    // own view of it (Mr::nic), which is also what another process's responder reaches.
    rq.sges.reserve(ps.sges.size());
    for (const Sge& s : ps.sges) rq.sges.push_back(Sge{find_key(s.lkey, false)->dma_addr(s.addr), s.length, s.lkey});
  }

  // The packet goes where the remote GID points: this process's own fabric answers at
  // once; another process's answers over the link (or, when nothing listens for that
  // GID, nobody does: an ACK timeout, as for any unreachable responder).
  if (qp.rtr.remote_gid == gid_) {
    finish(qp, respond(rq, 0));
    return;
  }
  const pid_t pid = gid_pid(qp.rtr.remote_gid);
  uint64_t link = 0;
  if (pid <= 0 || !link_ || link_->send_request(pid, rq, &link) != 0) {
    finish(qp, Answer{Reply::kNoAck, 0});
    return;
  }
  qp.inflight_token = rq.h.token;
  qp.inflight_link = link;
  qp.inflight_deadline = Clock::now() + ack_timeout(qp.rts.timeout);
  schedule_progress(qp, qp.inflight_deadline);
}

void Fabric::finish(Qp& qp, const Answer& answer) {
  PostedSend& ps = qp.sq.front();
  const Clock::time_point now = Clock::now();
  auto retry_at = [&](Clock::time_point at) {
    qp.last_retry_at = at;
    schedule_progress(qp, at);
  };
  switch (answer.reply) {
    case Reply::kNoAck:
      ++ps.retry_tries;
      if (qp.rts.timeout != 0 && ps.retry_tries > qp.rts.retry_cnt) {
        fail_head(qp, WcStatus::kRetryExcErr);
      } else {
        retry_at(now + ack_timeout(qp.rts.timeout));
      }
      return;
    case Reply::kRnr:
      // No receive posted: retried after the responder's RNR timer, rnr_retry times (7:
      // forever), then RNR_RETRY_EXC_ERR.
      ++qp.rnr_naks;
      ++ps.rnr_tries;
      if (qp.rts.rnr_retry != 7 && ps.rnr_tries > qp.rts.rnr_retry) {
        fail_head(qp, WcStatus::kRnrRetryExcErr);
      } else {
        retry_at(now + rnr_delay(answer.min_rnr_timer));
      }
      return;
    case Reply::kRemAccess: fail_head(qp, WcStatus::kRemAccessErr); return;
    case Reply::kRemInvReq: fail_head(qp, WcStatus::kRemInvReqErr); return;
    case Reply::kRemOpErr: fail_head(qp, WcStatus::kRemOpErr); return;
    case Reply::kAck: break;
  }
  PostedSend done = std::move(ps);
  qp.sq.pop_front();
  const uint64_t mtu = static_cast<uint64_t>(mtu_bytes(qp.rtr.path_mtu));
  const uint64_t total = done.wr.inline_data ? done.inline_bytes.size() : sge_total(done.sges);
  const uint32_t packets = static_cast<uint32_t>(std::max<uint64_t>(1, (total + mtu - 1) / mtu));
  qp.next_send_psn = (qp.next_send_psn + packets) & 0xffffff;
  if (done.wr.signaled) {
    WorkCompletion wc;
    wc.wr_id = done.wr.wr_id;
    wc.opcode = send_wc_opcode(done.wr.opcode);
    wc.qp_num = qp.qpn;
    wc.status = WcStatus::kSuccess;
    // verbs: byte_len is for reads and receives
    wc.byte_len = done.wr.opcode == WrOpcode::kRdmaRead ? static_cast<uint32_t>(total) : 0;
    complete(qp, true, done.seq, wc);
  }
}

Answer Fabric::respond(const Request& rq, pid_t requester) {
  const RequestHeader& h = rq.h;
  // The packet is accepted only by a QP that exists, is connected back to the requester
  // (QPN and GID), can receive (RTR or RTS) and expects this PSN. Otherwise nothing
  // acknowledges it: the requester retries after its ACK timeout, then RETRY_EXC_ERR.
  Qp* peer = find_qp(h.dst_qpn);
  const bool reachable = peer && peer->rtr.remote_qpn == h.src_qpn && peer->rtr.remote_gid == h.src_gid &&
                         (peer->state == QpState::kRtr || peer->state == QpState::kRts) &&
                         h.psn == peer->expected_psn;
  if (!reachable) return Answer{Reply::kNoAck, 0};
  const bool is_read = h.opcode == WrOpcode::kRdmaRead;

  // An RDMA op needs the access it asks for granted by the responder QP, and a valid rkey in
  // the responder's PD covering the range, granting that access too. A zero-byte op is not
  // required to carry a valid R_Key or VA (IBA C9-88; rxe skips the check): only the QP's
  // access is checked for it.
  uint64_t remote_dma = 0;  // where the NIC moves the bytes of [remote_addr, +total)
  if (!needs_recv(h.opcode) || h.opcode == WrOpcode::kRdmaWriteWithImm) {
    const uint32_t need = is_read ? kRemoteRead : kRemoteWrite;
    if (!(peer->init.access & need)) return Answer{Reply::kRemAccess, 0};
    if (h.total > 0) {
      const Mr* rmr = find_key(h.rkey, true);
      if (!rmr || rmr->pd != peer->pd || !in_range(*rmr, h.remote_addr, h.total) || !(rmr->access & need)) {
        return Answer{Reply::kRemAccess, 0};
      }
      remote_dma = rmr->dma_addr(h.remote_addr);
    }
  }

  // Ops that consume a receive: none posted is an RNR NAK.
  std::optional<PostedRecv> recv;
  if (needs_recv(h.opcode)) {
    if (peer->rq.empty()) return Answer{Reply::kRnr, peer->rtr.min_rnr_timer};
    recv = std::move(peer->rq.front());
    peer->rq.pop_front();
  }

  // Where the requester's bytes are: its buffers in its process, or the inline copy here.
  const std::vector<Sge> inline_src{Sge{reinterpret_cast<uint64_t>(rq.inline_bytes.data()),
                                        static_cast<uint32_t>(rq.inline_bytes.size()), 0}};
  const std::vector<Sge>& src = h.inline_data ? inline_src : rq.sges;
  const pid_t src_pid = h.inline_data ? 0 : requester;

  WorkCompletion rwc;
  rwc.qp_num = peer->qpn;
  int err = 0;
  if (h.opcode == WrOpcode::kSend || h.opcode == WrOpcode::kSendWithImm) {
    rwc.wr_id = recv->wr_id;
    rwc.opcode = WcOpcode::kRecv;
    bool recv_ok = true;
    std::vector<Sge> recv_dma;  // the receive's buffers where the NIC writes them
    for (const Sge& s : recv->sges) {
      const Mr* mr = find_key(s.lkey, false);
      if (!mr || mr->pd != peer->pd || !in_range(*mr, s.addr, s.length) || !(mr->access & kLocalWrite)) {
        recv_ok = false;
      } else {
        recv_dma.push_back(Sge{mr->dma_addr(s.addr), s.length, s.lkey});
      }
    }
    // A bad receive buffer is the responder's protection error (the requester sees a
    // remote operational error); a message longer than the receive is a length error at
    // the responder and an invalid request at the requester. Both QPs go to ERR.
    if (!recv_ok || h.total > sge_total(recv->sges)) {
      rwc.status = recv_ok ? WcStatus::kLocLenErr : WcStatus::kLocProtErr;
      complete(*peer, false, recv->seq, rwc);
      to_error(*peer);
      return Answer{recv_ok ? Reply::kRemInvReq : Reply::kRemOpErr, 0};
    }
    err = move_bytes(0, recv_dma, src_pid, src, h.total);
  } else if (is_read) {
    err = move_bytes(requester, rq.sges, 0, {Sge{remote_dma, static_cast<uint32_t>(h.total), 0}}, h.total);
  } else if (h.total > 0) {
    err = move_bytes(0, {Sge{remote_dma, static_cast<uint32_t>(h.total), 0}}, src_pid, src, h.total);
  }
  if (err != 0) {
    // The requester's memory could not be reached (ptrace permission, a process that is
    // gone, unmapped pages): nothing was consumed here, the requester's WR fails.
    if (recv) peer->rq.push_front(std::move(*recv));
    report_copy_error(requester, err);
    return Answer{Reply::kRemOpErr, 0};
  }
  peer->expected_psn = (peer->expected_psn + h.packets) & 0xffffff;

  if (recv) {
    if (h.opcode == WrOpcode::kRdmaWriteWithImm) {
      rwc.wr_id = recv->wr_id;
      rwc.opcode = WcOpcode::kRecvRdmaWithImm;
    }
    rwc.status = WcStatus::kSuccess;
    rwc.byte_len = static_cast<uint32_t>(h.total);
    rwc.has_imm = h.opcode == WrOpcode::kSendWithImm || h.opcode == WrOpcode::kRdmaWriteWithImm;
    rwc.imm_data = rwc.has_imm ? h.imm_data : 0;
    complete(*peer, false, recv->seq, rwc);
  }
  return Answer{Reply::kAck, 0};
}

void Fabric::on_answer(uint32_t qpn, uint64_t token, const Answer& answer) {
  Qp* qp = find_qp(qpn);
  if (!qp || qp->inflight_token == 0 || qp->inflight_token != token) return;  // late: already given up
  qp->inflight_token = 0;
  if (qp->state == QpState::kErr) {
    flush(*qp);
    return;
  }
  finish(*qp, answer);
  if (qp->state == QpState::kRts && !qp->sq.empty() && qp->inflight_token == 0) {
    schedule_progress(*qp, std::max(Clock::now(), qp->last_retry_at));
  }
}

void Fabric::on_link_lost(uint64_t link) {
  // A closed connection is a dead peer: its requests will never be answered. That is a
  // lost packet, so the requester sees no ACK (and retries, reconnecting, until its
  // retry count runs out).
  for (auto& [qpn, qp] : qps_) {
    if (qp->inflight_token != 0 && qp->inflight_link == link) on_answer(qpn, qp->inflight_token, Answer{Reply::kNoAck, 0});
  }
}

void Fabric::complete(Qp& qp, bool send_queue, uint64_t seq, const WorkCompletion& wc) {
  if (qp.drop_completions > 0) {
    --qp.drop_completions;
    return;
  }
  const std::shared_ptr<Cq>& cq = send_queue ? qp.send_cq : qp.recv_cq;
  Cq::Entry entry{wc, qp.qpn, send_queue, seq};
  const Clock::time_point now = Clock::now();
  if (qp.completion_delay.count() == 0 && qp.delayed_in_flight == 0) {
    deliver(*cq, entry);
    return;
  }
  // A delayed completion, and every one after it, is delivered in order.
  Clock::time_point at = std::max(now + qp.completion_delay, qp.last_delivery_at);
  qp.last_delivery_at = at;
  ++qp.delayed_in_flight;
  events_.push(Event{at, next_order_++, qp.qpn, true, cq, entry});
  cv_.notify_one();
}

void Fabric::deliver(Cq& cq, const Cq::Entry& entry) {
  if (cq.overrun) return;  // the CQ is in error: nothing more is reported on it
  if (static_cast<int>(cq.entries.size()) >= cq.depth) {
    // Overrun (IBV_EVENT_CQ_ERR on hardware): poll fails from now on; wake any waiter.
    cq.overrun = true;
    cq.signal();
    return;
  }
  cq.entries.push_back(entry);
  if (cq.armed) {
    cq.armed = false;
    cq.signal();
  }
}

void Fabric::to_error(Qp& qp) {
  qp.state = QpState::kErr;
  flush(qp);
}

void Fabric::flush(Qp& qp) {
  WorkCompletion wc;
  wc.status = WcStatus::kWrFlushErr;
  wc.qp_num = qp.qpn;
  // A WR another process is answering is flushed (with those after it, in order) once
  // its answer came or the wait for it ran out: until then the responder may still be
  // copying into its buffers.
  while (qp.inflight_token == 0 && !qp.sq.empty()) {
    PostedSend ps = std::move(qp.sq.front());
    qp.sq.pop_front();
    wc.wr_id = ps.wr.wr_id;
    wc.opcode = send_wc_opcode(ps.wr.opcode);
    complete(qp, true, ps.seq, wc);
  }
  wc.opcode = WcOpcode::kRecv;
  while (!qp.rq.empty()) {
    PostedRecv pr = std::move(qp.rq.front());
    qp.rq.pop_front();
    wc.wr_id = pr.wr_id;
    complete(qp, false, pr.seq, wc);
  }
}

void Fabric::fail_qp(uint32_t qpn) {
  Qp& qp = require_qp(qpn);
  qp.state = QpState::kErr;
  schedule_progress(qp, Clock::now());
}

void Fabric::delay_completions(uint32_t qpn, std::chrono::microseconds delay) { require_qp(qpn).completion_delay = delay; }

void Fabric::drop_completions(uint32_t qpn, int count) { require_qp(qpn).drop_completions = count; }

uint64_t Fabric::rnr_naks(uint32_t qpn) { return require_qp(qpn).rnr_naks; }

namespace {
std::shared_ptr<Fabric> require_fabric() {
  std::shared_ptr<Fabric> fabric = Fabric::current();
  if (!fabric) throw NotFoundError("no simulated RDMA device is open (DLSLIME_RDMA_SIM=1 and open sim_rdma0 first)");
  return fabric;
}
}  // namespace

void fail_qp(uint32_t qpn) {
  auto f = require_fabric();
  std::lock_guard<std::mutex> lock(f->mu);
  f->fail_qp(qpn);
}

void delay_completions(uint32_t qpn, std::chrono::microseconds delay) {
  auto f = require_fabric();
  std::lock_guard<std::mutex> lock(f->mu);
  f->delay_completions(qpn, delay);
}

void drop_completions(uint32_t qpn, int count) {
  auto f = require_fabric();
  std::lock_guard<std::mutex> lock(f->mu);
  f->drop_completions(qpn, count);
}

uint64_t rnr_naks(uint32_t qpn) {
  auto f = require_fabric();
  std::lock_guard<std::mutex> lock(f->mu);
  return f->rnr_naks(qpn);
}

}  // namespace dlslime::rdma::sim
