// Completion without blocking (issue 24): Future::on_complete, wait_any and wait_all, on
// bare op states and on real TCP loopback transfers. Nothing here synchronises by
// sleeping: every wait is on a condition with a deadline.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/op_state.h"
#include "dlslime/errors.h"
#include "dlslime/future.h"
#ifndef DLSLIME_TEST_WITHOUT_TCP
#include "dlslime/tcp_endpoint.h"
#endif

using namespace dlslime;
using namespace std::chrono_literals;

namespace {

// Counts events from any thread; a test waits for a count with a deadline. add() notifies
// under the lock: the waiter may destroy the Counter as soon as it sees the count.
class Counter {
 public:
  void add() {
    std::lock_guard lock(mu_);
    ++n_;
    cv_.notify_all();
  }
  bool wait_for(int n, std::chrono::seconds limit = 10s) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return n_ >= n; });
  }
  int count() {
    std::lock_guard lock(mu_);
    return n_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_ = 0;
};

Future pending(OpKind kind = OpKind::kRecv) { return Future(std::make_shared<OpState>(kind)); }

}  // namespace

TEST(FutureOnComplete, AfterCompletionRunsAtOnceOnTheCallingThread) {
  Future f = pending();
  f.state()->complete(Status::ok(), 7);
  int calls = 0;
  std::thread::id ran_on;
  f.on_complete([&](const Future& done) {
    ++calls;
    ran_on = std::this_thread::get_id();
    EXPECT_TRUE(done.done());
    EXPECT_EQ(done.nbytes(), 7u);
    EXPECT_EQ(done.state(), f.state());
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(FutureOnComplete, BeforeCompletionRunsOnceOnTheCompletingThreadWithItsResult) {
  Future f = pending();
  Counter ran;
  std::mutex mu;
  int status = -1;
  uint64_t nbytes = 0;
  std::string message;
  std::thread::id ran_on;
  f.on_complete([&](const Future& done) {
    std::lock_guard lock(mu);
    status = done.status();
    nbytes = done.nbytes();
    message = done.message();
    ran_on = std::this_thread::get_id();
    ran.add();
  });
  EXPECT_EQ(ran.count(), 0);
  std::thread::id completer_id;
  std::thread completer([&] {
    completer_id = std::this_thread::get_id();
    f.state()->complete(Status::out_of_bounds("past the end"), 3);
    f.state()->complete(Status::ok(), 99);  // a second completion is ignored
  });
  completer.join();
  ASSERT_TRUE(ran.wait_for(1));
  std::lock_guard lock(mu);
  EXPECT_EQ(ran.count(), 1);
  EXPECT_EQ(status, static_cast<int>(StatusCode::kOutOfBounds));
  EXPECT_EQ(message, "past the end");
  EXPECT_EQ(nbytes, 3u);
  EXPECT_EQ(ran_on, completer_id);
}

TEST(FutureOnComplete, SeveralCallbacksRunInRegistrationOrder) {
  Future f = pending();
  Future copy = f;  // a copy refers to the same op
  std::vector<int> order;
  f.on_complete([&](const Future&) { order.push_back(1); });
  copy.on_complete([&](const Future&) { order.push_back(2); });
  f.on_complete([&](const Future&) { order.push_back(3); });
  f.state()->complete(Status::ok());
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  f.on_complete([&](const Future&) { order.push_back(4); });  // late: at once, after the others
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3, 4}));
}

// The library's own continuation (PeerAgent's named ops register one through OpState) and
// a user's: neither replaces the other.
TEST(FutureOnComplete, TheInternalContinuationAndAUserCallbackBothRun) {
  Future f = pending(OpKind::kWrite);
  std::vector<std::string> order;
  f.state()->on_complete([&](const OpState& s) {
    EXPECT_TRUE(s.done());
    order.push_back("internal");
  });
  f.on_complete([&](const Future&) { order.push_back("user"); });
  {
    CompletionScope scope;  // as on an I/O thread: both run when the handler's scope closes
    f.state()->complete(Status::ok());
    EXPECT_TRUE(order.empty());
  }
  EXPECT_EQ(order, (std::vector<std::string>{"internal", "user"}));
}

TEST(FutureOnComplete, AThrowingCallbackDoesNotStopTheOthers) {
  Future f = pending();
  Future g = pending();
  std::vector<int> ran;
  f.on_complete([&](const Future&) { ran.push_back(1); });
  f.on_complete([](const Future&) { throw std::runtime_error("user bug"); });
  f.on_complete([](const Future&) { throw 42; });  // not even a std::exception
  f.on_complete([&](const Future&) { ran.push_back(2); });
  g.on_complete([&](const Future&) { ran.push_back(3); });
  {
    CompletionScope scope;
    EXPECT_NO_THROW(f.state()->complete(Status::ok()));
    EXPECT_NO_THROW(g.state()->complete(Status::ok()));
  }
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3}));
  // Without a scope (the completing thread runs them inline) and when already done.
  Future h = pending();
  h.on_complete([](const Future&) { throw std::runtime_error("inline"); });
  h.on_complete([&](const Future&) { ran.push_back(4); });
  EXPECT_NO_THROW(h.state()->complete(Status::ok()));
  EXPECT_NO_THROW(h.on_complete([](const Future&) { throw std::runtime_error("late"); }));
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3, 4}));
}

TEST(FutureOnComplete, AnEmptyFutureOrCallbackIsInvalidArgument) {
  Future empty;
  EXPECT_THROW(empty.on_complete([](const Future&) {}), InvalidArgumentError);
  EXPECT_THROW(pending().on_complete(nullptr), InvalidArgumentError);
  EXPECT_THROW(wait_any({pending(), empty}, 1ms), InvalidArgumentError);
  EXPECT_THROW(wait_all({empty}, 1ms), InvalidArgumentError);
  EXPECT_THROW(wait_all({empty}), InvalidArgumentError);
}

// A callback holds its op weakly: an op nobody completes is still freed.
TEST(FutureOnComplete, ACallbackDoesNotKeepItsOpAlive) {
  std::weak_ptr<OpState> weak;
  {
    Future f = pending();
    weak = f.state();
    f.on_complete([](const Future&) {});
  }
  EXPECT_TRUE(weak.expired());
}

TEST(WaitAny, ReturnsTheIndexOfTheOpThatCompleted) {
  std::vector<Future> fs{pending(), pending(), pending()};
  std::thread completer([s = fs[2].state()] { s->complete(Status::ok()); });
  EXPECT_EQ(wait_any(fs, 10s), std::optional<size_t>(2));
  completer.join();
  EXPECT_FALSE(fs[0].done());
  EXPECT_FALSE(fs[1].done());
  // The no-limit form.
  std::thread second([s = fs[1].state()] { s->complete(Status::failed("lost")); });
  second.join();
  EXPECT_EQ(wait_any(std::vector<Future>{fs[0], fs[1]}), 1u);
}

TEST(WaitAny, TakesTheLowestIndexAlreadyDone) {
  std::vector<Future> fs{pending(), pending(), pending()};
  fs[2].state()->complete(Status::ok());
  fs[1].state()->complete(Status::cancelled("shut down"));  // any status counts as ended
  EXPECT_EQ(wait_any(fs, 0ms), std::optional<size_t>(1));
}

TEST(WaitAny, TimesOutAndCanWaitAgain) {
  std::vector<Future> fs{pending(), pending()};
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(wait_any(fs, 30ms), std::nullopt);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 30ms);
  EXPECT_EQ(wait_any(fs, 0ms), std::nullopt);
  // Repeated timed-out waits leave nothing behind that breaks a later completion, and the
  // op's own callbacks still run once.
  for (int i = 0; i < 20; ++i) EXPECT_EQ(wait_any(fs, 1ms), std::nullopt);
  int calls = 0;
  fs[0].on_complete([&](const Future&) { ++calls; });
  fs[0].state()->complete(Status::ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(wait_any(fs, 1s), std::optional<size_t>(0));
}

TEST(WaitAny, AnEmptyListIsInvalidArgument) {
  EXPECT_THROW(wait_any(std::vector<Future>{}, 1s), InvalidArgumentError);
  EXPECT_THROW(wait_any(std::vector<Future>{}), InvalidArgumentError);
}

TEST(WaitAll, TimesOutWhileOneRunsThenSeesAllDone) {
  std::vector<Future> fs{pending(), pending(), pending()};
  fs[0].state()->complete(Status::ok());
  fs[2].state()->complete(Status::ok());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(wait_all(fs, 30ms));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 30ms);
  EXPECT_FALSE(wait_all(fs, 0ms));
  std::thread completer([s = fs[1].state()] { s->complete(Status::timeout("late")); });
  EXPECT_TRUE(wait_all(fs, 10s));
  completer.join();
  wait_all(fs);  // the no-limit form returns at once now
  EXPECT_TRUE(wait_all(std::vector<Future>{}, 0ms));  // nothing to wait for
  wait_all(std::vector<Future>{});
}

#ifndef DLSLIME_TEST_WITHOUT_TCP

namespace {

struct Pair {
  TcpEndpoint a{"127.0.0.1", 0};
  TcpEndpoint b{"127.0.0.1", 0};
  Pair() {
    a.connect(b.endpoint_info());
    b.connect(a.endpoint_info());
  }
};

Chunk chunk_of(std::vector<char>& buf) { return {reinterpret_cast<uintptr_t>(buf.data()), 0, buf.size()}; }

}  // namespace

// A real transfer: the callback registered before the data arrives runs once, on a
// library thread, after the bytes are in place; wait_any/wait_all see the same ops.
TEST(FutureOnCompleteTcp, RecvCallbackRunsOnALibraryThreadWithTheMessage) {
  Pair p;
  std::vector<char> inbox(64, 0), never(8, 0), msg{'h', 'e', 'l', 'l', 'o'};
  Future idle = p.b.recv(chunk_of(never));  // matched only by a second send: stays pending
  Future recv = p.a.recv(chunk_of(inbox));
  Counter ran;
  std::mutex mu;
  std::thread::id ran_on;
  int status = -1;
  uint64_t nbytes = 0;
  std::string seen;
  recv.on_complete([&](const Future& done) {
    std::lock_guard lock(mu);
    ran_on = std::this_thread::get_id();
    status = done.status();
    nbytes = done.nbytes();
    seen.assign(inbox.data(), done.nbytes());
    ran.add();
  });
  EXPECT_EQ(wait_any({idle, recv}, 0ms), std::nullopt);
  Future send = p.b.send(chunk_of(msg));
  EXPECT_EQ(wait_any({idle, recv}, 10s), std::optional<size_t>(1));
  EXPECT_TRUE(wait_all({send, recv}, 10s));
  EXPECT_FALSE(wait_all({send, recv, idle}, 20ms));
  ASSERT_TRUE(ran.wait_for(1));
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(status, 0);
    EXPECT_EQ(nbytes, 5u);
    EXPECT_EQ(seen, "hello");
    EXPECT_NE(ran_on, std::this_thread::get_id());
  }
  // Shutting down ends the idle recv with an error: its callback runs then.
  Counter idle_ran;
  int idle_status = 0;
  idle.on_complete([&](const Future& done) {
    idle_status = done.status();
    idle_ran.add();
  });
  p.b.shutdown();
  ASSERT_TRUE(idle_ran.wait_for(1));
  EXPECT_EQ(idle_status, static_cast<int>(StatusCode::kCancelled));
  EXPECT_EQ(ran.count(), 1);
}

// A callback may submit: each completed recv posts the next one, from the I/O thread.
TEST(FutureOnCompleteTcp, ACallbackMaySubmitTheNextOp) {
  Pair p;
  std::vector<char> first(16, 0), second(16, 0), one{'1'}, two{'2', '2'};
  Counter ran;
  std::mutex mu;
  Future next;
  Future recv = p.a.recv(chunk_of(first));
  recv.on_complete([&](const Future&) {
    Future f = p.a.recv(chunk_of(second));
    {
      std::lock_guard lock(mu);
      next = f;
    }
    ran.add();
  });
  Future s1 = p.b.send(chunk_of(one));
  ASSERT_TRUE(ran.wait_for(1));
  Future s2 = p.b.send(chunk_of(two));
  Future posted;
  {
    std::lock_guard lock(mu);
    posted = next;
  }
  ASSERT_TRUE(posted.valid());
  ASSERT_EQ(posted.wait_for(10s), std::optional<int>(0));
  EXPECT_EQ(posted.nbytes(), 2u);
  EXPECT_EQ(std::string(second.data(), 2), "22");
  EXPECT_TRUE(wait_all({s1, s2}, 10s));
}

#endif  // DLSLIME_TEST_WITHOUT_TCP
