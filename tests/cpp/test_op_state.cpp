#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
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

// --- cancellation (Future::cancel) ------------------------------------------------------

namespace {

// A transport's side of cancellation, reduced to its rule: it withdraws the op while it
// still holds it (`held`), completing it with the user's cancellation.
class FakeTransport final : public OpCanceller {
 public:
  bool held = true;
  uint64_t asked_for = 0;
  int calls = 0;
  bool cancel_op(OpState& op, uint64_t op_id) override {
    ++calls;
    asked_for = op_id;
    if (!held) return false;
    held = false;
    return op.complete(OpState::cancelled_by_user());
  }
};

}  // namespace

TEST(OpStateCancel, WithoutACancellerItIsRefused) {
  auto s = std::make_shared<OpState>(OpKind::kWrite);
  Future f(s);
  EXPECT_FALSE(f.cancel());
  EXPECT_FALSE(f.done());
  EXPECT_THROW(Future().cancel(), std::exception);
}

TEST(OpStateCancel, ACancelledOpEndsCancelledByTheUser) {
  auto transport = std::make_shared<FakeTransport>();
  auto s = std::make_shared<OpState>(OpKind::kRead);
  s->set_canceller(transport, 42);
  Future f(s);
  EXPECT_TRUE(f.cancel());
  EXPECT_EQ(transport->asked_for, 42u);
  EXPECT_TRUE(f.done());
  EXPECT_EQ(f.status(), static_cast<int>(StatusCode::kCancelled));
  EXPECT_NE(f.message().find("cancelled by the user"), std::string::npos) << f.message();
  // Once ended, cancel() is refused without asking the transport, and the status stays.
  EXPECT_FALSE(f.cancel());
  EXPECT_EQ(transport->calls, 1);
  EXPECT_FALSE(s->complete(Status::ok()));
  EXPECT_EQ(f.status(), static_cast<int>(StatusCode::kCancelled));
}

TEST(OpStateCancel, AfterCompletionItIsRefusedAndTheStatusStays) {
  auto transport = std::make_shared<FakeTransport>();
  auto s = std::make_shared<OpState>(OpKind::kWrite);
  s->set_canceller(transport, 1);
  s->complete(Status::ok(), 8);
  Future f(s);
  EXPECT_FALSE(f.cancel());
  EXPECT_EQ(transport->calls, 0);
  EXPECT_EQ(f.status(), 0);
  EXPECT_EQ(f.nbytes(), 8u);
}

TEST(OpStateCancel, ATransportThatCannotWithdrawLeavesTheOpRunning) {
  auto transport = std::make_shared<FakeTransport>();
  transport->held = false;  // e.g. its bytes are on the wire
  auto s = std::make_shared<OpState>(OpKind::kSend);
  s->set_canceller(transport, 7);
  Future f(s);
  EXPECT_FALSE(f.cancel());
  EXPECT_FALSE(f.done());
  s->complete(Status::ok());
  EXPECT_EQ(f.wait(), 0);
}

TEST(OpStateCancel, AGoneTransportIsRefusedAndTheOpDoesNotKeepItAlive) {
  auto transport = std::make_shared<FakeTransport>();
  std::weak_ptr<FakeTransport> weak = transport;
  auto s = std::make_shared<OpState>(OpKind::kRecv);
  s->set_canceller(transport, 3);
  transport.reset();
  EXPECT_TRUE(weak.expired()) << "the op kept its transport alive";
  EXPECT_FALSE(Future(s).cancel());
}

// A canceller that claims success while another completion won must not make cancel()
// claim the op was withdrawn.
TEST(OpStateCancel, TrueOnlyIfTheOpEndedCancelled) {
  struct Liar final : OpCanceller {
    bool cancel_op(OpState& op, uint64_t) override {
      op.complete(Status::ok());
      return true;
    }
  };
  auto liar = std::make_shared<Liar>();
  auto s = std::make_shared<OpState>(OpKind::kWrite);
  s->set_canceller(liar, 0);
  EXPECT_FALSE(Future(s).cancel());
  EXPECT_EQ(Future(s).status(), 0);
}

// cancel() against the real completion, from two threads, many times: exactly one
// outcome each time, and cancel() is true exactly when the op ended cancelled.
TEST(OpStateCancel, RacingTheRealCompletionHasExactlyOneOutcome) {
  // The transport's table, as a transport keeps it: whoever takes the op out ends it.
  struct Racing final : OpCanceller {
    std::atomic<bool> held{true};
    bool cancel_op(OpState& op, uint64_t) override {
      if (!held.exchange(false)) return false;
      return op.complete(OpState::cancelled_by_user());
    }
  };
  int cancelled = 0, completed = 0;
  for (int round = 0; round < 2000; ++round) {
    auto transport = std::make_shared<Racing>();
    auto s = std::make_shared<OpState>(OpKind::kWrite);
    s->set_canceller(transport, round);
    std::atomic<int> continuation_runs{0};
    s->on_complete([&](const OpState&) { continuation_runs.fetch_add(1); });
    std::atomic<bool> go{false};
    std::thread io([&] {
      while (!go.load()) {
      }
      if (transport->held.exchange(false)) s->complete(Status::ok(), 1);
    });
    go.store(true);
    const bool withdrawn = Future(s).cancel();
    io.join();
    ASSERT_TRUE(s->done());
    ASSERT_EQ(continuation_runs.load(), 1);
    if (withdrawn) {
      ++cancelled;
      ASSERT_EQ(s->status().code(), StatusCode::kCancelled);
      ASSERT_EQ(s->nbytes(), 0u);
    } else {
      ++completed;
      ASSERT_EQ(s->status().code(), StatusCode::kSuccess);
    }
  }
  EXPECT_EQ(cancelled + completed, 2000);
}

// From inside a continuation (as on a transport's I/O thread) and from inside a
// CompletionScope: no deadlock, and the answer is known when cancel() returns.
TEST(OpStateCancel, FromAContinuationAndInsideACompletionScope) {
  auto transport = std::make_shared<FakeTransport>();
  auto other = std::make_shared<OpState>(OpKind::kRecv);
  other->set_canceller(transport, 9);
  auto first = std::make_shared<OpState>(OpKind::kRecv);
  std::optional<bool> from_continuation;
  first->on_complete([&](const OpState&) { from_continuation = Future(other).cancel(); });
  int other_ran = 0;
  other->on_complete([&](const OpState&) { ++other_ran; });
  {
    CompletionScope scope;  // what an I/O thread's handler has open
    first->complete(Status::ok());
    EXPECT_FALSE(from_continuation.has_value());  // deferred to the scope's end
  }
  ASSERT_TRUE(from_continuation.has_value());
  EXPECT_TRUE(*from_continuation);
  EXPECT_TRUE(other->done());
  EXPECT_EQ(other_ran, 1);
}

TEST(OpStateCancel, ForwardedToTheInnerOpOfAWrapper) {
  auto transport = std::make_shared<FakeTransport>();
  auto inner = std::make_shared<OpState>(OpKind::kWrite);
  inner->set_canceller(transport, 5);
  auto outer = std::make_shared<OpState>(OpKind::kWrite);
  auto keep = forward_cancel(*outer, inner);
  inner->on_complete([outer, keep](const OpState& done) { outer->complete(done.status(), done.nbytes()); });
  {
    CompletionScope scope;  // the inner continuation is deferred: the outer ends at once anyway
    EXPECT_TRUE(Future(outer).cancel());
    EXPECT_TRUE(outer->done());
  }
  EXPECT_EQ(outer->status().code(), StatusCode::kCancelled);
  EXPECT_EQ(inner->status().code(), StatusCode::kCancelled);
  // An inner op that cannot be withdrawn: the wrapper is not either.
  auto inner2 = std::make_shared<OpState>(OpKind::kWrite);
  auto outer2 = std::make_shared<OpState>(OpKind::kWrite);
  auto keep2 = forward_cancel(*outer2, inner2);  // inner2 has no canceller
  EXPECT_FALSE(Future(outer2).cancel());
  EXPECT_FALSE(outer2->done());
}
