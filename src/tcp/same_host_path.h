#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/same_host.h"
#include "dlslime/tcp_endpoint.h"
#include "tcp/frame_codec.h"
#include "tcp/tcp_connection.h"

namespace dlslime {

// Whether this endpoint's writes go over the same-host path (docs/tcp.md "Same-host
// path"), and the negotiation that decides it, in both roles:
//   initiator  once our lanes are up, offers the path on lane 0: our pid, uid, pid namespace,
//              boot id and the address of a probe buffer. The target answers with a random
//              challenge, we put it in the probe buffer, and the target reads it back from
//              our memory with process_vm_readv (and writes the rest of the buffer). Only a
//              passed probe turns the path on; any refusal leaves the writes on TCP, with
//              its reason kept for describe().
//   target     checks an offer (same boot, same pid namespace, same uid, our own switch),
//              challenges, probes, and from then on trusts the proven pid with pull requests
//              (TargetServer::serve_pull). The challenge makes the probe prove that the
//              offered pid is the process at the other end of this connection, so a peer
//              cannot make us copy from or into a third process.
// Threads: the I/O thread, except active(), describe() and wait_settled().
// Test faults (docs/tcp.md): whether DLSLIME_TCP_SAME_HOST_FAULT names `fault` ("probe":
// a target refuses every offer as if its probe had failed; "slow_report": each copy this
// endpoint makes reports 300 ms after its bytes are in place). Read once per process.
bool same_host_fault(std::string_view fault);

class SameHostPath {
 public:
  explicit SameHostPath(const TcpOptions& options) : options_(options) {}

  // Initiator. Our dialed lanes are up: offers the path on `lane0` (or settles at once
  // when it is turned off).
  void start(tcp::TcpConnection& lane0);
  // A kSameHost answer of the target, on one of our dialed lanes.
  void on_answer(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view payload);
  // Any thread: our writes may be pulled by the peer now.
  bool active() const { return active_.load(std::memory_order_acquire); }
  // Any thread: {"path": "cma" | "tcp", "reason": why} for the writes, and "reads",
  // "reads_reason" for the reads.
  nlohmann::json describe() const;
  // Any thread: waits until the negotiation started by start() has ended, at most until
  // `deadline`; false if it has not.
  bool wait_settled(std::chrono::steady_clock::time_point deadline);

  // Target. A kSameHost request of the peer, on one of its lanes.
  void on_request(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view payload);
  // The pid the peer proved to be on `conn` (0: none there, pull requests are refused).
  // Only the connection the probe ran on is trusted: another lane claiming the same peer
  // id (anyone who can reach the port can open one without a token) is not.
  uint32_t trusted_pid(const tcp::TcpConnection& conn) const {
    return trusted_conn_.lock().get() == &conn ? trusted_pid_ : 0;
  }

  // Any thread: the peer's pid once our probe of its own offer passed (0: not proved). Our
  // reads copy out of the peer with it, so they take the path only when each side has
  // proved the other (both connected to each other, as PeerAgent and symmetric pairs do).
  uint32_t proven_peer_pid() const { return proven_pid_.load(std::memory_order_acquire); }

  // The peer is gone: both roles start over at the next connection.
  void reset(const char* why);

  // Bytes this endpoint copied out of the peer itself, by what they were (the peer's
  // writes it served, its own reads, messages it received): describe()'s "copied_bytes".
  struct CopiedBytes {
    std::atomic<uint64_t> writes{0};
    std::atomic<uint64_t> reads{0};
    std::atomic<uint64_t> messages{0};
  };
  CopiedBytes& copied_bytes() { return copied_; }

 private:
  enum class Stage { kIdle, kOffered, kReady, kSettled };
  void settle(bool on, std::string reason);
  void send(tcp::TcpConnection& conn, tcp::SameHostStage stage, const Status& status, std::string_view payload);
  void refuse(tcp::TcpConnection& conn, std::string reason);

  const TcpOptions& options_;

  // Initiator (I/O thread), and what other threads read.
  Stage stage_ = Stage::kIdle;
  alignas(64) std::array<uint8_t, 2 * tcp::kSameHostNonce> probe_{};  // the peer reads and writes it
  std::atomic<bool> active_{false};
  mutable std::mutex mu_;
  std::condition_variable settled_cv_;
  bool settled_ = true;  // guarded by mu_ (with reason_): no negotiation under way
  std::string reason_ = "not connected";

  // Target (I/O thread).
  uint32_t offered_pid_ = 0;
  uint64_t offered_probe_ = 0;
  std::array<uint8_t, tcp::kSameHostNonce> nonce_{};
  bool challenged_ = false;
  uint32_t trusted_pid_ = 0;
  std::atomic<uint32_t> proven_pid_{0};  // trusted_pid_, for other threads
  std::weak_ptr<tcp::TcpConnection> trusted_conn_;  // weak: a later connection at its address is not it
  std::weak_ptr<tcp::TcpConnection> challenged_conn_;
  CopiedBytes copied_;
};

}  // namespace dlslime
