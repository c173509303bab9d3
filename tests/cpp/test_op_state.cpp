#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

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

// Continuations of ops completed inside a CompletionScope run when the outermost scope
// closes (after the completing code's bookkeeping), waiters see the completion at once,
// and continuations that complete further ops have theirs run too.
TEST(OpState, ContinuationsDeferredToTheOutermostScope) {
  auto a = std::make_shared<OpState>(OpKind::kWrite);
  auto b = std::make_shared<OpState>(OpKind::kWrite);
  std::vector<std::string> order;
  a->on_complete([&](const OpState&) {
    order.push_back("a");
    b->complete(Status::ok());  // completes another op from inside a continuation
  });
  b->on_complete([&](const OpState&) { order.push_back("b"); });
  {
    CompletionScope outer;
    {
      CompletionScope inner;
      a->complete(Status::ok());
      EXPECT_TRUE(a->done());  // waiters are not delayed
    }
    order.push_back("bookkeeping");
    EXPECT_EQ(order, std::vector<std::string>{"bookkeeping"});
  }
  EXPECT_EQ(order, (std::vector<std::string>{"bookkeeping", "a", "b"}));
}

TEST(OpState, ThrowingContinuationDoesNotEscapeTheScope) {
  auto s = std::make_shared<OpState>(OpKind::kRecv);
  int later = 0;
  s->on_complete([](const OpState&) { throw std::runtime_error("boom"); });
  auto t = std::make_shared<OpState>(OpKind::kRecv);
  t->on_complete([&](const OpState&) { ++later; });
  {
    CompletionScope scope;
    s->complete(Status::ok());
    t->complete(Status::ok());
  }
  EXPECT_EQ(later, 1);
}
