#pragma once

#include <cstddef>
#include <cstdint>

namespace dlslime::tcp {

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

}  // namespace dlslime::tcp
