// What every transport owes (docs/conformance.md), run over each transport that
// available_transports() says is usable here. Endpoints come from make_endpoint() only, so
// nothing below names a transport except transport_options(). A new transport passes this file
// unchanged; an op its capabilities() exclude is skipped with the capability's name.
//
// The binary has its own main(): run as `dlslime_conformance_tests --peer <transport>` it
// is the peer process of the killed-peer test (spawned, never forked: the test process has
// I/O threads).
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "dlslime/endpoint.h"
#include "dlslime/errors.h"
#include "dlslime/future.h"
#include "dlslime/status.h"
#include "dlslime/transport.h"

#include "test_support.h"

extern char** environ;

using namespace dlslime;
using namespace dlslime::test_support;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

// The options each transport's test endpoints are made with: loopback only, and deadlines
// short enough that a broken transport fails a test instead of stalling CI.
json transport_options(const std::string& transport) {
  if (transport == "tcp") {
    return {{"ip", "127.0.0.1"}, {"port", 0}, {"connect_timeout_ms", 5000}, {"op_timeout_ms", 20000}};
  }
  return json::object();
}

// `transport_options` for a peer that takes no message while it has no recv posted (so a
// send to it waits for its answer until a deadline ends the send), with `op_timeout`.
json refusing_receiver_options(const std::string& transport, std::chrono::milliseconds op_timeout) {
  json o = transport_options(transport);
  o["op_timeout_ms"] = op_timeout.count();
  if (transport == "tcp") o["unexpected_buffer_bytes"] = 0;  // holds nothing: the lane pauses
  return o;  // rdma: a send waits for the receiver's DONE, which only a posted recv sends
}

std::vector<std::string> usable_transports() {
  std::vector<std::string> names;
  for (const auto& t : available_transports()) {
    if (t.available) names.push_back(t.name);
  }
  return names;
}

constexpr auto kDeadline = 20s;  // any single op in this file, on a loaded 2-core CI box

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + seed);
  return v;
}

// The final status of `f`, or -1 if it did not complete within `timeout` (a hang).
int status_within(const Future& f, std::chrono::nanoseconds timeout = kDeadline) {
  return f.wait_for(timeout).value_or(-1);
}

const char* capability_name(OpKind kind) {
  switch (kind) {
    case OpKind::kSend:
    case OpKind::kRecv: return "send_recv";
    default: return op_kind_name(kind);
  }
}

// Skips the calling test (with the capability's name) if the transport cannot do `kind`.
#define REQUIRE_CAPABILITY(kind)                                                                    \
  do {                                                                                              \
    if (!caps_.supports(kind)) GTEST_SKIP() << GetParam() << " lacks the capability " << capability_name(kind); \
  } while (0)

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  std::shared_ptr<Endpoint> make() { return make_endpoint(GetParam(), transport_options(GetParam())); }

  void SetUp() override {
    a_ = make();
    b_ = make();
    caps_ = a_->capabilities();
  }
  void TearDown() override {
    a_->shutdown();
    b_->shutdown();
  }

  void connect() {
    a_->connect(b_->endpoint_info());
    b_->connect(a_->endpoint_info());
  }
  // a's handle for b's region `name`, from b's published endpoint_info.
  int32_t remote(const std::string& name) {
    return a_->register_remote_memory_region(name, b_->endpoint_info()["mr_info"][name]);
  }

  std::shared_ptr<Endpoint> a_, b_;
  Capabilities caps_;
};

// --- one-sided -------------------------------------------------------------------------

TEST_P(Conformance, WriteAndReadAreByteExactWithOffsetsOnBothSides) {
  REQUIRE_CAPABILITY(OpKind::kWrite);
  REQUIRE_CAPABILITY(OpKind::kRead);
  auto src = pattern(4096, 7);
  std::vector<uint8_t> dst(8192, 0), back(4096, 0);
  const int32_t h_src = a_->register_memory_region("src", addr_of(src), 0, src.size());
  const int32_t h_back = a_->register_memory_region("back", addr_of(back), 0, back.size());
  // A registration offset is part of the region: offsets below count from dst[1024].
  b_->register_memory_region("dst", addr_of(dst), 1024, 4096);
  connect();
  const int32_t h_dst = remote("dst");

  // write: local[source_offset:+len] -> remote[target_offset:+len]
  auto w = a_->write({{h_src, h_dst, /*target*/ 1000, /*source*/ 7, 300}});
  ASSERT_EQ(status_within(w), 0) << w.message();
  EXPECT_TRUE(std::equal(src.begin() + 7, src.begin() + 307, dst.begin() + 1024 + 1000));
  EXPECT_TRUE(std::all_of(dst.begin(), dst.begin() + 2024, [](uint8_t v) { return v == 0; }));
  EXPECT_TRUE(std::all_of(dst.begin() + 2324, dst.end(), [](uint8_t v) { return v == 0; }));

  // read: remote[target_offset:+len] -> local[source_offset:+len]
  const std::string text = "remote-bytes";
  std::memcpy(dst.data() + 1024 + 2000, text.data(), text.size());
  auto r = a_->read({{h_back, h_dst, /*target*/ 2000, /*source*/ 3000, text.size()}});
  ASSERT_EQ(status_within(r), 0) << r.message();
  EXPECT_EQ(r.nbytes(), text.size());
  EXPECT_EQ(std::string(back.begin() + 3000, back.begin() + 3000 + text.size()), text);
  EXPECT_EQ(back[2999], 0);
  EXPECT_EQ(back[3000 + text.size()], 0);

  // The region ends where its registration said, not where the buffer does.
  const auto before = dst;
  auto past = a_->write({{h_src, h_dst, 1, 0, 4096}});
  EXPECT_EQ(status_within(past), code(StatusCode::kOutOfBounds)) << past.message();
  EXPECT_EQ(dst, before);
}

TEST_P(Conformance, BatchesOf1000ItemsWriteAndReadBack) {
  REQUIRE_CAPABILITY(OpKind::kWrite);
  REQUIRE_CAPABILITY(OpKind::kRead);
  constexpr size_t n = 1000, item = 64;
  auto src = pattern(n * item, 3);
  std::vector<uint8_t> dst(2 * n * item, 0), back(n * item, 0);
  const int32_t h_src = a_->register_memory_region("src", addr_of(src), 0, src.size());
  const int32_t h_back = a_->register_memory_region("back", addr_of(back), 0, back.size());
  b_->register_memory_region("dst", addr_of(dst), 0, dst.size());
  connect();
  const int32_t h_dst = remote("dst");

  // Strided: item i goes to remote offset 2*i*item, so every item's placement is checked.
  std::vector<Assignment> batch, back_batch;
  for (size_t i = 0; i < n; ++i) {
    batch.push_back({h_src, h_dst, 2 * i * item, i * item, item});
    back_batch.push_back({h_back, h_dst, 2 * i * item, i * item, item});
  }
  auto w = a_->write(batch);
  ASSERT_EQ(status_within(w), 0) << w.message();
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(std::equal(src.begin() + i * item, src.begin() + (i + 1) * item, dst.begin() + 2 * i * item)) << i;
    ASSERT_TRUE(std::all_of(dst.begin() + (2 * i + 1) * item, dst.begin() + (2 * i + 2) * item,
                            [](uint8_t v) { return v == 0; }))
        << i;
  }
  auto r = a_->read(back_batch);
  ASSERT_EQ(status_within(r), 0) << r.message();
  EXPECT_EQ(r.nbytes(), n * item);
  EXPECT_EQ(back, src);
}

TEST_P(Conformance, BoundsAndUnknownHandleErrorsFailAlone) {
  REQUIRE_CAPABILITY(OpKind::kWrite);
  REQUIRE_CAPABILITY(OpKind::kRead);
  auto src = pattern(256, 1);
  std::vector<uint8_t> dst(256, 0);
  const int32_t h_src = a_->register_memory_region("src", addr_of(src), 0, src.size());
  b_->register_memory_region("dst", addr_of(dst), 0, dst.size());
  connect();
  const int32_t h_dst = remote("dst");
  struct Case {
    Assignment item;
    StatusCode expected;
    const char* what;
  };
  const std::vector<Case> cases = {
      {{h_src + 100, h_dst, 0, 0, 8}, StatusCode::kUnknownHandle, "unknown local handle"},
      {{h_src, h_dst + 100, 0, 0, 8}, StatusCode::kUnknownHandle, "unknown remote handle"},
      {{h_src, h_dst, 250, 0, 8}, StatusCode::kOutOfBounds, "remote range past the end"},
      {{h_src, h_dst, 0, 250, 8}, StatusCode::kOutOfBounds, "local range past the end"},
      {{h_src, h_dst, uint64_t(1) << 63, 0, 8}, StatusCode::kOutOfBounds, "offset + length overflows"},
  };
  for (const auto& c : cases) {
    for (OpKind kind : {OpKind::kWrite, OpKind::kRead}) {
      auto f = kind == OpKind::kWrite ? a_->write({c.item}) : a_->read({c.item});
      EXPECT_EQ(status_within(f), code(c.expected)) << op_kind_name(kind) << ", " << c.what << ": " << f.message();
      EXPECT_FALSE(f.message().empty()) << c.what;
      // Fails alone: the next op on the same connection succeeds.
      auto ok = a_->write({{h_src, h_dst, 0, 0, 4}});
      ASSERT_EQ(status_within(ok), 0) << "after " << c.what << ": " << ok.message();
    }
  }
  // A good item in the same batch as a bad one: the batch fails, with the bad item's status.
  auto mixed = a_->write({{h_src, h_dst, 0, 0, 8}, {h_src, h_dst, 250, 0, 8}});
  EXPECT_EQ(status_within(mixed), code(StatusCode::kOutOfBounds)) << mixed.message();
  EXPECT_TRUE(std::all_of(dst.begin() + 8, dst.end(), [](uint8_t v) { return v == 0; }))
      << "a refused item wrote bytes";
  auto all = a_->write({{h_src, h_dst, 0, 0, 256}});
  ASSERT_EQ(status_within(all), 0) << all.message();
  EXPECT_EQ(dst, src);
}

// --- two-sided -------------------------------------------------------------------------

TEST_P(Conformance, SendAndRecvAreByteExactWithOffsetsOnBothSides) {
  REQUIRE_CAPABILITY(OpKind::kSend);
  connect();
  auto out = pattern(1000, 9);
  std::vector<uint8_t> inbox(2000, 0xAA);
  // Sender's bytes [5, 505); receiver's buffer [100, 700).
  auto rv = b_->recv({addr_of(inbox), 100, 600});
  auto sd = a_->send({addr_of(out), 5, 500});
  ASSERT_EQ(status_within(sd), 0) << sd.message();
  ASSERT_EQ(status_within(rv), 0) << rv.message();
  EXPECT_EQ(rv.nbytes(), 500u);
  EXPECT_TRUE(std::equal(out.begin() + 5, out.begin() + 505, inbox.begin() + 100));
  EXPECT_TRUE(std::all_of(inbox.begin(), inbox.begin() + 100, [](uint8_t v) { return v == 0xAA; }));
  EXPECT_TRUE(std::all_of(inbox.begin() + 600, inbox.end(), [](uint8_t v) { return v == 0xAA; }));

  // And the other way, several messages: they arrive in order.
  std::vector<std::vector<uint8_t>> boxes(8, std::vector<uint8_t>(64, 0));
  std::vector<Future> recvs, sends;
  for (auto& box : boxes) recvs.push_back(a_->recv({addr_of(box), 0, box.size()}));
  std::vector<std::vector<uint8_t>> msgs;
  for (int i = 0; i < 8; ++i) msgs.push_back(pattern(10 + i, uint8_t(i)));
  for (auto& m : msgs) sends.push_back(b_->send({addr_of(m), 0, m.size()}));
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(status_within(sends[i]), 0) << sends[i].message();
    ASSERT_EQ(status_within(recvs[i]), 0) << recvs[i].message();
    ASSERT_EQ(recvs[i].nbytes(), msgs[i].size()) << i;
    EXPECT_TRUE(std::equal(msgs[i].begin(), msgs[i].end(), boxes[i].begin())) << i;
  }
}

TEST_P(Conformance, MessageShorterThanThePostedBufferReportsItsLength) {
  REQUIRE_CAPABILITY(OpKind::kSend);
  connect();
  std::vector<uint8_t> box(64, 0xAA);
  auto rv = b_->recv({addr_of(box), 0, box.size()});
  std::string msg = "0123456789";
  auto sd = a_->send({reinterpret_cast<uintptr_t>(msg.data()), 0, msg.size()});
  ASSERT_EQ(status_within(sd), 0) << sd.message();
  ASSERT_EQ(status_within(rv), 0) << rv.message();
  EXPECT_EQ(rv.nbytes(), msg.size());
  EXPECT_EQ(std::string(box.begin(), box.begin() + 10), msg);
  EXPECT_TRUE(std::all_of(box.begin() + 10, box.end(), [](uint8_t v) { return v == 0xAA; }));
}

TEST_P(Conformance, MessageLongerThanThePostedBufferFailsThatRecvAlone) {
  REQUIRE_CAPABILITY(OpKind::kSend);
  connect();
  std::vector<uint8_t> box(64, 0xAA);
  auto msg = pattern(40, 5);
  auto rv = b_->recv({addr_of(box), 8, 16});  // bytes [8, 24) only
  auto sd = a_->send({addr_of(msg), 0, msg.size()});
  EXPECT_EQ(status_within(rv), code(StatusCode::kMessageTooLarge)) << rv.message();
  EXPECT_EQ(status_within(sd), code(StatusCode::kMessageTooLarge)) << sd.message();
  EXPECT_TRUE(std::all_of(box.begin(), box.end(), [](uint8_t v) { return v == 0xAA; }))
      << "bytes were written into or past the too-small buffer";
  // The connection stays usable.
  auto rv2 = b_->recv({addr_of(box), 0, box.size()});
  auto sd2 = a_->send({addr_of(msg), 0, msg.size()});
  ASSERT_EQ(status_within(sd2), 0) << sd2.message();
  ASSERT_EQ(status_within(rv2), 0) << rv2.message();
  EXPECT_EQ(rv2.nbytes(), msg.size());
  EXPECT_TRUE(std::equal(msg.begin(), msg.end(), box.begin()));
}

TEST_P(Conformance, ExactSizeRecvFailsAShorterMessageAndItsSenderLearns) {
  REQUIRE_CAPABILITY(OpKind::kSend);
  connect();
  // Eager-sized and large (a transport may move those differently: RDMA's rendezvous).
  for (const size_t size : {size_t{64}, size_t{256} << 10}) {
    std::vector<uint8_t> box(size, 0);
    auto shorter = pattern(size / 2, 3);
    auto rv = b_->recv({addr_of(box), 0, box.size()}, /*exact_size=*/true);
    auto sd = a_->send({addr_of(shorter), 0, shorter.size()});
    EXPECT_EQ(status_within(rv), code(StatusCode::kFailed)) << size << ": " << rv.message();
    EXPECT_NE(rv.message().find("exact_size"), std::string::npos) << rv.message();
    EXPECT_EQ(rv.nbytes(), 0u);
    EXPECT_EQ(status_within(sd), code(StatusCode::kFailed)) << size << ": the sender must learn the refusal";
    // The message was consumed by that recv; the next one fitting exactly is delivered.
    auto exact = pattern(size, 9);
    auto rv2 = b_->recv({addr_of(box), 0, box.size()}, /*exact_size=*/true);
    auto sd2 = a_->send({addr_of(exact), 0, exact.size()});
    ASSERT_EQ(status_within(sd2), 0) << sd2.message();
    ASSERT_EQ(status_within(rv2), 0) << rv2.message();
    EXPECT_EQ(rv2.nbytes(), size);
    EXPECT_TRUE(std::equal(exact.begin(), exact.end(), box.begin()));
  }
}

// --- per-op deadlines (OpRequest::timeout) ----------------------------------------------

TEST_P(Conformance, AnOpsOwnTimeoutEndsItLongBeforeTheEndpointsOpTimeout) {
  REQUIRE_CAPABILITY(OpKind::kSend);
  a_ = make_endpoint(GetParam(), refusing_receiver_options(GetParam(), 20s));
  b_ = make_endpoint(GetParam(), refusing_receiver_options(GetParam(), 20s));
  connect();
  auto msg = pattern(4096, 1);
  const auto t0 = std::chrono::steady_clock::now();
  auto sd = a_->send({addr_of(msg), 0, msg.size()}, 200ms);  // b posts no recv: no answer
  EXPECT_EQ(status_within(sd), code(StatusCode::kTimeout)) << sd.message();
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 190ms) << "the deadline passed early";
  EXPECT_LT(took, 10s) << "the endpoint's op_timeout (20 s) applied instead of the op's";
  EXPECT_NE(sd.message().find("200 ms (its timeout)"), std::string::npos) << sd.message();
}

TEST_P(Conformance, AnOpsOwnTimeoutLongerThanTheEndpointsOpTimeoutWins) {
  REQUIRE_CAPABILITY(OpKind::kSend);
  a_ = make_endpoint(GetParam(), refusing_receiver_options(GetParam(), 100ms));
  b_ = make_endpoint(GetParam(), refusing_receiver_options(GetParam(), 100ms));
  connect();
  auto msg = pattern(4096, 2);
  const auto t0 = std::chrono::steady_clock::now();
  auto sd = a_->send({addr_of(msg), 0, msg.size()}, 1500ms);
  // op_timeout (100 ms) would have ended it by now.
  EXPECT_EQ(sd.wait_for(700ms), std::nullopt) << sd.message();
  EXPECT_EQ(status_within(sd), code(StatusCode::kTimeout)) << sd.message();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 1400ms);
  EXPECT_NE(sd.message().find("1500 ms (its timeout)"), std::string::npos) << sd.message();
  // An op without one still has the endpoint's.
  auto sd2 = a_->send({addr_of(msg), 0, msg.size()});
  EXPECT_EQ(status_within(sd2), code(StatusCode::kTimeout)) << sd2.message();
  EXPECT_NE(sd2.message().find("100 ms (op_timeout)"), std::string::npos) << sd2.message();
}

TEST_P(Conformance, APerOpTimeoutOutOfRangeOrOnARecvIsInvalid) {
  connect();
  std::vector<uint8_t> buf(16, 0);
  OpRequest req;
  req.kind = OpKind::kSend;
  req.chunk = {addr_of(buf), 0, buf.size()};
  if (caps_.supports(OpKind::kSend)) {
    req.timeout = -1ms;
    EXPECT_THROW(a_->submit(req), InvalidArgumentError);
    req.timeout = OpRequest::kMaxOpTimeout + 1ms;
    EXPECT_THROW(a_->submit(req), InvalidArgumentError);
    req.kind = OpKind::kRecv;
    req.timeout = 100ms;
    EXPECT_THROW(a_->submit(req), InvalidArgumentError);
  }
  if (caps_.supports(OpKind::kImmRecv)) {
    req.kind = OpKind::kImmRecv;
    req.timeout = 100ms;
    EXPECT_THROW(a_->submit(req), InvalidArgumentError);
  }
}

// --- waits and shutdown ----------------------------------------------------------------

TEST_P(Conformance, WaitForOnAnOpThatCannotCompleteReturnsNotDone) {
  REQUIRE_CAPABILITY(OpKind::kRecv);
  connect();
  std::vector<uint8_t> box(16, 0);
  auto rv = b_->recv({addr_of(box), 0, box.size()});  // nobody sends
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(rv.wait_for(50ms), std::nullopt);
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, 40ms);
  EXPECT_LT(waited, 5s) << "wait_for overslept its timeout";
  EXPECT_FALSE(rv.done());
  EXPECT_EQ(rv.status(), code(StatusCode::kPending));
  EXPECT_EQ(rv.wait_for(0ms), std::nullopt);  // a zero timeout polls
}

TEST_P(Conformance, ShutdownCompletesPendingFuturesWithCancelled) {
  REQUIRE_CAPABILITY(OpKind::kRecv);
  connect();
  std::vector<uint8_t> box(16, 0);
  std::vector<Future> pending;
  for (int i = 0; i < 3; ++i) pending.push_back(a_->recv({addr_of(box), 0, box.size()}));
  std::vector<uint8_t> peer_box(16, 0);
  Future peer_pending = b_->recv({addr_of(peer_box), 0, peer_box.size()});
  a_->shutdown();
  a_->shutdown();  // idempotent
  for (auto& f : pending) EXPECT_EQ(status_within(f, 10s), code(StatusCode::kCancelled)) << f.message();
  // Later ops fail the same way, and connect() refuses.
  EXPECT_EQ(status_within(a_->recv({addr_of(box), 0, box.size()}), 10s), code(StatusCode::kCancelled));
  EXPECT_THROW(a_->connect(b_->endpoint_info()), ConnectionError);
  // The peer learns: its posted recv fails instead of waiting forever.
  EXPECT_EQ(status_within(peer_pending), code(StatusCode::kPeerClosed)) << peer_pending.message();
}

// A message the receiver's recv completed was delivered: the sender must see OK even when
// the receiver shuts down right after (its acknowledgement is not lost in the teardown).
// Once with an idle receiver, once while the receiver's own large write is still on its
// connections. Rounds, because the shutdown races the acknowledgement.
TEST_P(Conformance, AMessageTheReceiverCompletedIsOkForTheSenderEvenIfTheReceiverShutsDownAtOnce) {
  REQUIRE_CAPABILITY(OpKind::kSend);
  REQUIRE_CAPABILITY(OpKind::kWrite);
  for (const bool busy : {false, true}) {
    for (int round = 0; round < 20; ++round) {
      SCOPED_TRACE(::testing::Message() << (busy ? "busy" : "idle") << " receiver, round " << round);
      auto sender = make(), receiver = make();
      std::vector<uint8_t> big(busy ? (8u << 20) : 64, 1), sink(big.size(), 0);
      const int32_t h_big = receiver->register_memory_region("big", addr_of(big), 0, big.size());
      sender->register_memory_region("sink", addr_of(sink), 0, sink.size());
      sender->connect(receiver->endpoint_info());
      receiver->connect(sender->endpoint_info());
      const int32_t h_sink =
          receiver->register_remote_memory_region("sink", sender->endpoint_info()["mr_info"]["sink"]);
      std::vector<uint8_t> box(64, 0);
      auto msg = pattern(48, static_cast<uint8_t>(round));
      auto rv = receiver->recv({addr_of(box), 0, box.size()});
      std::optional<Future> bulk;
      if (busy) bulk = receiver->write({{h_big, h_sink, 0, 0, big.size()}});
      auto sd = sender->send({addr_of(msg), 0, msg.size()});
      ASSERT_EQ(status_within(rv), 0) << rv.message();
      receiver->shutdown();
      ASSERT_TRUE(std::equal(msg.begin(), msg.end(), box.begin()));
      EXPECT_EQ(status_within(sd), 0) << sd.message();
      if (bulk) status_within(*bulk);  // cancelled or done: either is right for the receiver's own op
      sender->shutdown();
    }
  }
}

TEST_P(Conformance, OpsTheCapabilitiesExcludeThrowNotImplemented) {
  connect();
  std::vector<uint8_t> buf(16, 0);
  const Chunk chunk{addr_of(buf), 0, buf.size()};
  const std::vector<Assignment> item = {{0, 0, 0, 0, 1}};
  for (OpKind kind : {OpKind::kRead, OpKind::kWrite, OpKind::kWriteWithImm, OpKind::kSend, OpKind::kRecv,
                      OpKind::kImmRecv}) {
    if (caps_.supports(kind)) continue;
    OpRequest req;
    req.kind = kind;
    req.assignments = item;
    req.chunk = chunk;
    EXPECT_THROW(a_->submit(req), NotImplementedError) << op_kind_name(kind);
  }
  EXPECT_EQ(std::string(caps_.transport), GetParam());
  EXPECT_TRUE(caps_.host_memory) << "every transport moves host memory";
}

// --- unregister during traffic ---------------------------------------------------------

TEST_P(Conformance, NoByteLandsInARegionAfterUnregisterReturns) {
  REQUIRE_CAPABILITY(OpKind::kWrite);
  constexpr size_t size = 8 << 20, item = 512, per_batch = (1 << 20) / item;
  std::vector<uint8_t> src(size, 0x5A), dst(size, 0);
  const int32_t h_src = a_->register_memory_region("src", addr_of(src), 0, size);
  b_->register_memory_region("dst", addr_of(dst), 0, size);
  connect();
  const int32_t h_dst = remote("dst");
  std::vector<Future> writes;
  for (size_t k = 0; k < size / (1 << 20); ++k) {
    std::vector<Assignment> batch;
    for (size_t i = 0; i < per_batch; ++i) {
      const uint64_t off = (k << 20) + i * item;
      batch.push_back({h_src, h_dst, off, off, item});
    }
    writes.push_back(a_->write(std::move(batch)));
  }
  b_->unregister_memory_region("dst");
  std::memset(dst.data(), 0xEE, size);  // the canary: any later write would overwrite it
  for (auto& w : writes) {
    const int st = status_within(w);
    EXPECT_TRUE(st == 0 || st == code(StatusCode::kUnknownHandle)) << st << ": " << w.message();
  }
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](uint8_t v) { return v == 0xEE; }))
      << "bytes landed in the region after unregister returned";
  // The handle is gone at the owner; the connection still serves other regions.
  auto stale = a_->write({{h_src, h_dst, 0, 0, 8}});
  EXPECT_EQ(status_within(stale), code(StatusCode::kUnknownHandle)) << stale.message();
  std::vector<uint8_t> other(64, 0);
  b_->register_memory_region("other", addr_of(other), 0, other.size());
  auto ok = a_->write({{h_src, remote("other"), 0, 0, other.size()}});
  ASSERT_EQ(status_within(ok), 0) << ok.message();
  EXPECT_TRUE(std::all_of(other.begin(), other.end(), [](uint8_t v) { return v == 0x5A; }));
}

// --- a peer process killed mid-transfer ------------------------------------------------

constexpr size_t kPeerRegion = 64 << 20;

// The peer side (this binary with --peer): registers "peer", prints its endpoint_info as
// one line, reads ours, connects, prints "connected", then serves until killed (or until
// stdin closes).
int run_peer(const std::string& transport) {
  try {
    auto ep = make_endpoint(transport, transport_options(transport));
    std::vector<uint8_t> region(kPeerRegion, 0x33);
    ep->register_memory_region("peer", addr_of(region), 0, region.size());
    std::cout << ep->endpoint_info().dump() << std::endl;
    std::string line;
    if (!std::getline(std::cin, line)) return 2;
    ep->connect(json::parse(line));
    std::cout << "connected" << std::endl;
    while (std::getline(std::cin, line)) {
    }
    ep->shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "conformance peer: " << e.what() << std::endl;
    return 1;
  }
}

// A peer process, spawned with pipes to its stdin and stdout. Killed when destroyed.
class PeerProcess {
 public:
  explicit PeerProcess(const std::string& transport) {
    int in[2], out[2];
    if (::pipe(in) != 0 || ::pipe(out) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    std::string exe = "/proc/self/exe", flag = "--peer", name = transport;
    char* argv[] = {exe.data(), flag.data(), name.data(), nullptr};
    const int rc = posix_spawn(&pid_, exe.c_str(), &fa, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    to_child_ = in[1];
    from_child_ = out[0];
    if (rc != 0) {
      pid_ = -1;
      throw std::runtime_error(std::string("posix_spawn failed: ") + std::strerror(rc));
    }
  }
  ~PeerProcess() {
    kill();
    ::close(to_child_);
    ::close(from_child_);
  }

  // One line from the child, or nullopt after `timeout` or at its EOF.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (auto nl = buffered_.find('\n'); nl != std::string::npos) {
        std::string line = buffered_.substr(0, nl);
        buffered_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{from_child_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(from_child_, buf, sizeof buf);
      if (n <= 0) return std::nullopt;
      buffered_.append(buf, static_cast<size_t>(n));
    }
  }
  void write_line(const std::string& line) {
    const std::string data = line + "\n";
    ASSERT_EQ(::write(to_child_, data.data(), data.size()), static_cast<ssize_t>(data.size()));
  }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
  std::string buffered_;
};

TEST_P(Conformance, PeerProcessKilledMidTransferFailsPendingFuturesWithinADeadline) {
  REQUIRE_CAPABILITY(OpKind::kWrite);
  REQUIRE_CAPABILITY(OpKind::kRead);
  REQUIRE_CAPABILITY(OpKind::kRecv);
  PeerProcess peer(GetParam());
  auto info = peer.read_line(30s);
  ASSERT_TRUE(info) << "the peer process did not start";
  const json peer_info = json::parse(*info);
  std::vector<uint8_t> local(kPeerRegion, 0x01);
  const int32_t h_local = a_->register_memory_region("local", addr_of(local), 0, local.size());
  a_->connect(peer_info);
  peer.write_line(a_->endpoint_info().dump());
  ASSERT_EQ(peer.read_line(30s), std::optional<std::string>("connected"));
  const int32_t h_peer = a_->register_remote_memory_region("peer", peer_info["mr_info"]["peer"]);

  std::vector<uint8_t> box(64, 0);
  std::vector<Future> futures = {a_->recv({addr_of(box), 0, box.size()})};  // can only fail
  for (int i = 0; i < 4; ++i) {
    futures.push_back(a_->write({{h_local, h_peer, 0, 0, kPeerRegion}}));
    futures.push_back(a_->read({{h_local, h_peer, 0, 0, kPeerRegion}}));
  }
  peer.kill();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> statuses;
  for (auto& f : futures) statuses.push_back(status_within(f, 15s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 15s);
  EXPECT_EQ(statuses[0], code(StatusCode::kPeerClosed)) << futures[0].message();
  bool some_failed = false;
  for (size_t i = 1; i < statuses.size(); ++i) {
    EXPECT_NE(statuses[i], -1) << "future " << i << " hung after the peer died";
    // Submission may reach the transport after it has seen the loss: NOT_CONNECTED then.
    EXPECT_TRUE(statuses[i] == 0 || statuses[i] == code(StatusCode::kPeerClosed) ||
                statuses[i] == code(StatusCode::kNotConnected))
        << i << ": " << statuses[i] << " " << futures[i].message();
    some_failed |= statuses[i] != 0;
  }
  EXPECT_TRUE(some_failed) << "every 64 MiB transfer finished before the kill: nothing was mid-transfer";

  // The survivor notices, and connects to a new peer.
  ASSERT_TRUE(wait_until([&] { return !a_->is_connected(); })) << "the dead peer was not noticed";
  std::vector<uint8_t> dst(16, 0);
  b_->register_memory_region("dst", addr_of(dst), 0, dst.size());
  connect();
  auto w = a_->write({{h_local, remote("dst"), 0, 0, dst.size()}});
  ASSERT_EQ(status_within(w), 0) << w.message();
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](uint8_t v) { return v == 0x01; }));
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Transports, Conformance, ::testing::ValuesIn(usable_transports()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });
// A build with no usable transport (e.g. -DBUILD_TCP=OFF) has nothing to run here.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Conformance);

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--peer") return run_peer(argv[2]);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
