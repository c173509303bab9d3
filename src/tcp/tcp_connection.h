#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <asio/buffer.hpp>
#include <asio/ip/tcp.hpp>

#include "core/memory_registry.h"
#include "dlslime/status.h"
#include "tcp/frame.h"

namespace dlslime::tcp {

// One queued unit of output: frames of one op (or one response), in wire order. Headers
// and small payloads are copied into `bytes`; large payloads are referenced in place
// (registered memory) and gathered by writev, never copied.
class WriteItem {
 public:
  // Payloads up to this size are copied into the item: one iovec instead of two. Larger
  // ones are gathered in place; copying them costs more than the extra iovec (2 KiB x 256:
  // 2048 here gave 1.87 GB/s write / 1.70 read, 256 gives 2.27 / 2.10; docs/performance.md).
  static constexpr size_t kInlinePayloadMax = 256;

  explicit WriteItem(uint64_t op_id = 0) : op_id_(op_id) {}
  WriteItem(WriteItem&& o) noexcept;
  WriteItem& operator=(WriteItem&& o) noexcept;
  ~WriteItem();

  // Room for `frames` frames carrying `payload` bytes in all, so that building a batch
  // allocates once instead of regrowing (and re-copying) its buffers.
  void reserve(size_t frames, uint64_t payload);
  void add_header(const FrameHeader& h);
  // Overwrites the header added last with `h`, if nothing was added after it and
  // `replaceable(old header)` holds (a cumulative acknowledgement superseding the previous
  // one). Returns false, changing nothing, otherwise.
  template <class Pred>
  bool replace_tail_header(const FrameHeader& h, Pred&& replaceable);
  void add_payload(const void* data, size_t n);  // inline or by reference, by size
  void add_copy(const void* data, size_t n);
  uint64_t op_id() const { return op_id_; }
  void append_buffers(std::vector<iovec>& out) const;
  // Memory the item holds (copied bytes and its segment list), not what it references.
  size_t memory() const { return bytes_.capacity() + segments_.capacity() * sizeof(Segment); }
  // Keeps the regions its referenced payloads point into registered until the item is
  // written or dropped (read answers; an op's own frames are covered by the op).
  void hold(RegionUses&& uses) { uses_.take(std::move(uses)); }
  const RegionUses& uses() const { return uses_; }
  // Counts memory() into *meter while the item lives (the answer budget of a peer).
  void meter(size_t* meter);

 private:
  void remeter();

  struct Segment {
    const uint8_t* external;  // nullptr: the bytes are bytes_[offset, offset+size)
    size_t offset;
    size_t size;
  };
  static constexpr size_t kNoTail = SIZE_MAX;
  uint64_t op_id_;  // the op whose memory external segments point into (0 = none)
  size_t tail_header_ = kNoTail;  // offset in bytes_ of the last header, if nothing followed it
  std::vector<uint8_t> bytes_;
  std::vector<Segment> segments_;
  RegionUses uses_;
  size_t* meter_ = nullptr;  // where memory() is counted (nullptr: nowhere)
  size_t metered_ = 0;       // what is counted there now
};

template <class Pred>
bool WriteItem::replace_tail_header(const FrameHeader& h, Pred&& replaceable) {
  if (tail_header_ == kNoTail) return false;
  FrameHeader old;
  if (!parse_frame_header(bytes_.data() + tail_header_, &old) || !replaceable(old)) return false;
  encode_frame_header(h, bytes_.data() + tail_header_);
  return true;
}

// A destination range in local memory.
struct PayloadSegment {
  uint8_t* addr;
  uint64_t length;
};

// Where the payload of the frame being read goes: into local memory (one range, or a list
// of ranges filled in order: the pieces of a write or of a read answer), into the
// connection's buffer (error texts, read-request lists; handed to on_frame), or nowhere (a
// rejected write, a late read response: the bytes are read and dropped so the stream stays
// in sync). A write frame starts with its piece list: the sink then first collects that
// prefix, and the handler sets the rest once it has arrived (on_prefix).
struct PayloadSink {
  uint8_t* dst = nullptr;  // the next byte goes here; nullptr: drop what is left
  uint64_t dst_left = 0;   // room at dst before the next segment
  const PayloadSegment* more = nullptr;  // the segments after dst
  size_t more_count = 0;
  bool collect = false;
  uint64_t prefix = 0;  // payload bytes to collect for on_prefix before placing any
  uint64_t op_id = 0;   // the local op whose memory the segments point into (0 = none)

  void place(uint8_t* addr, uint64_t length) {
    dst = addr;
    dst_left = length;
  }
  // `segments` must outlive the frame (or the op must be released first: release()).
  void scatter(const PayloadSegment* segments, size_t count) {
    place(segments[0].addr, segments[0].length);
    more = segments + 1;
    more_count = count - 1;
  }
  // Marks n bytes at dst as placed.
  void advance(uint64_t n);
};

class TcpConnection;

// Answers (acknowledgements, read responses) queued to one peer on all its connections: a
// peer that sends requests and never reads the answers may make them hold at most `limit`
// bytes. Past it the peer's connections stop reading requests until half has drained
// (bounded memory however many lanes the peer opens). Only answers count: requests are
// bounded by max_inflight_ops, and pausing on them could wait on the peer's own pause.
// Shared by the connections of one endpoint, on its I/O thread.
struct AnswerBudget {
  static constexpr size_t kDefaultLimit = 8 << 20;
  size_t bytes = 0;
  size_t limit = kDefaultLimit;
  std::vector<std::weak_ptr<TcpConnection>> stalled;  // stopped reading until bytes <= limit / 2
  bool full() const { return bytes > limit; }
  // Restarts the stalled connections once enough has drained.
  void on_drained();
};

enum class RxAction { kContinue, kPause };

// Frame semantics live in the endpoint; the connection only moves bytes.
class FrameHandler {
 public:
  virtual ~FrameHandler() = default;
  // A header arrived and was validated. Fill `sink` for its payload, or pause reading
  // until resume_reading() (flow control for unmatched messages).
  virtual RxAction on_header(TcpConnection& conn, const FrameHeader& h, PayloadSink& sink) = 0;
  // The first sink.prefix payload bytes arrived: fill `sink` for the rest. Segments it
  // scatters into may be kept in conn.segments().
  virtual void on_prefix(TcpConnection& conn, const FrameHeader& h, std::string_view prefix, PayloadSink& sink) = 0;
  // The frame's payload is fully placed (called at once for frames without payload).
  virtual void on_frame(TcpConnection& conn, const FrameHeader& h, const PayloadSink& sink, std::string_view text) = 0;
  // The connection failed or was closed by the peer. Not called for close_quietly().
  virtual void on_closed(TcpConnection& conn, const Status& why) = 0;
};

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
  // some of its bytes are being written right now; only closing the connection stops that.
  bool abandon(uint64_t op_id);
  // Stops placing payload bytes into the memory of local op `op_id` (the rest of the
  // frame is dropped). Returns false if the kernel is writing into that memory right now
  // (a direct read); only closing the connection stops that.
  bool release(uint64_t op_id);

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
  size_t writing_items_ = 0;  // items at the front of queue_ handed to async_write
  bool flush_posted_ = false;
};

}  // namespace dlslime::tcp
