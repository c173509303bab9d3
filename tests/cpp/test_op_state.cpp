#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/op_state.h"
#include "dlslime/future.h"

using namespace dlslime;
using namespace std::chrono_literals;

TEST(OpState, FirstCompletionWins) {
  auto s = std::make_shared<OpState>(OpKind::kWrite);
  EXPECT_TRUE(s->complete(Status::timeout("late")));
  EXPECT_FALSE(s->complete(Status::ok()));
  Future f(s);
  EXPECT_TRUE(f.done());
  EXPECT_EQ(f.wait(), 402);
  EXPECT_EQ(f.message(), "late");
}

TEST(OpState, PartsCompleteWithTheFirstError) {
  auto s = std::make_shared<OpState>(OpKind::kRead, 3);
  EXPECT_FALSE(s->finish_part(Status::ok(), 10));
  EXPECT_FALSE(s->finish_part(Status::out_of_bounds("piece 1"), 0));
  EXPECT_FALSE(s->done());
  EXPECT_TRUE(s->finish_part(Status::unknown_handle("piece 2"), 0));
  Future f(s);
  EXPECT_EQ(f.status(), static_cast<int>(StatusCode::kOutOfBounds));
  EXPECT_EQ(f.message(), "piece 1");
  EXPECT_EQ(f.nbytes(), 10u);
}

TEST(OpState, WaitForTimesOutThenSeesCompletion) {
  auto s = std::make_shared<OpState>(OpKind::kRecv);
  Future f(s);
  EXPECT_FALSE(f.wait_for(20ms).has_value());
  EXPECT_FALSE(f.done());
  std::thread t([s] { s->complete(Status::ok(), 5); });
  EXPECT_EQ(f.wait_for(10s), std::optional<int>(0));
  t.join();
  EXPECT_EQ(f.nbytes(), 5u);
}

TEST(OpState, ContinuationRunsOnceAfterCompletion) {
  auto s = std::make_shared<OpState>(OpKind::kSend);
  int calls = 0;
  s->on_complete([&](const OpState& st) {
    ++calls;
    EXPECT_TRUE(st.done());
  });
  s->complete(Status::ok());
  s->complete(Status::failed("again"));
  EXPECT_EQ(calls, 1);
  s->on_complete([&](const OpState&) { ++calls; });  // already done: runs at once
  EXPECT_EQ(calls, 2);
}
