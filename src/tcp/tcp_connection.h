#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <asio/buffer.hpp>
#include <asio/ip/tcp.hpp>

#include "core/memory_registry.h"
#include "dlslime/status.h"
#include "tcp/answer_budget.h"
#include "tcp/frame_codec.h"
#include "tcp/frame_handler.h"
#include "tcp/payload_sink.h"
#include "tcp/write_item.h"

namespace dlslime::tcp {

// One TCP connection ("lane") after its handshake. asio chat-server pattern: handlers keep
// it alive with shared_from_this, at most one write is outstanding with a queue behind it,
// and every error takes the one close() path. All methods run on the endpoint's I/O thread.
class TcpConnection : public std::enable_shared_from_this<TcpConnection> {
 public:
  enum class Role : uint8_t { kDialed, kAccepted };

  TcpConnection(asio::ip::tcp::socket socket, FrameHandler* handler, Role role, uint16_t lane,
                std::shared_ptr<AnswerBudget> budget = nullptr);

  void start();
  // Queues the frames of local op `item.op_id()` (they may reference its memory, so
  // abandon() can drop them). Nothing is written before the current handler returns.
  void send(WriteItem item);
  // The open item for frames that reference no local op (acknowledgements, read
  // responses): they accumulate into one buffer, so a burst of answers costs one iovec
  // and one write. Valid until the handler returns; nothing is written before then.
  WriteItem& control();
  // Drops queued items of `op_id` that have not reached the socket yet. Returns false if
  // the kernel has taken part of an item that points into the op's memory and not the rest
  // (the socket was full); only closing the connection stops that.
  bool abandon(uint64_t op_id);
  // Stops placing payload bytes into the memory of local op `op_id` (the rest of the
  // frame is dropped). Returns false if the kernel is writing into that memory right now
  // (a direct read); only closing the connection stops that.
  bool release(uint64_t op_id);
  // Whether release(op_id) or abandon(op_id) would refuse now: the kernel is reading from
  // or writing into the op's memory. Future::cancel asks first and withdraws nothing
  // while this holds (closing a healthy lane is not a price a cancel may pay).
  bool moving(uint64_t op_id) const;
  // Whether an item of `op_id` is queued here (written or not yet).
  bool has_queued(uint64_t op_id) const;

  // Storage for the segments of the frame being read (on_prefix); reused per frame.
  std::vector<PayloadSegment>& segments() { return segments_; }
  // The regions those segments point into, held until the frame is placed or dropped.
  RegionUses& segment_uses() { return segment_uses_; }
  // Whether a frame being read or an item queued here refers to `lifetime`'s region.
  bool holds(const RegionLifetime* lifetime) const;

  void pause_reading() { paused_ = true; }
  void resume_reading();
  // The peer's answer budget has drained: reading its requests goes on (AnswerBudget).
  void resume_answers();

  // Fails the connection: cancels its I/O and reports `why` to the handler once.
  void close(const Status& why);
  // Sends a goodbye frame if the socket takes it without blocking, then closes without
  // calling the handler (endpoint shutdown).
  void close_quietly();

  bool is_open() const { return !closed_; }
  Role role() const { return role_; }
  uint16_t lane() const { return lane_; }
  std::string peer_address() const;

 private:
  static constexpr size_t kStagingSize = 256 * 1024;
  // Payload remainders at least this large are read straight into their destination
  // (one readv over up to kMaxDirectSegments segments), if those segments average at
  // least kDirectSegmentMin bytes; smaller ones are copied out of the staging buffer.
  static constexpr uint64_t kDirectReadMin = 16 * 1024;
  static constexpr uint64_t kDirectSegmentMin = 1024;
  // Receive low watermark while reading a payload directly (set_low_watermark).
  static constexpr uint64_t kLowWatermarkMin = 128 * 1024;
  static constexpr uint64_t kLowWatermarkMax = 512 * 1024;
  // Segments one direct read fills at most.
  static constexpr size_t kMaxDirectSegments = 64;

  void process();
  void schedule_read();
  void consume(const uint8_t* src, size_t n);
  void finish_frame();
  void take_prefix();
  void schedule_flush();
  uint64_t gather_direct();
  void read_direct(uint64_t bytes);
  void set_low_watermark(uint64_t bytes);
  void do_write();
  void retire_written();
  void stall_for_answers();
  // Runs an I/O completion: an exception from the frame handlers (allocation failure, a
  // bug) closes this connection, failing its ops, instead of leaving it with no read
  // posted and its ops hanging.
  template <class F>
  void guarded(F&& fn) noexcept;
  Status io_error(const std::error_code& ec, const char* what) const;

  std::shared_ptr<AnswerBudget> budget_;  // before queue_: its items count into it
  asio::ip::tcp::socket socket_;
  FrameHandler* handler_;
  const Role role_;
  const uint16_t lane_;
  bool closed_ = false;

  // Receive side.
  std::unique_ptr<uint8_t[]> rbuf_;
  size_t rbeg_ = 0, rend_ = 0;
  FrameHeader hdr_;
  PayloadSink sink_;
  std::string rx_text_;  // collected payloads
  std::vector<PayloadSegment> segments_;
  RegionUses segment_uses_;
  std::vector<asio::mutable_buffer> direct_bufs_;
  uint64_t remaining_ = 0;
  bool have_header_ = false, sink_ready_ = false;
  bool paused_ = false, reading_ = false, reading_direct_ = false;
  bool answers_full_ = false;  // stopped reading: too many answers queued (AnswerBudget)
  // The last payload was read directly: the next frame is likely large too, so staging
  // reads take only its header and piece list instead of copying the start of its payload.
  bool expect_large_ = false;
  int rcvlowat_ = 1;  // SO_RCVLOWAT now set on the socket

  // Send side.
  std::deque<WriteItem> queue_;
  static constexpr size_t kMaxIov = 1024;  // IOV_MAX on Linux
  std::vector<iovec> iov_;  // the write in progress: queue_'s first writing_items_ items
  size_t iov_pos_ = 0;      // first iovec not fully sent
  size_t writing_items_ = 0;  // items at the front of queue_ in the write in progress, not fully sent
  std::vector<size_t> item_ends_;  // per item of that write, in order: the end of its iovecs in iov_
  // At most the smallest op id with an item in queue_ (UINT64_MAX: none). Items only leave
  // after it was computed, so it stays a lower bound; abandon() makes it exact.
  uint64_t min_op_hint_ = UINT64_MAX;
  bool flush_posted_ = false;
};

}  // namespace dlslime::tcp
