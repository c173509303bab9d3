#include "tcp/same_host_path.h"

#include <cstdlib>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "core/log.h"
#include "tcp/wire.h"
#include "tcp/write_item.h"

namespace dlslime {

using tcp::FrameHeader;
using tcp::FrameType;
using tcp::SameHostStage;
using tcp::TcpConnection;

void SameHostPath::settle(bool on, std::string reason) {
  {
    std::lock_guard lock(mu_);
    reason_ = std::move(reason);
    settled_ = true;
  }
  active_.store(on, std::memory_order_release);
  stage_ = Stage::kSettled;
  settled_cv_.notify_all();
}

bool same_host_fault(std::string_view fault) {
  static const std::string chosen = [] {
    const char* v = std::getenv("DLSLIME_TCP_SAME_HOST_FAULT");
    return std::string(v ? v : "");
  }();
  return chosen == fault;
}

nlohmann::json SameHostPath::describe() const {
  std::lock_guard lock(mu_);
  const bool reads = active() && proven_peer_pid() != 0;
  return {{"path", active() ? "cma" : "tcp"},
          {"reason", settled_ ? reason_ : std::string("negotiating")},
          {"reads", reads ? "cma" : "tcp"},
          {"reads_reason", reads        ? std::string("this endpoint's probe of the peer passed as well")
                           : !active()  ? std::string("as the writes")
                                        : std::string("this endpoint has not probed the peer: the peer did not connect "
                                                      "back, or its offer was refused here")},
          {"copied_bytes",
           {{"writes", copied_.writes.load(std::memory_order_relaxed)},
            {"reads", copied_.reads.load(std::memory_order_relaxed)},
            {"messages", copied_.messages.load(std::memory_order_relaxed)}}}};
}

bool SameHostPath::wait_settled(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mu_);
  return settled_cv_.wait_until(lock, deadline, [&] { return settled_; });
}

void SameHostPath::reset(const char* why) {
  {
    std::lock_guard lock(mu_);
    reason_ = why;
    settled_ = true;
  }
  active_.store(false, std::memory_order_release);
  stage_ = Stage::kIdle;
  probe_.fill(0);
  settled_cv_.notify_all();
  offered_pid_ = 0;
  offered_probe_ = 0;
  challenged_ = false;
  trusted_pid_ = 0;
  proven_pid_.store(0, std::memory_order_release);
  trusted_conn_.reset();
  challenged_conn_.reset();
}

void SameHostPath::send(TcpConnection& conn, SameHostStage stage, const Status& status, std::string_view payload) {
  FrameHeader h;
  h.type = FrameType::kSameHost;
  h.index = static_cast<uint32_t>(stage);
  h.status = status.raw_code();
  h.length = payload.size();
  tcp::WriteItem item(0);
  item.add_header(h);
  item.add_copy(payload.data(), payload.size());
  conn.send(std::move(item));
}

void SameHostPath::start(TcpConnection& lane0) {
  if (!options_.same_host) {
    return settle(false, "turned off on this endpoint (same_host=False or DLSLIME_TCP_SAME_HOST=0)");
  }
  {
    std::lock_guard lock(mu_);
    settled_ = false;
  }
  const ProcessIdentity me = this_process_identity();
  probe_.fill(0);
  uint8_t offer[tcp::kSameHostOfferSize];
  tcp::WireWriter w(offer);
  w.u32(me.pid);
  w.u32(me.uid);
  w.u64(me.pid_namespace);
  w.bytes(me.boot_id.data(), me.boot_id.size());
  w.u64(reinterpret_cast<uintptr_t>(probe_.data()));
  stage_ = Stage::kOffered;
  send(lane0, SameHostStage::kOffer, Status::ok(), {reinterpret_cast<const char*>(offer), sizeof offer});
}

void SameHostPath::on_answer(TcpConnection& conn, const FrameHeader& h, std::string_view payload) {
  const auto stage = static_cast<SameHostStage>(h.index);
  if (stage == SameHostStage::kChallenge && stage_ == Stage::kOffered && h.status == 0 &&
      payload.size() == tcp::kSameHostNonce) {
    // The target reads the challenge back from our memory: only the process at this end
    // of the connection can have put it there.
    std::memcpy(probe_.data(), payload.data(), payload.size());
    stage_ = Stage::kReady;
    return send(conn, SameHostStage::kReady, Status::ok(), {});
  }
  if (stage == SameHostStage::kVerdict && (stage_ == Stage::kOffered || stage_ == Stage::kReady)) {
    if (h.status == 0 && stage_ == Stage::kReady) {
      DLSLIME_INFO("same-host path on: the peer pulls this endpoint's writes (cross-memory attach)");
      return settle(true, "same host: the peer's cross-memory-attach probe of this process passed");
    }
    if (h.status == 0) return conn.close(Status::protocol_error("a same-host verdict without a probe"));
    return settle(false, std::string(payload));
  }
  conn.close(Status::protocol_error(fmt::format("an unexpected same-host frame (stage {})", h.index)));
}

void SameHostPath::refuse(TcpConnection& conn, std::string reason) {
  DLSLIME_DEBUG("same-host path refused to the peer: {}", reason);
  offered_pid_ = 0;
  challenged_ = false;
  const std::string_view text = std::string_view(reason).substr(0, tcp::kMaxErrorText);
  send(conn, SameHostStage::kVerdict, Status(StatusCode::kAccessDenied, "refused"), text);
}

void SameHostPath::on_request(TcpConnection& conn, const FrameHeader& h, std::string_view payload) {
  const auto stage = static_cast<SameHostStage>(h.index);
  if (stage == SameHostStage::kOffer && payload.size() == tcp::kSameHostOfferSize && !challenged_ &&
      trusted_pid_ == 0) {
    tcp::WireReader r(reinterpret_cast<const uint8_t*>(payload.data()));
    ProcessIdentity peer;
    peer.pid = r.u32();
    peer.uid = r.u32();
    peer.pid_namespace = r.u64();
    r.bytes(peer.boot_id.data(), peer.boot_id.size());
    const uint64_t probe = r.u64();
    if (!options_.same_host) return refuse(conn, "turned off on the peer (same_host=False or DLSLIME_TCP_SAME_HOST=0)");
    const ProcessIdentity me = this_process_identity();
    if (std::string why = me.mismatch(peer); !why.empty()) return refuse(conn, why);
    if (peer.pid == me.pid || peer.pid == 0) return refuse(conn, "the peer is this process (the copy would be local)");
    if (same_host_fault("probe")) return refuse(conn, "probe failed: EPERM (simulated by DLSLIME_TCP_SAME_HOST_FAULT=probe)");
    std::random_device rd;
    for (size_t i = 0; i < nonce_.size(); i += 4) {
      const uint32_t v = rd();
      std::memcpy(nonce_.data() + i, &v, 4);
    }
    offered_pid_ = peer.pid;
    offered_probe_ = probe;
    challenged_ = true;
    challenged_conn_ = conn.weak_from_this();
    return send(conn, SameHostStage::kChallenge, Status::ok(),
                {reinterpret_cast<const char*>(nonce_.data()), nonce_.size()});
  }
  if (stage == SameHostStage::kReady && payload.empty() && challenged_ && challenged_conn_.lock().get() == &conn) {
    challenged_ = false;
    const int pid = static_cast<int>(offered_pid_);
    std::array<uint8_t, tcp::kSameHostNonce> seen{};
    const CrossCopy read{seen.data(), offered_probe_, seen.size()};
    if (Status st = cross_copy(pid, {&read, 1}, true); !st) return refuse(conn, "probe failed: " + st.message());
    if (seen != nonce_) {
      return refuse(conn, fmt::format("probe failed: pid {} does not hold the challenge (it is not the peer)", pid));
    }
    // Both directions: the probe buffer's second half takes a write.
    std::array<uint8_t, tcp::kSameHostNonce> back = nonce_;
    const CrossCopy write{back.data(), offered_probe_ + tcp::kSameHostNonce, back.size()};
    if (Status st = cross_copy(pid, {&write, 1}, false); !st) return refuse(conn, "probe failed: " + st.message());
    trusted_pid_ = offered_pid_;
    proven_pid_.store(trusted_pid_, std::memory_order_release);
    trusted_conn_ = conn.weak_from_this();
    DLSLIME_INFO("same-host path on: pulling the writes of peer process {} (cross-memory attach)", pid);
    return send(conn, SameHostStage::kVerdict, Status::ok(), {});
  }
  conn.close(Status::protocol_error(fmt::format("an unexpected same-host frame (stage {})", h.index)));
}

}  // namespace dlslime
