// core/batch_planner.h: cutting a batch into chunks and striping it over lanes.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/batch_planner.h"
#include "dlslime/errors.h"

namespace dlslime {
namespace {

std::vector<Assignment> items_of(const std::vector<uint64_t>& lengths) {
  std::vector<Assignment> items;
  for (uint64_t n : lengths) items.push_back(Assignment{0, 0, 0, 0, n});
  return items;
}

// What every plan owes: each item's bytes covered exactly once, in order, per lane and
// piece counts that add up, no piece over chunk_size, and item order within each lane.
void check_plan(const std::vector<Assignment>& items, const BatchPlanConfig& cfg, const BatchPlan& plan) {
  ASSERT_EQ(plan.lanes.size(), cfg.lanes);
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges(items.size());
  uint64_t total = 0;
  uint32_t next_first = 0;
  for (uint16_t l = 0; l < cfg.lanes; ++l) {
    const LanePlan& lane = plan.lanes[l];
    EXPECT_EQ(lane.first, next_first);
    next_first += lane.count;
    uint64_t bytes = 0;
    const PlannedPiece* prev = nullptr;
    for (const PlannedPiece& p : plan.lane(l)) {
      ASSERT_LT(p.item, items.size());
      EXPECT_GT(p.length, 0u);
      EXPECT_LE(p.length, cfg.chunk_size);
      if (prev) {  // order kept on the lane
        EXPECT_TRUE(prev->item < p.item || (prev->item == p.item && prev->offset < p.offset));
      }
      prev = &p;
      ranges[p.item].emplace_back(p.offset, p.length);
      bytes += p.length;
    }
    EXPECT_EQ(lane.bytes, bytes);
    EXPECT_EQ(lane.cost, bytes + lane.count * cfg.piece_overhead);
    total += bytes;
  }
  EXPECT_EQ(next_first, plan.pieces.size());
  EXPECT_EQ(total, plan.total_bytes);
  for (size_t i = 0; i < items.size(); ++i) {  // exact coverage, no overlap, no gap
    auto& r = ranges[i];
    std::sort(r.begin(), r.end());
    uint64_t pos = 0;
    for (auto [off, len] : r) {
      EXPECT_EQ(off, pos) << "item " << i;
      pos = off + len;
    }
    EXPECT_EQ(pos, items[i].length) << "item " << i;
  }
}

TEST(BatchPlanner, ChunksAtChunkSizeAndCoversEveryByte) {
  const auto items = items_of({0, 1, 4096, 4097, 10000, 0, 3});
  BatchPlanConfig cfg{.chunk_size = 4096, .lanes = 1};
  BatchPlan plan;
  plan_batch(items, cfg, plan);
  check_plan(items, cfg, plan);
  // 1 | 4096 | 4096+1 | 4096+4096+1808 | 3: nine pieces, all on the one lane.
  EXPECT_EQ(plan.pieces.size(), 1u + 1 + 2 + 3 + 1);
  EXPECT_EQ(plan.total_bytes, 1u + 4096 + 4097 + 10000 + 3);
}

TEST(BatchPlanner, SmallBatchesStayOnTheFirstLane) {
  const auto items = items_of({100, 200, 300});
  BatchPlanConfig cfg{.chunk_size = 4096, .lanes = 4, .first_lane = 2, .piece_overhead = 32,
                      .stripe_min_bytes = 4096};
  BatchPlan plan;
  plan_batch(items, cfg, plan);
  check_plan(items, cfg, plan);
  EXPECT_EQ(plan.lanes[2].count, 3u);
  EXPECT_EQ(plan.lanes[2].bytes, 600u);
}

TEST(BatchPlanner, LargeBatchesAreBalancedOverTheLanes) {
  std::mt19937_64 rng(7);
  for (uint16_t lanes : {2, 3, 8, 16}) {
    std::vector<uint64_t> lengths;
    for (int i = 0; i < 500; ++i) lengths.push_back(rng() % 20000);
    const auto items = items_of(lengths);
    BatchPlanConfig cfg{.chunk_size = 8192, .lanes = lanes, .first_lane = static_cast<uint16_t>(lanes - 1),
                        .piece_overhead = 32, .stripe_min_bytes = 8192};
    BatchPlan plan;
    plan_batch(items, cfg, plan);
    check_plan(items, cfg, plan);
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const LanePlan& l : plan.lanes) {
      lo = std::min(lo, l.cost);
      hi = std::max(hi, l.cost);
    }
    // Greedy least-cost: no lane is ahead of another by more than one piece.
    EXPECT_LE(hi - lo, cfg.chunk_size + cfg.piece_overhead) << lanes << " lanes";
  }
}

TEST(BatchPlanner, OneLargeItemIsStripedChunkByChunk) {
  const auto items = items_of({1 << 20});
  BatchPlanConfig cfg{.chunk_size = 64 << 10, .lanes = 4, .stripe_min_bytes = 64 << 10};
  BatchPlan plan;
  plan_batch(items, cfg, plan);
  check_plan(items, cfg, plan);
  for (const LanePlan& l : plan.lanes) EXPECT_EQ(l.bytes, 256u << 10);
}

TEST(BatchPlanner, APlanIsReusedAcrossBatches) {
  BatchPlan plan;
  BatchPlanConfig cfg{.chunk_size = 1000, .lanes = 3, .stripe_min_bytes = 1};
  const auto big = items_of({50000, 7, 9999});
  plan_batch(big, cfg, plan);
  check_plan(big, cfg, plan);
  const auto small = items_of({5});
  plan_batch(small, cfg, plan);  // nothing of the previous plan is left
  check_plan(small, cfg, plan);
  EXPECT_EQ(plan.pieces.size(), 1u);
  const std::vector<Assignment> none;
  plan_batch(none, cfg, plan);
  check_plan(none, cfg, plan);
  EXPECT_TRUE(plan.pieces.empty());
}

TEST(BatchPlanner, ABadConfigIsAnError) {
  BatchPlan plan;
  const auto items = items_of({10});
  EXPECT_THROW(plan_batch(items, BatchPlanConfig{.chunk_size = 0}, plan), InvalidArgumentError);
  EXPECT_THROW(plan_batch(items, BatchPlanConfig{.chunk_size = 8, .lanes = 0}, plan), InvalidArgumentError);
  EXPECT_THROW(plan_batch(items, BatchPlanConfig{.chunk_size = 8, .lanes = 2, .first_lane = 2}, plan),
               InvalidArgumentError);
}

}  // namespace
}  // namespace dlslime
