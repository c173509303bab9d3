// The core of notifications, without a transport: the fence that orders them after the
// writes before them (core/notify_fence.h) and the inbox that holds them at the receiver
// (core/notification_inbox.h). Every transport's behaviour is in the conformance suite.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/notification_inbox.h"
#include "core/notify_fence.h"
#include "core/op_state.h"

using namespace dlslime;
using namespace std::chrono_literals;

namespace {

// A fence whose "transport" records what it was handed and completes nothing by itself.
struct Recorder {
  std::vector<std::string> sent;
  std::vector<std::shared_ptr<OpState>> states;
  std::shared_ptr<NotifyFence> fence = std::make_shared<NotifyFence>([this](OpRequest r) {
    sent.push_back(*r.notification);
    states.push_back(std::make_shared<OpState>(r.kind));
    return Future(states.back());
  });
  // A write the test completes by hand.
  std::shared_ptr<OpState> write() {
    auto w = std::make_shared<OpState>(OpKind::kWrite);
    fence->submit_write(OpRequest{}, [&](OpRequest) { return Future(w); });
    return w;
  }
  Future notify(const std::string& bytes) {
    OpRequest r;
    r.kind = OpKind::kSendNotify;
    r.notification = bytes;
    return fence->send_notify(std::move(r));
  }
};

}  // namespace

TEST(NotifyFence, ANotificationWaitsForEveryEarlierWriteAndNotForLaterOnes) {
  Recorder t;
  auto w1 = t.write();
  Future a = t.notify("a");
  auto w2 = t.write();  // after a: a does not wait for it
  Future b = t.notify("b");
  EXPECT_TRUE(t.sent.empty());
  w2->complete(Status::ok());
  EXPECT_TRUE(t.sent.empty()) << "b went before a, or before w1";
  w1->complete(Status::ok());
  EXPECT_EQ(t.sent, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(a.done());  // until the transport says the peer holds it
  t.states[0]->complete(Status::ok());
  EXPECT_TRUE(a.done());
  EXPECT_EQ(a.status(), 0);
}

TEST(NotifyFence, ANotificationWithNoWriteInFlightGoesAtOnceAndOrderHolds) {
  Recorder t;
  Future a = t.notify("a");
  EXPECT_EQ(t.sent, std::vector<std::string>{"a"});
  auto w = t.write();
  Future b = t.notify("b");
  Future c = t.notify("c");
  EXPECT_EQ(t.sent.size(), 1u);
  w->complete(Status::timeout("the write's deadline"));  // a failed earlier write: still over
  EXPECT_EQ(t.sent, (std::vector<std::string>{"a", "b", "c"}));
}

TEST(NotifyFence, AFailedCarryingWriteSendsNoNotificationAndItsFutureHasTheWritesError) {
  Recorder t;
  std::shared_ptr<OpState> carried;
  OpRequest r;
  r.kind = OpKind::kWrite;
  r.notification = "n";
  Future user = t.fence->write_then_notify(std::move(r), [&](OpRequest w) {
    EXPECT_FALSE(w.notification.has_value()) << "the transport's write must not carry it";
    carried = std::make_shared<OpState>(OpKind::kWrite);
    return Future(carried);
  });
  Future after = t.notify("after");
  carried->complete(Status::unknown_handle("no region 7"));
  EXPECT_EQ(t.sent, std::vector<std::string>{"after"});
  ASSERT_TRUE(user.done());
  EXPECT_EQ(user.result().code(), StatusCode::kUnknownHandle);
}

TEST(NotifyFence, ACarryingWriteCompletesWithItsBytesOnceItsNotificationIsHeldAndNamesARefusal) {
  Recorder t;
  std::shared_ptr<OpState> carried;
  auto submit = [&](OpRequest) {
    carried = std::make_shared<OpState>(OpKind::kWrite);
    return Future(carried);
  };
  OpRequest r;
  r.kind = OpKind::kWrite;
  r.notification = "ok";
  Future good = t.fence->write_then_notify(r, submit);
  carried->complete(Status::ok(), 64);
  ASSERT_EQ(t.sent.size(), 1u);
  EXPECT_FALSE(good.done());
  t.states[0]->complete(Status::ok());
  EXPECT_EQ(good.status(), 0);
  EXPECT_EQ(good.nbytes(), 64u);

  r.notification = "refused";
  Future bad = t.fence->write_then_notify(r, submit);
  carried->complete(Status::ok(), 64);
  t.states[1]->complete(Status(StatusCode::kBatchOverflow, "the budget is full"));
  EXPECT_EQ(bad.result().code(), StatusCode::kBatchOverflow);
  EXPECT_NE(bad.message().find("the write completed, but its notification failed"), std::string::npos)
      << bad.message();
}

TEST(NotifyFence, AWriteThatThrowsInSubmitHoldsNothingBack) {
  Recorder t;
  OpRequest r;
  r.kind = OpKind::kWrite;
  r.notification = "n";
  EXPECT_THROW(t.fence->write_then_notify(r, [](OpRequest) -> Future { throw std::runtime_error("bad batch"); }),
               std::runtime_error);
  t.notify("next");
  EXPECT_EQ(t.sent, std::vector<std::string>{"next"});
}

TEST(NotificationInbox, HoldsWithinItsBudgetHandsOutInOrderAndRefusesPastIt) {
  NotificationInbox inbox(2 * (NotificationInbox::kOverhead + 10), "the test's budget");
  NotificationInbox::EndedList ended;
  EXPECT_TRUE(inbox.deliver(std::string(10, 'a'), ended).is_ok());
  EXPECT_TRUE(inbox.deliver(std::string(10, 'b'), ended).is_ok());
  const Status refused = inbox.deliver("c", ended);
  EXPECT_EQ(refused.code(), StatusCode::kBatchOverflow);
  EXPECT_NE(refused.message().find("the test's budget"), std::string::npos) << refused.message();
  EXPECT_TRUE(ended.empty());
  auto first = std::make_shared<OpState>(OpKind::kRecvNotify);
  inbox.post(first, OpLimit{}, ended);
  ASSERT_EQ(ended.size(), 1u);
  ended[0].complete();
  EXPECT_EQ(first->notification(), std::string(10, 'a'));
  ended.clear();
  EXPECT_TRUE(inbox.deliver("c", ended).is_ok()) << "room again once one was taken";
}

TEST(NotificationInbox, AWaitExpiresAloneAndThePeersDepartureFailsTheRest) {
  NotificationInbox inbox(1 << 20, "budget");
  NotificationInbox::EndedList ended;
  auto soon = std::make_shared<OpState>(OpKind::kRecvNotify);
  auto later = std::make_shared<OpState>(OpKind::kRecvNotify);
  const auto deadline = inbox.post(soon, OpLimit{10ms, "its timeout"}, ended);
  inbox.post(later, OpLimit{}, ended);
  EXPECT_EQ(inbox.expire(deadline, ended), NotificationInbox::Clock::time_point::max());
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].state, soon);
  EXPECT_EQ(ended[0].status.code(), StatusCode::kTimeout);
  ended.clear();
  inbox.deliver("kept", ended);  // goes to `later`
  ASSERT_EQ(ended.size(), 1u);
  ended.clear();
  inbox.deliver("held", ended);
  inbox.gone(Status::peer_closed("gone"), /*drop_held=*/false, ended);
  auto after = std::make_shared<OpState>(OpKind::kRecvNotify);
  inbox.post(after, OpLimit{}, ended);  // what arrived before stays to be received
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_TRUE(ended[0].status.is_ok());
  ended.clear();
  inbox.post(std::make_shared<OpState>(OpKind::kRecvNotify), OpLimit{}, ended);  // then the departure
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].status.code(), StatusCode::kPeerClosed);
  ended.clear();
  inbox.connected(/*drop_held=*/true);
  inbox.post(std::make_shared<OpState>(OpKind::kRecvNotify), OpLimit{}, ended);
  EXPECT_TRUE(ended.empty()) << "a new peer: recv_notify waits again";
}

namespace {
// A transport's canceller that can always withdraw the op.
struct Withdraws final : OpCanceller, std::enable_shared_from_this<Withdraws> {
  bool cancel_op(OpState& op, uint64_t) override { return op.complete(OpState::cancelled_by_user()); }
};
}  // namespace

TEST(NotifyFence, CancelWithdrawsAQueuedNotificationAndTheOnesBehindItGoInOrder) {
  Recorder t;
  auto w = t.write();
  Future a = t.notify("a");
  Future b = t.notify("b");
  EXPECT_TRUE(a.state()->cancel());
  EXPECT_EQ(a.result().code(), StatusCode::kCancelled);
  EXPECT_FALSE(a.state()->cancel());
  w->complete(Status::ok());
  EXPECT_EQ(t.sent, std::vector<std::string>{"b"}) << "a withdrawn notification was sent";
  EXPECT_FALSE(b.state()->cancel()) << "one handed to the transport is not withdrawn here";
}

TEST(NotifyFence, CancellingAWriteThatCarriesANotificationCancelsTheWriteAndNeverSendsIt) {
  Recorder t;
  auto withdraws = std::make_shared<Withdraws>();
  std::shared_ptr<OpState> carried;
  OpRequest r;
  r.kind = OpKind::kWrite;
  r.notification = "never";
  Future user = t.fence->write_then_notify(std::move(r), [&](OpRequest) {
    carried = std::make_shared<OpState>(OpKind::kWrite);
    carried->set_canceller(withdraws, 0);
    return Future(carried);
  });
  Future after = t.notify("after");
  EXPECT_TRUE(user.state()->cancel());
  EXPECT_EQ(user.result().code(), StatusCode::kCancelled);
  EXPECT_EQ(carried->status().code(), StatusCode::kCancelled) << "the transport's write was not cancelled";
  EXPECT_EQ(t.sent, std::vector<std::string>{"after"});
}
