// The core's op bookkeeping: core/pending_ops.h (ops by id with deadlines on a heap: expiry
// without scanning) and core/submission_queue.h (the hand-off to the I/O thread, the
// in-flight limit).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/pending_ops.h"
#include "core/submission_queue.h"

namespace dlslime {
namespace {

using Clock = std::chrono::steady_clock;
using Ops = PendingOps<std::string>;
using std::chrono::milliseconds;

const Clock::time_point t0{};

std::vector<uint64_t> expire_ids(Ops& ops, Clock::time_point now, Clock::time_point* next = nullptr) {
  std::vector<uint64_t> ids;
  const auto n = ops.expire(now, [&](uint64_t id, std::string&&) { ids.push_back(id); });
  if (next) *next = n;
  return ids;
}

TEST(PendingOps, InsertFindTake) {
  Ops ops;
  ASSERT_NE(ops.insert(1, "one", t0 + milliseconds(10)), nullptr);
  ASSERT_NE(ops.insert(2, "two"), nullptr);
  EXPECT_EQ(ops.insert(1, "again"), nullptr);  // an id is in the table once
  ASSERT_NE(ops.find(1), nullptr);
  EXPECT_EQ(*ops.find(1), "one");
  EXPECT_EQ(ops.size(), 2u);
  auto taken = ops.take(1);
  ASSERT_TRUE(taken);
  EXPECT_EQ(*taken, "one");
  EXPECT_FALSE(static_cast<bool>(ops.take(1)));  // a late second answer finds nothing
  EXPECT_EQ(ops.find(1), nullptr);
  EXPECT_EQ(ops.size(), 1u);
}

TEST(PendingOps, ExpireEndsExactlyThePassedDeadlinesEarliestFirst) {
  Ops ops;
  ops.insert(1, "a", t0 + milliseconds(30));
  ops.insert(2, "b", t0 + milliseconds(10));
  ops.insert(3, "c");  // no deadline: never expires
  ops.insert(4, "d", t0 + milliseconds(20));
  Clock::time_point next;
  EXPECT_TRUE(expire_ids(ops, t0 + milliseconds(5), &next).empty());
  EXPECT_EQ(next, t0 + milliseconds(10));
  EXPECT_EQ(expire_ids(ops, t0 + milliseconds(20), &next), (std::vector<uint64_t>{2, 4}));
  EXPECT_EQ(next, t0 + milliseconds(30));
  EXPECT_EQ(expire_ids(ops, t0 + milliseconds(100), &next), (std::vector<uint64_t>{1}));
  EXPECT_EQ(next, Ops::kNever);
  EXPECT_TRUE(ops.contains(3));
  EXPECT_EQ(ops.size(), 1u);
}

TEST(PendingOps, AnOpThatEndedEarlyIsNotExpiredAndItsEntryIsSkipped) {
  Ops ops;
  ops.insert(1, "a", t0 + milliseconds(10));
  ops.insert(2, "b", t0 + milliseconds(20));
  ASSERT_TRUE(static_cast<bool>(ops.take(1)));
  EXPECT_EQ(ops.next_deadline(), t0 + milliseconds(20));
  EXPECT_EQ(expire_ids(ops, t0 + milliseconds(50)), (std::vector<uint64_t>{2}));
  EXPECT_EQ(ops.heap_size(), 0u);
}

TEST(PendingOps, AnIdThatComesBackKeepsOnlyItsNewDeadline) {
  Ops ops;
  ops.insert(7, "first", t0 + milliseconds(10));
  ASSERT_TRUE(static_cast<bool>(ops.take(7)));
  ops.insert(7, "second", t0 + milliseconds(40));
  EXPECT_TRUE(expire_ids(ops, t0 + milliseconds(20)).empty());  // the old entry is stale
  EXPECT_EQ(*ops.find(7), "second");
  EXPECT_EQ(expire_ids(ops, t0 + milliseconds(40)), (std::vector<uint64_t>{7}));
}

TEST(PendingOps, TheCallbackMayChangeTheTable) {
  // Ending one op can end others (a lane closed fails every op on it) or start new ones.
  Ops ops;
  for (uint64_t id = 1; id <= 4; ++id) ops.insert(id, std::to_string(id), t0 + milliseconds(id));
  std::vector<uint64_t> seen;
  ops.expire(t0 + milliseconds(10), [&](uint64_t id, std::string&& op) {
    EXPECT_EQ(op, std::to_string(id));
    seen.push_back(id);
    if (id == 1) EXPECT_TRUE(static_cast<bool>(ops.take(3)));   // taken by the callback: not expired
    if (id == 2) ops.insert(9, "new", t0 + milliseconds(500));  // not due yet
  });
  EXPECT_EQ(seen, (std::vector<uint64_t>{1, 2, 4}));
  EXPECT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops.next_deadline(), t0 + milliseconds(500));
}

TEST(PendingOps, TheCallbackMayClearTheTable) {
  Ops ops;
  for (uint64_t id = 1; id <= 3; ++id) ops.insert(id, "x", t0 + milliseconds(id));
  std::vector<uint64_t> seen;
  const auto next = ops.expire(t0 + milliseconds(10), [&](uint64_t id, std::string&&) {
    seen.push_back(id);
    ops.clear();  // fail_all from inside a finish
  });
  EXPECT_EQ(seen, (std::vector<uint64_t>{1}));
  EXPECT_EQ(next, Ops::kNever);
  EXPECT_TRUE(ops.empty());
}

TEST(PendingOps, TheHeapStaysBoundedUnderChurn) {
  // Ops that finish long before their deadline must not pile up in the heap until the
  // deadlines come (30 s op_timeout at a million ops a second).
  Ops ops;
  for (uint64_t id = 1; id <= 100000; ++id) {
    ops.insert(id, "x", t0 + milliseconds(30000) + std::chrono::microseconds(id));
    if (id > 10) ASSERT_TRUE(static_cast<bool>(ops.take(id - 10)));  // 10 in flight at a time
  }
  EXPECT_EQ(ops.size(), 10u);
  EXPECT_LE(ops.heap_size(), 2 * 10u + 64 + 1);
  EXPECT_EQ(expire_ids(ops, t0 + milliseconds(60000)).size(), 10u);
}

TEST(PendingOps, OpsWithoutDeadlineCostNoHeapEntry) {
  PendingOps<std::unique_ptr<int>> ops;  // move-only payloads work
  for (uint64_t id = 1; id <= 1000; ++id) ops.insert(id, std::make_unique<int>(int(id)));
  EXPECT_EQ(ops.heap_size(), 0u);
  EXPECT_EQ(ops.next_deadline(), (PendingOps<std::unique_ptr<int>>::kNever));
  EXPECT_EQ(**ops.find(500), 500);
}

TEST(PendingOps, MovingTheTableOutLeavesAnEmptyOne) {
  // fail_all: everything in flight is taken at once and completed afterwards.
  Ops ops;
  ops.insert(1, "a", t0 + milliseconds(10));
  ops.insert(2, "b");
  Ops all = std::move(ops);
  ops.clear();
  EXPECT_TRUE(ops.empty());
  EXPECT_EQ(ops.next_deadline(), Ops::kNever);
  std::vector<uint64_t> ids;
  all.for_each([&](uint64_t id, const std::string&) { ids.push_back(id); });
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<uint64_t>{1, 2}));
}

}  // namespace
}  // namespace dlslime

// --- the submission hand-off and in-flight limit (core/submission_queue.h) ---------------

namespace dlslime {
namespace {

TEST(SubmissionQueue, OnlyThePushThatFindsNoDrainScheduledAsksForOneAndOrderIsKept) {
  SubmissionQueue<int> q;
  auto never = [] { FAIL() << "nothing was left for another drain"; };
  EXPECT_TRUE(q.push(1));
  EXPECT_FALSE(q.push(2));  // rides on the drain the first push asked for
  EXPECT_FALSE(q.push(3));
  std::vector<int> seen;
  bool asked_again = true;
  q.drain(
      [&](int& v) {
        seen.push_back(v);
        if (v == 1) asked_again = q.push(4);  // a continuation submitting from the drain
      },
      never);
  // The running drain takes it in its next round: no second wake-up of the consumer.
  EXPECT_FALSE(asked_again);
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_TRUE(q.push(5));  // the drain ended with the queue empty: the next push asks again
}

TEST(SubmissionQueue, ADrainYieldsAfterItsRoundsAndAsksForAnotherWhenItemsAreLeft) {
  // A continuation that always submits again must not hold the consumer thread for good.
  SubmissionQueue<int> q;
  EXPECT_TRUE(q.push(0));
  int handled = 0;
  int reposts = 0;
  auto resubmit = [&](int& v) {
    ++handled;
    EXPECT_FALSE(q.push(v + 1));  // scheduled throughout: no push posts
  };
  q.drain(resubmit, [&] { ++reposts; });
  EXPECT_EQ(handled, SubmissionQueue<int>::kMaxRounds);
  EXPECT_EQ(reposts, 1);  // one item is left, and the queue is still scheduled
  std::vector<int> seen;
  q.drain([&](int& v) { seen.push_back(v); }, [&] { ++reposts; });
  EXPECT_EQ(seen, (std::vector<int>{SubmissionQueue<int>::kMaxRounds}));
  EXPECT_EQ(reposts, 1);
  EXPECT_TRUE(q.push(99));
}

TEST(SubmissionQueue, AThrowingHandlerLeavesNoItemUnhandledOrHandledTwice) {
  SubmissionQueue<int> q;
  for (int i = 1; i <= 4; ++i) (void)q.push(i);
  std::vector<int> seen;
  int reposts = 0;
  EXPECT_THROW(q.drain(
                   [&](int& v) {
                     seen.push_back(v);
                     if (v == 2) throw std::runtime_error("start failed");
                   },
                   [&] { ++reposts; }),
               std::runtime_error);
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(reposts, 0);
  EXPECT_TRUE(q.push(5));  // settled before the rethrow: the next push asks for a drain
  seen.clear();
  q.drain([&](int& v) { seen.push_back(v); }, [&] { ++reposts; });
  EXPECT_EQ(seen, (std::vector<int>{5}));
}

TEST(InflightLimiter, RefusesPastTheLimitAndASlotGivesItsPlaceBackWhereverItEnds) {
  InflightLimiter limit(2);
  auto a = limit.acquire();
  auto b = limit.acquire();
  ASSERT_TRUE(a);
  ASSERT_TRUE(b);
  EXPECT_FALSE(limit.acquire());  // backpressure is a value: the caller fails the op
  EXPECT_EQ(limit.in_flight(), 2u);
  {
    InflightLimiter::Slot moved = std::move(a);  // travels with the op
    EXPECT_FALSE(a);
  }
  EXPECT_EQ(limit.in_flight(), 1u);
  EXPECT_TRUE(limit.acquire());  // a temporary: given back at once
  EXPECT_EQ(limit.in_flight(), 1u);
}

}  // namespace
}  // namespace dlslime
