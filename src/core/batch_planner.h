#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dlslime/endpoint.h"

namespace dlslime {

// How a batch of one-sided items (read/write assignments) is cut and spread: every item
// is cut into pieces of at most chunk_size bytes, and the pieces are striped over `lanes`
// (TCP connections; RDMA queue pairs), each to the lane with the least cost so far
// (cost = bytes + piece_overhead per piece: a frame header, a work request). A batch
// smaller than stripe_min_bytes stays on first_lane, so that it costs one completion.
struct BatchPlanConfig {
  uint64_t chunk_size = 0;  // > 0
  uint16_t lanes = 1;       // >= 1
  uint16_t first_lane = 0;  // < lanes: small batches go here, and ties are broken from here
  uint64_t piece_overhead = 0;
  uint64_t stripe_min_bytes = 0;
};

// One piece: bytes [offset, offset + length) of item `item` (offsets are within the
// item: its local and remote ranges both start at item's own offsets).
struct PlannedPiece {
  uint32_t item;
  uint64_t offset;
  uint64_t length;
};

struct LanePlan {
  uint32_t first = 0;  // index of the lane's first piece in BatchPlan::pieces
  uint32_t count = 0;  // its pieces
  uint64_t bytes = 0;  // their bytes
  uint64_t cost = 0;   // bytes + piece_overhead per piece
};

// The result, grouped by lane: lane l's pieces are pieces[lanes[l].first, +count), in
// item order (so the bytes of one lane go out in the order the items were given). Reused
// across plan_batch() calls, a plan allocates nothing once its vectors have grown.
struct BatchPlan {
  std::vector<PlannedPiece> pieces;
  std::vector<LanePlan> lanes;
  uint64_t total_bytes = 0;

  std::span<const PlannedPiece> lane(uint16_t l) const {
    return std::span<const PlannedPiece>(pieces).subspan(lanes[l].first, lanes[l].count);
  }
  // Gives back the memory of an unusually large plan (kept plans stay small).
  void trim(size_t keep_pieces);

 private:
  friend void plan_batch(std::span<const Assignment>, const BatchPlanConfig&, BatchPlan&);
  std::vector<uint16_t> lane_of_;  // scratch: each piece's lane, in item order
};

// Plans `items` into `out` (replacing what it held). Throws InvalidArgumentError for a
// config outside its bounds, or more pieces than fit in 32 bits.
void plan_batch(std::span<const Assignment> items, const BatchPlanConfig& config, BatchPlan& out);

}  // namespace dlslime
