#include "core/batch_planner.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "dlslime/errors.h"

namespace dlslime {

void BatchPlan::trim(size_t keep_pieces) {
  if (pieces.capacity() > keep_pieces) std::vector<PlannedPiece>().swap(pieces);
  if (lane_of_.capacity() > keep_pieces) std::vector<uint16_t>().swap(lane_of_);
}

void plan_batch(std::span<const Assignment> items, const BatchPlanConfig& config, BatchPlan& out) {
  if (config.chunk_size == 0) throw InvalidArgumentError("batch plan: chunk_size must be > 0");
  if (config.lanes == 0 || config.first_lane >= config.lanes) {
    throw InvalidArgumentError(
        fmt::format("batch plan: first lane {} of {} lanes is out of range", config.first_lane, config.lanes));
  }
  const uint64_t chunk = config.chunk_size;
  uint64_t total = 0, count = 0;
  for (const Assignment& a : items) {
    total += a.length;
    count += a.length / chunk + (a.length % chunk != 0);
  }
  if (count > std::numeric_limits<uint32_t>::max() || items.size() > std::numeric_limits<uint32_t>::max()) {
    throw InvalidArgumentError(fmt::format("batch plan: {} pieces, more than 2^32", count));
  }
  out.total_bytes = total;
  out.lanes.assign(config.lanes, LanePlan{});
  out.lane_of_.resize(count);
  out.pieces.resize(count);

  // Pass 1: each piece's lane, in item order (greedy least cost; ties from first_lane).
  const bool stripe = config.lanes > 1 && total >= config.stripe_min_bytes;
  size_t k = 0;
  for (const Assignment& a : items) {
    for (uint64_t done = 0; done < a.length; done += chunk) {
      const uint64_t n = std::min(chunk, a.length - done);
      uint16_t lane = config.first_lane;
      if (stripe) {
        for (uint16_t j = 1; j < config.lanes; ++j) {
          const auto cand = static_cast<uint16_t>((config.first_lane + j) % config.lanes);
          if (out.lanes[cand].cost < out.lanes[lane].cost) lane = cand;
        }
      }
      LanePlan& l = out.lanes[lane];
      l.cost += n + config.piece_overhead;
      l.bytes += n;
      ++l.count;
      out.lane_of_[k++] = lane;
    }
  }
  // Pass 2: place the pieces grouped by lane (a counting sort, stable: item order kept).
  uint32_t first = 0;
  for (LanePlan& l : out.lanes) {
    l.first = first;
    first += l.count;
  }
  std::vector<LanePlan>& fill = out.lanes;  // count doubles as the fill cursor below
  for (LanePlan& l : fill) l.count = 0;
  k = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const uint64_t length = items[i].length;
    for (uint64_t done = 0; done < length; done += chunk) {
      LanePlan& l = fill[out.lane_of_[k++]];
      out.pieces[l.first + l.count++] = {static_cast<uint32_t>(i), done, std::min(chunk, length - done)};
    }
  }
}

}  // namespace dlslime
