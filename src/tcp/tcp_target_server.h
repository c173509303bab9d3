#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/memory_registry.h"
#include "dlslime/status.h"
#include "tcp/frame_codec.h"
#include "tcp/payload_sink.h"
#include "tcp/tcp_connection.h"

namespace dlslime {

// The target side of the peer's one-sided ops: places its write frames into local
// regions and acknowledges each lane's frames of an op once, and answers its read
// requests from local regions. Every piece is checked against the local region table
// first; a bad one fails its frame alone (the op's acknowledgement or answer reports
// the error) and nothing of that frame is placed. Threads: the I/O thread only.
class TargetServer {
 public:
  explicit TargetServer(const MemoryRegistry& regions) : regions_(regions) {}

  // A write frame's piece list arrived (sink.prefix bytes): sets `sink` for its data.
  void on_write_prefix(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view list,
                       tcp::PayloadSink& sink);
  // A write frame was placed (or drained): the lane's last one is acknowledged.
  void on_write_frame(tcp::TcpConnection& conn, const tcp::FrameHeader& h);
  // Answers a read request (its piece list): one frame with all pieces' bytes, or the
  // first bad piece's error.
  void answer_read(tcp::TcpConnection& conn, const tcp::FrameHeader& h, std::string_view list);
  // The peer is gone: forgets the errors of its writes.
  void clear() { inbound_writes_.clear(); }

  // Queues an acknowledgement (kWriteAck, kSendAck) of the peer's op `op_id` on `conn`.
  // A successful message acknowledgement still queued is superseded by the next one
  // (they are cumulative), so a burst of messages costs one frame.
  static void ack(tcp::TcpConnection& conn, tcp::FrameType type, uint64_t op_id, const Status& status);

 private:
  // The first error of the write frames of one op arriving on one connection (they are
  // contiguous); no entry while they all succeed.
  struct InboundWrite {
    uint64_t op_id = 0;
    Status status;
  };
  template <class OverLimit>
  Status resolve_pieces(std::string_view list, uint64_t first, uint64_t limit,
                        std::vector<tcp::PayloadSegment>& segments, RegionUses& uses, uint64_t* total,
                        OverLimit over_limit) const;

  const MemoryRegistry& regions_;
  std::unordered_map<const tcp::TcpConnection*, InboundWrite> inbound_writes_;
  std::vector<tcp::PayloadSegment> read_scratch_;  // answer_read's resolved pieces (capacity reused)
};

}  // namespace dlslime
