// RDMAEndpoint on the strict simulated device (DLSLIME_RDMA_SIM=1): what a user relies on
// (bytes that arrived, the status an op ends with and its reason, futures that never hang),
// including the faults a NIC produces (bad rkey, QP error, dead peer, deadline).
#include <stdlib.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "dlslime/errors.h"
#include "dlslime/rdma_endpoint.h"
#include "dlslime/transport.h"
#include "device_buffer.h"
#include "gpu/device_runtime.h"
#include "rdma/sim_device.h"
#include "rdma/verbs.h"
#include "test_support.h"

namespace dlslime {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr auto kDeadline = 10s;

int status_within(const Future& f, std::chrono::nanoseconds t = kDeadline) { return f.wait_for(t).value_or(-1); }
using test_support::addr_of;
using test_support::code;
using test_support::wait_until;
std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + seed);
  return v;
}

class RdmaEndpointTest : public ::testing::Test {
 protected:
  void SetUp() override { ::setenv("DLSLIME_RDMA_SIM", "1", 1); }
  void TearDown() override {
    ::unsetenv("SLIME_VISIBLE_DEVICES");
    if (a_) a_->shutdown();
    if (b_) b_->shutdown();
  }
  void make(RdmaOptions options = RdmaOptions()) {
    a_ = std::make_unique<RDMAEndpoint>(options);
    b_ = std::make_unique<RDMAEndpoint>(options);
  }
  void connect() {
    a_->connect(b_->endpoint_info());
    b_->connect(a_->endpoint_info());
  }
  int32_t remote(const std::string& name) {
    return a_->register_remote_memory_region(name, b_->endpoint_info()["mr_info"][name]);
  }
  std::unique_ptr<RDMAEndpoint> a_, b_;
};

TEST_F(RdmaEndpointTest, EndpointInfoHasEveryQpAndEveryRegionsRkey) {
  RdmaOptions o;
  o.num_qp = 3;
  make(o);
  std::vector<uint8_t> buf(4096);
  a_->register_memory_region("buf", addr_of(buf), 16, 1000);
  const json info = a_->endpoint_info();
  EXPECT_EQ(info["transport"], "rdma");
  EXPECT_EQ(info["link_layer"], "Ethernet");
  EXPECT_EQ(info["num_qp"], 3);
  ASSERT_EQ(info["qp_info"].size(), 3u);
  std::vector<uint32_t> qpns;
  for (const auto& q : info["qp_info"]) {
    // The simulated device's GID encodes this process's pid (docs/rdma.md).
    EXPECT_EQ(q["gid"], rdma::gid_to_string(rdma::sim::device_gid()));
    EXPECT_EQ(q["lid"], 0);
    EXPECT_EQ(q["mtu"], 4096);
    EXPECT_LE(q["psn"].get<uint32_t>(), 0xffffffu);
    qpns.push_back(q["qpn"].get<uint32_t>());
  }
  EXPECT_EQ(qpns, a_->qp_nums());
  const json& mr = info["mr_info"]["buf"];
  EXPECT_EQ(mr["addr"].get<uint64_t>(), addr_of(buf) + 16);
  EXPECT_EQ(mr["length"], 1000);
  EXPECT_TRUE(mr.contains("rkey"));
}

// The device's limits (ibv_query_device) bound the CQ and the queues: asking for more is an
// error naming the option and the limit, before verbs would refuse it with a bare EINVAL.
// Fork safety (review F12): the adapter asks for it before it opens any device.
TEST_F(RdmaEndpointTest, TheAdapterCallsForkInitBeforeOpeningADevice) {
  make();
  EXPECT_EQ(rdma::sim_object_counts().fork_init, 1);
}

TEST_F(RdmaEndpointTest, QueuesBeyondTheDevicesCapsAreRefusedNamingTheLimit) {
  RdmaOptions big;
  big.num_qp = 8;
  big.max_send_wr = 16384;  // 8 x 16384 + 128 completion entries > max_cqe 65536
  try {
    RDMAEndpoint ep(big);
    FAIL() << "a CQ beyond max_cqe was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("max_cqe 65536"), std::string::npos) << e.what();
  }
  RdmaOptions fits;
  fits.num_qp = 3;
  fits.max_send_wr = 16384;
  EXPECT_NO_THROW(RDMAEndpoint ep(fits));
}

TEST_F(RdmaEndpointTest, ConnectRefusesTwiceAMismatchAndBadOptionsWithClearErrors) {
  make();
  RdmaOptions two;
  two.num_qp = 2;
  RDMAEndpoint c(two);
  try {
    a_->connect(c.endpoint_info());
    FAIL() << "num_qp mismatch accepted";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("num_qp mismatch"), std::string::npos) << e.what();
  }
  json ib = b_->endpoint_info();
  ib["link_layer"] = "InfiniBand";
  try {
    a_->connect(ib);
    FAIL() << "link-layer mismatch accepted";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("link layer mismatch"), std::string::npos) << e.what();
  }
  EXPECT_THROW(a_->connect(json{{"transport", "rdma"}}), ConnectionError);
  EXPECT_FALSE(a_->is_connected());
  connect();
  EXPECT_TRUE(a_->is_connected());
  try {
    a_->connect(b_->endpoint_info());
    FAIL() << "second connect accepted";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("already connected"), std::string::npos) << e.what();
  }
  c.shutdown();

  RdmaOptions bad;
  bad.device_name = "mlx5_nope";
  EXPECT_THROW(RDMAEndpoint{bad}, NotFoundError);
  bad = RdmaOptions();
  bad.link_type = "IB";
  try {
    RDMAEndpoint ep(bad);
    FAIL() << "an Ethernet port was taken for link_type=IB";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("not InfiniBand"), std::string::npos) << e.what();
  }
  bad = RdmaOptions();
  bad.ib_port = 2;
  EXPECT_THROW(RDMAEndpoint{bad}, ConnectionError);
  EXPECT_THROW(RdmaOptions::from_json({{"num_qp", 0}}), InvalidArgumentError);
  EXPECT_THROW(RdmaOptions::from_json({{"link_type", "token-ring"}}), InvalidArgumentError);
  EXPECT_THROW(RdmaOptions::from_json({{"qp_num", 2}}), InvalidArgumentError);
}

TEST_F(RdmaEndpointTest, DestroyingAnEndpointDestroysEveryVerbsObjectChildrenFirst) {
  // Review F1: the message pools' MRs outlived the PD and the context, a use-after-free in
  // libibverbs at every destruction. The simulated device refuses (and counts) a destroy
  // of a parent with live children, as verbs does.
  const rdma::SimObjectCounts before = rdma::sim_object_counts();
  {
    RdmaOptions o;
    o.num_qp = 2;
    make(o);
    std::vector<uint8_t> src = pattern(4096, 1), dst(4096, 0);
    const int32_t h_src = a_->register_memory_region("src", addr_of(src), 0, src.size());
    b_->register_memory_region("dst", addr_of(dst), 0, dst.size());
    connect();
    ASSERT_EQ(status_within(a_->write({{h_src, remote("dst"), 0, 0, 4096}})), 0);
    ASSERT_EQ(dst, src);
    const std::string msg = "hello";
    std::vector<uint8_t> box(64, 0);
    auto r = b_->recv(Chunk{addr_of(box), 0, box.size()});
    ASSERT_EQ(status_within(a_->send(Chunk{reinterpret_cast<uintptr_t>(msg.data()), 0, msg.size()})), 0);
    ASSERT_EQ(status_within(r), 0);
    EXPECT_GT(rdma::sim_object_counts().mrs, before.mrs);
    a_.reset();
    b_.reset();
  }
  // The completion thread holds the endpoint until it has stopped: the objects go then.
  EXPECT_TRUE(wait_until([&] { return rdma::sim_object_counts().contexts == before.contexts; }))
      << "the endpoints' device contexts were never destroyed";
  const rdma::SimObjectCounts after = rdma::sim_object_counts();
  EXPECT_EQ(after.destroy_failures, before.destroy_failures) << "a verbs object was destroyed before its children";
  EXPECT_EQ(after.contexts, before.contexts);
  EXPECT_EQ(after.pds, before.pds);
  EXPECT_EQ(after.cqs, before.cqs);
  EXPECT_EQ(after.comp_channels, before.comp_channels);
  EXPECT_EQ(after.qps, before.qps);
  EXPECT_EQ(after.mrs, before.mrs);
}

TEST_F(RdmaEndpointTest, WritesAndReadsStripedOverQpsAreByteExact) {
  RdmaOptions o;
  o.num_qp = 4;
  o.chunk_size = 4096;
  make(o);
  constexpr size_t n = 1 << 20;
  auto src = pattern(n, 3);
  std::vector<uint8_t> dst(n + 8192, 0), back(n, 0);
  const int32_t h_src = a_->register_memory_region("src", addr_of(src), 0, n);
  const int32_t h_back = a_->register_memory_region("back", addr_of(back), 0, n);
  b_->register_memory_region("dst", addr_of(dst), 4096, n);
  connect();
  const int32_t h_dst = remote("dst");
  auto w = a_->write({{h_src, h_dst, 0, 0, n}});
  ASSERT_EQ(status_within(w), 0) << w.message();
  EXPECT_EQ(w.nbytes(), n);
  EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin() + 4096));
  EXPECT_TRUE(std::all_of(dst.begin(), dst.begin() + 4096, [](uint8_t v) { return v == 0; }));
  EXPECT_TRUE(std::all_of(dst.end() - 4096, dst.end(), [](uint8_t v) { return v == 0; }));
  auto r = a_->read({{h_back, h_dst, 0, 0, n}});
  ASSERT_EQ(status_within(r), 0) << r.message();
  EXPECT_EQ(r.nbytes(), n);
  EXPECT_EQ(back, src);
  // Small items stay inline and exact too.
  auto small = a_->write({{h_src, h_dst, 7, 100, 9}});
  ASSERT_EQ(status_within(small), 0) << small.message();
  EXPECT_TRUE(std::equal(src.begin() + 100, src.begin() + 109, dst.begin() + 4096 + 7));
}

TEST_F(RdmaEndpointTest, BatchLargerThanTheSendQueueIsQueuedNotFailed) {
  RdmaOptions o;
  o.max_send_wr = 8;
  o.num_qp = 2;
  make(o);
  constexpr size_t items = 1000, item = 64;
  auto src = pattern(items * item, 5);
  std::vector<uint8_t> dst(items * item, 0), back(items * item, 0);
  const int32_t h_src = a_->register_memory_region("src", addr_of(src), 0, src.size());
  const int32_t h_back = a_->register_memory_region("back", addr_of(back), 0, back.size());
  b_->register_memory_region("dst", addr_of(dst), 0, dst.size());
  connect();
  const int32_t h_dst = remote("dst");
  std::vector<Assignment> wb, rb;
  for (size_t i = 0; i < items; ++i) {
    // Reversed on the remote side, so each item's placement is checked.
    wb.push_back({h_src, h_dst, (items - 1 - i) * item, i * item, item});
    rb.push_back({h_back, h_dst, (items - 1 - i) * item, i * item, item});
  }
  std::vector<Future> writes;
  for (int k = 0; k < 3; ++k) writes.push_back(a_->write(wb));
  for (auto& w : writes) ASSERT_EQ(status_within(w), 0) << w.message();
  for (size_t i = 0; i < items; ++i) {
    ASSERT_TRUE(std::equal(src.begin() + i * item, src.begin() + (i + 1) * item,
                           dst.begin() + (items - 1 - i) * item))
        << i;
  }
  auto r = a_->read(rb);
  ASSERT_EQ(status_within(r), 0) << r.message();
  EXPECT_EQ(back, src);
}

TEST_F(RdmaEndpointTest, OutOfRangeAndUnknownHandlesFailThatOpAlone) {
  make();
  auto src = pattern(256, 1);
  std::vector<uint8_t> dst(256, 0);
  const int32_t h_src = a_->register_memory_region("src", addr_of(src), 0, src.size());
  b_->register_memory_region("dst", addr_of(dst), 0, dst.size());
  connect();
  const int32_t h_dst = remote("dst");
  auto f = a_->write({{h_src, h_dst, 0, 0, 8}, {h_src, h_dst, 250, 0, 8}});
  EXPECT_EQ(status_within(f), code(StatusCode::kOutOfBounds)) << f.message();
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](uint8_t v) { return v == 0; })) << "a refused batch wrote bytes";
  f = a_->read({{h_src, h_dst, 0, 250, 8}});
  EXPECT_EQ(status_within(f), code(StatusCode::kOutOfBounds)) << f.message();
  f = a_->write({{h_src + 9, h_dst, 0, 0, 8}});
  EXPECT_EQ(status_within(f), code(StatusCode::kUnknownHandle)) << f.message();
  f = a_->write({{h_src, h_dst + 9, 0, 0, 8}});
  EXPECT_EQ(status_within(f), code(StatusCode::kUnknownHandle)) << f.message();
  auto ok = a_->write({{h_src, h_dst, 0, 0, 256}});
  ASSERT_EQ(status_within(ok), 0) << ok.message();
  EXPECT_EQ(dst, src);
  EXPECT_TRUE(a_->is_connected());
}

TEST_F(RdmaEndpointTest, AnUnregisteredPeerRegionFailsLaterOpsAloneAndTheQpLives) {
  make();
  auto src = pattern(256, 1);
  std::vector<uint8_t> dst(256, 0), other(256, 0);
  const int32_t h_src = a_->register_memory_region("src", addr_of(src), 0, src.size());
  b_->register_memory_region("dst", addr_of(dst), 0, dst.size());
  connect();
  const int32_t h_dst = remote("dst");
  // The owner revokes the rkey with the initiator before deregistering it, so no op meets a
  // dead rkey: later ones fail locally and the QP stays up.
  b_->unregister_memory_region("dst");
  auto f = a_->write({{h_src, h_dst, 0, 0, 64}});
  EXPECT_EQ(status_within(f), code(StatusCode::kUnknownHandle)) << f.message();
  EXPECT_NE(f.message().find("unregistered by the peer"), std::string::npos) << f.message();
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](uint8_t v) { return v == 0; }));
  EXPECT_TRUE(a_->is_connected());
  b_->register_memory_region("other", addr_of(other), 0, other.size());
  auto ok = a_->write({{h_src, remote("other"), 0, 0, 256}});
  ASSERT_EQ(status_within(ok), 0) << ok.message();
  EXPECT_EQ(other, src);
}

TEST_F(RdmaEndpointTest, AWrongRkeyIsARemoteAccessErrorThatNamesItsCause) {
  make();
  auto src = pattern(256, 1);
  std::vector<uint8_t> dst(256, 0);
  const int32_t h_src = a_->register_memory_region("src", addr_of(src), 0, src.size());
  b_->register_memory_region("dst", addr_of(dst), 0, dst.size());
  connect();
  json entry = b_->endpoint_info()["mr_info"]["dst"];
  entry["rkey"] = entry["rkey"].get<uint32_t>() + 1000;  // a key the peer never gave out
  const int32_t h_bad = a_->register_remote_memory_region("bad", entry);
  auto f = a_->write({{h_src, h_bad, 0, 0, 64}});
  EXPECT_EQ(status_within(f), code(StatusCode::kUnknownHandle)) << f.message();
  EXPECT_NE(f.message().find("REM_ACCESS_ERR"), std::string::npos) << f.message();
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](uint8_t v) { return v == 0; }));
  // An RC QP does not survive a remote access error: the endpoint says so, later ops too.
  EXPECT_FALSE(a_->is_connected());
  auto later = a_->write({{h_src, remote("dst"), 0, 0, 8}});
  EXPECT_EQ(status_within(later), code(StatusCode::kNotConnected)) << later.message();
  EXPECT_NE(later.message().find("REM_ACCESS_ERR"), std::string::npos) << later.message();
}

// Endpoints whose peer stops answering without a word (no BYE): b's QPs are failed, so
// a's work is retried for the ACK timeout, as with a peer that lost power.
void silence(RDMAEndpoint& ep) {
  for (uint32_t qpn : ep.qp_nums()) rdma::sim::fail_qp(qpn);
}

class RdmaSilentPeer : public RdmaEndpointTest {
 protected:
  void start(RdmaOptions o) {
    make(o);
    src_ = pattern(1 << 16, 2);
    dst_.assign(1 << 16, 0);
    h_src_ = a_->register_memory_region("src", addr_of(src_), 0, src_.size());
    b_->register_memory_region("dst", addr_of(dst_), 0, dst_.size());
    connect();
    h_dst_ = remote("dst");
    silence(*b_);
  }
  // Two 32 KiB items: a 64 KiB batch, striped one item per QP over num_qp = 2.
  std::vector<Assignment> both_qps() const {
    const uint64_t half = src_.size() / 2;
    return {{h_src_, h_dst_, 0, 0, half}, {h_src_, h_dst_, half, half, half}};
  }
  std::vector<uint8_t> src_, dst_;
  int32_t h_src_ = -1, h_dst_ = -1;
};

TEST_F(RdmaSilentPeer, QpFailureFailsEveryPendingFutureWithItsCause) {
  RdmaOptions o;
  o.ack_timeout = 22;  // 17 s per retry: nothing completes unless the QP fails
  o.op_timeout = 0ms;
  start(o);
  std::vector<Future> pending;
  for (int i = 0; i < 5; ++i) pending.push_back(a_->write({{h_src_, h_dst_, 0, 0, 4096}}));
  pending.push_back(a_->read({{h_src_, h_dst_, 0, 0, 4096}}));
  for (auto& f : pending) EXPECT_EQ(f.wait_for(20ms), std::nullopt);
  rdma::sim::fail_qp(a_->qp_nums()[0]);
  for (auto& f : pending) {
    EXPECT_EQ(status_within(f), code(StatusCode::kFailed)) << f.message();
    EXPECT_NE(f.message().find("WR_FLUSH_ERR"), std::string::npos) << f.message();
  }
  EXPECT_FALSE(a_->is_connected());
}

TEST_F(RdmaSilentPeer, ADeadPeerFailsPendingFuturesWithinTheRetryBound) {
  RdmaOptions o;
  o.ack_timeout = 8;  // 1 ms
  o.retry_cnt = 2;
  start(o);
  auto f = a_->write({{h_src_, h_dst_, 0, 0, 4096}});
  EXPECT_EQ(status_within(f, 5s), code(StatusCode::kPeerClosed)) << f.message();
  EXPECT_NE(f.message().find("RETRY_EXC_ERR"), std::string::npos) << f.message();
}

TEST_F(RdmaSilentPeer, DeadlineFailsTheOpWithTimeout) {
  RdmaOptions o;
  o.ack_timeout = 22;
  o.op_timeout = 100ms;
  start(o);
  const auto t0 = std::chrono::steady_clock::now();
  auto f = a_->write({{h_src_, h_dst_, 0, 0, 4096}});
  EXPECT_EQ(status_within(f, 5s), code(StatusCode::kTimeout)) << f.message();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 90ms);
  EXPECT_NE(f.message().find("deadline"), std::string::npos) << f.message();
  EXPECT_FALSE(a_->is_connected());
}

// Liveness (review F11): a side that only waits (a recv, an imm_recv) has nothing on the
// wire, so only the keepalive probe can find that the peer went silent.
TEST_F(RdmaSilentPeer, TheKeepaliveProbeNoticesASilentPeerWhileThisSideOnlyWaits) {
  for (const auto keepalive : {0ms, 100ms}) {
    SCOPED_TRACE(fmt::format("keepalive {} ms", keepalive.count()));
    RdmaOptions o;
    o.ack_timeout = 8;  // 1 ms
    o.retry_cnt = 2;
    o.keepalive = keepalive;
    make(o);
    src_ = pattern(4096, 3);
    dst_.assign(4096, 0);
    h_src_ = a_->register_memory_region("src", addr_of(src_), 0, src_.size());
    b_->register_memory_region("dst", addr_of(dst_), 0, dst_.size());
    connect();
    auto w = a_->write({{h_src_, remote("dst"), 0, 0, 4096}});
    ASSERT_EQ(status_within(w), 0) << w.message();  // the peer has answered once
    std::vector<uint8_t> box(64);
    auto rv = a_->recv(Chunk{addr_of(box), 0, box.size()});
    auto imm = a_->imm_recv();
    silence(*b_);
    if (keepalive == 0ms) {
      EXPECT_EQ(rv.wait_for(1s), std::nullopt) << "without a probe nothing can notice: " << rv.message();
      EXPECT_TRUE(a_->is_connected());
    } else {
      for (Future* f : {&rv, &imm}) {
        EXPECT_EQ(status_within(*f, 5s), code(StatusCode::kPeerClosed)) << f->message();
        EXPECT_NE(f->message().find("RETRY_EXC_ERR"), std::string::npos) << f->message();
      }
      EXPECT_FALSE(a_->is_connected());
    }
    a_->shutdown();
    b_->shutdown();
  }
}

// A peer that has not connected back yet is not probed: the probe would fail the connection
// before the peer's connect() (both sides connect in their own time).
TEST_F(RdmaEndpointTest, APeerThatHasNeverAnsweredIsNotProbed) {
  RdmaOptions o;
  o.ack_timeout = 8;
  o.retry_cnt = 2;
  o.keepalive = 20ms;
  make(o);
  std::vector<uint8_t> src = pattern(64, 4), dst(64, 0);
  const int32_t h_src = a_->register_memory_region("src", addr_of(src), 0, src.size());
  b_->register_memory_region("dst", addr_of(dst), 0, dst.size());
  a_->connect(b_->endpoint_info());
  std::vector<uint8_t> box(64);
  auto rv = a_->recv(Chunk{addr_of(box), 0, box.size()});
  EXPECT_EQ(rv.wait_for(500ms), std::nullopt) << rv.message();  // 25 probe intervals
  EXPECT_TRUE(a_->is_connected());
  b_->connect(a_->endpoint_info());
  auto w = a_->write({{h_src, remote("dst"), 0, 0, 64}});
  ASSERT_EQ(status_within(w), 0) << w.message();
  EXPECT_EQ(dst, src);
}

// Review F12: only lane 0 carries messages, so only it has a receive queue (and the CQ only
// its entries); and no lane starts at a guessable PSN.
TEST_F(RdmaEndpointTest, OnlyLaneZeroHasReceivesAndEveryLaneARandomPsn) {
  // The earlier tests' endpoints are released by their completion threads, in their time.
  ASSERT_TRUE(wait_until([] { return rdma::sim_object_counts().contexts == 0; }));
  const rdma::SimObjectCounts before = rdma::sim_object_counts();
  RdmaOptions o;
  o.num_qp = 4;
  make(o);
  const rdma::SimObjectCounts with = rdma::sim_object_counts();
  EXPECT_EQ(with.recv_wrs - before.recv_wrs, 2 * int64_t(o.max_recv_wr));
  EXPECT_EQ(with.cqes - before.cqes, 2 * int64_t(4 * o.max_send_wr + o.max_recv_wr));
  std::vector<uint32_t> psns;
  for (RDMAEndpoint* ep : {a_.get(), b_.get()}) {
    const json info = ep->endpoint_info();
    for (const auto& q : info["qp_info"]) psns.push_back(q["psn"]);
  }
  std::sort(psns.begin(), psns.end());
  // Eight draws of 24 bits: a repeat or a zero is a one-in-a-million event, a constant a bug.
  EXPECT_EQ(std::unique(psns.begin(), psns.end()) - psns.begin(), 8) << "PSNs repeat";
  EXPECT_NE(psns.front(), 0u);
  connect();  // and they work
  std::vector<uint8_t> src = pattern(1 << 16, 5), dst(1 << 16, 0);
  const int32_t h_src = a_->register_memory_region("src", addr_of(src), 0, src.size());
  b_->register_memory_region("dst", addr_of(dst), 0, dst.size());
  auto w = a_->write({{h_src, remote("dst"), 0, 0, src.size()}});
  ASSERT_EQ(status_within(w), 0) << w.message();
  EXPECT_EQ(dst, src);
}

TEST_F(RdmaEndpointTest, WriteWithImmGivesOneImmRecvEventPerWriteInOrder) {
  RdmaOptions o;
  o.num_qp = 2;
  make(o);
  auto src = pattern(8192, 4);
  std::vector<uint8_t> dst(8192, 0);
  const int32_t h_src = a_->register_memory_region("src", addr_of(src), 0, src.size());
  b_->register_memory_region("dst", addr_of(dst), 0, dst.size());
  connect();
  const int32_t h_dst = remote("dst");
  auto early = b_->imm_recv();  // posted before the event
  auto w1 = a_->write_with_imm({{h_src, h_dst, 0, 0, 4096}, {h_src, h_dst, 4096, 4096, 4096}}, 0xabcd);
  ASSERT_EQ(status_within(w1), 0) << w1.message();
  ASSERT_EQ(status_within(early), 0) << early.message();
  EXPECT_EQ(early.imm_data(), 0xabcdu);
  EXPECT_EQ(dst, src) << "the immediate arrived before the batch's bytes";
  // Events that arrive first wait for their imm_recv, in order.
  std::vector<Future> writes;
  for (uint32_t i = 1; i <= 5; ++i) writes.push_back(a_->write_with_imm({{h_src, h_dst, 0, 0, 16 * i}}, i));
  for (auto& w : writes) ASSERT_EQ(status_within(w), 0) << w.message();
  for (uint32_t i = 1; i <= 5; ++i) {
    auto r = b_->imm_recv();
    ASSERT_EQ(status_within(r), 0) << r.message();
    EXPECT_EQ(r.imm_data(), i);
  }
  auto pending = b_->imm_recv();
  EXPECT_EQ(pending.wait_for(20ms), std::nullopt);
  b_->shutdown();
  EXPECT_EQ(status_within(pending), code(StatusCode::kCancelled)) << pending.message();
}

TEST_F(RdmaEndpointTest, ShutdownCancelsPendingOpsAndLaterOnes) {
  RdmaOptions o;
  o.ack_timeout = 22;
  make(o);
  auto src = pattern(4096, 1);
  std::vector<uint8_t> dst(4096, 0);
  const int32_t h_src = a_->register_memory_region("src", addr_of(src), 0, src.size());
  b_->register_memory_region("dst", addr_of(dst), 0, dst.size());
  connect();
  const int32_t h_dst = remote("dst");
  silence(*b_);  // a's writes now wait for ACKs that never come
  auto w = a_->write({{h_src, h_dst, 0, 0, 4096}});
  EXPECT_EQ(w.wait_for(20ms), std::nullopt);
  a_->shutdown();
  a_->shutdown();
  EXPECT_EQ(status_within(w), code(StatusCode::kCancelled)) << w.message();
  EXPECT_EQ(status_within(a_->write({{h_src, h_dst, 0, 0, 8}})), code(StatusCode::kCancelled));
  EXPECT_THROW(a_->connect(b_->endpoint_info()), ConnectionError);
}

TEST_F(RdmaEndpointTest, SlimeVisibleDevicesHidesTheOthers) {
  ::setenv("SLIME_VISIBLE_DEVICES", "mlx5_0,mlx5_1", 1);
  auto rdma = [] {
    for (const auto& t : available_transports()) {
      if (t.name == "rdma") return t;
    }
    return TransportInfo{};
  };
  TransportInfo t = rdma();
  EXPECT_FALSE(t.available);
  EXPECT_TRUE(t.devices.empty());
  EXPECT_NE(t.reason.find("SLIME_VISIBLE_DEVICES='mlx5_0,mlx5_1' hides every RDMA device (found: sim_rdma0)"),
            std::string::npos)
      << t.reason;
  EXPECT_THROW(RDMAEndpoint{}, ConnectionError);
  ::setenv("SLIME_VISIBLE_DEVICES", "mlx5_0,sim_rdma0", 1);
  t = rdma();
  EXPECT_TRUE(t.available) << t.reason;
  EXPECT_EQ(t.devices, std::vector<std::string>{"sim_rdma0"});
  ::unsetenv("SLIME_VISIBLE_DEVICES");
}

TEST_F(RdmaEndpointTest, MakeEndpointBuildsItFromJsonOptions) {
  auto ep = make_endpoint("rdma", {{"num_qp", 2}, {"max_send_wr", 32}, {"link_type", "RoCE"}});
  auto* rdma = dynamic_cast<RDMAEndpoint*>(ep.get());
  ASSERT_NE(rdma, nullptr);
  EXPECT_EQ(rdma->options().num_qp, 2u);
  EXPECT_EQ(rdma->options().max_send_wr, 32u);
  EXPECT_EQ(ep->endpoint_info()["qp_info"].size(), 2u);
  EXPECT_THROW(make_endpoint("rdma", {{"num_qp", "two"}}), InvalidArgumentError);
  ep->shutdown();
}

// --- send / recv ---------------------------------------------------------------------

// A read-only mapping (a PROT_READ mmap of a weights file, say) is registered for remote
// reads only, as a NIC allows (local write would fail the pinning with EFAULT), and
// published so: a peer reads it, its write fails alone (ACCESS_DENIED) with the connection
// alive, a read cannot land in it, and it can be sent from (review F8).
TEST_F(RdmaEndpointTest, ReadOnlyMemoryIsReadableByThePeerAndItsWritesFailAlone) {
  make();
  const size_t n = 64 << 10;
  void* ro = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(ro, MAP_FAILED);
  const auto weights = pattern(n, 9);
  std::memcpy(ro, weights.data(), n);
  ASSERT_EQ(::mprotect(ro, n, PROT_READ), 0);
  const auto ro_addr = reinterpret_cast<uintptr_t>(ro);
  const int32_t h_ro = b_->register_memory_region("weights", ro_addr, 0, n);
  const json entry = b_->endpoint_info()["mr_info"]["weights"];
  EXPECT_EQ(entry.value("access", ""), "read") << entry.dump();
  std::vector<uint8_t> local(n, 0);
  const int32_t h_local = a_->register_memory_region("local", addr_of(local), 0, n);
  EXPECT_FALSE(a_->endpoint_info()["mr_info"]["local"].contains("access")) << "writable memory: read and write";
  connect();
  const int32_t h_weights = remote("weights");

  auto rd = a_->read({{h_local, h_weights, 0, 0, n}});
  ASSERT_EQ(status_within(rd), 0) << rd.message();
  EXPECT_EQ(local, weights);
  for (const bool imm : {false, true}) {
    auto w = imm ? a_->write_with_imm({{h_local, h_weights, 0, 0, 16}}, 1) : a_->write({{h_local, h_weights, 0, 0, 16}});
    EXPECT_EQ(status_within(w), code(StatusCode::kAccessDenied)) << w.message();
    EXPECT_NE(w.message().find("read-only"), std::string::npos) << w.message();
  }
  EXPECT_TRUE(a_->is_connected());
  // The owner's own read into it is refused locally too (its NIC could not write there).
  const int32_t b_local = b_->register_memory_region("b_local", addr_of(local), 0, n);
  const int32_t b_remote = b_->register_remote_memory_region("local", a_->endpoint_info()["mr_info"]["local"]);
  auto into_ro = b_->read({{h_ro, b_remote, 0, 0, 16}});
  EXPECT_EQ(status_within(into_ro), code(StatusCode::kAccessDenied)) << into_ro.message();
  auto from_ro = b_->write({{h_ro, b_remote, 0, 0, n}});  // the NIC reads it: fine
  ASSERT_EQ(status_within(from_ro), 0) << from_ro.message();
  (void)b_local;
  // A rendezvous send (over 8 KiB) from read-only memory: registered for remote read only.
  std::vector<uint8_t> box(n, 0);
  auto rv = a_->recv({addr_of(box), 0, n});
  auto sd = b_->send({ro_addr, 0, n});
  ASSERT_EQ(status_within(sd), 0) << sd.message();
  ASSERT_EQ(status_within(rv), 0) << rv.message();
  EXPECT_EQ(box, weights);
  EXPECT_TRUE(a_->is_connected() && b_->is_connected());
  a_->shutdown();
  b_->shutdown();
  a_.reset();
  b_.reset();
  ::munmap(ro, n);
}

TEST_F(RdmaEndpointTest, EagerAndRendezvousMessagesAreByteExactInFifoOrder) {
  make();
  connect();
  // Sizes on both sides of the eager limit; the large ones in registered memory and not.
  auto big = pattern(1 << 20, 6);
  std::vector<uint8_t> big_box(1 << 20, 0);
  a_->register_memory_region("big", addr_of(big), 0, big.size());
  std::vector<std::vector<uint8_t>> msgs = {pattern(1, 1), pattern(8000, 2), pattern(9000, 3), pattern(300000, 4)};
  std::vector<std::vector<uint8_t>> boxes;
  for (auto& m : msgs) boxes.emplace_back(m.size() + 16, 0xAA);
  std::vector<Future> recvs, sends;
  for (auto& box : boxes) recvs.push_back(b_->recv({addr_of(box), 8, box.size() - 8}));
  recvs.push_back(b_->recv({addr_of(big_box), 0, big_box.size()}));
  for (auto& m : msgs) sends.push_back(a_->send({addr_of(m), 0, m.size()}));
  sends.push_back(a_->send({addr_of(big), 0, big.size()}));
  for (size_t i = 0; i < sends.size(); ++i) {
    ASSERT_EQ(status_within(sends[i]), 0) << i << ": " << sends[i].message();
    ASSERT_EQ(status_within(recvs[i]), 0) << i << ": " << recvs[i].message();
  }
  for (size_t i = 0; i < msgs.size(); ++i) {
    EXPECT_EQ(recvs[i].nbytes(), msgs[i].size()) << i;
    EXPECT_TRUE(std::equal(msgs[i].begin(), msgs[i].end(), boxes[i].begin() + 8)) << i;
    EXPECT_TRUE(std::all_of(boxes[i].begin(), boxes[i].begin() + 8, [](uint8_t v) { return v == 0xAA; })) << i;
    EXPECT_TRUE(std::all_of(boxes[i].begin() + 8 + msgs[i].size(), boxes[i].end(), [](uint8_t v) { return v == 0xAA; }))
        << i;
  }
  EXPECT_EQ(big_box, big);
}

// Peers with different receive queues use one credit, a quarter of the smaller one: the
// larger side never has more messages waiting at the smaller than it allows (review F5).
TEST_F(RdmaEndpointTest, PeersWithDifferentReceiveQueuesShareTheSmallerCredit) {
  RdmaOptions big, small;
  big.max_recv_wr = 256;  // credit 64 alone
  small.max_recv_wr = 16;  // credit 4
  a_ = std::make_unique<RDMAEndpoint>(big);
  b_ = std::make_unique<RDMAEndpoint>(small);
  EXPECT_EQ(a_->endpoint_info()["max_recv_wr"], 256);
  connect();
  constexpr int kMessages = 40;
  std::vector<std::vector<uint8_t>> msgs, boxes;
  for (int i = 0; i < kMessages; ++i) {
    msgs.push_back(pattern(64 + i, static_cast<uint8_t>(i)));
    boxes.emplace_back(64 + i, 0);
  }
  std::vector<Future> sends, recvs;
  for (auto& m : msgs) sends.push_back(a_->send({addr_of(m), 0, m.size()}));
  // No recv yet: at most the credit (4) may wait at b; more would have failed its lane.
  EXPECT_EQ(sends.back().wait_for(30ms), std::nullopt);
  EXPECT_TRUE(b_->is_connected());
  for (auto& box : boxes) recvs.push_back(b_->recv({addr_of(box), 0, box.size()}));
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_EQ(status_within(sends[i]), 0) << i << ": " << sends[i].message();
    ASSERT_EQ(status_within(recvs[i]), 0) << i << ": " << recvs[i].message();
    EXPECT_EQ(boxes[i], msgs[i]) << i;
  }
}

// A peer that ignores the credit (here: told the receiver has a larger queue than it has)
// fails the connection with PROTOCOL_ERROR at the receiver, instead of growing its memory.
TEST_F(RdmaEndpointTest, APeerThatIgnoresTheCreditFailsTheConnectionNotTheReceiversMemory) {
  RdmaOptions big, small;
  big.max_recv_wr = 256;
  small.max_recv_wr = 16;
  a_ = std::make_unique<RDMAEndpoint>(big);
  b_ = std::make_unique<RDMAEndpoint>(small);
  json b_info = b_->endpoint_info();
  b_info["max_recv_wr"] = 256;  // a's credit becomes 64; b's stays 4
  a_->connect(b_info);
  b_->connect(a_->endpoint_info());
  std::vector<std::vector<uint8_t>> msgs;
  for (int i = 0; i < 12; ++i) msgs.push_back(pattern(32, static_cast<uint8_t>(i)));
  std::vector<Future> sends;
  for (auto& m : msgs) sends.push_back(a_->send({addr_of(m), 0, m.size()}));
  ASSERT_TRUE(wait_until([&] { return !b_->is_connected(); })) << "b kept more unmatched messages than its credit";
  std::vector<uint8_t> box(32);
  auto rv = b_->recv({addr_of(box), 0, box.size()});
  const int st = status_within(rv);
  EXPECT_TRUE(st == code(StatusCode::kNotConnected) || st == code(StatusCode::kPeerClosed)) << st << " "
                                                                                           << rv.message();
  // a learns of it only when it next needs an answer from b (a peer gone with nothing of
  // ours in flight goes unnoticed until then: review F11, open), so its sends end at its
  // shutdown at the latest, and never hang.
  a_->shutdown();
  for (auto& s : sends) EXPECT_NE(status_within(s), -1) << "a send hung after the connection failed";
}

TEST_F(RdmaEndpointTest, AMessageThatArrivesFirstWaitsForItsRecv) {
  make();
  connect();
  auto small = pattern(100, 1), large = pattern(50000, 2);
  auto s1 = a_->send({addr_of(small), 0, small.size()});
  auto s2 = a_->send({addr_of(large), 0, large.size()});
  // Neither can complete before its recv exists: the receiver answers each one.
  EXPECT_EQ(s1.wait_for(30ms), std::nullopt);
  std::vector<uint8_t> b1(100, 0), b2(50000, 0);
  auto r1 = b_->recv({addr_of(b1), 0, b1.size()});
  auto r2 = b_->recv({addr_of(b2), 0, b2.size()});
  ASSERT_EQ(status_within(r1), 0) << r1.message();
  ASSERT_EQ(status_within(r2), 0) << r2.message();
  ASSERT_EQ(status_within(s1), 0) << s1.message();
  ASSERT_EQ(status_within(s2), 0) << s2.message();
  EXPECT_EQ(b1, small);
  EXPECT_EQ(b2, large);
}

TEST_F(RdmaEndpointTest, AMessageLongerThanItsRecvFailsThatRecvAloneAndNeverTheQp) {
  make();
  connect();
  for (size_t len : {size_t(40), size_t(100000)}) {  // eager, rendezvous
    auto msg = pattern(len, 3);
    std::vector<uint8_t> box(len, 0xAA);
    auto rv = b_->recv({addr_of(box), 0, len / 2});
    auto sd = a_->send({addr_of(msg), 0, len});
    EXPECT_EQ(status_within(rv), code(StatusCode::kMessageTooLarge)) << rv.message();
    EXPECT_EQ(status_within(sd), code(StatusCode::kMessageTooLarge)) << sd.message();
    EXPECT_TRUE(std::all_of(box.begin(), box.end(), [](uint8_t v) { return v == 0xAA; }));
    EXPECT_TRUE(a_->is_connected());
    EXPECT_TRUE(b_->is_connected());
    auto rv2 = b_->recv({addr_of(box), 0, len});
    auto sd2 = a_->send({addr_of(msg), 0, len});
    ASSERT_EQ(status_within(sd2), 0) << sd2.message();
    ASSERT_EQ(status_within(rv2), 0) << rv2.message();
    EXPECT_EQ(box, msg);
  }
}

TEST_F(RdmaEndpointTest, MoreSendsThanTheCreditWaitInOrder) {
  RdmaOptions o;
  o.max_recv_wr = 8;  // a credit of 2 messages
  make(o);
  connect();
  constexpr int n = 40;
  std::vector<std::vector<uint8_t>> msgs, boxes;
  std::vector<Future> sends, recvs;
  for (int i = 0; i < n; ++i) {
    msgs.push_back(pattern(16 + i, uint8_t(i)));
    sends.push_back(a_->send({addr_of(msgs.back()), 0, msgs.back().size()}));
  }
  for (int i = 0; i < n; ++i) {
    boxes.emplace_back(64, 0);
    recvs.push_back(b_->recv({addr_of(boxes.back()), 0, 64}));
  }
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(status_within(recvs[i]), 0) << i << ": " << recvs[i].message();
    ASSERT_EQ(status_within(sends[i]), 0) << i << ": " << sends[i].message();
    ASSERT_EQ(recvs[i].nbytes(), msgs[i].size()) << i;
    EXPECT_TRUE(std::equal(msgs[i].begin(), msgs[i].end(), boxes[i].begin())) << i;
  }
}

TEST_F(RdmaEndpointTest, APeerShutdownFailsPostedRecvsWithPeerClosed) {
  make();
  connect();
  std::vector<uint8_t> box(16, 0);
  auto rv = a_->recv({addr_of(box), 0, box.size()});
  b_->shutdown();
  EXPECT_EQ(status_within(rv), code(StatusCode::kPeerClosed)) << rv.message();
  EXPECT_FALSE(a_->is_connected());
  EXPECT_EQ(status_within(a_->send({addr_of(box), 0, 4})), code(StatusCode::kPeerClosed));
}

// The sender of a message refused by recv(exact_size) learns why, as on TCP: its status
// names exact_size and both sizes (the reason travels in the receiver's DONE).
TEST_F(RdmaEndpointTest, AnExactSizeRefusalNamesItsReasonAtTheSender) {
  make();
  connect();
  for (size_t size : {size_t(64), size_t(256) << 10}) {  // eager, rendezvous
    std::vector<uint8_t> box(size, 0);
    auto shorter = pattern(size / 2, 3);
    auto rv = b_->recv({addr_of(box), 0, size}, /*exact_size=*/true);
    auto sd = a_->send({addr_of(shorter), 0, shorter.size()});
    EXPECT_EQ(status_within(rv), code(StatusCode::kFailed)) << rv.message();
    ASSERT_EQ(status_within(sd), code(StatusCode::kFailed)) << sd.message();
    EXPECT_NE(sd.message().find("exact_size"), std::string::npos) << sd.message();
    EXPECT_NE(sd.message().find(fmt::format("the message has {} bytes, the buffer {}", size / 2, size)),
              std::string::npos)
        << sd.message();
    // A too-long message: the sender's MESSAGE_TOO_LARGE names the recv buffer's size.
    auto longer = pattern(size, 4);
    auto rv2 = b_->recv({addr_of(box), 0, size / 4});
    auto sd2 = a_->send({addr_of(longer), 0, longer.size()});
    EXPECT_EQ(status_within(rv2), code(StatusCode::kMessageTooLarge)) << rv2.message();
    ASSERT_EQ(status_within(sd2), code(StatusCode::kMessageTooLarge)) << sd2.message();
    EXPECT_NE(sd2.message().find(fmt::format("{}-byte buffer", size / 4)), std::string::npos) << sd2.message();
    EXPECT_TRUE(a_->is_connected());
  }
}

// --- reconnecting after the connection failed ----------------------------------------------

json qp_field(const json& info, const char* key) {
  json out = json::array();
  for (const auto& q : info["qp_info"]) out.push_back(q[key]);
  return out;
}

// An endpoint whose connection failed connects to a fresh peer, in the conformance suite's
// order (connect first, then the peer connects to our endpoint_info()), with new QPs, the
// same rkeys, and every op kind working again.
void expect_reconnects(RDMAEndpoint& a, const RdmaOptions& options, std::vector<uint8_t>& src, int32_t h_src,
                       const json& before) {
  RDMAEndpoint c(options);
  std::vector<uint8_t> dst(4096, 0);
  const int32_t c_dst = c.register_memory_region("dst", addr_of(dst), 0, dst.size());
  a.connect(c.endpoint_info());
  c.connect(a.endpoint_info());
  ASSERT_TRUE(a.is_connected());
  const json after = a.endpoint_info();
  const json new_qpns = qp_field(after, "qpn");
  for (const auto& old_qpn : qp_field(before, "qpn")) {
    EXPECT_EQ(std::count(new_qpns.begin(), new_qpns.end(), old_qpn), 0) << "an old QP was reused: " << after.dump();
  }
  EXPECT_EQ(after["mr_info"]["src"]["rkey"], before["mr_info"]["src"]["rkey"]);  // regions stay registered
  const int32_t h_dst = a.register_remote_memory_region("dst", c.endpoint_info()["mr_info"]["dst"]);
  auto w = a.write({{h_src, h_dst, 0, 0, dst.size()}});
  ASSERT_EQ(status_within(w), 0) << w.message();
  EXPECT_TRUE(std::equal(dst.begin(), dst.end(), src.begin()));
  // The peer reaches our region by the rkey published before the failure.
  std::fill(dst.begin(), dst.end(), 0x5a);
  const int32_t c_src = c.register_remote_memory_region("src", before["mr_info"]["src"]);
  auto cw = c.write({{c_dst, c_src, 0, 0, 100}});
  ASSERT_EQ(status_within(cw), 0) << cw.message();
  EXPECT_TRUE(std::all_of(src.begin(), src.begin() + 100, [](uint8_t v) { return v == 0x5a; }));
  // Two-sided messages both ways (the eager buffers and credits start afresh), eager and rendezvous.
  for (size_t len : {size_t(16), size_t(100000)}) {
    auto msg = pattern(len, 7);
    std::vector<uint8_t> box(len, 0);
    auto rv = c.recv({addr_of(box), 0, len});
    auto sd = a.send({addr_of(msg), 0, len});
    ASSERT_EQ(status_within(sd), 0) << sd.message();
    ASSERT_EQ(status_within(rv), 0) << rv.message();
    EXPECT_EQ(box, msg);
    std::fill(box.begin(), box.end(), 0);
    auto rv2 = a.recv({addr_of(box), 0, len});
    auto sd2 = c.send({addr_of(msg), 0, len});
    ASSERT_EQ(status_within(sd2), 0) << sd2.message();
    ASSERT_EQ(status_within(rv2), 0) << rv2.message();
    EXPECT_EQ(box, msg);
  }
  // Healthy again: a second connect is refused.
  try {
    a.connect(c.endpoint_info());
    ADD_FAILURE() << "connect() on a healthy connection accepted";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("already connected"), std::string::npos) << e.what();
  }
  c.shutdown();
}

TEST_F(RdmaEndpointTest, AfterThePeerShutDownTheEndpointConnectsToAFreshPeer) {
  make();
  auto src = pattern(4096, 1);
  const int32_t h_src = a_->register_memory_region("src", addr_of(src), 0, src.size());
  connect();
  const json before = a_->endpoint_info();
  std::vector<uint8_t> box(16, 0);
  auto rv = a_->recv({addr_of(box), 0, box.size()});
  b_->shutdown();
  EXPECT_EQ(status_within(rv), code(StatusCode::kPeerClosed)) << rv.message();
  ASSERT_TRUE(wait_until([&] { return !a_->is_connected(); }));
  auto later = a_->write({{h_src, 0, 0, 0, 8}});
  EXPECT_EQ(status_within(later), code(StatusCode::kPeerClosed)) << later.message();
  expect_reconnects(*a_, RdmaOptions(), src, h_src, before);
}

// The peer dies (its QPs stop answering) with writes in flight on both QPs: they fail
// within the retry bound, and the endpoint's endpoint_info() then names fresh QPs that a
// new peer connects to (the Python suite's order: endpoint_info() before connect()).
TEST_F(RdmaSilentPeer, AfterADeadPeerEndpointInfoNamesFreshQpsAndANewPeerConnects) {
  RdmaOptions o;
  o.num_qp = 2;
  o.ack_timeout = 8;  // 1 ms
  o.retry_cnt = 2;
  start(o);
  const json before = a_->endpoint_info();
  auto f = a_->write(both_qps());
  EXPECT_EQ(status_within(f, 5s), code(StatusCode::kPeerClosed)) << f.message();
  ASSERT_TRUE(wait_until([&] { return !a_->is_connected(); }));
  const json fresh = a_->endpoint_info();
  EXPECT_NE(qp_field(fresh, "qpn"), qp_field(before, "qpn"));
  EXPECT_FALSE(a_->is_connected());
  auto idle = a_->write({{h_src_, h_dst_, 0, 0, 8}});
  EXPECT_EQ(status_within(idle), code(StatusCode::kNotConnected)) << idle.message();
  EXPECT_NE(idle.message().find("RETRY_EXC_ERR"), std::string::npos) << idle.message();  // names the old cause
  RdmaOptions two;
  two.num_qp = 2;
  RDMAEndpoint c(two);
  std::vector<uint8_t> dst(src_.size(), 0);
  c.register_memory_region("dst", addr_of(dst), 0, dst.size());
  c.connect(fresh);
  a_->connect(c.endpoint_info());
  EXPECT_EQ(qp_field(a_->endpoint_info(), "qpn"), qp_field(fresh, "qpn"));
  const int32_t h = a_->register_remote_memory_region("dst2", c.endpoint_info()["mr_info"]["dst"]);
  auto w = a_->write({{h_src_, h, 0, 0, src_.size()}});
  ASSERT_EQ(status_within(w), 0) << w.message();
  EXPECT_EQ(dst, src_);
  c.shutdown();
}

// One QP fails while the other still has work in flight to a peer that will not answer
// for seconds: connect() takes that QP down too and waits until its work came back
// (flushed), so no op of the old connection is pending once the new QPs exist.
TEST_F(RdmaSilentPeer, ReconnectSettlesWorkStillInFlightOnTheOtherQps) {
  RdmaOptions o;
  o.num_qp = 2;
  o.ack_timeout = 22;  // 17 s per retry: nothing completes unless its QP fails
  o.op_timeout = 0ms;
  start(o);
  const json before = a_->endpoint_info();
  auto f = a_->write(both_qps());
  EXPECT_EQ(f.wait_for(20ms), std::nullopt);
  rdma::sim::fail_qp(a_->qp_nums()[0]);
  ASSERT_TRUE(wait_until([&] { return !a_->is_connected(); }));
  expect_reconnects(*a_, o, src_, h_src_, before);
  ASSERT_TRUE(f.wait_for(0ms).has_value()) << "an op of the old connection was still pending after connect()";
  EXPECT_EQ(*f.wait_for(0ms), code(StatusCode::kFailed)) << f.message();
}

// ---- GPU memory (docs/rdma.md, "GPU memory") on the simulated GPU: its device pointers are
// PROT_NONE to host code, so a host touch of device memory anywhere in the endpoint (an
// inline post, an eager copy) kills the test.

using test_support::DeviceBuffer;

class RdmaGpuTest : public RdmaEndpointTest {
 protected:
  void SetUp() override {
    RdmaEndpointTest::SetUp();
    ::setenv("DLSLIME_GPU_SIM", "1", 1);
    ::unsetenv("DLSLIME_RDMA_SIM_DEVICE_MEMORY");
  }
  void TearDown() override {
    ::unsetenv("DLSLIME_RDMA_SIM_DEVICE_MEMORY");
    RdmaEndpointTest::TearDown();
  }
};

TEST_F(RdmaGpuTest, WriteAndReadBetweenDeviceAndHostInEveryDirectionAtOffsetsAndSizes) {
  RdmaOptions o;
  o.num_qp = 2;
  o.chunk_size = 256 << 10;  // several WRs per item, striped over both QPs
  make(o);
  constexpr size_t kMax = (3 << 20) + 11, kSize = kMax + 64;
  DeviceBuffer a_dev(kSize), b_dev(kSize);
  std::vector<uint8_t> a_host(kSize, 0), b_host(kSize, 0);
  const auto a_bytes = pattern(kSize, 1), b_bytes = pattern(kSize, 2);
  a_dev.write(a_bytes);
  b_dev.write(b_bytes);
  const int32_t la_dev = a_->register_memory_region("a_dev", a_dev.addr(), 0, kSize);
  const int32_t la_host = a_->register_memory_region("a_host", addr_of(a_host), 0, kSize);
  b_->register_memory_region("b_dev", b_dev.addr(), 0, kSize);
  b_->register_memory_region("b_host", addr_of(b_host), 0, kSize);
  connect();
  EXPECT_TRUE(a_->capabilities().device_memory);
  const int32_t rb_dev = remote("b_dev"), rb_host = remote("b_host");
  std::vector<uint8_t> b_dev_want = b_bytes, a_dev_want = a_bytes;
  for (size_t n : {size_t(1), size_t(63), size_t(4099), size_t(1 << 20), kMax}) {
    SCOPED_TRACE(n);
    const uint64_t src_off = n % 7 + 1, dst_off = n % 13 + 3;
    // device -> device write, then device -> host write.
    auto w = a_->write({{la_dev, rb_dev, dst_off, src_off, n}});
    ASSERT_EQ(status_within(w), 0) << w.message();
    // (a_dev_want: a_dev's bytes, which the reads below change)
    std::copy_n(a_dev_want.begin() + src_off, n, b_dev_want.begin() + dst_off);
    EXPECT_EQ(b_dev.read(), b_dev_want);
    std::fill(b_host.begin(), b_host.end(), 0);
    auto wh = a_->write({{la_dev, rb_host, dst_off, src_off, n}});
    ASSERT_EQ(status_within(wh), 0) << wh.message();
    EXPECT_TRUE(std::equal(a_dev_want.begin() + src_off, a_dev_want.begin() + src_off + n, b_host.begin() + dst_off));
    // host -> device (read the peer's host region into local device memory).
    auto r = a_->read({{la_dev, rb_host, dst_off, src_off + 1, n}});
    ASSERT_EQ(status_within(r), 0) << r.message();
    std::copy_n(b_host.begin() + dst_off, n, a_dev_want.begin() + src_off + 1);
    EXPECT_EQ(a_dev.read(), a_dev_want);
    // device -> host (read the peer's device region into local host memory).
    std::fill(a_host.begin(), a_host.end(), 0);
    auto rh = a_->read({{la_host, rb_dev, dst_off, 5, n}});
    ASSERT_EQ(status_within(rh), 0) << rh.message();
    EXPECT_TRUE(std::equal(b_dev_want.begin() + dst_off, b_dev_want.begin() + dst_off + n, a_host.begin() + 5));
  }
}

TEST_F(RdmaGpuTest, WriteWithImmSendAndRecvUseDeviceMemoryWithoutTheCpu) {
  make();
  DeviceBuffer a_dev(1 << 16), b_dev(1 << 16);
  const auto bytes = pattern(1 << 16, 9);
  a_dev.write(bytes);
  b_dev.write(std::vector<uint8_t>(1 << 16, 0));
  std::vector<uint8_t> host_msg = pattern(100, 4);
  const int32_t la = a_->register_memory_region("a_dev", a_dev.addr(), 0, 1 << 16);
  b_->register_memory_region("b_dev", b_dev.addr(), 0, 1 << 16);
  connect();
  const int32_t rb = remote("b_dev");
  // write_with_imm of 16 bytes: small enough to be inline for host memory, never for GPU.
  auto imm = b_->imm_recv();
  auto w = a_->write_with_imm({{la, rb, 32, 8, 16}}, 0x1234);
  ASSERT_EQ(status_within(w), 0) << w.message();
  ASSERT_EQ(status_within(imm), 0) << imm.message();
  EXPECT_EQ(imm.imm_data(), 0x1234u);
  auto got = b_dev.read();
  EXPECT_TRUE(std::equal(bytes.begin() + 8, bytes.begin() + 24, got.begin() + 32));
  // send from GPU memory (small: sent by rendezvous, the receiver's NIC reads it) into GPU
  // memory; a host message (eager) into GPU memory; a large GPU message into host memory.
  std::vector<uint8_t> host_box(40000, 0);
  auto r1 = b_->recv({b_dev.addr(), 1000, 200});
  auto r2 = b_->recv({b_dev.addr(), 2000, 100});
  auto r3 = b_->recv({addr_of(host_box), 0, host_box.size()});
  auto s1 = a_->send({a_dev.addr(), 10, 200});
  auto s2 = a_->send({addr_of(host_msg), 0, 100});
  auto s3 = a_->send({a_dev.addr(), 0, 40000});
  for (Future* f : {&s1, &s2, &s3, &r1, &r2, &r3}) ASSERT_EQ(status_within(*f), 0) << f->message();
  EXPECT_EQ(r1.nbytes(), 200u);
  EXPECT_EQ(r2.nbytes(), 100u);
  EXPECT_EQ(r3.nbytes(), 40000u);
  got = b_dev.read();
  EXPECT_TRUE(std::equal(bytes.begin() + 10, bytes.begin() + 210, got.begin() + 1000));
  EXPECT_TRUE(std::equal(host_msg.begin(), host_msg.end(), got.begin() + 2000));
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.begin() + 40000, host_box.begin()));
}

TEST_F(RdmaGpuTest, UnregisteringADeviceRegionRevokesItsRkeyThenOpsOnItFail) {
  make();
  DeviceBuffer dev(8192);
  std::vector<uint8_t> src = pattern(8192, 5);
  const int32_t ls = a_->register_memory_region("src", addr_of(src), 0, 8192);
  b_->register_memory_region("dev", dev.addr(), 0, 8192);
  connect();
  const int32_t rd = remote("dev");
  auto ok = a_->write({{ls, rd, 0, 0, 8192}});
  ASSERT_EQ(status_within(ok), 0) << ok.message();
  EXPECT_EQ(dev.read(), src);
  b_->unregister_memory_region("dev");
  auto late = a_->write({{ls, rd, 0, 0, 64}});
  EXPECT_EQ(status_within(late), code(StatusCode::kUnknownHandle)) << late.message();
  // The local side: a device region unregistered is no handle any more.
  const int32_t la = a_->register_memory_region("a_dev", dev.addr(), 0, 8192);
  a_->unregister_memory_region(la);
  auto gone = a_->write({{la, rd, 0, 0, 8}});
  EXPECT_EQ(status_within(gone), code(StatusCode::kUnknownHandle)) << gone.message();
}

TEST_F(RdmaGpuTest, DeviceMemoryRegistersByDmabufOrPeerMemoryAndOtherwiseFailsNamingBoth) {
  make();
  DeviceBuffer dev(4096);
  std::vector<uint8_t> src = pattern(4096, 7);
  a_->register_memory_region("src", addr_of(src), 0, 4096);
  connect();
  for (const char* support : {"dmabuf", "peermem"}) {
    SCOPED_TRACE(support);
    ::setenv("DLSLIME_RDMA_SIM_DEVICE_MEMORY", support, 1);
    const std::string name = std::string("dev_") + support;
    b_->register_memory_region(name, dev.addr(), 0, 4096);
    auto w = a_->write({{0, remote(name), 0, 0, 4096}});
    ASSERT_EQ(status_within(w), 0) << w.message();
    EXPECT_EQ(dev.read(), src);
    b_->unregister_memory_region(name);
  }
  ::setenv("DLSLIME_RDMA_SIM_DEVICE_MEMORY", "none", 1);
  try {
    b_->register_memory_region("dev", dev.addr(), 0, 4096);
    FAIL() << "device memory registered without dma-buf or peer-memory support";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("dma-buf"), std::string::npos) << what;
    EXPECT_NE(what.find("nvidia-peermem"), std::string::npos) << what;
    EXPECT_NE(what.find("never staged through host memory"), std::string::npos) << what;
  }
  EXPECT_FALSE(b_->mr_info().contains("dev"));  // the refused registration left nothing behind
}

TEST_F(RdmaGpuTest, DmabufRegistrationTakesUpstreamsArgumentsAndChecksThem) {
  make();
  DeviceBuffer dev(8192);
  std::vector<uint8_t> src = pattern(8192, 3);
  a_->register_memory_region("src", addr_of(src), 0, 8192);
  const gpu::DmabufRange buf = gpu::runtime().dmabuf_fd(reinterpret_cast<void*>(dev.addr() + 4096), 4096);
  ::setenv("DLSLIME_RDMA_SIM_DEVICE_MEMORY", "dmabuf", 1);
  const int32_t h = b_->register_dmabuf_memory_region("kv", buf.fd, buf.offset, 4096, dev.addr() + 4096);
  ::close(buf.fd);  // borrowed for the call
  EXPECT_EQ(b_->mr_info()["kv"]["addr"].get<uint64_t>(), dev.addr() + 4096);
  EXPECT_GE(h, 0);
  connect();
  auto w = a_->write({{0, remote("kv"), 0, 100, 4096}});
  ASSERT_EQ(status_within(w), 0) << w.message();
  const auto got = dev.read();
  EXPECT_TRUE(std::equal(src.begin() + 100, src.begin() + 4196, got.begin() + 4096));
  std::vector<uint8_t> host(4096);
  EXPECT_THROW(b_->register_dmabuf_memory_region("h", buf.fd, 0, 4096, addr_of(host)), InvalidArgumentError);
  EXPECT_THROW(b_->register_dmabuf_memory_region("bad", -1, 0, 4096, dev.addr()), InvalidArgumentError);
  EXPECT_THROW(b_->register_dmabuf_memory_region("zero", 0, 0, 0, dev.addr()), InvalidArgumentError);
}

// Hostile N11: the fd is checked as the kernel checks a dma-buf (dma_buf_get, then the
// size), and the simulated GPU, which knows its buffers, also checks that iova is where the
// buffer's byte `offset` lives. Every refusal leaves no region behind.
TEST_F(RdmaGpuTest, ADmabufRegistrationRefusesEveryFdThatIsNotTheDmabufOfThatMemory) {
  make();
  ::setenv("DLSLIME_RDMA_SIM_DEVICE_MEMORY", "dmabuf", 1);
  DeviceBuffer a(8192), b(8192);
  const gpu::DmabufRange of_a = gpu::runtime().dmabuf_fd(a.ptr(), 8192);
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  int sockets[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets), 0);
  const int dev_null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  char file_name[] = "/tmp/dlslime-dmabuf-XXXXXX";
  const int file = ::mkstemp(file_name);
  ASSERT_GE(file, 0);
  ::unlink(file_name);
  ASSERT_EQ(::ftruncate(file, 8192), 0);
  const int memfd = ::memfd_create("not-a-gpu", MFD_CLOEXEC);
  ASSERT_EQ(::ftruncate(memfd, 8192), 0);
  for (int fd : {pipe_fds[0], sockets[0], dev_null, file, memfd}) {
    try {
      b_->register_dmabuf_memory_region("bad", fd, 0, 4096, a.addr());
      ADD_FAILURE() << "fd " << fd << " was taken as a dma-buf";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("is not a dma-buf"), std::string::npos) << e.what();
    }
  }
  // A's buffer with an address in B, or past A's offset: the region would not be that memory.
  EXPECT_THROW(b_->register_dmabuf_memory_region("bad", of_a.fd, 0, 4096, b.addr()), InvalidArgumentError);
  EXPECT_THROW(b_->register_dmabuf_memory_region("bad", of_a.fd, 4096, 4096, a.addr()), InvalidArgumentError);
  EXPECT_THROW(b_->register_dmabuf_memory_region("bad", of_a.fd, 4096, 8192, a.addr(4096)), InvalidArgumentError);
  EXPECT_FALSE(b_->mr_info().contains("bad"));
  // The right pair is taken, and the fd is only borrowed: the registry keeps its own.
  const int32_t h = b_->register_dmabuf_memory_region("a", of_a.fd, 4096, 4096, a.addr(4096));
  for (int fd : {of_a.fd, pipe_fds[0], pipe_fds[1], sockets[0], sockets[1], dev_null, file, memfd}) ::close(fd);
  std::vector<uint8_t> src = pattern(4096, 9);
  a_->register_memory_region("src", addr_of(src), 0, 4096);
  connect();
  auto w = a_->write({{0, remote("a"), 0, 0, 4096}});
  ASSERT_EQ(status_within(w), 0) << w.message();
  EXPECT_EQ(a.read(4096, 4096), src);
  EXPECT_GE(h, 0);
}

}  // namespace
}  // namespace dlslime
