// NVLinkEndpoint's notification channel (docs/nvlink.md "Notifications"): CUDA IPC moves
// the bytes, and nothing else passes between the two processes after connect(), so
// notifications need a channel of their own. It is a pair of AF_UNIX SOCK_SEQPACKET
// connections in the abstract namespace (reliable, ordered, message boundaries kept, no
// file left behind): each endpoint listens on an address it publishes in endpoint_info(),
// dials the peer's when it connects, sends its notifications on the connection it dialed
// and receives the peer's on the one it accepted, answering each with an acknowledgement.
// An accepted connection is taken only from the peer process connect() named (SO_PEERCRED),
// so another local process cannot inject notifications.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/completion_thread.h"
#include "core/notification_inbox.h"
#include "core/op_limit.h"
#include "core/op_state.h"
#include "dlslime/future.h"

namespace dlslime::nvlink {

class NotifyChannel final : public OpCanceller, public std::enable_shared_from_this<NotifyChannel> {
 public:
  // Held notifications no recv_notify has claimed: at most this many bytes (256 each on top).
  static constexpr uint64_t kHeldBudget = 16u << 20;

  // Binds and listens (throws ConnectionError if it cannot); start() runs its thread.
  NotifyChannel();
  ~NotifyChannel();
  void start();
  // The abstract socket name peers dial (endpoint_info "notify_socket").
  const std::string& address() const { return address_; }

  // connect(): dials the peer's `address`; its accepted connection must come from `pid`
  // (0: the peer's pid is unknown here, another pid namespace: any process of this user).
  // A new peer replaces the old one; what the old one sent and nobody received is dropped.
  void connect(const std::string& address, int64_t pid);
  // The ops (called by NVLinkEndpointImpl::submit, after the core's fence for sends).
  Future send(std::string bytes, const OpLimit& limit);
  Future receive(const OpLimit& limit);
  // Fails everything CANCELLED and ends the thread; idempotent. join() waits for it (off
  // the thread itself).
  void shutdown();
  void join() { thread_.join(); }
  // Future::cancel: a recv_notify still waiting, or a notification not yet written to the
  // socket (`seq`), is withdrawn; one written may arrive (whole) and is not.
  bool cancel_op(OpState& op, uint64_t seq) override;

 private:
  using Clock = std::chrono::steady_clock;
  struct Sending {
    std::shared_ptr<OpState> state;
    OpLimit limit;
    Clock::time_point deadline;
  };
  struct Outgoing {
    uint64_t seq = 0;
    std::string bytes;
  };
  void run();
  void wake();
  // Under mu_: what the thread does each turn. Ended ops go to `ended`.
  void accept_locked();
  void read_notifications_locked(NotificationInbox::EndedList& ended);
  void read_acks_locked(NotificationInbox::EndedList& ended);
  void flush_locked();
  void expire_locked(Clock::time_point now, NotificationInbox::EndedList& ended);
  Clock::time_point next_deadline_locked() const;
  // The peer is gone (or broke the protocol): its connections close, sends in flight fail
  // with `why`, waiting recv_notifys too.
  void lose_peer_locked(const Status& why, NotificationInbox::EndedList& ended);
  void close_fds_locked();

  std::string address_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;

  mutable std::mutex mu_;
  bool closed_ = false;
  int out_fd_ = -1;  // dialed: our notifications out, the peer's acknowledgements in
  int in_fd_ = -1;   // accepted from the peer: its notifications in, our acknowledgements out
  int64_t peer_pid_ = -1;  // whose dial to accept (-1: no peer yet; 0: any process of this user)
  std::vector<int> unclaimed_;  // accepted before connect() named the peer (at most a few)
  uint64_t next_seq_ = 1;
  std::deque<Outgoing> outbox_;          // not yet written (the socket was full)
  std::map<uint64_t, Sending> sending_;  // written or queued, awaiting the peer's acknowledgement
  std::deque<std::string> acks_;         // acknowledgements not yet written
  NotificationInbox inbox_{kHeldBudget, "NVLinkEndpoint's notification budget (16 MiB)"};
  CompletionThread thread_;
};

}  // namespace dlslime::nvlink
