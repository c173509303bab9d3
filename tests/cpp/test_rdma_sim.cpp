// The verbs seam (src/rdma/verbs.h) on the strict simulated device (DLSLIME_RDMA_SIM=1):
// every check a real RC NIC makes, asserted through the completions a user relies on.
// Every wait has a deadline and goes through the completion channel, as on hardware.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/transport_registry.h"
#include "dlslime/errors.h"
#include "dlslime/transport.h"
#include "device_buffer.h"
#include "gpu/device_runtime.h"
#include "rdma/sim_device.h"
#include "rdma/verbs.h"

extern char** environ;

namespace dlslime::rdma {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kDeadline = 5s;

// Waits for `n` completions on `cq` through its channel (poll, arm, poll again, wait on
// the fd: the order verbs requires). Fails the test at the deadline.
std::vector<WorkCompletion> wait_for(CompletionQueue& cq, size_t n, std::chrono::milliseconds deadline = kDeadline) {
  std::vector<WorkCompletion> out;
  const auto until = Clock::now() + deadline;
  WorkCompletion wc[64];
  while (out.size() < n) {
    int got = cq.poll(static_cast<int>(std::min<size_t>(64, n - out.size())), wc);
    if (got < 0) {
      ADD_FAILURE() << "poll_cq failed: " << got;
      return out;
    }
    out.insert(out.end(), wc, wc + got);
    if (got > 0) continue;
    EXPECT_EQ(cq.req_notify(), 0);
    got = cq.poll(static_cast<int>(std::min<size_t>(64, n - out.size())), wc);
    if (got > 0) {
      out.insert(out.end(), wc, wc + got);
      continue;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left <= 0ms) {
      ADD_FAILURE() << "timed out waiting for " << n << " completions (got " << out.size() << ")";
      return out;
    }
    pollfd pfd{cq.channel_fd(), POLLIN, 0};
    ::poll(&pfd, 1, static_cast<int>(left.count()) + 1);
    cq.ack_events();
  }
  return out;
}

WorkCompletion wait_one(CompletionQueue& cq) {
  auto v = wait_for(cq, 1);
  return v.empty() ? WorkCompletion{0, WcStatus::kGeneralErr} : v[0];
}

struct Side {
  Side() = default;
  Side(Side&&) = default;
  // Children before parents, as verbs requires (the simulated device counts a parent
  // destroyed first: DestroyingAParentBeforeItsChildrenIsRefusedAndCountedAsVerbsDoes).
  // Member-wise assignment would replace the context first.
  Side& operator=(Side&& o) noexcept {
    release();
    ctx = std::move(o.ctx);
    pd = std::move(o.pd);
    scq = std::move(o.scq);
    rcq = std::move(o.rcq);
    qp = std::move(o.qp);
    buf = std::move(o.buf);
    mr = std::move(o.mr);
    return *this;
  }
  ~Side() { release(); }
  void release() {
    mr.reset();
    qp.reset();
    rcq.reset();
    scq.reset();
    pd.reset();
    ctx.reset();
  }

  std::unique_ptr<Context> ctx;
  std::unique_ptr<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> scq;
  std::unique_ptr<CompletionQueue> rcq;
  std::unique_ptr<QueuePair> qp;
  std::vector<uint8_t> buf;
  std::unique_ptr<MemoryRegion> mr;

  Sge sge(size_t offset, uint32_t length) const {
    return Sge{reinterpret_cast<uint64_t>(buf.data()) + offset, length, mr->lkey()};
  }
  uint64_t addr(size_t offset) const { return reinterpret_cast<uint64_t>(buf.data()) + offset; }
};

struct Config {
  QpCaps caps;
  int cq_depth = 4096;
  uint32_t mr_access = kLocalWrite | kRemoteWrite | kRemoteRead;
  RcRtsAttr rts{0, 1, 2, 2, 16};  // short timeouts: error paths finish in milliseconds
  uint8_t min_rnr_timer = 1;      // 10 us
  size_t buf_size = 1 << 16;
};

void fill_pattern(std::vector<uint8_t>& v, size_t off, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; ++i) v[off + i] = static_cast<uint8_t>(seed + i * 7);
}

bool has_pattern(const std::vector<uint8_t>& v, size_t off, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; ++i) {
    if (v[off + i] != static_cast<uint8_t>(seed + i * 7)) return false;
  }
  return true;
}

Side open_side(const Config& cfg) {
  Side s;
  s.ctx = provider().open("sim_rdma0");
  s.pd = s.ctx->alloc_pd();
  s.scq = s.ctx->create_cq(cfg.cq_depth);
  s.rcq = s.ctx->create_cq(cfg.cq_depth);
  s.qp = s.pd->create_rc_qp(*s.scq, *s.rcq, cfg.caps);
  s.buf.assign(cfg.buf_size, 0);
  s.mr = s.pd->reg_mr(s.buf.data(), s.buf.size(), cfg.mr_access);
  return s;
}

// Takes a's QP to RTS towards the QP `remote_qpn` of the device with `remote_gid`; the
// PSNs are 100 + the sender's QPN on both sides. Returns the first failing modify's errno.
int connect_qp(Side& a, uint32_t remote_qpn, const GidBytes& remote_gid, const Config& cfg) {
  if (int err = a.qp->modify_to_init(RcInitAttr{})) return err;
  RcRtrAttr rtr;
  rtr.remote_qpn = remote_qpn;
  rtr.rq_psn = 100 + remote_qpn;
  rtr.remote_gid = remote_gid;
  rtr.min_rnr_timer = cfg.min_rnr_timer;
  if (int err = a.qp->modify_to_rtr(rtr)) return err;
  RcRtsAttr rts = cfg.rts;
  rts.sq_psn = 100 + a.qp->qp_num();
  return a.qp->modify_to_rts(rts);
}

class RdmaSim : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("DLSLIME_RDMA_SIM", "1", 1);
  }

  Side make_side(const Config& cfg) { return open_side(cfg); }

  static void connect_one(Side& a, const Side& b, const Config& cfg) {
    ASSERT_EQ(connect_qp(a, b.qp->qp_num(), b.ctx->query_gid(1, 0).gid, cfg), 0);
  }

  void connect(const Config& cfg = {}) {
    a_ = make_side(cfg);
    b_ = make_side(cfg);
    connect_one(a_, b_, cfg);
    connect_one(b_, a_, cfg);
  }

  static int post(QueuePair& qp, SendWr wr) {
    const SendWr* bad = nullptr;
    return qp.post_send(&wr, &bad);
  }
  static int post_recv(QueuePair& qp, uint64_t wr_id, const Sge* sges, int n) {
    RecvWr wr{wr_id, nullptr, sges, n};
    const RecvWr* bad = nullptr;
    return qp.post_recv(&wr, &bad);
  }
  static SendWr rdma(WrOpcode op, uint64_t wr_id, const Sge* sge, int n, uint64_t raddr, uint32_t rkey) {
    SendWr wr;
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.sg_list = sge;
    wr.num_sge = n;
    wr.remote_addr = raddr;
    wr.rkey = rkey;
    return wr;
  }

  static void fill(std::vector<uint8_t>& v, size_t off, size_t n, uint8_t seed) { fill_pattern(v, off, n, seed); }

  Side a_, b_;
};

TEST_F(RdmaSim, SelectedOnlyByTheVariableAndIsTheOnlyDevice) {
  EXPECT_STREQ(provider().name(), "sim");
  EXPECT_EQ(provider().list_devices(), std::vector<std::string>{"sim_rdma0"});
  EXPECT_THROW(provider().open("mlx5_0"), NotFoundError);
  ::unsetenv("DLSLIME_RDMA_SIM");
  EXPECT_STREQ(provider().name(), "ibverbs");
  // No NIC here: libibverbs lists nothing, without crashing, and the sim is not a fallback.
  auto real = provider().list_devices();
  EXPECT_EQ(std::count(real.begin(), real.end(), "sim_rdma0"), 0);
  ::setenv("DLSLIME_RDMA_SIM", "0", 1);
  EXPECT_STREQ(provider().name(), "ibverbs");
}

// A typo never silently selects the real device: anything but unset, empty, 0 or 1 is an
// InvalidArgumentError naming the variable, from the provider and from the transport probe.
TEST_F(RdmaSim, AValueOtherThanZeroOrOneIsAClearErrorNotTheRealDevice) {
  ::setenv("DLSLIME_RDMA_SIM", "", 1);
  EXPECT_STREQ(provider().name(), "ibverbs");
  for (const char* bad : {"true", "yes", "2", " 1"}) {
    ::setenv("DLSLIME_RDMA_SIM", bad, 1);
    try {
      provider();
      ADD_FAILURE() << "DLSLIME_RDMA_SIM='" << bad << "' was accepted";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("DLSLIME_RDMA_SIM"), std::string::npos) << e.what();
    }
    EXPECT_THROW(make_endpoint("rdma", nlohmann::json::object()), InvalidArgumentError);
    const auto all = available_transports();
    auto rdma = std::find_if(all.begin(), all.end(), [](const TransportInfo& t) { return t.name == "rdma"; });
    ASSERT_NE(rdma, all.end());
    EXPECT_FALSE(rdma->available);
    EXPECT_NE(rdma->reason.find("DLSLIME_RDMA_SIM"), std::string::npos) << rdma->reason;
  }
  ::setenv("DLSLIME_RDMA_SIM", "1", 1);
  EXPECT_STREQ(provider().name(), "sim");
}

TEST_F(RdmaSim, PortIsActiveRoceWithAnIpv4MappedLoopbackGid) {
  auto ctx = provider().open("sim_rdma0");
  PortAttr port = ctx->query_port(1);
  EXPECT_EQ(port.state, PortState::kActive);
  EXPECT_EQ(port.link_layer, LinkLayer::kEthernet);
  EXPECT_EQ(port.active_mtu, Mtu::k4096);
  EXPECT_EQ(port.gid_table_len, 1);
  GidEntry gid = ctx->query_gid(1, 0);
  EXPECT_EQ(gid.type, GidType::kRoceV2);
  // ::ffff:127.a.b.c with a.b.c = this pid: each process is its own addressable host.
  const auto pid = static_cast<uint32_t>(::getpid());
  EXPECT_EQ(gid_to_string(gid.gid), fmt::format("0000:0000:0000:0000:0000:ffff:7f{:02x}:{:04x}", pid >> 16, pid & 0xffff));
  EXPECT_EQ(sim::gid_pid(gid.gid), static_cast<pid_t>(pid));
  EXPECT_THROW(ctx->query_port(2), VerbsError);
  EXPECT_THROW(ctx->query_gid(1, 1), VerbsError);  // past the table (gid_tbl_len 1): EINVAL
}

TEST_F(RdmaSim, TransportProbeListsTheDeviceAndTheFactoryMakesAnEndpoint) {
  const TransportEntry* entry = TransportRegistry::instance().find("rdma");
  ASSERT_NE(entry, nullptr);
  TransportProbe p = entry->probe();
  EXPECT_TRUE(p.available) << p.reason;
  EXPECT_EQ(p.devices, std::vector<std::string>{"sim_rdma0"});
  EXPECT_EQ(p.reason, "");
  auto ep = make_endpoint("rdma", nlohmann::json::object());
  ASSERT_NE(ep, nullptr);
  EXPECT_EQ(std::string(ep->capabilities().transport), "rdma");
  ep->shutdown();
  EXPECT_THROW(make_endpoint("rdma", {{"no_such_option", 1}}), InvalidArgumentError);
  ::unsetenv("DLSLIME_RDMA_SIM");
  p = entry->probe();
  if (p.devices.empty()) {
    EXPECT_FALSE(p.available);
    EXPECT_EQ(p.reason, kNoDeviceReason);
  }
}

TEST_F(RdmaSim, WriteReadSendRecvAndWriteWithImmAreByteExact) {
  connect();
  // WRITE gathering two sges of a into one range of b.
  fill(a_.buf, 0, 3000, 1);
  fill(a_.buf, 5000, 1096, 2);
  Sge two[2] = {a_.sge(0, 3000), a_.sge(5000, 1096)};
  ASSERT_EQ(post(*a_.qp, rdma(WrOpcode::kRdmaWrite, 1, two, 2, b_.addr(8192), b_.mr->rkey())), 0);
  WorkCompletion wc = wait_one(*a_.scq);
  EXPECT_EQ(wc.status, WcStatus::kSuccess) << wc_status_name(wc.status);
  EXPECT_EQ(wc.opcode, WcOpcode::kRdmaWrite);
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.qp_num, a_.qp->qp_num());
  EXPECT_EQ(std::memcmp(b_.buf.data() + 8192, a_.buf.data(), 3000), 0);
  EXPECT_EQ(std::memcmp(b_.buf.data() + 8192 + 3000, a_.buf.data() + 5000, 1096), 0);

  // READ it back into a fresh range of a.
  Sge dst = a_.sge(20000, 4096);
  ASSERT_EQ(post(*a_.qp, rdma(WrOpcode::kRdmaRead, 2, &dst, 1, b_.addr(8192), b_.mr->rkey())), 0);
  wc = wait_one(*a_.scq);
  EXPECT_EQ(wc.status, WcStatus::kSuccess);
  EXPECT_EQ(wc.opcode, WcOpcode::kRdmaRead);
  EXPECT_EQ(wc.byte_len, 4096u);
  EXPECT_EQ(std::memcmp(a_.buf.data() + 20000, b_.buf.data() + 8192, 4096), 0);

  // SEND_WITH_IMM into a posted receive scattered over two sges.
  Sge rs[2] = {b_.sge(30000, 100), b_.sge(40000, 1000)};
  ASSERT_EQ(post_recv(*b_.qp, 77, rs, 2), 0);
  fill(a_.buf, 100, 500, 9);
  Sge src = a_.sge(100, 500);
  SendWr send = rdma(WrOpcode::kSendWithImm, 3, &src, 1, 0, 0);
  send.imm_data = 0xdeadbeef;
  ASSERT_EQ(post(*a_.qp, send), 0);
  WorkCompletion rwc = wait_one(*b_.rcq);
  EXPECT_EQ(rwc.status, WcStatus::kSuccess);
  EXPECT_EQ(rwc.opcode, WcOpcode::kRecv);
  EXPECT_EQ(rwc.wr_id, 77u);
  EXPECT_EQ(rwc.byte_len, 500u);
  EXPECT_TRUE(rwc.has_imm);
  EXPECT_EQ(rwc.imm_data, 0xdeadbeefu);
  EXPECT_EQ(rwc.qp_num, b_.qp->qp_num());
  EXPECT_EQ(std::memcmp(b_.buf.data() + 30000, a_.buf.data() + 100, 100), 0);
  EXPECT_EQ(std::memcmp(b_.buf.data() + 40000, a_.buf.data() + 200, 400), 0);
  wc = wait_one(*a_.scq);
  EXPECT_EQ(wc.status, WcStatus::kSuccess);
  EXPECT_EQ(wc.opcode, WcOpcode::kSend);

  // WRITE_WITH_IMM: the data lands at the rkey's range and consumes a zero-sge receive.
  ASSERT_EQ(post_recv(*b_.qp, 78, nullptr, 0), 0);
  fill(a_.buf, 1000, 777, 5);
  Sge w = a_.sge(1000, 777);
  SendWr wimm = rdma(WrOpcode::kRdmaWriteWithImm, 4, &w, 1, b_.addr(50000), b_.mr->rkey());
  wimm.imm_data = 42;
  ASSERT_EQ(post(*a_.qp, wimm), 0);
  rwc = wait_one(*b_.rcq);
  EXPECT_EQ(rwc.status, WcStatus::kSuccess);
  EXPECT_EQ(rwc.opcode, WcOpcode::kRecvRdmaWithImm);
  EXPECT_EQ(rwc.wr_id, 78u);
  EXPECT_EQ(rwc.byte_len, 777u);
  EXPECT_TRUE(rwc.has_imm);
  EXPECT_EQ(rwc.imm_data, 42u);
  EXPECT_EQ(std::memcmp(b_.buf.data() + 50000, a_.buf.data() + 1000, 777), 0);
  EXPECT_EQ(wait_one(*a_.scq).status, WcStatus::kSuccess);
}

TEST_F(RdmaSim, InlineDataIsCopiedAtPostTime) {
  Config cfg;
  cfg.caps.max_inline_data = 64;
  connect(cfg);
  std::vector<uint8_t> payload(64, 0xab);
  Sge s{reinterpret_cast<uint64_t>(payload.data()), 64, 0};  // inline: no lkey needed
  SendWr wr = rdma(WrOpcode::kRdmaWrite, 1, &s, 1, b_.addr(0), b_.mr->rkey());
  wr.inline_data = true;
  ASSERT_EQ(post(*a_.qp, wr), 0);
  std::fill(payload.begin(), payload.end(), 0);  // reusing the buffer at once is allowed
  EXPECT_EQ(wait_one(*a_.scq).status, WcStatus::kSuccess);
  EXPECT_EQ(std::count(b_.buf.begin(), b_.buf.begin() + 64, 0xab), 64);
  // Past the inline limit, or inline READ: EINVAL at post.
  std::vector<uint8_t> big(65, 1);
  Sge bs{reinterpret_cast<uint64_t>(big.data()), 65, 0};
  wr.sg_list = &bs;
  EXPECT_EQ(post(*a_.qp, wr), EINVAL);
  wr.sg_list = &s;
  wr.opcode = WrOpcode::kRdmaRead;
  EXPECT_EQ(post(*a_.qp, wr), EINVAL);
}

TEST_F(RdmaSim, BadRkeyRangeOrFlagIsRemoteAccessErrorThenLaterWorkFlushes) {
  struct Case {
    const char* what;
    WrOpcode op;
    uint32_t access;  // b's MR
    uint64_t offset;
    uint32_t length;
    bool wrong_key;
  };
  const Case cases[] = {
      {"unknown rkey", WrOpcode::kRdmaWrite, kLocalWrite | kRemoteWrite | kRemoteRead, 0, 16, true},
      {"past the end", WrOpcode::kRdmaWrite, kLocalWrite | kRemoteWrite | kRemoteRead, (1 << 16) - 8, 16, false},
      {"write to a read-only MR", WrOpcode::kRdmaWrite, kLocalWrite | kRemoteRead, 0, 16, false},
      {"read from a write-only MR", WrOpcode::kRdmaRead, kLocalWrite | kRemoteWrite, 0, 16, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Config cfg;
    cfg.mr_access = c.access;
    connect(cfg);
    fill(a_.buf, 0, 64, 1);
    ASSERT_EQ(post_recv(*a_.qp, 500, nullptr, 0), 0);  // flushed with the QP
    Sge s = a_.sge(0, c.length);
    uint32_t rkey = c.wrong_key ? b_.mr->lkey() : b_.mr->rkey();  // an lkey is never an rkey
    SendWr first = rdma(c.op, 1, &s, 1, b_.addr(c.offset), rkey);
    SendWr second = rdma(WrOpcode::kRdmaWrite, 2, &s, 1, b_.addr(0), b_.mr->rkey());
    second.signaled = false;  // flushed WRs complete even when unsignaled
    first.next = &second;
    const SendWr* bad = nullptr;
    ASSERT_EQ(a_.qp->post_send(&first, &bad), 0);
    auto wcs = wait_for(*a_.scq, 2);
    ASSERT_EQ(wcs.size(), 2u);
    EXPECT_EQ(wcs[0].wr_id, 1u);
    EXPECT_EQ(wcs[0].status, WcStatus::kRemAccessErr) << wc_status_name(wcs[0].status);
    EXPECT_EQ(wcs[1].wr_id, 2u);
    EXPECT_EQ(wcs[1].status, WcStatus::kWrFlushErr);
    EXPECT_EQ(a_.qp->state(), QpState::kErr);
    WorkCompletion r = wait_one(*a_.rcq);
    EXPECT_EQ(r.wr_id, 500u);
    EXPECT_EQ(r.status, WcStatus::kWrFlushErr);
    // Posting to a QP in ERR is accepted and flushed, as verbs does.
    ASSERT_EQ(post(*a_.qp, rdma(WrOpcode::kRdmaWrite, 3, &s, 1, b_.addr(0), b_.mr->rkey())), 0);
    EXPECT_EQ(wait_one(*a_.scq).status, WcStatus::kWrFlushErr);
    EXPECT_EQ(std::count(b_.buf.begin(), b_.buf.end(), 0), static_cast<long>(b_.buf.size())) << "nothing landed";
  }
}

// IBA C9-88: a zero-byte RDMA op need not carry a valid R_Key or VA (rxe skips the check):
// zero-byte writes and writes with immediate complete with key 0 and address 0, while the
// responder QP's access flags are still checked; one byte with that key is REM_ACCESS_ERR.
TEST_F(RdmaSim, AZeroByteWriteNeedsNoValidRkeyButOneByteDoes) {
  connect();
  ASSERT_EQ(post(*a_.qp, rdma(WrOpcode::kRdmaWrite, 1, nullptr, 0, 0, 0)), 0);
  EXPECT_EQ(wait_one(*a_.scq).status, WcStatus::kSuccess);
  ASSERT_EQ(post_recv(*b_.qp, 90, nullptr, 0), 0);
  SendWr imm = rdma(WrOpcode::kRdmaWriteWithImm, 2, nullptr, 0, 0, 0);
  imm.imm_data = 0xfeed;
  ASSERT_EQ(post(*a_.qp, imm), 0);
  EXPECT_EQ(wait_one(*a_.scq).status, WcStatus::kSuccess);
  WorkCompletion r = wait_one(*b_.rcq);
  EXPECT_EQ(r.status, WcStatus::kSuccess);
  EXPECT_EQ(r.opcode, WcOpcode::kRecvRdmaWithImm);
  EXPECT_EQ(r.byte_len, 0u);
  EXPECT_EQ(r.imm_data, 0xfeedu);
  Sge one = a_.sge(0, 1);
  ASSERT_EQ(post(*a_.qp, rdma(WrOpcode::kRdmaWrite, 3, &one, 1, 0, 0)), 0);
  EXPECT_EQ(wait_one(*a_.scq).status, WcStatus::kRemAccessErr);
}

TEST_F(RdmaSim, DeregisteredRemoteMrIsRemoteAccessError) {
  connect();
  uint32_t rkey = b_.mr->rkey();
  b_.mr.reset();
  Sge s = a_.sge(0, 8);
  ASSERT_EQ(post(*a_.qp, rdma(WrOpcode::kRdmaWrite, 1, &s, 1, b_.addr(0), rkey)), 0);
  EXPECT_EQ(wait_one(*a_.scq).status, WcStatus::kRemAccessErr);
}

TEST_F(RdmaSim, BadLkeyOrLocalRangeIsLocalProtectionError) {
  connect();
  Sge bad_key = a_.sge(0, 8);
  bad_key.lkey = a_.mr->rkey();
  ASSERT_EQ(post(*a_.qp, rdma(WrOpcode::kRdmaWrite, 1, &bad_key, 1, b_.addr(0), b_.mr->rkey())), 0);
  WorkCompletion wc = wait_one(*a_.scq);
  EXPECT_EQ(wc.status, WcStatus::kLocProtErr);
  EXPECT_EQ(a_.qp->state(), QpState::kErr);

  connect();
  Sge past = a_.sge(a_.buf.size() - 4, 8);
  ASSERT_EQ(post(*a_.qp, rdma(WrOpcode::kRdmaRead, 1, &past, 1, b_.addr(0), b_.mr->rkey())), 0);
  EXPECT_EQ(wait_one(*a_.scq).status, WcStatus::kLocProtErr);

  // An MR of another PD is not usable on this QP.
  connect();
  auto other_pd = a_.ctx->alloc_pd();
  std::vector<uint8_t> other(64);
  auto other_mr = other_pd->reg_mr(other.data(), other.size(), kLocalWrite);
  Sge foreign{reinterpret_cast<uint64_t>(other.data()), 8, other_mr->lkey()};
  ASSERT_EQ(post(*a_.qp, rdma(WrOpcode::kRdmaWrite, 1, &foreign, 1, b_.addr(0), b_.mr->rkey())), 0);
  EXPECT_EQ(wait_one(*a_.scq).status, WcStatus::kLocProtErr);
}

TEST_F(RdmaSim, DestroyingAParentBeforeItsChildrenIsRefusedAndCountedAsVerbsDoes) {
  // ibv_dealloc_pd / ibv_destroy_cq / ibv_destroy_comp_channel / ibv_close_device with live
  // children: EBUSY, and the object leaks. The simulated device counts each such destroy.
  Config cfg;
  const SimObjectCounts before = sim_object_counts();
  {
    Side s = open_side(cfg);
    const SimObjectCounts live = sim_object_counts();
    EXPECT_EQ(live.contexts - before.contexts, 1);
    EXPECT_EQ(live.pds - before.pds, 1);
    EXPECT_EQ(live.cqs - before.cqs, 2);
    EXPECT_EQ(live.comp_channels - before.comp_channels, 2);
    EXPECT_EQ(live.qps - before.qps, 1);
    EXPECT_EQ(live.mrs - before.mrs, 1);
    s.pd.reset();  // its MR and QP still live: ibv_dealloc_pd is refused
    EXPECT_EQ(sim_object_counts().destroy_failures - before.destroy_failures, 1);
    s.scq.reset();  // the QP still uses it: ibv_destroy_cq is refused, and then its channel's
    EXPECT_EQ(sim_object_counts().destroy_failures - before.destroy_failures, 3);
    s.ctx.reset();  // its PD, other CQ and channels still live: ibv_close_device is refused
    EXPECT_EQ(sim_object_counts().destroy_failures - before.destroy_failures, 4);
  }
  // What was refused leaks, on a NIC as here; the children, destroyed later, are gone.
  const SimObjectCounts after = sim_object_counts();
  EXPECT_EQ(after.contexts, before.contexts + 1);
  EXPECT_EQ(after.pds, before.pds + 1);
  EXPECT_EQ(after.cqs, before.cqs + 1);
  EXPECT_EQ(after.comp_channels, before.comp_channels + 1);
  EXPECT_EQ(after.qps, before.qps);
  EXPECT_EQ(after.mrs, before.mrs);
  // Children first (the declaration order of Side, destroyed in reverse): nothing refused.
  { Side s = open_side(cfg); }
  EXPECT_EQ(sim_object_counts().destroy_failures, after.destroy_failures);
}

// As ibv_reg_mr pins pages (get_user_pages): unmapped or PROT_NONE memory is EFAULT, and
// read-only memory is EFAULT when the MR asks for local or remote write; remote read alone
// registers it.
TEST_F(RdmaSim, RegisteringUnmappedOrReadOnlyMemoryForWritingIsEfault) {
  auto ctx = provider().open("sim_rdma0");
  auto pd = ctx->alloc_pd();
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto map = [&](int prot) {
    void* p = ::mmap(nullptr, 4 * page, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    return static_cast<uint8_t*>(p);
  };
  auto efault = [&](void* addr, size_t len, uint32_t access) {
    try {
      pd->reg_mr(addr, len, access);
    } catch (const VerbsError& e) {
      return e.error_number() == EFAULT;
    }
    return false;
  };
  uint8_t* ro = map(PROT_READ);
  EXPECT_TRUE(efault(ro, 4 * page, kLocalWrite));
  EXPECT_TRUE(efault(ro, 4 * page, kLocalWrite | kRemoteWrite | kRemoteRead));
  EXPECT_NE(pd->reg_mr(ro, 4 * page, kRemoteRead), nullptr);
  uint8_t* none = map(PROT_NONE);
  EXPECT_TRUE(efault(none, page, kRemoteRead));
  // A hole in the middle. The mmap area hands out addresses top down, so a fresh hole near its
  // top is the first gap the next one-page mmap fills (the sanitizers' runtimes map pages of
  // their own at any time). Placed far below it, the hole stays a hole for the test.
  uint8_t* rw = nullptr;
  for (uintptr_t hint = uintptr_t{1} << 28; rw == nullptr && hint < (uintptr_t{1} << 31); hint += uintptr_t{1} << 24) {
    void* p = ::mmap(reinterpret_cast<void*>(hint), 4 * page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == reinterpret_cast<void*>(hint)) rw = static_cast<uint8_t*>(p);
    else if (p != MAP_FAILED) ::munmap(p, 4 * page);  // a kernel before 4.17 takes the flag as a hint
  }
  ASSERT_NE(rw, nullptr) << "no free low address range for the holed mapping";
  ASSERT_EQ(::munmap(rw + 2 * page, page), 0);
  EXPECT_TRUE(efault(rw, 4 * page, kRemoteRead));
  EXPECT_TRUE(efault(rw + 2 * page, 1, kLocalWrite));
  EXPECT_NE(pd->reg_mr(rw, 2 * page, kLocalWrite | kRemoteWrite), nullptr);  // the mapped part
  EXPECT_NE(pd->reg_mr(rw + 3 * page + 5, 100, kLocalWrite), nullptr);
  // Half read-only: one read-only page in a writable range is enough to refuse writing.
  uint8_t* mixed = map(PROT_READ | PROT_WRITE);
  ASSERT_EQ(::mprotect(mixed + page, page, PROT_READ), 0);
  EXPECT_TRUE(efault(mixed, 3 * page, kLocalWrite));
  EXPECT_NE(pd->reg_mr(mixed, 3 * page, kRemoteRead), nullptr);
  ::munmap(ro, 4 * page);
  ::munmap(none, 4 * page);
  ::munmap(rw, 2 * page);
  ::munmap(rw + 3 * page, page);
  ::munmap(mixed, 4 * page);
}

TEST_F(RdmaSim, AQpWithACqOfAnotherContextIsEinval) {
  auto ctx = provider().open("sim_rdma0");
  auto other = provider().open("sim_rdma0");
  auto pd = ctx->alloc_pd();
  auto own_cq = ctx->create_cq(16);
  auto foreign_cq = other->create_cq(16);
  for (const bool foreign_send : {true, false}) {
    try {
      pd->create_rc_qp(foreign_send ? *foreign_cq : *own_cq, foreign_send ? *own_cq : *foreign_cq, QpCaps{});
      ADD_FAILURE() << "a CQ of another context was accepted";
    } catch (const VerbsError& e) {
      EXPECT_EQ(e.error_number(), EINVAL) << e.what();
    }
  }
  EXPECT_NE(pd->create_rc_qp(*own_cq, *own_cq, QpCaps{}), nullptr);
}

TEST_F(RdmaSim, RegisteringRemoteWriteWithoutLocalWriteFails) {
  auto ctx = provider().open("sim_rdma0");
  auto pd = ctx->alloc_pd();
  std::vector<uint8_t> buf(64);
  EXPECT_THROW(pd->reg_mr(buf.data(), buf.size(), kRemoteWrite), VerbsError);
  EXPECT_THROW(pd->reg_mr(buf.data(), 0, kLocalWrite), VerbsError);
}

TEST_F(RdmaSim, PostingInTheWrongStateFailsAndTransitionsAreChecked) {
  Config cfg;
  a_ = make_side(cfg);
  b_ = make_side(cfg);
  Sge s = a_.sge(0, 8);
  SendWr wr = rdma(WrOpcode::kRdmaWrite, 1, &s, 1, b_.addr(0), b_.mr->rkey());
  EXPECT_EQ(post(*a_.qp, wr), EINVAL);                 // RESET
  EXPECT_EQ(post_recv(*a_.qp, 1, &s, 1), EINVAL);      // RESET: no receives either
  EXPECT_EQ(a_.qp->modify_to_rts(RcRtsAttr{}), EINVAL);  // RESET -> RTS is not a transition
  ASSERT_EQ(a_.qp->modify_to_init(RcInitAttr{}), 0);
  EXPECT_EQ(post(*a_.qp, wr), EINVAL);  // INIT
  EXPECT_EQ(post_recv(*a_.qp, 1, &s, 1), 0);
  RcRtrAttr rtr;
  rtr.remote_qpn = b_.qp->qp_num();
  rtr.remote_gid = sim::device_gid();
  rtr.use_gid = false;
  EXPECT_EQ(a_.qp->modify_to_rtr(rtr), EINVAL);  // RoCE needs a GRH
  rtr.use_gid = true;
  rtr.path_mtu = static_cast<Mtu>(6);
  EXPECT_EQ(a_.qp->modify_to_rtr(rtr), EINVAL);  // beyond the port's MTU
  rtr.path_mtu = Mtu::k1024;
  ASSERT_EQ(a_.qp->modify_to_rtr(rtr), 0);
  EXPECT_EQ(post(*a_.qp, wr), EINVAL);  // RTR
  EXPECT_EQ(a_.qp->state(), QpState::kRtr);
  ASSERT_EQ(a_.qp->modify_to_rts(RcRtsAttr{}), 0);
  EXPECT_EQ(a_.qp->state(), QpState::kRts);
  EXPECT_EQ(a_.qp->modify_to_init(RcInitAttr{}), EINVAL);
}

TEST_F(RdmaSim, QueueAndSgeLimitsFailAsVerbsDoes) {
  Config cfg;
  cfg.caps = QpCaps{4, 2, 2, 1, 0};
  connect(cfg);
  Sge s[3] = {a_.sge(0, 8), a_.sge(8, 8), a_.sge(16, 8)};
  // max_send_sge
  EXPECT_EQ(post(*a_.qp, rdma(WrOpcode::kRdmaWrite, 1, s, 3, b_.addr(0), b_.mr->rkey())), EINVAL);
  // max_recv_sge
  EXPECT_EQ(post_recv(*a_.qp, 1, s, 2), EINVAL);
  // max_recv_wr
  ASSERT_EQ(post_recv(*a_.qp, 1, s, 1), 0);
  ASSERT_EQ(post_recv(*a_.qp, 2, s, 1), 0);
  EXPECT_EQ(post_recv(*a_.qp, 3, s, 1), ENOMEM);

  // max_send_wr: unsignaled WRs hold their slots until a later completion is polled, as on
  // hardware; a list that overflows posts its head and names the first WR not posted.
  SendWr wrs[5];
  for (int i = 0; i < 5; ++i) {
    wrs[i] = rdma(WrOpcode::kRdmaWrite, 10 + i, s, 1, b_.addr(64 * i), b_.mr->rkey());
    wrs[i].signaled = i == 3;
    wrs[i].next = i + 1 < 5 ? &wrs[i + 1] : nullptr;
  }
  const SendWr* bad = nullptr;
  EXPECT_EQ(a_.qp->post_send(&wrs[0], &bad), ENOMEM);
  EXPECT_EQ(bad, &wrs[4]);
  WorkCompletion wc = wait_one(*a_.scq);
  EXPECT_EQ(wc.wr_id, 13u);
  EXPECT_EQ(wc.status, WcStatus::kSuccess);
  // Polling the signaled completion freed all four slots.
  wrs[4].next = nullptr;
  wrs[4].signaled = true;
  EXPECT_EQ(a_.qp->post_send(&wrs[4], &bad), 0);
  EXPECT_EQ(wait_one(*a_.scq).wr_id, 14u);

  // Device limits at creation.
  QpCaps huge;
  huge.max_send_wr = sim::kMaxQpWr + 1;
  EXPECT_THROW(a_.pd->create_rc_qp(*a_.scq, *a_.rcq, huge), VerbsError);
}

TEST_F(RdmaSim, ThousandWrListWithSelectiveSignallingCompletesInOrder) {
  Config cfg;
  cfg.caps.max_send_wr = 1000;
  cfg.buf_size = 1000 * 64;
  connect(cfg);
  for (size_t i = 0; i < a_.buf.size(); ++i) a_.buf[i] = static_cast<uint8_t>(i * 31 + 7);
  std::vector<Sge> sges(1000);
  std::vector<SendWr> wrs(1000);
  for (int i = 0; i < 1000; ++i) {
    sges[i] = a_.sge(64 * i, 64);
    wrs[i] = rdma(WrOpcode::kRdmaWrite, i, &sges[i], 1, b_.addr(64 * i), b_.mr->rkey());
    wrs[i].signaled = i % 100 == 99;
    wrs[i].next = i + 1 < 1000 ? &wrs[i + 1] : nullptr;
  }
  const SendWr* bad = nullptr;
  ASSERT_EQ(a_.qp->post_send(wrs.data(), &bad), 0);
  auto wcs = wait_for(*a_.scq, 10);
  ASSERT_EQ(wcs.size(), 10u);
  for (int k = 0; k < 10; ++k) {
    EXPECT_EQ(wcs[k].wr_id, static_cast<uint64_t>(100 * k + 99));
    EXPECT_EQ(wcs[k].status, WcStatus::kSuccess);
  }
  EXPECT_EQ(a_.buf, b_.buf);
  WorkCompletion extra;
  EXPECT_EQ(a_.scq->poll(1, &extra), 0) << "unsignaled WRs gave a completion";
}

TEST_F(RdmaSim, SendWithoutReceiveIsRnrRetriedThenFails) {
  Config cfg;
  cfg.rts.rnr_retry = 3;
  connect(cfg);
  Sge s = a_.sge(0, 16);
  ASSERT_EQ(post(*a_.qp, rdma(WrOpcode::kSend, 1, &s, 1, 0, 0)), 0);
  WorkCompletion wc = wait_one(*a_.scq);
  EXPECT_EQ(wc.status, WcStatus::kRnrRetryExcErr) << wc_status_name(wc.status);
  EXPECT_EQ(sim::rnr_naks(a_.qp->qp_num()), 4u);  // the first try and three retries
  EXPECT_EQ(a_.qp->state(), QpState::kErr);
}

TEST_F(RdmaSim, RnrThenSuccessOnceAReceiveIsPostedWithinTheRetryWindow) {
  Config cfg;
  cfg.rts.rnr_retry = 7;  // infinite
  connect(cfg);
  fill(a_.buf, 0, 16, 3);
  Sge s = a_.sge(0, 16);
  SendWr wimm = rdma(WrOpcode::kRdmaWriteWithImm, 1, &s, 1, b_.addr(0), b_.mr->rkey());
  wimm.imm_data = 7;
  ASSERT_EQ(post(*a_.qp, wimm), 0);
  const auto until = Clock::now() + kDeadline;
  while (sim::rnr_naks(a_.qp->qp_num()) < 2 && Clock::now() < until) std::this_thread::yield();
  ASSERT_GE(sim::rnr_naks(a_.qp->qp_num()), 2u) << "the sender was not RNR-retrying";
  Sge r = b_.sge(0, 0);
  ASSERT_EQ(post_recv(*b_.qp, 9, &r, 0), 0);
  WorkCompletion rwc = wait_one(*b_.rcq);
  EXPECT_EQ(rwc.status, WcStatus::kSuccess);
  EXPECT_EQ(rwc.wr_id, 9u);
  EXPECT_EQ(rwc.imm_data, 7u);
  EXPECT_EQ(rwc.byte_len, 16u);
  EXPECT_EQ(wait_one(*a_.scq).status, WcStatus::kSuccess);
  EXPECT_EQ(std::memcmp(a_.buf.data(), b_.buf.data(), 16), 0);
}

TEST_F(RdmaSim, MessageLongerThanTheReceiveFailsBothSides) {
  connect();
  Sge small = b_.sge(0, 8);
  ASSERT_EQ(post_recv(*b_.qp, 4, &small, 1), 0);
  ASSERT_EQ(post_recv(*b_.qp, 5, &small, 1), 0);  // flushed after the error
  Sge s = a_.sge(0, 16);
  ASSERT_EQ(post(*a_.qp, rdma(WrOpcode::kSend, 1, &s, 1, 0, 0)), 0);
  auto r = wait_for(*b_.rcq, 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].wr_id, 4u);
  EXPECT_EQ(r[0].status, WcStatus::kLocLenErr) << wc_status_name(r[0].status);
  EXPECT_EQ(r[1].wr_id, 5u);
  EXPECT_EQ(r[1].status, WcStatus::kWrFlushErr);
  WorkCompletion wc = wait_one(*a_.scq);
  EXPECT_EQ(wc.status, WcStatus::kRemInvReqErr) << wc_status_name(wc.status);
  EXPECT_EQ(a_.qp->state(), QpState::kErr);
  EXPECT_EQ(b_.qp->state(), QpState::kErr);
}

TEST_F(RdmaSim, CompletionQueueOverrunIsAnError) {
  Config cfg;
  cfg.cq_depth = 4;
  connect(cfg);
  Sge s = a_.sge(0, 8);
  SendWr wrs[6];
  for (int i = 0; i < 6; ++i) {
    wrs[i] = rdma(WrOpcode::kRdmaWrite, i, &s, 1, b_.addr(0), b_.mr->rkey());
    wrs[i].next = i + 1 < 6 ? &wrs[i + 1] : nullptr;
  }
  ASSERT_EQ(a_.qp->post_send(&wrs[0], nullptr), 0);
  // The overrun wakes the channel even without req_notify, so no waiter hangs on it.
  pollfd pfd{a_.scq->channel_fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 5000), 1);
  WorkCompletion wc[8];
  EXPECT_EQ(a_.scq->poll(8, wc), -EOVERFLOW);
  EXPECT_EQ(a_.scq->req_notify(), EIO);
}

TEST_F(RdmaSim, ChannelFiresOnlyWhenArmed) {
  connect();
  Sge s = a_.sge(0, 8);
  // Armed before the completion can arrive: a completion already queued when the CQ is
  // armed does not fire the channel (verbs semantics; wait_for polls again after arming).
  ASSERT_EQ(a_.scq->req_notify(), 0);
  ASSERT_EQ(post(*a_.qp, rdma(WrOpcode::kRdmaWrite, 1, &s, 1, b_.addr(0), b_.mr->rkey())), 0);
  pollfd pfd{a_.scq->channel_fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 5000), 1);
  EXPECT_EQ(a_.scq->ack_events(), 1);
  WorkCompletion wc;
  ASSERT_EQ(a_.scq->poll(1, &wc), 1);
  EXPECT_EQ(wc.status, WcStatus::kSuccess);
  // Not armed: a completion arrives (seen by polling) and the fd stays quiet.
  ASSERT_EQ(post(*a_.qp, rdma(WrOpcode::kRdmaWrite, 2, &s, 1, b_.addr(0), b_.mr->rkey())), 0);
  const auto until = Clock::now() + kDeadline;
  int n = 0;
  while ((n = a_.scq->poll(1, &wc)) == 0 && Clock::now() < until) std::this_thread::yield();
  ASSERT_EQ(n, 1);
  EXPECT_EQ(::poll(&pfd, 1, 0), 0);
}

TEST_F(RdmaSim, UnreachablePeerIsRetryExceeded) {
  connect();  // rts: timeout 1 (8 us), retry_cnt 2
  b_.qp.reset();  // the peer's QP is gone: nothing acknowledges
  Sge s = a_.sge(0, 8);
  ASSERT_EQ(post(*a_.qp, rdma(WrOpcode::kRdmaWrite, 1, &s, 1, b_.addr(0), b_.mr->rkey())), 0);
  EXPECT_EQ(wait_one(*a_.scq).status, WcStatus::kRetryExcErr);
  EXPECT_EQ(a_.qp->state(), QpState::kErr);
}

TEST_F(RdmaSim, WrongPsnIsNeverAcknowledged) {
  Config cfg;
  a_ = make_side(cfg);
  b_ = make_side(cfg);
  connect_one(b_, a_, cfg);  // b expects PSN 100 + a's QPN
  ASSERT_EQ(a_.qp->modify_to_init(RcInitAttr{}), 0);
  RcRtrAttr rtr;
  rtr.remote_qpn = b_.qp->qp_num();
  rtr.rq_psn = 100 + b_.qp->qp_num();
  rtr.remote_gid = sim::device_gid();
  ASSERT_EQ(a_.qp->modify_to_rtr(rtr), 0);
  RcRtsAttr rts = cfg.rts;
  rts.sq_psn = 5;
  ASSERT_EQ(a_.qp->modify_to_rts(rts), 0);
  Sge s = a_.sge(0, 8);
  ASSERT_EQ(post(*a_.qp, rdma(WrOpcode::kRdmaWrite, 1, &s, 1, b_.addr(0), b_.mr->rkey())), 0);
  EXPECT_EQ(wait_one(*a_.scq).status, WcStatus::kRetryExcErr);
}

TEST_F(RdmaSim, FailQpFlushesItsOutstandingWork) {
  connect();
  Sge r = a_.sge(0, 8);
  ASSERT_EQ(post_recv(*a_.qp, 1, &r, 1), 0);
  ASSERT_EQ(post_recv(*a_.qp, 2, &r, 1), 0);
  sim::fail_qp(a_.qp->qp_num());
  auto wcs = wait_for(*a_.rcq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(wcs[0].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(wcs[1].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(a_.qp->state(), QpState::kErr);
  EXPECT_THROW(sim::fail_qp(0xffffff), NotFoundError);
}

TEST_F(RdmaSim, DelayedCompletionsArriveLateAndInOrder) {
  connect();
  sim::delay_completions(a_.qp->qp_num(), std::chrono::microseconds(30000));
  Sge s = a_.sge(0, 8);
  SendWr w1 = rdma(WrOpcode::kRdmaWrite, 1, &s, 1, b_.addr(0), b_.mr->rkey());
  SendWr w2 = rdma(WrOpcode::kRdmaWrite, 2, &s, 1, b_.addr(8), b_.mr->rkey());
  w1.next = &w2;
  const auto t0 = Clock::now();
  ASSERT_EQ(a_.qp->post_send(&w1, nullptr), 0);
  auto wcs = wait_for(*a_.scq, 1);
  EXPECT_GE(Clock::now() - t0, 30ms);
  sim::delay_completions(a_.qp->qp_num(), std::chrono::microseconds(0));
  auto rest = wait_for(*a_.scq, 1);
  ASSERT_EQ(wcs.size() + rest.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(rest[0].wr_id, 2u);
}

TEST_F(RdmaSim, DroppedCompletionIsNeverDelivered) {
  connect();
  sim::drop_completions(a_.qp->qp_num(), 1);
  Sge s = a_.sge(0, 8);
  SendWr w1 = rdma(WrOpcode::kRdmaWrite, 1, &s, 1, b_.addr(0), b_.mr->rkey());
  SendWr w2 = rdma(WrOpcode::kRdmaWrite, 2, &s, 1, b_.addr(8), b_.mr->rkey());
  w1.next = &w2;
  ASSERT_EQ(a_.qp->post_send(&w1, nullptr), 0);
  // Completions are ordered per QP: once 2 is here, 1 would have been first.
  WorkCompletion wc = wait_one(*a_.scq);
  EXPECT_EQ(wc.wr_id, 2u);
  EXPECT_EQ(a_.scq->poll(1, &wc), 0);
}


// ---- GPU memory (docs/rdma.md, "GPU memory"): MRs over the simulated GPU's device memory.
// The device pointers are PROT_NONE to host code, so these pass only if the NIC alone moves
// their bytes (through its own view), as with GPUDirect RDMA.

using test_support::DeviceBuffer;

std::vector<uint8_t> bytes_of(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  fill_pattern(v, 0, n, seed);
  return v;
}

constexpr uint32_t kAllAccess = kLocalWrite | kRemoteWrite | kRemoteRead;

class RdmaSimGpu : public RdmaSim {
 protected:
  void SetUp() override {
    RdmaSim::SetUp();
    ::setenv("DLSLIME_GPU_SIM", "1", 1);
    ::unsetenv("DLSLIME_RDMA_SIM_DEVICE_MEMORY");
  }
  void TearDown() override { ::unsetenv("DLSLIME_RDMA_SIM_DEVICE_MEMORY"); }
  // An RDMA op of `len` bytes on a_'s QP, waited for; its completion's status.
  WcStatus run(WrOpcode op, const Sge& local, uint64_t raddr, uint32_t rkey) {
    SendWr wr = rdma(op, 7, &local, 1, raddr, rkey);
    if (post(*a_.qp, wr) != 0) return WcStatus::kGeneralErr;
    return wait_one(*a_.scq).status;
  }
};

TEST_F(RdmaSimGpu, PeerMemoryMrsMoveDeviceBytesBothWaysAtOffsets) {
  connect();
  const size_t n = 3 * 4096 + 5;  // several MTUs, not a multiple of one
  DeviceBuffer src(n + 64), dst(n + 64);
  const auto src_bytes = bytes_of(n + 64, 0x21), dst_bytes = bytes_of(n + 64, 0x77);
  src.write(src_bytes);
  dst.write(dst_bytes);
  // Registered by address: the simulated device has peer-memory support by default.
  auto src_mr = a_.pd->reg_mr(src.ptr(), n + 64, kAllAccess);
  auto dst_mr = b_.pd->reg_mr(dst.ptr(), n + 64, kAllAccess);
  EXPECT_NE(src_mr->lkey(), dst_mr->rkey());

  // WRITE device -> device: local offset 3, remote offset 40.
  ASSERT_EQ(run(WrOpcode::kRdmaWrite, Sge{src.addr(3), static_cast<uint32_t>(n), src_mr->lkey()}, dst.addr(40),
                dst_mr->rkey()),
            WcStatus::kSuccess);
  auto got = dst.read();
  std::vector<uint8_t> want = dst_bytes;
  std::copy(src_bytes.begin() + 3, src_bytes.begin() + 3 + n, want.begin() + 40);
  EXPECT_EQ(got, want);

  // READ device -> host and WRITE host -> device, 1 byte and a few KiB.
  ASSERT_EQ(run(WrOpcode::kRdmaRead, a_.sge(10, 1), dst.addr(40), dst_mr->rkey()), WcStatus::kSuccess);
  EXPECT_EQ(a_.buf[10], src_bytes[3]);
  fill(a_.buf, 100, 5000, 0x42);
  ASSERT_EQ(run(WrOpcode::kRdmaWrite, a_.sge(100, 5000), dst.addr(1), dst_mr->rkey()), WcStatus::kSuccess);
  got = dst.read();
  EXPECT_TRUE(std::equal(got.begin() + 1, got.begin() + 5001, a_.buf.begin() + 100));
  // READ host -> device: the NIC writes the device bytes of a READ's destination.
  fill(b_.buf, 0, 777, 0x13);
  ASSERT_EQ(run(WrOpcode::kRdmaRead, Sge{src.addr(9), 777, src_mr->lkey()}, b_.addr(0), b_.mr->rkey()),
            WcStatus::kSuccess);
  got = src.read();
  EXPECT_TRUE(std::equal(got.begin() + 9, got.begin() + 9 + 777, b_.buf.begin()));
}

TEST_F(RdmaSimGpu, SendAndWriteWithImmIntoDeviceMemoryCompleteTheReceive) {
  connect();
  DeviceBuffer dev(8192);
  dev.write(std::vector<uint8_t>(8192, 0));
  auto mr = b_.pd->reg_mr(dev.ptr(), 8192, kAllAccess);
  Sge r{dev.addr(16), 4096, mr->lkey()};
  ASSERT_EQ(post_recv(*b_.qp, 1, &r, 1), 0);
  ASSERT_EQ(post_recv(*b_.qp, 2, nullptr, 0), 0);
  fill(a_.buf, 0, 3000, 0x5c);
  Sge m = a_.sge(0, 3000);
  ASSERT_EQ(post(*a_.qp, rdma(WrOpcode::kSend, 1, &m, 1, 0, 0)), 0);
  Sge w = a_.sge(0, 100);
  SendWr imm = rdma(WrOpcode::kRdmaWriteWithImm, 2, &w, 1, dev.addr(5000), mr->rkey());
  imm.imm_data = 0xfeed;
  ASSERT_EQ(post(*a_.qp, imm), 0);
  auto rs = wait_for(*b_.rcq, 2);
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].status, WcStatus::kSuccess);
  EXPECT_EQ(rs[0].byte_len, 3000u);
  EXPECT_EQ(rs[1].status, WcStatus::kSuccess);
  EXPECT_EQ(rs[1].imm_data, 0xfeedu);
  EXPECT_EQ(wait_for(*a_.scq, 2).size(), 2u);
  const auto got = dev.read();
  EXPECT_TRUE(std::equal(got.begin() + 16, got.begin() + 16 + 3000, a_.buf.begin()));
  EXPECT_TRUE(std::equal(got.begin() + 5000, got.begin() + 5100, a_.buf.begin()));
}

TEST_F(RdmaSimGpu, DmabufMrsRegisterTheGpusExportAndOutliveItsFd) {
  connect();
  DeviceBuffer dev(12288);  // whole pages: a dma-buf exports whole pages of one allocation
  const auto init = bytes_of(12288, 0x09);
  dev.write(init);
  // The export covers whole pages: ask at an unaligned address.
  const gpu::DmabufRange buf = gpu::runtime().dmabuf_fd(reinterpret_cast<void*>(dev.addr(100)), 9000);
  EXPECT_EQ(buf.offset, 100u);
  auto mr = b_.pd->reg_dmabuf_mr(buf.offset, 9000, dev.addr(100), buf.fd, kAllAccess);
  ::close(buf.fd);  // the MR holds the buffer, not the descriptor
  fill(a_.buf, 0, 9000, 0x66);
  ASSERT_EQ(run(WrOpcode::kRdmaWrite, a_.sge(0, 9000), dev.addr(100), mr->rkey()), WcStatus::kSuccess);
  auto got = dev.read();
  EXPECT_TRUE(std::equal(got.begin() + 100, got.begin() + 9100, a_.buf.begin()));
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + 100, init.begin()));
  // The MR covers [iova, +9000): a byte past it is a remote access error.
  EXPECT_EQ(run(WrOpcode::kRdmaRead, a_.sge(0, 2), dev.addr(100 + 8999), mr->rkey()), WcStatus::kRemAccessErr);
}

TEST_F(RdmaSimGpu, DmabufRegistrationRefusesWhatIsNoGpuBufferOrRunsPastIt) {
  Side s = make_side(Config{});
  DeviceBuffer dev(4096);
  const gpu::DmabufRange buf = gpu::runtime().dmabuf_fd(dev.ptr(), 4096);
  auto errno_of = [&](auto&& fn) {
    try {
      fn();
    } catch (const VerbsError& e) {
      return e.error_number();
    }
    return 0;
  };
  EXPECT_EQ(errno_of([&] { s.pd->reg_dmabuf_mr(0, 8192, dev.addr(), buf.fd, kAllAccess); }), EINVAL);  // past it
  const int not_dmabuf = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  EXPECT_EQ(errno_of([&] { s.pd->reg_dmabuf_mr(0, 16, dev.addr(), not_dmabuf, kAllAccess); }), EINVAL);
  ::close(not_dmabuf);
  ::close(buf.fd);
  // The runtime exports device memory only, within its allocation.
  EXPECT_THROW(gpu::runtime().dmabuf_fd(s.buf.data(), 16), InvalidArgumentError);
  EXPECT_THROW(gpu::runtime().dmabuf_fd(dev.ptr(), 4097), InvalidArgumentError);
}

TEST_F(RdmaSimGpu, DeviceMemorySupportKnobRefusesEachPathAsTheRealOnesFail) {
  Side s = make_side(Config{});
  DeviceBuffer dev(4096);
  auto errno_of = [&](auto&& fn) {
    try {
      fn();
    } catch (const VerbsError& e) {
      return e.error_number();
    }
    return 0;
  };
  auto by_address = [&] { s.pd->reg_mr(dev.ptr(), 4096, kAllAccess); };
  auto by_dmabuf = [&] {
    const gpu::DmabufRange buf = gpu::runtime().dmabuf_fd(dev.ptr(), 4096);
    try {
      s.pd->reg_dmabuf_mr(buf.offset, 4096, dev.addr(), buf.fd, kAllAccess);
    } catch (...) {
      ::close(buf.fd);
      throw;
    }
    ::close(buf.fd);
  };
  ::setenv("DLSLIME_RDMA_SIM_DEVICE_MEMORY", "dmabuf", 1);
  EXPECT_EQ(errno_of(by_address), EFAULT);  // no peer-memory module: pinning a device address fails
  EXPECT_EQ(errno_of(by_dmabuf), 0);
  ::setenv("DLSLIME_RDMA_SIM_DEVICE_MEMORY", "peermem", 1);
  EXPECT_EQ(errno_of(by_address), 0);
  EXPECT_EQ(errno_of(by_dmabuf), EOPNOTSUPP);
  ::setenv("DLSLIME_RDMA_SIM_DEVICE_MEMORY", "none", 1);
  EXPECT_EQ(errno_of(by_address), EFAULT);
  EXPECT_EQ(errno_of(by_dmabuf), EOPNOTSUPP);
  // Host memory is unaffected; a range running from host into device memory never registers.
  EXPECT_NO_THROW(s.pd->reg_mr(s.buf.data(), 64, kAllAccess));
  ::setenv("DLSLIME_RDMA_SIM_DEVICE_MEMORY", "dmabuf,peermem", 1);
  EXPECT_EQ(errno_of([&] { s.pd->reg_mr(dev.ptr(), 4097, kAllAccess); }), EFAULT);
  ::setenv("DLSLIME_RDMA_SIM_DEVICE_MEMORY", "yes", 1);
  try {  // through the verbs ABI a refusal is an errno; the device's detail names the variable
    s.pd->reg_mr(dev.ptr(), 4096, kAllAccess);
    ADD_FAILURE() << "DLSLIME_RDMA_SIM_DEVICE_MEMORY=yes was accepted";
  } catch (const VerbsError& e) {
    EXPECT_EQ(e.error_number(), EINVAL);
    EXPECT_NE(std::string(e.what()).find("DLSLIME_RDMA_SIM_DEVICE_MEMORY"), std::string::npos) << e.what();
  }
}

// ---- Two processes: each has its own sim_rdma0 (its GID names its pid); the responder's
// device moves the bytes with process_vm_readv/writev (docs/rdma.md, "Across processes").

// The layout both processes agree on (offsets into each side's 64 KiB buffer).
constexpr size_t kPeerSource = 0;        // the peer's bytes that the test READs (seed 0x5a)
constexpr size_t kWriteAt = 8192;        // a WRITE lands here (seed 0x11)
constexpr size_t kImmAt = 12288;         // a WRITE_WITH_IMM lands here (seed 0x22)
constexpr size_t kRecvAt = 32768;        // the peer's receive buffer for a SEND (seed 0x33)
constexpr size_t kInlineAt = 40000;      // an inline WRITE (seed 0x44)
constexpr uint32_t kLen = 4096, kSendLen = 1000, kInlineLen = 64, kImm = 0xdecaf;

// A cross-process config: the default ACK timeout (67 ms, 7 retries: a dead peer is seen
// within about 0.54 s) so a loaded machine's scheduling is never mistaken for a lost packet.
Config two_process_config() {
  Config cfg;
  cfg.rts = RcRtsAttr{0, 14, 7, 2, 16};
  return cfg;
}

std::string describe(const Side& s) {
  const GidBytes gid = s.ctx->query_gid(1, 0).gid;
  std::string hex;
  for (uint8_t b : gid) hex += fmt::format("{:02x}", b);
  return fmt::format("{} {} {} {}", s.qp->qp_num(), hex, reinterpret_cast<uint64_t>(s.buf.data()), s.mr->rkey());
}

struct PeerDesc {
  uint32_t qpn = 0;
  GidBytes gid{};
  uint64_t addr = 0;
  uint32_t rkey = 0;
};

std::optional<PeerDesc> parse_desc(const std::string& line) {
  std::istringstream in(line);
  PeerDesc d;
  std::string hex;
  if (!(in >> d.qpn >> hex >> d.addr >> d.rkey) || hex.size() != 32) return std::nullopt;
  for (size_t i = 0; i < 16; ++i) d.gid[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return d;
}

std::optional<std::string> read_line_from(int fd, std::string& pending, std::chrono::milliseconds deadline) {
  const auto until = Clock::now() + deadline;
  while (true) {
    auto nl = pending.find('\n');
    if (nl != std::string::npos) {
      std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left <= 0ms) return std::nullopt;
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left.count()) + 1) <= 0) continue;
    char buf[256];
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) return std::nullopt;
    pending.append(buf, static_cast<size_t>(n));
  }
}

// The peer process (this binary with --sim-peer): one QP, driven by lines on stdin.
int run_sim_peer() {
  ::setenv("DLSLIME_RDMA_SIM", "1", 1);
  const Config cfg = two_process_config();
  Side b = open_side(cfg);
  fill_pattern(b.buf, kPeerSource, kLen, 0x5a);
  std::printf("%s\n", describe(b).c_str());
  std::fflush(stdout);
  std::string pending;
  auto line = read_line_from(0, pending, 30s);
  auto a = line ? parse_desc(*line) : std::nullopt;
  if (!a || connect_qp(b, a->qpn, a->gid, cfg) != 0) return 2;
  Sge r = b.sge(kRecvAt, kLen);
  // Receives are consumed in order: the WRITE_WITH_IMM comes first (it needs no sges).
  RecvWr imm_recv{1, nullptr, nullptr, 0};
  RecvWr send_recv{2, nullptr, &r, 1};
  imm_recv.next = &send_recv;
  if (b.qp->post_recv(&imm_recv, nullptr) != 0) return 3;
  std::printf("ready\n");
  std::fflush(stdout);
  // "check": report what arrived, in the order the receives completed.
  if (read_line_from(0, pending, 30s) != std::optional<std::string>("check")) return 4;
  std::string report;
  WorkCompletion wc[2];
  int got = 0;
  const auto until = Clock::now() + 10s;
  while (got < 2 && Clock::now() < until) {
    int n = b.rcq->poll(2 - got, wc + got);
    if (n < 0) return 5;
    got += n;
    if (n == 0) std::this_thread::sleep_for(1ms);  // the peer's own loop; the test itself waits on lines
  }
  for (int i = 0; i < got; ++i) {
    report += fmt::format("recv {} {} {} {} {}; ", wc[i].wr_id, wc_status_name(wc[i].status), wc[i].byte_len,
                          wc[i].has_imm ? 1 : 0, wc[i].imm_data);
  }
  report += fmt::format("write {} imm {} send {} inline {}", has_pattern(b.buf, kWriteAt, kLen, 0x11),
                        has_pattern(b.buf, kImmAt, kLen, 0x22), has_pattern(b.buf, kRecvAt, kSendLen, 0x33),
                        has_pattern(b.buf, kInlineAt, kInlineLen, 0x44));
  std::printf("%s\n", report.c_str());
  std::fflush(stdout);
  // Serve (as the responder) until told to stop or killed.
  read_line_from(0, pending, 60s);
  return 0;
}

class RdmaSimTwoProcesses : public RdmaSim {
 protected:
  void SetUp() override {
    RdmaSim::SetUp();
    int in[2], out[2];
    ASSERT_EQ(::pipe2(in, O_CLOEXEC), 0);
    ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    char exe[] = "/proc/self/exe";
    char flag[] = "--sim-peer";
    char* argv[] = {exe, flag, nullptr};
    ASSERT_EQ(::posix_spawn(&child_, exe, &fa, nullptr, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    to_child_ = in[1];
    from_child_ = out[0];
    a_ = make_side(two_process_config());
    auto line = read_line();
    ASSERT_TRUE(line) << "the peer process did not start";
    auto b = parse_desc(*line);
    ASSERT_TRUE(b) << *line;
    peer_ = *b;
    ASSERT_EQ(connect_qp(a_, peer_.qpn, peer_.gid, two_process_config()), 0);
    ASSERT_NE(peer_.gid, a_.ctx->query_gid(1, 0).gid) << "two processes must be two hosts";
    write_line(describe(a_));
    ASSERT_EQ(read_line(), std::optional<std::string>("ready"));
  }
  void TearDown() override {
    if (child_ > 0) {
      ::kill(child_, SIGKILL);
      ::waitpid(child_, nullptr, 0);
    }
    if (to_child_ >= 0) ::close(to_child_);
    if (from_child_ >= 0) ::close(from_child_);
  }
  std::optional<std::string> read_line(std::chrono::milliseconds deadline = 30s) {
    return read_line_from(from_child_, pending_, deadline);
  }
  void write_line(const std::string& line) {
    std::string l = line + "\n";
    ASSERT_EQ(::write(to_child_, l.data(), l.size()), static_cast<ssize_t>(l.size()));
  }
  // Posts one WR from a's QP and waits for its completion.
  WorkCompletion run(SendWr wr) {
    EXPECT_EQ(post(*a_.qp, wr), 0);
    return wait_one(*a_.scq);
  }
  void kill_peer() {
    ::kill(child_, SIGKILL);
    ::waitpid(child_, nullptr, 0);
    child_ = -1;
  }

  pid_t child_ = -1;
  int to_child_ = -1, from_child_ = -1;
  std::string pending_;
  PeerDesc peer_;
};

TEST_F(RdmaSimTwoProcesses, ReadWriteWriteWithImmAndSendMoveBytesExactly) {
  fill(a_.buf, 0, kLen, 0x11);
  Sge w = a_.sge(0, kLen);
  EXPECT_EQ(run(rdma(WrOpcode::kRdmaWrite, 1, &w, 1, peer_.addr + kWriteAt, peer_.rkey)).status, WcStatus::kSuccess);

  Sge r = a_.sge(16384, kLen);
  WorkCompletion rc = run(rdma(WrOpcode::kRdmaRead, 2, &r, 1, peer_.addr + kPeerSource, peer_.rkey));
  EXPECT_EQ(rc.status, WcStatus::kSuccess);
  EXPECT_EQ(rc.byte_len, kLen);
  EXPECT_TRUE(has_pattern(a_.buf, 16384, kLen, 0x5a)) << "READ did not bring the peer's bytes";

  // Two sges on the requester side, gathered into one remote range.
  fill(a_.buf, 4096, kLen, 0x22);
  Sge two[2] = {a_.sge(4096, 1000), a_.sge(4096 + 1000, kLen - 1000)};
  SendWr wimm = rdma(WrOpcode::kRdmaWriteWithImm, 3, two, 2, peer_.addr + kImmAt, peer_.rkey);
  wimm.imm_data = kImm;
  EXPECT_EQ(run(wimm).status, WcStatus::kSuccess);

  fill(a_.buf, 20480, kSendLen, 0x33);
  Sge snd = a_.sge(20480, kSendLen);
  SendWr send = rdma(WrOpcode::kSend, 4, &snd, 1, 0, 0);
  EXPECT_EQ(run(send).status, WcStatus::kSuccess);

  // Inline: the payload travels in the request, the buffer is reusable at once.
  fill(a_.buf, 24576, kInlineLen, 0x44);
  Sge in = a_.sge(24576, kInlineLen);
  SendWr inl = rdma(WrOpcode::kRdmaWrite, 5, &in, 1, peer_.addr + kInlineAt, peer_.rkey);
  inl.inline_data = true;
  ASSERT_EQ(post(*a_.qp, inl), 0);
  std::fill(a_.buf.begin() + 24576, a_.buf.begin() + 24576 + kInlineLen, 0);
  EXPECT_EQ(wait_one(*a_.scq).status, WcStatus::kSuccess);

  write_line("check");
  EXPECT_EQ(read_line(), std::optional<std::string>(fmt::format(
                             "recv 1 SUCCESS {} 1 {}; recv 2 SUCCESS {} 0 0; write true imm true send true inline true",
                             kLen, kImm, kSendLen)));
}

TEST_F(RdmaSimTwoProcesses, TheResponderChecksTheRkeyAndTheRequesterQpGoesToError) {
  Sge w = a_.sge(0, 64);
  // A range past the peer's MR: the peer's device refuses it.
  EXPECT_EQ(run(rdma(WrOpcode::kRdmaWrite, 1, &w, 1, peer_.addr + (1 << 16) - 32, peer_.rkey)).status,
            WcStatus::kRemAccessErr);
  EXPECT_EQ(a_.qp->state(), QpState::kErr);
  // Work after the error is flushed, in order.
  EXPECT_EQ(run(rdma(WrOpcode::kRdmaWrite, 2, &w, 1, peer_.addr, peer_.rkey)).status, WcStatus::kWrFlushErr);
}

TEST_F(RdmaSimTwoProcesses, APeerProcessThatDiedFailsWorkWithRetryExceededWithinTheBound) {
  Sge w = a_.sge(0, 64);
  ASSERT_EQ(run(rdma(WrOpcode::kRdmaWrite, 1, &w, 1, peer_.addr + kWriteAt, peer_.rkey)).status, WcStatus::kSuccess);
  kill_peer();
  const auto t0 = Clock::now();
  EXPECT_EQ(run(rdma(WrOpcode::kRdmaWrite, 2, &w, 1, peer_.addr + kWriteAt, peer_.rkey)).status,
            WcStatus::kRetryExcErr);
  // 4.096 us x 2^14 x (7 + 1) = 0.54 s, plus scheduling.
  EXPECT_LT(Clock::now() - t0, 3s);
  EXPECT_EQ(a_.qp->state(), QpState::kErr);
}

TEST_F(RdmaSimTwoProcesses, AnUnansweredRequestIsRetryExceededAndItsQpFlushedAfterIt) {
  // A stopped peer holds the request without answering: the ACK timeouts run out.
  ASSERT_EQ(::kill(child_, SIGSTOP), 0);
  int st = 0;
  ASSERT_EQ(::waitpid(child_, &st, WUNTRACED), child_);  // returns once it has stopped
  ASSERT_TRUE(WIFSTOPPED(st));
  Sge w = a_.sge(0, 64);
  SendWr w1 = rdma(WrOpcode::kRdmaWrite, 1, &w, 1, peer_.addr + kWriteAt, peer_.rkey);
  SendWr w2 = rdma(WrOpcode::kRdmaWrite, 2, &w, 1, peer_.addr + kWriteAt, peer_.rkey);
  w1.next = &w2;
  ASSERT_EQ(a_.qp->post_send(&w1, nullptr), 0);
  auto wcs = wait_for(*a_.scq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, WcStatus::kRetryExcErr);
  EXPECT_EQ(wcs[1].status, WcStatus::kWrFlushErr);
  ::kill(child_, SIGCONT);
}

}  // namespace
}  // namespace dlslime::rdma

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--sim-peer") return dlslime::rdma::run_sim_peer();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
