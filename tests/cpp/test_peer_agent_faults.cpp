// The fault-injecting Endpoint decorator (core/faulty_endpoint.h), and PeerAgent's failure
// paths driven by it through PeerAgentOptions::wrap_endpoint: a connect that fails, an op
// that is dropped or fails, without a broken network.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/faulty_endpoint.h"
#include "core/op_state.h"
#include "dlslime/errors.h"
#include "dlslime/nanoctrl.h"
#include "dlslime/peer_agent.h"

#include "agent_fixtures.h"
#include "test_support.h"

using namespace dlslime;
using namespace dlslime::test_support;
using namespace std::chrono_literals;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// An inner endpoint that records what reaches it. Its ops stay pending until the test
// completes them (complete_all), so a test sees exactly which ops got through and when.
class RecordingEndpoint final : public Endpoint {
 public:
  json endpoint_info() const override { return {{"recording", true}, {"mr_info", mr_info()}}; }
  void connect(const json& peer_info) override {
    std::lock_guard lock(mu_);
    connects.push_back(peer_info);
  }
  bool is_connected() const override {
    std::lock_guard lock(mu_);
    return !connects.empty();
  }
  int32_t register_memory_region(const std::string& name, uintptr_t, uint64_t, uint64_t) override {
    std::lock_guard lock(mu_);
    regions.push_back(name);
    return static_cast<int32_t>(regions.size());
  }
  int32_t register_remote_memory_region(const std::string& name, const json&) override {
    std::lock_guard lock(mu_);
    remote.push_back(name);
    return 100 + static_cast<int32_t>(remote.size());
  }
  void unregister_memory_region(const std::string& name) override {
    std::lock_guard lock(mu_);
    unregistered.push_back(name);
  }
  void unregister_memory_region(int32_t handle) override {
    std::lock_guard lock(mu_);
    unregistered.push_back(std::to_string(handle));
  }
  json mr_info() const override { return {{"r", {{"handle", 1}}}}; }
  Capabilities capabilities() const override {
    Capabilities c;
    c.transport = "recording";
    c.read = c.write = c.send_recv = c.host_memory = true;
    return c;
  }
  void shutdown() override {
    shutdowns.fetch_add(1);
    complete_all(Status::cancelled("recording endpoint shut down"));
  }

  size_t ops_seen() const {
    std::lock_guard lock(mu_);
    return ops.size();
  }
  std::vector<OpKind> kinds_seen() const {
    std::lock_guard lock(mu_);
    std::vector<OpKind> k;
    for (const auto& op : ops) k.push_back(op->kind());
    return k;
  }
  void complete_all(const Status& status, uint64_t nbytes = 0) {
    std::vector<std::shared_ptr<OpState>> todo;
    {
      std::lock_guard lock(mu_);
      todo = ops;
    }
    for (auto& op : todo) op->complete(status, nbytes);
  }

  std::vector<json> connects;
  std::vector<std::string> regions, remote, unregistered;
  std::atomic<int> shutdowns{0};

 protected:
  Future do_submit(OpRequest request) override {
    auto state = std::make_shared<OpState>(request.kind);
    std::lock_guard lock(mu_);
    ops.push_back(state);
    return Future(state);
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<OpState>> ops;
};

struct Decorated {
  std::shared_ptr<RecordingEndpoint> inner = std::make_shared<RecordingEndpoint>();
  std::shared_ptr<FaultPlan> plan = std::make_shared<FaultPlan>();
  std::shared_ptr<FaultyEndpoint> ep = std::make_shared<FaultyEndpoint>(inner, plan);
};

std::vector<uint8_t> g_buf(64);
const Chunk kChunk{reinterpret_cast<uintptr_t>(g_buf.data()), 0, g_buf.size()};
const std::vector<Assignment> kItem = {{1, 101, 0, 0, 8}};

}  // namespace

// --- FaultyEndpoint --------------------------------------------------------------------

TEST(FaultyEndpoint, ForwardsEveryCallWhenThePlanIsEmpty) {
  Decorated d;
  EXPECT_EQ(d.ep->endpoint_info()["recording"], true);
  EXPECT_FALSE(d.ep->is_connected());
  d.ep->connect({{"peer", 1}});
  EXPECT_TRUE(d.ep->is_connected());
  EXPECT_EQ(d.inner->connects.size(), 1u);
  EXPECT_EQ(d.ep->register_memory_region("a", 0x1000, 0, 8), 1);
  EXPECT_EQ(d.ep->register_remote_memory_region("b", json::object()), 101);
  d.ep->unregister_memory_region("a");
  d.ep->unregister_memory_region(7);
  EXPECT_EQ(d.inner->unregistered, (std::vector<std::string>{"a", "7"}));
  EXPECT_EQ(d.ep->mr_info(), d.inner->mr_info());
  EXPECT_STREQ(d.ep->capabilities().transport, "recording");
  // An op without a fault is the inner endpoint's own future.
  Future f = d.ep->write(kItem);
  ASSERT_EQ(d.inner->ops_seen(), 1u);
  d.inner->complete_all(Status::ok(), 8);
  EXPECT_EQ(f.wait_for(1s), std::optional<int>(0));
  EXPECT_EQ(f.nbytes(), 8u);
  EXPECT_EQ(d.plan->counts().passed, 2u);  // the connect and the write
  d.ep->shutdown();
  d.ep->shutdown();
  EXPECT_EQ(d.inner->shutdowns.load(), 2);  // idempotence is the inner endpoint's
}

TEST(FaultyEndpoint, CapabilitiesTheInnerEndpointLacksStillThrow) {
  Decorated d;
  EXPECT_THROW(d.ep->imm_recv(), NotImplementedError);
  EXPECT_THROW(d.ep->write({}), InvalidArgumentError);  // the base's checks run as before
  EXPECT_EQ(d.inner->ops_seen(), 0u);
}

TEST(FaultyEndpoint, FailCompletesAtOnceWithTheGivenStatusAndOnlyTheNextNOps) {
  Decorated d;
  d.plan->add(FaultRule::fail_ops(OpKind::kWrite, StatusCode::kPeerClosed, 2));
  for (int i = 0; i < 2; ++i) {
    Future f = d.ep->write(kItem);
    ASSERT_TRUE(f.done());
    EXPECT_EQ(f.status(), code(StatusCode::kPeerClosed));
    EXPECT_EQ(f.message(), "injected fault");
  }
  EXPECT_EQ(d.inner->ops_seen(), 0u) << "a failed op reached the inner endpoint";
  // Another kind is not matched; the rule is spent after two writes.
  Future r = d.ep->read(kItem);
  Future w = d.ep->write(kItem);
  EXPECT_FALSE(r.done());
  EXPECT_FALSE(w.done());
  EXPECT_EQ(d.inner->kinds_seen(), (std::vector<OpKind>{OpKind::kRead, OpKind::kWrite}));
  const auto counts = d.plan->counts();
  EXPECT_EQ(counts.failed, 2u);
  EXPECT_EQ(counts.passed, 2u);
}

TEST(FaultyEndpoint, DroppedOpNeverReachesTheInnerEndpointAndTimesOutAtItsDeadline) {
  Decorated d;
  d.plan->add(FaultRule::drop_ops(std::nullopt, 200ms, 1));
  const auto t0 = Clock::now();
  Future f = d.ep->send(kChunk);
  EXPECT_EQ(f.wait_for(50ms), std::nullopt);
  ASSERT_EQ(f.wait_for(5s), std::optional<int>(code(StatusCode::kTimeout))) << "a dropped op hung";
  EXPECT_GE(Clock::now() - t0, 190ms);
  EXPECT_NE(f.message().find("dropped"), std::string::npos) << f.message();
  EXPECT_EQ(d.inner->ops_seen(), 0u);
  EXPECT_EQ(d.plan->counts().dropped, 1u);
}

TEST(FaultyEndpoint, ShutdownCancelsDroppedAndDelayedOps) {
  Decorated d;
  d.plan->add(FaultRule::drop_ops(OpKind::kRecv, 60s));
  d.plan->add(FaultRule::delay_ops(OpKind::kSend, 60s));
  Future dropped = d.ep->recv(kChunk);
  Future delayed = d.ep->send(kChunk);
  d.ep->shutdown();
  EXPECT_EQ(dropped.wait_for(5s), std::optional<int>(code(StatusCode::kCancelled)));
  EXPECT_EQ(delayed.wait_for(5s), std::optional<int>(code(StatusCode::kCancelled)));
  EXPECT_EQ(d.inner->ops_seen(), 0u);
  // After shutdown a faulted op cannot be held: it is cancelled at once.
  EXPECT_EQ(d.ep->recv(kChunk).wait_for(1s), std::optional<int>(code(StatusCode::kCancelled)));
}

TEST(FaultyEndpoint, DelayedOpReachesTheInnerEndpointLaterWithItsResult) {
  Decorated d;
  d.plan->add(FaultRule::delay_ops(OpKind::kRead, 150ms, 1));
  const auto t0 = Clock::now();
  Future f = d.ep->read(kItem);
  EXPECT_EQ(d.inner->ops_seen(), 0u);
  ASSERT_TRUE(wait_until([&] { return d.inner->ops_seen() == 1; }, 5s)) << "the delayed op never went through";
  EXPECT_GE(Clock::now() - t0, 140ms);
  EXPECT_FALSE(f.done());
  d.inner->complete_all(Status::out_of_bounds("inner says no"), 3);
  ASSERT_EQ(f.wait_for(5s), std::optional<int>(code(StatusCode::kOutOfBounds)));
  EXPECT_EQ(f.message(), "inner says no");
  EXPECT_EQ(f.nbytes(), 3u);
  EXPECT_EQ(d.plan->counts().delayed, 1u);
}

// Future::cancel of a held op withdraws it before it reaches the inner endpoint; once
// forwarded, cancel is the inner op's (the recording endpoint's cannot be withdrawn).
TEST(FaultyEndpoint, CancelWithdrawsAHeldOpAndForwardsToTheInnerOpOnceItWentThrough) {
  Decorated d;
  d.plan->add(FaultRule::delay_ops(OpKind::kWrite, 50ms, 1));
  d.plan->add(FaultRule::delay_ops(OpKind::kRead, 100ms, 1));
  Future held = d.ep->write(kItem);
  Future later = d.ep->read(kItem);  // released after the write would have been
  ASSERT_TRUE(held.cancel());
  EXPECT_EQ(held.status(), code(StatusCode::kCancelled));
  EXPECT_NE(held.message().find("cancelled by the user"), std::string::npos) << held.message();
  ASSERT_TRUE(wait_until([&] { return d.inner->ops_seen() == 1; }, 5s)) << "the later op never went through";
  EXPECT_EQ(d.inner->kinds_seen(), std::vector<OpKind>{OpKind::kRead})
      << "the cancelled write reached the inner endpoint";
  EXPECT_FALSE(later.cancel()) << "the inner op cannot be withdrawn, so neither can its wrapper";
  EXPECT_FALSE(later.done());
  d.inner->complete_all(Status::ok(), 8);
  ASSERT_EQ(later.wait_for(5s), std::optional<int>(0));
  EXPECT_FALSE(held.cancel());
}

TEST(FaultyEndpoint, ThePlanCanChangeWhileOpsRun) {
  Decorated d;
  Future before = d.ep->write(kItem);  // passes
  d.plan->add(FaultRule::fail_ops(std::nullopt, StatusCode::kFailed));
  EXPECT_TRUE(d.ep->write(kItem).done());
  EXPECT_TRUE(d.ep->send(kChunk).done());
  d.plan->clear();
  Future after = d.ep->write(kItem);
  EXPECT_FALSE(after.done());
  EXPECT_EQ(d.inner->ops_seen(), 2u);
  // Rules are tried in order: the first that matches applies.
  d.plan->add(FaultRule::fail_ops(OpKind::kSend, StatusCode::kTimeout, 1));
  d.plan->add(FaultRule::fail_ops(std::nullopt, StatusCode::kFailed, 1));
  EXPECT_EQ(d.ep->send(kChunk).status(), code(StatusCode::kTimeout));
  EXPECT_EQ(d.ep->send(kChunk).status(), code(StatusCode::kFailed));
  EXPECT_FALSE(d.ep->send(kChunk).done());
  (void)before;
}

TEST(FaultyEndpoint, ConnectFailsDropsOrIsDelayed) {
  Decorated d;
  d.plan->add(FaultRule::fail_connect(1, "no route to peer"));
  try {
    d.ep->connect({{"peer", 1}});
    FAIL() << "the injected connect failure did not throw";
  } catch (const ConnectionError& e) {
    EXPECT_STREQ(e.what(), "no route to peer");
  }
  EXPECT_TRUE(d.inner->connects.empty());
  d.ep->connect({{"peer", 2}});  // spent: the next one goes through
  EXPECT_EQ(d.inner->connects.size(), 1u);

  FaultRule drop;
  drop.action = FaultRule::Action::kDrop;
  drop.on_connect = true;
  drop.deadline = 100ms;
  drop.times = 1;
  d.plan->add(drop);
  const auto t0 = Clock::now();
  try {
    d.ep->connect({{"peer", 3}});
    FAIL() << "a dropped connect returned";
  } catch (const ConnectionError& e) {
    EXPECT_EQ(e.code(), StatusCode::kTimeout);
    EXPECT_GE(Clock::now() - t0, 90ms);
  }
  // shutdown() wakes a connect held by a delay at once.
  FaultRule delay = drop;
  delay.action = FaultRule::Action::kDelay;
  delay.delay = 60s;
  d.plan->add(delay);
  std::atomic<bool> threw{false};
  std::thread t([&] {
    try {
      d.ep->connect({{"peer", 4}});
    } catch (const ConnectionError&) {
      threw = true;
    }
  });
  ASSERT_TRUE(wait_until([&] { return d.plan->counts().delayed == 1; }));
  d.ep->shutdown();
  t.join();
  EXPECT_TRUE(threw.load());
  EXPECT_EQ(d.inner->connects.size(), 1u);
}

TEST(FaultyEndpoint, RulesThatWouldLieAreRefused) {
  FaultPlan plan;
  EXPECT_THROW(plan.add(FaultRule::fail_ops(OpKind::kWrite, StatusCode::kSuccess)), InvalidArgumentError);
  EXPECT_THROW(plan.add(FaultRule::fail_ops(OpKind::kWrite, StatusCode::kPending)), InvalidArgumentError);
  EXPECT_THROW(plan.add(FaultRule::fail_ops(OpKind::kWrite, StatusCode::kFailed, 0)), InvalidArgumentError);
  EXPECT_THROW(plan.add(FaultRule::delay_ops(OpKind::kWrite, -1ms)), InvalidArgumentError);
  EXPECT_THROW(FaultyEndpoint(nullptr, std::make_shared<FaultPlan>()), InvalidArgumentError);
}

TEST(FaultyEndpoint, TheLastReferenceMayGoFromAContinuationOnItsTimerThread) {
  auto d = std::make_unique<Decorated>();
  d->plan->add(FaultRule::drop_ops(std::nullopt, 50ms, 1));
  Future f = d->ep->recv(kChunk);
  std::atomic<bool> ran{false};
  // The continuation holds the only reference left, and drops it on the timer thread.
  f.state()->on_complete([ep = d->ep, &ran](const OpState&) mutable {
    ep.reset();
    ran = true;
  });
  d.reset();
  EXPECT_EQ(f.wait_for(5s), std::optional<int>(code(StatusCode::kTimeout)));
  EXPECT_TRUE(wait_until([&] { return ran.load(); }));
}

// --- PeerAgent failures, injected through wrap_endpoint --------------------------------

namespace {

// An agent whose every endpoint applies `plan`.
PeerAgentOptions faulty_agent(const std::string& url, const std::string& alias, std::shared_ptr<FaultPlan> plan) {
  PeerAgentOptions o = agent(url, alias);
  o.wrap_endpoint = [plan](std::shared_ptr<Endpoint> made) -> std::shared_ptr<Endpoint> {
    return std::make_shared<FaultyEndpoint>(std::move(made), plan);
  };
  return o;
}

// Two agents on an in-process NanoCtrl; `a` applies `plan` to its endpoints. a has "src"
// (0x5A), b has "dst" (zeros).
struct AgentPair {
  explicit AgentPair(const std::string& prefix)
      : a(faulty_agent(ctrl.server.url(), prefix + "_a", plan)), b(agent(ctrl.server.url(), prefix + "_b")) {
    a.register_memory_region("src", addr_of(src), 0, src.size());
    b.register_memory_region("dst", addr_of(dst), 0, dst.size());
  }
  void connect_both() {
    PeerConnection ca = a.connect_to(b.alias(), tcp());
    PeerConnection cb = b.connect_to(a.alias(), tcp());
    ca.wait(10s);
    cb.wait(10s);
  }
  Future named_write() { return a.write(b.alias(), std::vector<NamedAssignment>{{"src", "dst", 0, 0, src.size()}}); }

  StartedCtrl ctrl;  // declared first: started before the agents, stopped after them
  std::shared_ptr<FaultPlan> plan = std::make_shared<FaultPlan>();
  std::vector<uint8_t> src = std::vector<uint8_t>(4096, 0x5A), dst = std::vector<uint8_t>(4096, 0);
  PeerAgent a, b;
};

}  // namespace

TEST(PeerAgentFaults, AFailedConnectFailsTheConnectionAndConnectingAgainSucceeds) {
  AgentPair p("pfc");
  p.plan->add(FaultRule::fail_connect(1, "injected: no route to the peer"));
  PeerConnection first = p.a.connect_to(p.b.alias(), tcp());
  try {
    first.wait(10s);
    FAIL() << "the connection succeeded although its connect() failed";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("injected: no route to the peer"), std::string::npos) << e.what();
  }
  EXPECT_EQ(first.state(), "failed");
  EXPECT_NE(first.error().find("injected: no route to the peer"), std::string::npos) << first.error();
  EXPECT_FALSE(first.is_connected());
  EXPECT_EQ(p.plan->counts().failed, 1u);

  PeerConnection again = p.a.connect_to(p.b.alias(), tcp());
  ASSERT_NO_THROW(again.wait(10s));
  EXPECT_TRUE(again.is_connected());
  auto w = p.named_write();
  ASSERT_EQ(w.wait_for(10s), std::optional<int>(0)) << w.message();
  EXPECT_EQ(p.dst, p.src);
}

TEST(PeerAgentFaults, ADroppedOpFailsWithinItsDeadlineAndTheNextOneWorks) {
  AgentPair p("pfd");
  p.connect_both();
  p.plan->add(FaultRule::drop_ops(OpKind::kWrite, 300ms, 1));
  const auto t0 = Clock::now();
  auto w = p.named_write();
  ASSERT_EQ(w.wait_for(10s), std::optional<int>(code(StatusCode::kTimeout))) << "a dropped write hung";
  EXPECT_GE(Clock::now() - t0, 290ms);
  EXPECT_EQ(p.dst, std::vector<uint8_t>(4096, 0)) << "a dropped write moved bytes";
  EXPECT_EQ(p.plan->counts().dropped, 1u);

  auto ok = p.named_write();
  ASSERT_EQ(ok.wait_for(10s), std::optional<int>(0)) << ok.message();
  EXPECT_EQ(p.dst, p.src);
}

// The agent's named write wraps the endpoint's op: Future::cancel goes through to it. Held
// by the fault plan (queued, never sent), it is withdrawn and moves no byte; a recv the
// agent posts is the endpoint's own op, withdrawn by the transport.
TEST(PeerAgentFaults, CancelOfANamedOpReachesTheEndpointsOp) {
  AgentPair p("pcx");
  p.connect_both();
  p.plan->add(FaultRule::delay_ops(OpKind::kWrite, 200ms, 1));
  p.plan->add(FaultRule::delay_ops(OpKind::kRead, 400ms, 1));
  auto w = p.named_write();
  ASSERT_TRUE(w.cancel()) << "a held write must be withdrawn through the agent's future";
  EXPECT_EQ(w.status(), code(StatusCode::kCancelled)) << w.message();
  EXPECT_NE(w.message().find("cancelled by the user"), std::string::npos) << w.message();
  // A later delayed op goes through after the cancelled write would have: by then the
  // write would have landed, had it not been withdrawn.
  std::vector<uint8_t> back(16, 0);
  p.a.register_memory_region("back", addr_of(back), 0, back.size());
  auto r = p.a.read(p.b.alias(), std::vector<NamedAssignment>{{"back", "dst", 0, 0, back.size()}});
  ASSERT_EQ(r.wait_for(10s), std::optional<int>(0)) << r.message();
  EXPECT_EQ(p.dst, std::vector<uint8_t>(4096, 0)) << "the cancelled write moved bytes";
  std::vector<uint8_t> inbox(16, 0xAA);
  auto rv = p.b.recv(p.a.alias(), {addr_of(inbox), 0, inbox.size()});
  ASSERT_TRUE(rv.cancel());
  EXPECT_EQ(rv.status(), code(StatusCode::kCancelled)) << rv.message();
  auto ok = p.named_write();
  ASSERT_EQ(ok.wait_for(10s), std::optional<int>(0)) << ok.message();
  EXPECT_EQ(p.dst, p.src);
}

TEST(PeerAgentFaults, AFailedWriteSurfacesItsStatusThroughPeerAgentWrite) {
  AgentPair p("pff");
  p.connect_both();
  FaultRule rule = FaultRule::fail_ops(OpKind::kWrite, StatusCode::kOutOfBounds, 1);
  rule.message = "injected: range refused";
  p.plan->add(rule);
  auto w = p.named_write();
  ASSERT_EQ(w.wait_for(10s), std::optional<int>(code(StatusCode::kOutOfBounds)));
  EXPECT_NE(w.message().find("injected: range refused"), std::string::npos) << w.message();
  EXPECT_EQ(p.dst, std::vector<uint8_t>(4096, 0));
  // Two-sided ops are not matched by a write rule, and the connection is unharmed.
  std::vector<uint8_t> inbox(16, 0), msg(16, 0x77);
  auto rv = p.b.recv(p.a.alias(), {addr_of(inbox), 0, inbox.size()});
  ASSERT_EQ(p.a.send(p.b.alias(), {addr_of(msg), 0, msg.size()}).wait_for(10s), std::optional<int>(0));
  ASSERT_EQ(rv.wait_for(10s), std::optional<int>(0));
  EXPECT_EQ(inbox, msg);
  auto ok = p.named_write();
  ASSERT_EQ(ok.wait_for(10s), std::optional<int>(0)) << ok.message();
  EXPECT_EQ(p.dst, p.src);
}

TEST(PeerAgentFaults, AgentShutdownCancelsAHeldOp) {
  AgentPair p("pfs");
  p.connect_both();
  p.plan->add(FaultRule::drop_ops(OpKind::kSend, 60s));
  std::vector<uint8_t> msg(16, 1);
  auto sd = p.a.send(p.b.alias(), {addr_of(msg), 0, msg.size()});
  EXPECT_EQ(sd.wait_for(20ms), std::nullopt);
  p.a.shutdown();
  EXPECT_EQ(sd.wait_for(10s), std::optional<int>(code(StatusCode::kCancelled))) << "a held op outlived shutdown";
}

namespace {

// A transport that has not noticed its peer is gone: is_connected() stays true until the
// test says otherwise. Records when the agent shut it down.
class LateLossEndpoint final : public FaultyEndpoint {
 public:
  using FaultyEndpoint::FaultyEndpoint;
  bool is_connected() const override { return !loss_seen.load() || FaultyEndpoint::is_connected(); }
  void shutdown() override {
    if (!shut_at.load()) shut_at = Clock::now().time_since_epoch().count();
    FaultyEndpoint::shutdown();
  }
  Clock::time_point shut_time() const { return Clock::time_point(Clock::duration(shut_at.load())); }
  std::atomic<bool> loss_seen{false};
  std::atomic<Clock::rep> shut_at{0};
};

// Agents a and b, connected; a's endpoint is a LateLossEndpoint. leave() shuts b down (its
// endpoint says goodbye, then it cleans up in NanoCtrl) and waits until a has closed the
// connection on b's cleanup notice.
struct LateLossPair {
  explicit LateLossPair(const std::string& prefix)
      : a(late_agent(ctrl.server.url(), prefix + "_a", late)),
        b(std::make_unique<PeerAgent>(agent(ctrl.server.url(), prefix + "_b"))),
        ca(a.connect_to(b->alias(), tcp())) {
    PeerConnection cb = b->connect_to(a.alias(), tcp());
    ca.wait(10s);
    cb.wait(10s);
  }
  static PeerAgentOptions late_agent(const std::string& url, const std::string& alias,
                                     std::shared_ptr<std::shared_ptr<LateLossEndpoint>> slot) {
    PeerAgentOptions o = agent(url, alias);
    o.wrap_endpoint = [slot](std::shared_ptr<Endpoint> made) -> std::shared_ptr<Endpoint> {
      *slot = std::make_shared<LateLossEndpoint>(std::move(made), std::make_shared<FaultPlan>());
      return *slot;
    };
    return o;
  }
  LateLossEndpoint& endpoint() { return **late; }
  void leave() {
    b.reset();
    ASSERT_TRUE(wait_until([&] { return ca.state() == "closed"; })) << ca.state();
  }

  StartedCtrl ctrl;
  std::shared_ptr<std::shared_ptr<LateLossEndpoint>> late = std::make_shared<std::shared_ptr<LateLossEndpoint>>();
  PeerAgent a;
  std::unique_ptr<PeerAgent> b;
  PeerConnection ca;
};

}  // namespace

// A peer's cleanup closes the connection at once, but the agent shuts the endpoint down
// only once its transport has seen the loss (here: never), or after the grace: an
// acknowledgement the peer sent before it left still completes our op instead of our
// shutdown cancelling it.
TEST(PeerAgentFaults, APeersCleanupLeavesTheEndpointToItsTransportUntilTheGracePasses) {
  LateLossPair p("plg");
  const auto gone = Clock::now();
  p.leave();
  EXPECT_EQ(p.endpoint().shut_at.load(), 0) << "the endpoint was shut down before its transport saw the loss";
  ASSERT_TRUE(wait_until([&] { return p.endpoint().shut_at.load() != 0; }, 10s))
      << "the retired endpoint was never shut down";
  EXPECT_GE(p.endpoint().shut_time() - gone, 1500ms) << "shut down before the grace (2 s) passed";
  EXPECT_THROW(p.a.send("plg_b", kChunk), Error) << "a closed connection took a new op";
}

// The usual case: the transport sees the loss, and the endpoint goes without waiting out
// the grace.
TEST(PeerAgentFaults, APeersCleanupShutsTheEndpointDownOnceItsTransportSawTheLoss) {
  LateLossPair p("pls");
  p.leave();
  EXPECT_EQ(p.endpoint().shut_at.load(), 0);
  const auto seen = Clock::now();
  p.endpoint().loss_seen = true;
  ASSERT_TRUE(wait_until([&] { return p.endpoint().shut_at.load() != 0; }, 10s));
  EXPECT_LT(p.endpoint().shut_time() - seen, 1500ms) << "waited out the grace although the transport had seen the loss";
}
