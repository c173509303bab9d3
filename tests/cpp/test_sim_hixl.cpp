// The simulated NPU and HIXL engine (src/ascend/sim_*): what the Ascend transport relies on
// them for, in one process (two engines) and across processes (a forked child serving one).
// Waits are on conditions with deadlines; nothing syncs by sleeping.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ascend/hixl_engine.h"
#include "ascend/sim_hixl.h"
#include "ascend/sim_hixl_wire.h"
#include "ascend/sim_npu_memory.h"
#include "dlslime/errors.h"

namespace dlslime::ascend {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int32_t kTimeoutMs = 5000;

// Names unique to this process, so parallel runs on one host do not meet.
std::string next_name() {
  static int n = 0;
  return "127.0.0.1:" + std::to_string(20000 + (::getpid() % 900) * 50 + n++ % 50);
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed);
  return v;
}

std::unique_ptr<HixlEngine> engine(const std::string& name) {
  auto e = make_sim_engine();
  EXPECT_EQ(e->Initialize(name, {}), kHixlSuccess) << name;
  return e;
}

MemHandle reg(HixlEngine& e, const void* p, size_t n, MemType t = MemType::kHost) {
  MemHandle h = nullptr;
  EXPECT_EQ(e.RegisterMem(MemDesc{reinterpret_cast<uintptr_t>(p), n}, t, h), kHixlSuccess);
  return h;
}

TransferOpDesc desc(const void* local, const void* remote, size_t n) {
  return TransferOpDesc{reinterpret_cast<uintptr_t>(local), reinterpret_cast<uintptr_t>(remote), n};
}

// Polls an async request until it leaves WAITING, or the deadline.
TransferStatus wait_final(HixlEngine& e, TransferReq req, std::chrono::milliseconds within = std::chrono::seconds(10)) {
  const auto deadline = Clock::now() + within;
  TransferStatus s = TransferStatus::kWaiting;
  while (Clock::now() < deadline) {
    EXPECT_EQ(e.GetTransferStatus(req, s), kHixlSuccess);
    if (s != TransferStatus::kWaiting) return s;
    std::this_thread::yield();
  }
  return s;
}

// Two engines in this process: A (client only) connected to B (serving a name).
struct Pair {
  std::string b_name = next_name();
  std::unique_ptr<HixlEngine> a = engine("127.0.0.1");
  std::unique_ptr<HixlEngine> b = engine(b_name);
};

// ---- the simulated NPU ----

TEST(SimNpuMemory, CopiesInAndOutAndChecksRanges) {
  NpuMemory& npu = sim_npu_memory();
  EXPECT_STREQ(npu.name(), "sim");
  EXPECT_EQ(npu.device_count(), 2);
  const int64_t before = sim_npu_allocations();
  void* d = npu.alloc(1, 5000);
  EXPECT_EQ(sim_npu_allocations(), before + 1);
  auto src = pattern(5000, 7);
  npu.copy_to_device(d, src.data(), src.size());
  std::vector<uint8_t> back(5000);
  npu.copy_to_host(back.data(), d, back.size());
  EXPECT_EQ(back, src);

  const auto base = reinterpret_cast<uintptr_t>(d);
  EXPECT_EQ(npu.classify(base + 100, 4900), MemType::kDevice);
  EXPECT_EQ(npu.classify(reinterpret_cast<uintptr_t>(src.data()), 10), MemType::kHost);
  EXPECT_THROW(npu.classify(base + 100, 4901), InvalidArgumentError);  // past the end, inside the page
  EXPECT_THROW(npu.classify(base - 16, 32), InvalidArgumentError);     // partly device memory
  try {
    npu.copy_to_device(static_cast<uint8_t*>(d) + 4000, src.data(), 1001);
    ADD_FAILURE() << "an overrun copy succeeded";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("5000 bytes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("runs 1 bytes past"), std::string::npos) << e.what();
  }
  EXPECT_THROW(npu.copy_to_device(d, d, 16), InvalidArgumentError);  // the source must be host memory
  EXPECT_THROW(npu.copy_to_host(back.data(), back.data(), 16), InvalidArgumentError);

  std::string why;
  EXPECT_NE(sim_host_view(base + 10, 10, &why), nullptr);
  EXPECT_EQ(why, "");
  EXPECT_EQ(sim_host_view(reinterpret_cast<uintptr_t>(src.data()), 10, &why), nullptr);
  EXPECT_EQ(why, "");
  EXPECT_EQ(sim_host_view(base + 4990, 20, &why), nullptr);
  EXPECT_NE(why, "");

  EXPECT_THROW(npu.free(static_cast<uint8_t*>(d) + 1), InvalidArgumentError);
  npu.free(d);
  EXPECT_EQ(sim_npu_allocations(), before);
  EXPECT_THROW(npu.free(d), InvalidArgumentError);
  EXPECT_THROW(npu.alloc(2, 16), InvalidArgumentError);
  EXPECT_THROW(npu.alloc(0, 0), InvalidArgumentError);
}

// Runs `child` in a forked process; returns its pid. The child never returns into gtest.
pid_t fork_child(const std::function<int()>& child) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 1;
    try {
      rc = child();
    } catch (...) {
    }
    ::_exit(rc);
  }
  return pid;
}

// Waits for `pid` to end, up to `within`; kills it past that. Returns its wait status.
int reap(pid_t pid, std::chrono::milliseconds within = std::chrono::seconds(20)) {
  const auto deadline = Clock::now() + within;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ADD_FAILURE() << "child " << pid << " did not end in time";
      return status;
    }
    pollfd none{-1, 0, 0};
    ::poll(&none, 1, 5);  // between checks of the child's state, not a synchronisation
  }
  return status;
}

TEST(SimNpuMemory, HostStoreThroughAnNpuPointerFaults) {
  void* d = sim_npu_memory().alloc(0, 64);
  const pid_t pid = fork_child([d] {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGSEGV, &dfl, nullptr);  // no sanitizer report: the signal itself is the result
    static_cast<volatile uint8_t*>(d)[0] = 1;
    return 0;
  });
  const int status = reap(pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) << "wait status " << status;
  sim_npu_memory().free(d);
}

// ---- one process, two engines ----

TEST(SimHixl, WriteAndReadHostMemory) {
  Pair p;
  auto a_buf = pattern(1 << 20, 1), b_buf = std::vector<uint8_t>(1 << 20);
  reg(*p.a, a_buf.data(), a_buf.size());
  reg(*p.b, b_buf.data(), b_buf.size());
  ASSERT_EQ(p.a->Connect(p.b_name, kTimeoutMs), kHixlSuccess);
  ASSERT_EQ(p.a->TransferSync(p.b_name, TransferOp::kWrite, {desc(a_buf.data(), b_buf.data(), b_buf.size())},
                              kTimeoutMs),
            kHixlSuccess);
  EXPECT_EQ(b_buf, a_buf);
  // READ a slice back into another place, in two descriptors.
  auto fresh = pattern(1 << 20, 9);
  std::memcpy(b_buf.data(), fresh.data(), fresh.size());
  ASSERT_EQ(p.a->TransferSync(p.b_name, TransferOp::kRead,
                              {desc(a_buf.data(), b_buf.data() + 100, 1000), desc(a_buf.data() + 5000, b_buf.data(), 10)},
                              kTimeoutMs),
            kHixlSuccess);
  EXPECT_EQ(0, std::memcmp(a_buf.data(), fresh.data() + 100, 1000));
  EXPECT_EQ(0, std::memcmp(a_buf.data() + 5000, fresh.data(), 10));
}

TEST(SimHixl, NpuMemoryOnBothSides) {
  Pair p;
  NpuMemory& npu = sim_npu_memory();
  const size_t n = 3 * 4096 + 17;
  void* da = npu.alloc(0, n);
  void* db = npu.alloc(1, n);
  auto src = pattern(n, 3);
  npu.copy_to_device(da, src.data(), n);
  reg(*p.a, da, n, MemType::kDevice);
  reg(*p.b, db, n, MemType::kDevice);
  // Registering NPU memory as host memory (or the reverse) is refused.
  MemHandle h = nullptr;
  EXPECT_EQ(p.a->RegisterMem(MemDesc{reinterpret_cast<uintptr_t>(da), n}, MemType::kHost, h), kHixlParamInvalid);
  EXPECT_EQ(p.a->RegisterMem(MemDesc{reinterpret_cast<uintptr_t>(src.data()), n}, MemType::kDevice, h),
            kHixlParamInvalid);
  ASSERT_EQ(p.a->Connect(p.b_name, kTimeoutMs), kHixlSuccess);
  ASSERT_EQ(p.a->TransferSync(p.b_name, TransferOp::kWrite, {desc(da, db, n)}, kTimeoutMs), kHixlSuccess);
  std::vector<uint8_t> back(n);
  npu.copy_to_host(back.data(), db, n);
  EXPECT_EQ(back, src);
  // And from device memory into host memory by READ.
  std::vector<uint8_t> host(n);
  reg(*p.a, host.data(), n);
  ASSERT_EQ(p.a->TransferSync(p.b_name, TransferOp::kRead, {desc(host.data(), db, n)}, kTimeoutMs), kHixlSuccess);
  EXPECT_EQ(host, src);
  p.a.reset();
  p.b.reset();
  npu.free(da);
  npu.free(db);
}

// NPU memory freed while still registered is never touched: the transfer fails instead.
TEST(SimHixl, NpuMemoryFreedUnderItsRegistrationIsNotTouched) {
  Pair p;
  NpuMemory& npu = sim_npu_memory();
  void* da = npu.alloc(0, 4096);
  void* db = npu.alloc(0, 4096);
  reg(*p.a, da, 4096, MemType::kDevice);
  reg(*p.b, db, 4096, MemType::kDevice);
  ASSERT_EQ(p.a->Connect(p.b_name, kTimeoutMs), kHixlSuccess);
  npu.free(db);  // the responder's
  EXPECT_EQ(p.a->TransferSync(p.b_name, TransferOp::kWrite, {desc(da, db, 64)}, kTimeoutMs), kHixlFailed);
  ASSERT_EQ(p.a->Disconnect(p.b_name, kTimeoutMs), kHixlSuccess);
  std::vector<uint8_t> b_host(4096);
  reg(*p.b, b_host.data(), b_host.size());
  ASSERT_EQ(p.a->Connect(p.b_name, kTimeoutMs), kHixlSuccess);
  npu.free(da);  // the requester's
  EXPECT_EQ(p.a->TransferSync(p.b_name, TransferOp::kRead, {desc(da, b_host.data(), 64)}, kTimeoutMs),
            kHixlParamInvalid);
}

TEST(SimHixl, RangesOutsideRegisteredMemoryAreParamInvalid) {
  Pair p;
  std::vector<uint8_t> a_buf(4096, 1), b_buf(4096, 2), later(4096, 3), unregistered(4096, 4);
  reg(*p.a, a_buf.data(), a_buf.size());
  const MemHandle b_handle = reg(*p.b, b_buf.data(), b_buf.size());
  ASSERT_EQ(p.a->Connect(p.b_name, kTimeoutMs), kHixlSuccess);
  reg(*p.b, later.data(), later.size());  // after the link was made: not reachable through it
  const auto w = TransferOp::kWrite;
  EXPECT_EQ(p.a->TransferSync(p.b_name, w, {desc(a_buf.data(), b_buf.data() + 1, 4096)}, kTimeoutMs),
            kHixlParamInvalid);
  EXPECT_EQ(p.a->TransferSync(p.b_name, w, {desc(unregistered.data(), b_buf.data(), 16)}, kTimeoutMs),
            kHixlParamInvalid);
  EXPECT_EQ(p.a->TransferSync(p.b_name, w, {desc(a_buf.data(), later.data(), 16)}, kTimeoutMs), kHixlParamInvalid);
  EXPECT_EQ(p.a->TransferSync(p.b_name, w, {}, kTimeoutMs), kHixlParamInvalid);
  EXPECT_EQ(p.a->TransferSync(p.b_name, w, {desc(a_buf.data(), b_buf.data(), 0)}, kTimeoutMs), kHixlParamInvalid);
  // A batch fails as a whole: the valid first descriptor moved nothing.
  EXPECT_EQ(p.a->TransferSync(p.b_name, w,
                              {desc(a_buf.data(), b_buf.data(), 16), desc(a_buf.data(), later.data(), 16)}, kTimeoutMs),
            kHixlParamInvalid);
  EXPECT_EQ(b_buf[0], 2);
  TransferReq req = nullptr;
  EXPECT_EQ(p.a->TransferAsync(p.b_name, w, {desc(a_buf.data(), later.data(), 16)}, req), kHixlParamInvalid);
  // Memory the responder deregistered after Connect: it refuses, and touches nothing.
  ASSERT_EQ(p.b->DeregisterMem(b_handle), kHixlSuccess);
  EXPECT_EQ(p.a->TransferSync(p.b_name, w, {desc(a_buf.data(), b_buf.data(), 16)}, kTimeoutMs), kHixlFailed);
  EXPECT_EQ(b_buf[0], 2);
  EXPECT_EQ(p.b->DeregisterMem(b_handle), kHixlParamInvalid);
  // A new link sees what is registered now.
  ASSERT_EQ(p.a->Disconnect(p.b_name, kTimeoutMs), kHixlSuccess);
  ASSERT_EQ(p.a->Connect(p.b_name, kTimeoutMs), kHixlSuccess);
  EXPECT_EQ(p.a->TransferSync(p.b_name, w, {desc(a_buf.data(), later.data(), 16)}, kTimeoutMs), kHixlSuccess);
  EXPECT_EQ(later[0], 1);
}

TEST(SimHixl, LinkStatusCodes) {
  Pair p;
  std::vector<uint8_t> buf(64);
  reg(*p.a, buf.data(), buf.size());
  EXPECT_EQ(p.a->TransferSync(p.b_name, TransferOp::kRead, {desc(buf.data(), buf.data(), 8)}, kTimeoutMs),
            kHixlNotConnected);
  EXPECT_EQ(p.a->Disconnect(p.b_name, kTimeoutMs), kHixlNotConnected);
  EXPECT_EQ(p.a->SendNotify(p.b_name, NotifyDesc{"", "x"}, kTimeoutMs), kHixlNotConnected);
  ASSERT_EQ(p.a->Connect(p.b_name, kTimeoutMs), kHixlSuccess);
  EXPECT_EQ(p.a->Connect(p.b_name, kTimeoutMs), kHixlAlreadyConnected);
  // Links are one-directional: B has none to A (and A, a client only, cannot be reached).
  EXPECT_EQ(p.b->SendNotify("127.0.0.1", NotifyDesc{"", "x"}, kTimeoutMs), kHixlNotConnected);
  EXPECT_EQ(p.b->Connect("127.0.0.1", kTimeoutMs), kHixlParamInvalid);
  // Nobody serves this name: TIMEOUT, in about the time asked for.
  const auto start = Clock::now();
  EXPECT_EQ(p.a->Connect(next_name(), 100), kHixlTimeout);
  const auto took = Clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(100));
  EXPECT_LT(took, std::chrono::seconds(3));
}

TEST(SimHixl, InitializeChecksNames) {
  for (const char* bad : {"", "host:", "host:0", "host:65536", "host:1:2", "ho st:5", ":5", "[::1", "a:b"}) {
    EXPECT_EQ(make_sim_engine()->Initialize(bad, {}), kHixlParamInvalid) << bad;
  }
  const std::string name = next_name();
  auto first = engine(name);
  EXPECT_EQ(make_sim_engine()->Initialize(name, {}), kHixlFailed);  // the name is served already
  EXPECT_EQ(first->Initialize(next_name(), {}), kHixlFailed);      // twice
  auto client = engine("10.0.0.1");
  auto v6 = engine("[::1]:" + name.substr(name.find(':') + 1));
  first->Finalize();
  first->Finalize();  // idempotent
  EXPECT_EQ(engine(name)->Connect(name, kTimeoutMs), kHixlSuccess);  // served again, by a new engine (itself)
}

TEST(SimHixl, AsyncStatusIsWaitingThenCompletedThenConsumed) {
  Pair p;
  auto a_buf = pattern(8192, 5);
  std::vector<uint8_t> b_buf(8192);
  reg(*p.a, a_buf.data(), a_buf.size());
  reg(*p.b, b_buf.data(), b_buf.size());
  ASSERT_EQ(p.a->Connect(p.b_name, kTimeoutMs), kHixlSuccess);
  set_sim_fault(*p.b, SimFault{.delay_ms = 1000});  // long enough that the first look sees WAITING
  TransferReq req = nullptr;
  ASSERT_EQ(p.a->TransferAsync(p.b_name, TransferOp::kWrite, {desc(a_buf.data(), b_buf.data(), 8192)}, req),
            kHixlSuccess);
  TransferStatus s = TransferStatus::kCompleted;
  ASSERT_EQ(p.a->GetTransferStatus(req, s), kHixlSuccess);
  EXPECT_EQ(s, TransferStatus::kWaiting);
  EXPECT_EQ(wait_final(*p.a, req), TransferStatus::kCompleted);
  EXPECT_EQ(b_buf, a_buf);
  EXPECT_EQ(p.a->GetTransferStatus(req, s), kHixlParamInvalid);  // consumed
  EXPECT_EQ(p.a->GetTransferStatus(reinterpret_cast<TransferReq>(uintptr_t{12345678}), s), kHixlParamInvalid);

  // Many at once, with no delay: each completes.
  set_sim_fault(*p.b, SimFault{});
  std::vector<TransferReq> reqs(200);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(p.a->TransferAsync(p.b_name, TransferOp::kRead, {desc(a_buf.data() + i, b_buf.data() + i, 1)}, reqs[i]),
              kHixlSuccess);
  }
  for (TransferReq r : reqs) EXPECT_EQ(wait_final(*p.a, r), TransferStatus::kCompleted);
}

TEST(SimHixl, LargeBatchesGoInParts) {
  Pair p;
  auto a_buf = pattern(5000 * 8, 2);
  std::vector<uint8_t> b_buf(5000 * 8);
  reg(*p.a, a_buf.data(), a_buf.size());
  reg(*p.b, b_buf.data(), b_buf.size());
  ASSERT_EQ(p.a->Connect(p.b_name, kTimeoutMs), kHixlSuccess);
  std::vector<TransferOpDesc> descs;
  for (size_t i = 0; i < 5000; ++i) descs.push_back(desc(a_buf.data() + 8 * i, b_buf.data() + 8 * (4999 - i), 8));
  ASSERT_EQ(p.a->TransferSync(p.b_name, TransferOp::kWrite, descs, kTimeoutMs), kHixlSuccess);
  for (size_t i = 0; i < 5000; ++i) ASSERT_EQ(0, std::memcmp(a_buf.data() + 8 * i, b_buf.data() + 8 * (4999 - i), 8));
}

TEST(SimHixl, SyncTimeoutLeavesTheLinkUnusableUntilReconnected) {
  Pair p;
  std::vector<uint8_t> a_buf(64, 1), b_buf(64, 2);
  reg(*p.a, a_buf.data(), a_buf.size());
  reg(*p.b, b_buf.data(), b_buf.size());
  ASSERT_EQ(p.a->Connect(p.b_name, kTimeoutMs), kHixlSuccess);
  set_sim_fault(*p.b, SimFault{.hang = true});
  const auto w = TransferOp::kWrite;
  EXPECT_EQ(p.a->TransferSync(p.b_name, w, {desc(a_buf.data(), b_buf.data(), 8)}, 50), kHixlTimeout);
  set_sim_fault(*p.b, SimFault{});
  EXPECT_EQ(p.a->TransferSync(p.b_name, w, {desc(a_buf.data(), b_buf.data(), 8)}, kTimeoutMs), kHixlFailed);
  TransferReq req = nullptr;
  EXPECT_EQ(p.a->TransferAsync(p.b_name, w, {desc(a_buf.data(), b_buf.data(), 8)}, req), kHixlFailed);
  ASSERT_EQ(p.a->Disconnect(p.b_name, kTimeoutMs), kHixlSuccess);
  ASSERT_EQ(p.a->Connect(p.b_name, kTimeoutMs), kHixlSuccess);
  EXPECT_EQ(p.a->TransferSync(p.b_name, w, {desc(a_buf.data(), b_buf.data(), 8)}, kTimeoutMs), kHixlSuccess);
  EXPECT_EQ(b_buf[0], 1);
}

TEST(SimHixl, DisconnectAndFinalizeFailRequestsInFlight) {
  Pair p;
  std::vector<uint8_t> a_buf(64, 1), b_buf(64, 2);
  reg(*p.a, a_buf.data(), a_buf.size());
  reg(*p.b, b_buf.data(), b_buf.size());
  ASSERT_EQ(p.a->Connect(p.b_name, kTimeoutMs), kHixlSuccess);
  set_sim_fault(*p.b, SimFault{.hang = true});
  TransferReq req = nullptr;
  ASSERT_EQ(p.a->TransferAsync(p.b_name, TransferOp::kRead, {desc(a_buf.data(), b_buf.data(), 8)}, req), kHixlSuccess);
  TransferStatus s = TransferStatus::kCompleted;
  ASSERT_EQ(p.a->GetTransferStatus(req, s), kHixlSuccess);
  EXPECT_EQ(s, TransferStatus::kWaiting);
  ASSERT_EQ(p.a->Disconnect(p.b_name, kTimeoutMs), kHixlSuccess);
  ASSERT_EQ(p.a->GetTransferStatus(req, s), kHixlSuccess);
  EXPECT_EQ(s, TransferStatus::kFailed);
  EXPECT_EQ(p.a->TransferSync(p.b_name, TransferOp::kRead, {desc(a_buf.data(), b_buf.data(), 8)}, kTimeoutMs),
            kHixlNotConnected);

  // Finalize fails what is in flight, wakes a TransferSync waiting in another thread.
  ASSERT_EQ(p.a->Connect(p.b_name, kTimeoutMs), kHixlSuccess);
  ASSERT_EQ(p.a->TransferAsync(p.b_name, TransferOp::kRead, {desc(a_buf.data(), b_buf.data(), 8)}, req), kHixlSuccess);
  uint32_t sync_rc = 0;
  std::thread waiter([&] {
    sync_rc = p.a->TransferSync(p.b_name, TransferOp::kRead, {desc(a_buf.data(), b_buf.data(), 8)}, 60000);
  });
  // Finalize may come before the waiter submits (then it sees FAILED at once) or after.
  p.a->Finalize();
  waiter.join();
  EXPECT_EQ(sync_rc, kHixlFailed);
  ASSERT_EQ(p.a->GetTransferStatus(req, s), kHixlSuccess);
  EXPECT_EQ(s, TransferStatus::kFailed);
}

TEST(SimHixl, ConcurrentCallersOnOneLink) {
  Pair p;
  constexpr size_t kThreads = 4, kEach = 100;
  auto a_buf = pattern(kThreads * kEach, 4);
  std::vector<uint8_t> b_buf(kThreads * kEach);
  reg(*p.a, a_buf.data(), a_buf.size());
  reg(*p.b, b_buf.data(), b_buf.size());
  ASSERT_EQ(p.a->Connect(p.b_name, kTimeoutMs), kHixlSuccess);
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < kEach; ++i) {
        const size_t at = t * kEach + i;
        if (i % 2 == 0) {
          failures[t] += p.a->TransferSync(p.b_name, TransferOp::kWrite, {desc(&a_buf[at], &b_buf[at], 1)},
                                           kTimeoutMs) != kHixlSuccess;
        } else {
          TransferReq req = nullptr;
          failures[t] += p.a->TransferAsync(p.b_name, TransferOp::kWrite, {desc(&a_buf[at], &b_buf[at], 1)}, req) !=
                             kHixlSuccess ||
                         wait_final(*p.a, req) != TransferStatus::kCompleted;
        }
        failures[t] += p.a->SendNotify(p.b_name, NotifyDesc{"", "n"}, kTimeoutMs) != kHixlSuccess;
      }
    });
  }
  std::vector<NotifyDesc> got;
  size_t notifies = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (notifies < kThreads * kEach && Clock::now() < deadline) {
    ASSERT_EQ(p.b->GetNotifies(got), kHixlSuccess);
    notifies += got.size();
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(notifies, kThreads * kEach);
  for (int f : failures) EXPECT_EQ(f, 0);
  EXPECT_EQ(b_buf, a_buf);
}

TEST(SimHixl, FinalizeWakesAConnectStillRetrying) {
  auto a = engine("127.0.0.1");
  const std::string nobody = next_name();
  uint32_t rc = 0;
  std::thread connecting([&] { rc = a->Connect(nobody, 60000); });
  // Whether Finalize comes before the first try or during the retries, Connect ends now.
  const auto start = Clock::now();
  a->Finalize();
  connecting.join();
  EXPECT_EQ(rc, kHixlFailed);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

TEST(SimHixl, NotifiesArriveInOrderNamedBySenderAndAreBounded) {
  const std::string b_name = next_name(), c_name = next_name();
  auto a = engine("127.0.0.1");
  auto c = engine(c_name);
  auto b = engine(b_name);
  std::vector<uint8_t> a_buf(64, 7), b_buf(64);
  reg(*a, a_buf.data(), a_buf.size());
  reg(*b, b_buf.data(), b_buf.size());
  ASSERT_EQ(a->Connect(b_name, kTimeoutMs), kHixlSuccess);
  ASSERT_EQ(c->Connect(b_name, kTimeoutMs), kHixlSuccess);
  // A notify after a transfer finds the transfer's bytes in place.
  ASSERT_EQ(a->TransferSync(b_name, TransferOp::kWrite, {desc(a_buf.data(), b_buf.data(), 64)}, kTimeoutMs),
            kHixlSuccess);
  ASSERT_EQ(a->SendNotify(b_name, NotifyDesc{"ignored", "one"}, kTimeoutMs), kHixlSuccess);
  ASSERT_EQ(c->SendNotify(b_name, NotifyDesc{"", "two"}, kTimeoutMs), kHixlSuccess);
  ASSERT_EQ(a->SendNotify(b_name, NotifyDesc{"", std::string(1024, 'x')}, kTimeoutMs), kHixlSuccess);
  EXPECT_EQ(a->SendNotify(b_name, NotifyDesc{"", std::string(1025, 'x')}, kTimeoutMs), kHixlParamInvalid);
  EXPECT_EQ(a->SendNotify(b_name, NotifyDesc{std::string(1025, 'x'), ""}, kTimeoutMs), kHixlParamInvalid);
  std::vector<NotifyDesc> got;
  ASSERT_EQ(b->GetNotifies(got), kHixlSuccess);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].name, "127.0.0.1");
  EXPECT_EQ(got[0].notify_msg, "one");
  EXPECT_EQ(got[1].name, c_name);
  EXPECT_EQ(got[1].notify_msg, "two");
  EXPECT_EQ(got[2].notify_msg.size(), 1024u);
  EXPECT_EQ(b_buf[0], 7);
  ASSERT_EQ(b->GetNotifies(got), kHixlSuccess);
  EXPECT_TRUE(got.empty());

  // At most kMaxUnreadNotifies unread per link; another link is not held back.
  for (size_t i = 0; i < kMaxUnreadNotifies; ++i) {
    ASSERT_EQ(a->SendNotify(b_name, NotifyDesc{"", std::to_string(i)}, kTimeoutMs), kHixlSuccess) << i;
  }
  EXPECT_EQ(a->SendNotify(b_name, NotifyDesc{"", "over"}, kTimeoutMs), kHixlResourceExhausted);
  EXPECT_EQ(c->SendNotify(b_name, NotifyDesc{"", "other link"}, kTimeoutMs), kHixlSuccess);
  ASSERT_EQ(b->GetNotifies(got), kHixlSuccess);
  ASSERT_EQ(got.size(), kMaxUnreadNotifies + 1);
  EXPECT_EQ(got[4095].notify_msg, "4095");
  EXPECT_EQ(got[4096].notify_msg, "other link");
  EXPECT_EQ(a->SendNotify(b_name, NotifyDesc{"", "again"}, kTimeoutMs), kHixlSuccess);
}

TEST(SimHixl, CapabilitiesOffMakeCallsUnsupported) {
  Pair p;
  EXPECT_TRUE(p.a->GetCapability().transfer_async);
  set_sim_capability(*p.a, HixlEngine::Capability{false, false});
  EXPECT_FALSE(p.a->GetCapability().notify);
  std::vector<uint8_t> buf(64);
  reg(*p.a, buf.data(), buf.size());
  reg(*p.b, buf.data(), buf.size());
  ASSERT_EQ(p.a->Connect(p.b_name, kTimeoutMs), kHixlSuccess);
  TransferReq req = nullptr;
  EXPECT_EQ(p.a->TransferAsync(p.b_name, TransferOp::kRead, {desc(buf.data(), buf.data(), 8)}, req), kHixlUnsupported);
  EXPECT_EQ(p.a->SendNotify(p.b_name, NotifyDesc{"", "x"}, kTimeoutMs), kHixlUnsupported);
  std::vector<NotifyDesc> got;
  EXPECT_EQ(p.a->GetNotifies(got), kHixlUnsupported);
  EXPECT_EQ(p.a->TransferSync(p.b_name, TransferOp::kRead, {desc(buf.data(), buf.data(), 8)}, kTimeoutMs),
            kHixlSuccess);

  const auto caps = parse_sim_caps("async=0,notify=1");
  EXPECT_FALSE(caps.transfer_async);
  EXPECT_TRUE(caps.notify);
  EXPECT_THROW(parse_sim_caps("async=2"), InvalidArgumentError);
  EXPECT_THROW(parse_sim_caps("rdma=1"), InvalidArgumentError);
  const SimFault f = parse_sim_fault("delay_ms=50,hang=1,die_after=3");
  EXPECT_EQ(f.delay_ms, 50);
  EXPECT_TRUE(f.hang);
  EXPECT_EQ(f.die_after, 3);
  EXPECT_THROW(parse_sim_fault("delay_ms=-1"), InvalidArgumentError);
  EXPECT_THROW(parse_sim_fault("hang"), InvalidArgumentError);

  // A malformed variable makes Initialize refuse, naming it in the log.
  ::setenv("DLSLIME_ASCEND_SIM_FAULT", "explode=1", 1);
  auto e = make_sim_engine();
  ::unsetenv("DLSLIME_ASCEND_SIM_FAULT");
  EXPECT_EQ(e->Initialize("127.0.0.1", {}), kHixlParamInvalid);
}

// A connection that sends garbage (or too much) is dropped; the engine keeps serving.
TEST(SimHixl, MalformedMessagesDropOnlyTheirConnection) {
  Pair p;
  std::vector<uint8_t> a_buf(64, 1), b_buf(64, 2);
  reg(*p.a, a_buf.data(), a_buf.size());
  reg(*p.b, b_buf.data(), b_buf.size());
  auto raw = [&](const std::vector<uint8_t>& bytes) {
    const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string path = "dlslime-sim-hixl-" + p.b_name;
    std::memcpy(addr.sun_path + 1, path.data(), path.size());
    const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + path.size());
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
    // The engine closes it: recv sees EOF within the deadline.
    pollfd pfd{fd, POLLIN, 0};
    EXPECT_EQ(::poll(&pfd, 1, 5000), 1);
    char c = 0;
    EXPECT_EQ(::recv(fd, &c, 1, 0), 0);
    ::close(fd);
  };
  raw(std::vector<uint8_t>(7, 0xff));                           // short
  raw(std::vector<uint8_t>(simwire::kMaxMessage + 100, 0));     // oversized
  simwire::Message t;
  t.kind = simwire::Kind::kTransfer;
  t.descs.push_back(simwire::Desc{1, reinterpret_cast<uint64_t>(b_buf.data()), 8});
  raw(simwire::encode(t));                                      // a transfer before HELLO
  auto lying = simwire::encode(t);
  lying[8] = 200;                                               // count says 200 descriptors
  raw(lying);
  ASSERT_EQ(p.a->Connect(p.b_name, kTimeoutMs), kHixlSuccess);
  EXPECT_EQ(p.a->TransferSync(p.b_name, TransferOp::kWrite, {desc(a_buf.data(), b_buf.data(), 8)}, kTimeoutMs),
            kHixlSuccess);
  EXPECT_EQ(b_buf[0], 1);
}

TEST(SimHixlWire, ParseRefusesWhatIsNotOneWellFormedMessage) {
  simwire::Message m;
  m.kind = simwire::Kind::kAnswer;
  m.req = 42;
  m.status = kHixlSuccess;
  auto bytes = simwire::encode(m);
  simwire::Message out;
  ASSERT_TRUE(simwire::parse(bytes.data(), bytes.size(), &out));
  EXPECT_EQ(out.req, 42u);
  bytes.push_back(0);
  EXPECT_FALSE(simwire::parse(bytes.data(), bytes.size(), &out));
  m.status = 7;  // not a status an answer carries
  bytes = simwire::encode(m);
  EXPECT_FALSE(simwire::parse(bytes.data(), bytes.size(), &out));
  m.kind = simwire::Kind::kNotify;
  m.text = std::string(simwire::kMaxText + 1, 'x');
  bytes = simwire::encode(m);
  EXPECT_FALSE(simwire::parse(bytes.data(), bytes.size(), &out));
  m.kind = simwire::Kind::kTransfer;
  m.text.clear();
  m.descs = {simwire::Desc{~uint64_t{0} - 2, 16, 8}};  // wraps
  bytes = simwire::encode(m);
  EXPECT_FALSE(simwire::parse(bytes.data(), bytes.size(), &out));
}

// ---- across processes ----

// A child process serving an engine named `name` with `n` bytes (NPU memory when `npu`)
// filled with pattern(n, 11). It reports the address through a pipe, then serves until the
// parent closes the other pipe (or 30 s pass).
struct ServingChild {
  pid_t pid = 0;
  uintptr_t addr = 0;
  int done_fd = -1;

  ServingChild(const std::string& name, size_t n, bool npu, SimFault fault) {
    int ready[2], done[2];
    EXPECT_EQ(::pipe(ready), 0);
    EXPECT_EQ(::pipe(done), 0);
    pid = fork_child([&] {
      ::close(ready[0]);
      ::close(done[1]);
      auto e = make_sim_engine();
      if (e->Initialize(name, {}) != kHixlSuccess) return 2;
      auto src = pattern(n, 11);
      void* mem = npu ? sim_npu_memory().alloc(0, n) : new uint8_t[n];
      if (npu) sim_npu_memory().copy_to_device(mem, src.data(), n); else std::memcpy(mem, src.data(), n);
      MemHandle h = nullptr;
      if (e->RegisterMem(MemDesc{reinterpret_cast<uintptr_t>(mem), n}, npu ? MemType::kDevice : MemType::kHost, h) !=
          kHixlSuccess) {
        return 3;
      }
      set_sim_fault(*e, fault);
      const uint64_t a = reinterpret_cast<uint64_t>(mem);
      if (::write(ready[1], &a, sizeof(a)) != sizeof(a)) return 4;
      pollfd pfd{done[0], POLLIN, 0};
      ::poll(&pfd, 1, 30000);
      return 0;
    });
    ::close(ready[1]);
    ::close(done[0]);
    done_fd = done[1];
    pollfd pfd{ready[0], POLLIN, 0};
    uint64_t a = 0;
    if (::poll(&pfd, 1, 10000) == 1 && ::read(ready[0], &a, sizeof(a)) == sizeof(a)) addr = a;
    ::close(ready[0]);
    EXPECT_NE(addr, 0u) << "the serving child did not start";
  }
  int finish() {
    ::close(done_fd);
    return reap(pid);
  }
};

TEST(SimHixlCrossProcess, ReadAndWriteAnotherProcessesNpuMemory) {
  const std::string name = next_name();
  const size_t n = 64 * 1024 + 3;
  ServingChild child(name, n, /*npu=*/true, SimFault{});  // forked before this process has threads
  ASSERT_NE(child.addr, 0u);
  auto a = engine("127.0.0.1");
  NpuMemory& npu = sim_npu_memory();
  void* mine = npu.alloc(1, n);
  reg(*a, mine, n, MemType::kDevice);
  ASSERT_EQ(a->Connect(name, kTimeoutMs), kHixlSuccess);
  const auto remote = reinterpret_cast<void*>(child.addr);
  ASSERT_EQ(a->TransferSync(name, TransferOp::kRead, {desc(mine, remote, n)}, kTimeoutMs), kHixlSuccess);
  std::vector<uint8_t> back(n);
  npu.copy_to_host(back.data(), mine, n);
  EXPECT_EQ(back, pattern(n, 11));
  // WRITE new bytes there, READ them back into host memory.
  auto fresh = pattern(n, 99);
  npu.copy_to_device(mine, fresh.data(), n);
  ASSERT_EQ(a->TransferSync(name, TransferOp::kWrite, {desc(mine, remote, n)}, kTimeoutMs), kHixlSuccess);
  std::vector<uint8_t> host(n);
  reg(*a, host.data(), n);
  TransferReq req = nullptr;
  ASSERT_EQ(a->TransferAsync(name, TransferOp::kRead, {desc(host.data(), remote, n)}, req), kHixlSuccess);
  EXPECT_EQ(wait_final(*a, req), TransferStatus::kCompleted);
  EXPECT_EQ(host, fresh);
  a.reset();
  npu.free(mine);
  const int status = child.finish();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(SimHixlCrossProcess, PeerDeathFailsRequestsInFlight) {
  const std::string name = next_name();
  ServingChild child(name, 4096, /*npu=*/false, SimFault{.hang = true});
  ASSERT_NE(child.addr, 0u);
  auto a = engine("127.0.0.1");
  std::vector<uint8_t> buf(4096);
  reg(*a, buf.data(), buf.size());
  ASSERT_EQ(a->Connect(name, kTimeoutMs), kHixlSuccess);
  const auto remote = reinterpret_cast<void*>(child.addr);
  TransferReq req = nullptr;
  ASSERT_EQ(a->TransferAsync(name, TransferOp::kRead, {desc(buf.data(), remote, 64)}, req), kHixlSuccess);
  TransferStatus s = TransferStatus::kCompleted;
  ASSERT_EQ(a->GetTransferStatus(req, s), kHixlSuccess);
  EXPECT_EQ(s, TransferStatus::kWaiting);
  ::kill(child.pid, SIGKILL);
  EXPECT_EQ(wait_final(*a, req), TransferStatus::kFailed);
  EXPECT_EQ(a->TransferSync(name, TransferOp::kRead, {desc(buf.data(), remote, 64)}, kTimeoutMs), kHixlFailed);
  EXPECT_EQ(a->SendNotify(name, NotifyDesc{"", "x"}, kTimeoutMs), kHixlNotifyFailed);
  EXPECT_EQ(a->Connect(name, kTimeoutMs), kHixlAlreadyConnected);  // the link stays until Disconnect
  ASSERT_EQ(a->Disconnect(name, kTimeoutMs), kHixlSuccess);
  child.finish();  // reaped: its listening socket is surely closed too
  EXPECT_EQ(a->Connect(name, 50), kHixlTimeout);  // nobody serves the name now
}

TEST(SimHixlCrossProcess, DieAfterServesThenExits) {
  const std::string name = next_name();
  ServingChild child(name, 4096, /*npu=*/false, SimFault{.die_after = 1});
  ASSERT_NE(child.addr, 0u);
  auto a = engine("127.0.0.1");
  std::vector<uint8_t> buf(4096);
  reg(*a, buf.data(), buf.size());
  ASSERT_EQ(a->Connect(name, kTimeoutMs), kHixlSuccess);
  const auto remote = reinterpret_cast<void*>(child.addr);
  EXPECT_EQ(a->TransferSync(name, TransferOp::kRead, {desc(buf.data(), remote, 64)}, kTimeoutMs), kHixlSuccess);
  EXPECT_EQ(0, std::memcmp(buf.data(), pattern(64, 11).data(), 64));
  EXPECT_EQ(a->TransferSync(name, TransferOp::kRead, {desc(buf.data(), remote, 64)}, kTimeoutMs), kHixlFailed);
  const int status = child.finish();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
}

}  // namespace
}  // namespace dlslime::ascend
