#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "core/op_state.h"
#include "dlslime/tcp_endpoint.h"
#include "tcp/frame_codec.h"
#include "tcp/frame_handler.h"
#include "tcp/tcp_connection.h"

namespace dlslime {

class Pairing;

// Two-sided messages arriving from the peer. The sender's lane 0 carries them in order;
// each is matched FIFO to a posted recv, or held (bounded by unexpected_buffer_bytes)
// until one is posted, pausing that lane while the budget is full. The sender's future
// completes once the whole message is here: placed, refused (too large), or held.
// Owns the posted recvs (and their recv_timeout), the held messages and the message
// whose frames are arriving. Threads: the I/O thread only.
class MessageMatcher {
 public:
  using Clock = std::chrono::steady_clock;

  struct PostedRecv {
    std::shared_ptr<OpState> state;
    uint8_t* addr = nullptr;
    uint64_t length = 0;
    uint64_t local_id = 0;
    bool exact_size = false;  // OpRequest::exact_size: a shorter message fails it
    // Set on the I/O thread when it is posted (post_recv), so that recvs_, in posting
    // order, is in deadline order too.
    Clock::time_point deadline = Clock::time_point::max();
  };
  // What drop_all() took out of the tables, to be failed once the bookkeeping is done.
  struct Dropped {
    std::deque<PostedRecv> recvs;
    std::shared_ptr<OpState> arriving;  // the recv a message was streaming into
    void fail(const Status& why);
  };

  MessageMatcher(const TcpOptions& options, const Pairing& pairing);

  // Matches `recv` to the oldest held message, or queues it until `deadline` (set on
  // this thread, so that recvs_ stays in deadline order). Returns the deadline it now
  // waits for (max: none), for the endpoint's sweeper.
  Clock::time_point post_recv(PostedRecv recv, Clock::time_point deadline);
  // A message frame's header (kSendData) and its arrival.
  tcp::RxAction on_header(tcp::TcpConnection& conn, const tcp::FrameHeader& h, tcp::PayloadSink& sink);
  void on_frame(tcp::TcpConnection& conn, const tcp::FrameHeader& h);
  // Fails the recvs past their deadline (closing the lane of a message still streaming
  // into one: only that stops its bytes).
  void expire(Clock::time_point now);
  // The earliest deadline of a recv still waiting (max: none).
  Clock::time_point next_deadline() const;
  // Forgets the messages held from a peer this endpoint is no longer paired with.
  void drop_held();
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
  };
  // Messages held before a recv was posted: each costs its bytes plus this much.
  static constexpr uint64_t kHeldMessageOverhead = 256;

  void attach(InboundMessage& msg, PostedRecv recv);
  // `msg`, if it is the oldest held message, takes the oldest posted recv (if any).
  void match_held_front(const std::shared_ptr<InboundMessage>& msg);
  void finish_message(InboundMessage& msg);
  void resume_paused();
  void forget_held(const InboundMessage& msg);
  std::shared_ptr<InboundMessage> take_held_front();

  const TcpOptions& options_;
  const Pairing& pairing_;
  std::deque<PostedRecv> recvs_;  // posting order = deadline order (PostedRecv::deadline)
  std::deque<std::shared_ptr<InboundMessage>> unexpected_;
  std::shared_ptr<InboundMessage> current_msg_;  // message whose frames are arriving
  uint64_t unexpected_bytes_ = 0;
  std::weak_ptr<tcp::TcpConnection> paused_conn_;
};

}  // namespace dlslime
