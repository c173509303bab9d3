#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "core/copy_workers.h"
#include "core/notification_inbox.h"
#include "core/op_limit.h"
#include "core/op_state.h"
#include "dlslime/tcp_endpoint.h"
#include "tcp/frame_codec.h"
#include "tcp/frame_handler.h"
#include "tcp/tcp_connection.h"
#include "tcp/tcp_gpu_staging.h"

namespace dlslime {

class Pairing;

// Two-sided messages arriving from the peer. The sender's lane 0 carries them in order;
// each is matched FIFO to a posted recv, or held (bounded by unexpected_buffer_bytes)
// until one is posted, pausing that lane while the budget is full. The sender's future
// completes once the whole message is here: placed, refused (too large), or held.
// Owns the posted recvs (and their recv_timeout), the held messages and the message
// whose frames are arriving. A recv into GPU memory takes each frame in a staging slot
// and copies it to the device; it completes, and the sender is acknowledged, once those
// copies have finished (docs/tcp.md "GPU memory"). Threads: the I/O thread only.
class MessageMatcher {
 public:
  using Clock = std::chrono::steady_clock;

  struct PostedRecv {
    std::shared_ptr<OpState> state;
    uint8_t* addr = nullptr;
    uint64_t length = 0;
    uint64_t local_id = 0;
    bool exact_size = false;  // OpRequest::exact_size: a shorter message fails it
    bool device = false;      // the buffer is GPU memory: frames are staged
    // How long it waits (its own timeout, else recv_timeout). The deadline is set from it
    // on the I/O thread (post_recv).
    OpLimit limit;
    Clock::time_point deadline = Clock::time_point::max();
  };
  // What drop_all() took out of the tables, to be failed once the bookkeeping is done.
  struct Dropped {
    std::deque<PostedRecv> recvs;
    std::shared_ptr<OpState> arriving;  // the recv a message was streaming into
    // GPU recvs whose copies were pending (they have finished: the staging was drained),
    // with the status they had ended with, if any (else they fail with `why`).
    std::vector<std::pair<std::shared_ptr<OpState>, Status>> copying;
    NotificationInbox::EndedList notify_waits;  // recv_notifys waiting
    void fail(const Status& why);
  };

  MessageMatcher(const TcpOptions& options, const Pairing& pairing, tcp::GpuPath& gpu);

  // The same-host path (docs/tcp.md "Same-host path"): pulled messages are copied out of
  // the sender by `workers`, never on the I/O thread, each copy reporting back through
  // `post` (which runs its function on the I/O thread while the endpoint lives).
  struct PullRunner {
    CopyWorkers* workers = nullptr;
    std::function<void(std::function<void()>)> post;
    std::atomic<uint64_t>* copied_bytes = nullptr;  // counts the messages' bytes received
  };
  void set_pull_runner(PullRunner runner) { pull_ = std::move(runner); }
  // A pulled message's header: kPause while it can be neither matched nor held (the held
  // messages fill the budget), as a frame message's first frame waits.
  tcp::RxAction admit_pulled(tcp::TcpConnection& conn);
  // A pulled message (kPullSend) from the peer process `pid` (proved by SameHostPath): it
  // takes its place among the messages as a frame message would. Its bytes are copied out
  // of the sender into the matched recv's buffer, or into a held buffer when the budget
  // has room (else it waits, bytes and all, in the sender until a recv is posted), and
  // the sender's lease is checked after the copy; kSendCopied answers it.
  void on_pulled(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view payload, uint32_t pid);

  // Matches `recv` to the oldest held message, or queues it until `deadline` (set on
  // this thread, so that recvs_ stays in deadline order). Returns the deadline it now
  // waits for (max: none), for the endpoint's sweeper.
  Clock::time_point post_recv(PostedRecv recv, Clock::time_point deadline);
  // A message frame's header (kSendData) and its arrival.
  tcp::RxAction on_header(tcp::TcpConnection& conn, const tcp::FrameHeader& h, tcp::PayloadSink& sink);
  void on_frame(tcp::TcpConnection& conn, const tcp::FrameHeader& h);
  // Future::cancel: a recv posted and not matched yet (no message has started into it)
  // is taken out and completed with the user's cancellation; the next message goes to the
  // next recv. False if it is not waiting here (matched, or ended).
  bool withdraw_recv(uint64_t local_id);
  // Future::cancel of a recv_notify still waiting (NotificationInbox::withdraw).
  bool withdraw_notify(const OpState& state);
  // A notification from the peer (kNotify): held or handed to a recv_notify, and
  // acknowledged at once (kNotifyAck), or refused when the held ones fill the budget.
  void on_notification(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view bytes);
  // A recv_notify; returns the deadline it now waits for (max: none).
  Clock::time_point post_notify(std::shared_ptr<OpState> state, const OpLimit& limit);
  // A peer was paired (`new_peer`: another one than before, whose held messages and
  // notifications are dropped).
  void paired(bool new_peer);
  // Fails the recvs and recv_notifys past their deadline (closing the lane of a message
  // still streaming into one: only that stops its bytes).
  void expire(Clock::time_point now);
  // The earliest deadline of a recv still waiting (max: none).
  Clock::time_point next_deadline() const;
  // The peer is gone: takes the recvs and the arriving message out. Held messages that
  // arrived whole stay deliverable (they were acknowledged), unless `shutting_down`.
  Dropped drop_all(bool shutting_down);

 private:
  // A message from the peer, matched to a posted recv or held until one is posted.
  struct InboundMessage {
    uint64_t op_id = 0;  // the sender's op id, echoed in its ack
    std::weak_ptr<tcp::TcpConnection> conn;
    bool matched = false;
    PostedRecv recv;                // when matched (recv.state reset once it has completed)
    std::vector<uint8_t> buffered;  // when unmatched
    uint64_t received = 0;
    bool complete = false;
    bool too_large = false;  // longer than the posted receive buffer
    bool acked = false;      // the sender has been told the message arrived
    // A pulled message (on_pulled): where it is in the sender and the sender's lease on it.
    // `pulling` counts its copy jobs not reported back yet (at most kPullChunksInFlight),
    // `writing` those still writing (drop_all waits for them before a recv's memory is
    // given back), `next` where the next job starts.
    bool pulled = false;
    uint32_t pid = 0;
    uint64_t length = 0;
    uint64_t source = 0;
    uint64_t lease_address = 0;
    uint64_t lease_value = 0;
    uint32_t pulling = 0;
    uint64_t next = 0;
    std::shared_ptr<std::atomic<uint32_t>> writing;
    Status pull_error;
    // A GPU recv: copies of its bytes to the device not finished yet. Until they have,
    // neither the recv completes nor the sender is acknowledged: a finish or an end that
    // comes meanwhile waits here.
    uint32_t copies = 0;
    bool finish_due = false;
    std::shared_ptr<OpState> ended;  // the recv ended (timeout, abandoned) with `ended_status`
    Status ended_status;
    Status copy_error;
  };
  // Messages held before a recv was posted: each costs its bytes plus this much.
  static constexpr uint64_t kHeldMessageOverhead = 256;
  // Copy jobs of one pulled message queued at a time: the process's copy workers are shared
  // (FIFO), so a large message must not queue all its chunks ahead of everyone else's, and
  // an ended recv or a lost peer waits for these few only.
  static constexpr uint32_t kPullChunksInFlight = 4;

  void attach(const std::shared_ptr<InboundMessage>& msg, PostedRecv recv);
  // Ends msg's recv early with `why` (once its copies have finished).
  void end_recv(InboundMessage& msg, Status why);
  // Counts the copy just queued for msg on the incoming staging stream; once it has
  // finished, `slot` (if any) is released, `keep` (the copy's source) let go, and
  // copied() runs.
  void track_copy(const std::shared_ptr<InboundMessage>& msg, tcp::GpuStaging::Slot* slot,
                  std::shared_ptr<void> keep = nullptr);
  void copied(const std::shared_ptr<InboundMessage>& msg, const Status& st);
  // `msg`, if it is the oldest held message, takes the oldest posted recv (if any).
  void match_held_front(const std::shared_ptr<InboundMessage>& msg);
  // The sender abandoned the message whose frames were arriving (a new one starts).
  void abandon_current();
  // Starts copying pulled message `msg` into its recv's buffer (matched) or its held one.
  void start_pull(const std::shared_ptr<InboundMessage>& msg);
  // Queues its next chunks (up to kPullChunksInFlight), unless it failed or its recv ended.
  void pull_chunks(const std::shared_ptr<InboundMessage>& msg);
  // A chunk [pos, pos + n) was copied (into `bounce` for a GPU recv) or failed.
  void pull_reported(const std::shared_ptr<InboundMessage>& msg, uint64_t pos, uint64_t n,
                     const std::shared_ptr<std::vector<uint8_t>>& bounce, const Status& st);
  // Every chunk has been reported: checks the lease, then delivers, holds or refuses it.
  void pull_finished(const std::shared_ptr<InboundMessage>& msg);
  // Held messages at the front that are whole (or pulled and not started) take the posted
  // recvs, in order.
  void match_held();
  void finish_message(InboundMessage& msg);
  void resume_paused();
  void forget_held(const InboundMessage& msg);
  std::shared_ptr<InboundMessage> take_held_front();

  const TcpOptions& options_;
  const Pairing& pairing_;
  tcp::GpuPath& gpu_;
  // GPU recvs with copies pending, for drop_all (the copies' callbacks hold them too).
  std::vector<std::shared_ptr<InboundMessage>> copying_;
  PullRunner pull_;
  // Pulled messages being copied (matched or held), for expire() and drop_all().
  std::vector<std::shared_ptr<InboundMessage>> pulling_;
  // Posting order. With per-recv timeouts that is not deadline order: expire() and
  // next_deadline() look at every one (they run at deadlines, not per message).
  std::deque<PostedRecv> recvs_;
  std::deque<std::shared_ptr<InboundMessage>> unexpected_;
  std::shared_ptr<InboundMessage> current_msg_;  // message whose frames are arriving
  uint64_t unexpected_bytes_ = 0;
  std::weak_ptr<tcp::TcpConnection> paused_conn_;
  // Notifications: held ones are bounded by unexpected_buffer_bytes, as messages are
  // (each budget on its own, so that one kind cannot starve the other).
  NotificationInbox notes_;
};

}  // namespace dlslime
