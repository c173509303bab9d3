// NVLinkEndpoint (include/dlslime/nvlink_endpoint.h, docs/nvlink.md) on the simulated GPU:
// two processes (this binary re-run as the peer, `--nvlink-peer <region name>`), byte-exact
// reads and writes with offsets on both sides, batches, errors that fail only their op,
// shutdown with ops pending, a killed peer and a fresh one connected after it, and the error
// without a GPU. Its own main(): it sets
// DLSLIME_GPU_SIM=1 for every test but the one that checks the error without it.
#include <signal.h>
#include <spawn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/memory_registry.h"
#include "core/transport_registry.h"
#include "dlslime/errors.h"
#include "dlslime/nvlink_endpoint.h"
#include "dlslime/tcp_endpoint.h"
#include "gpu/device_runtime.h"
#include "gpu/sim_cudart.h"
#include "../test_support.h"

extern char** environ;

namespace dlslime {
namespace {

using namespace std::chrono_literals;

constexpr size_t kAlloc = 1 << 20;
constexpr uint64_t kRegionOffset = 4096;  // regions start inside their allocation
constexpr uint64_t kRegion = 256 * 1024;

uint8_t pattern(size_t i, uint8_t seed) { return static_cast<uint8_t>((i * 131 + seed) ^ (i >> 9)); }
std::vector<uint8_t> patterned(size_t n, uint8_t seed, size_t from = 0) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = pattern(from + i, seed);
  return v;
}

// Device memory filled with a pattern, read back through copies (the host cannot touch it).
struct DeviceBuffer {
  gpu::Runtime& rt = gpu::runtime();
  void* ptr = nullptr;
  size_t size = 0;
  DeviceBuffer(size_t n, uint8_t seed, gpu::sim::AllocationKind kind = gpu::sim::AllocationKind::kCudaMalloc) : size(n) {
    ptr = gpu::sim::device_alloc(0, n, kind);
    auto bytes = patterned(n, seed);
    copy(ptr, bytes.data(), n);
  }
  ~DeviceBuffer() {
    if (ptr) rt.device_free(ptr);
  }
  uintptr_t addr() const { return reinterpret_cast<uintptr_t>(ptr); }
  std::vector<uint8_t> read(size_t offset, size_t n) {
    std::vector<uint8_t> out(n);
    copy(out.data(), static_cast<uint8_t*>(ptr) + offset, n);
    return out;
  }
  void copy(void* dst, const void* src, size_t n) {
    gpu::Event e = rt.event_create(0);
    rt.memcpy_async(dst, src, n, nullptr);
    rt.event_record(e, nullptr);
    rt.event_synchronize(e);
    rt.event_destroy(e);
  }
};

// The peer: registers `name` (seed 1) at kRegionOffset of its allocation, prints its
// endpoint_info as one line, connects to the line it reads, then answers commands:
// "dump <offset> <n>" (the hex of its region's bytes), "free" (unregisters and frees the
// region's memory), "exit".
int peer_main(const std::string& name) {
  setenv("DLSLIME_GPU_SIM", "1", 1);
  DeviceBuffer buf(kAlloc, 1);
  NVLinkEndpoint ep;
  ep.register_memory_region(name, buf.addr(), kRegionOffset, kRegion);
  std::cout << ep.endpoint_info().dump() << std::endl;
  std::string line;
  if (!std::getline(std::cin, line)) return 2;
  ep.connect(nlohmann::json::parse(line));
  while (std::getline(std::cin, line)) {
    if (line.rfind("dump ", 0) == 0) {
      size_t off = 0, n = 0;
      std::sscanf(line.c_str() + 5, "%zu %zu", &off, &n);
      std::string hex;
      for (uint8_t b : buf.read(kRegionOffset + off, n)) hex += fmt::format("{:02x}", b);
      std::cout << hex << std::endl;
    } else if (line == "free") {
      ep.unregister_memory_region(name);
      buf.rt.device_free(buf.ptr);
      buf.ptr = nullptr;
      std::cout << "freed" << std::endl;
    } else if (line == "exit") {
      break;
    }
  }
  ep.shutdown();
  return 0;
}

// The other process, over its stdin/stdout.
class Peer {
 public:
  explicit Peer(const std::string& region = "weights") {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    const std::string exe = "/proc/self/exe";
    char* argv[] = {const_cast<char*>(exe.c_str()), const_cast<char*>("--nvlink-peer"),
                    const_cast<char*>(region.c_str()), nullptr};
    if (posix_spawn(&pid_, exe.c_str(), &fa, nullptr, argv, environ) != 0) throw std::runtime_error("spawn");
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
  }
  ~Peer() {
    if (pid_ > 0) {
      say("exit");
      fclose(to_);
      wait_exit();
    } else {
      fclose(to_);
    }
    fclose(from_);
  }
  void say(const std::string& line) {
    std::fprintf(to_, "%s\n", line.c_str());
    std::fflush(to_);
  }
  std::string hear() {
    char* buf = nullptr;
    size_t cap = 0;
    const ssize_t n = getline(&buf, &cap, from_);
    std::string out = n > 0 ? std::string(buf, static_cast<size_t>(n) - 1) : std::string();
    std::free(buf);
    return out;
  }
  std::vector<uint8_t> dump(size_t offset, size_t n) {
    say(fmt::format("dump {} {}", offset, n));
    const std::string hex = hear();
    std::vector<uint8_t> out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<uint8_t>(std::stoul(hex.substr(i, 2), nullptr, 16)));
    return out;
  }
  // SIGKILL, and waits until it is gone (the kernel's word, not a sleep).
  void kill_now() {
    ::kill(pid_, SIGKILL);
    wait_exit();
  }
  int wait_exit() {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

// This process's endpoint with a device buffer (seed 9) registered as "local" at
// kRegionOffset, connected to a peer process.
class NvlinkTwoProcesses : public ::testing::Test {
 protected:
  void SetUp() override {
    peer_info_ = nlohmann::json::parse(peer_.hear());
    local_ = ep_.register_memory_region("local", buf_.addr(), kRegionOffset, kRegion);
    peer_.say(ep_.endpoint_info().dump());
    ep_.connect(peer_info_);
    remote_ = *ep_.remote_handle("weights");
  }
  Peer peer_;
  nlohmann::json peer_info_;
  DeviceBuffer buf_{kAlloc, 9};
  NVLinkEndpoint ep_;
  int32_t local_ = -1, remote_ = -1;
};

TEST_F(NvlinkTwoProcesses, ThePublishedRegionCarriesItsAllocationsHandleAndOffset) {
  const auto& mr = peer_info_["mr_info"]["weights"];
  EXPECT_EQ(mr["alloc_offset"], kRegionOffset);
  EXPECT_EQ(mr["length"], kRegion);
  EXPECT_EQ(mr["alloc_size"], kAlloc);
  EXPECT_EQ(mr["ipc_handle"].get<std::string>().size(), 2 * gpu::IpcHandle::kSize);
  EXPECT_TRUE(ep_.is_connected());
  EXPECT_EQ(ep_.capabilities().transport, std::string("nvlink"));
}

TEST_F(NvlinkTwoProcesses, ReadsAndWritesAreByteExactWithOffsetsOnBothSides) {
  // read: remote[target_offset:+n] -> local[source_offset:+n]
  Future r = ep_.read({{local_, remote_, 1000, 8, 5000}});
  ASSERT_TRUE(r.wait_for(10s));
  ASSERT_TRUE(r.result().is_ok()) << r.result().message();
  EXPECT_EQ(r.nbytes(), 5000u);
  EXPECT_EQ(buf_.read(kRegionOffset + 8, 5000), patterned(5000, 1, kRegionOffset + 1000));
  EXPECT_EQ(buf_.read(kRegionOffset, 8), patterned(8, 9, kRegionOffset));  // untouched around it
  EXPECT_EQ(buf_.read(kRegionOffset + 5008, 8), patterned(8, 9, kRegionOffset + 5008));
  // write: local[source_offset:+n] -> remote[target_offset:+n]
  Future w = ep_.write({{local_, remote_, 777, 3, 3000}});
  ASSERT_TRUE(w.wait_for(10s));
  ASSERT_TRUE(w.result().is_ok()) << w.result().message();
  EXPECT_EQ(peer_.dump(777, 3000), buf_.read(kRegionOffset + 3, 3000));
  EXPECT_EQ(peer_.dump(770, 7), patterned(7, 1, kRegionOffset + 770));
}

TEST_F(NvlinkTwoProcesses, ABatchMovesEveryItem) {
  std::vector<Assignment> batch;
  for (uint64_t i = 0; i < 16; ++i) batch.push_back({local_, remote_, i * 4096 + 1, i * 8192 + 5, 4000});
  Future w = ep_.write(batch);
  ASSERT_TRUE(w.wait_for(10s));
  ASSERT_TRUE(w.result().is_ok()) << w.result().message();
  EXPECT_EQ(w.nbytes(), 16u * 4000);
  for (uint64_t i = 0; i < 16; ++i) {
    EXPECT_EQ(peer_.dump(i * 4096 + 1, 4000), buf_.read(kRegionOffset + i * 8192 + 5, 4000)) << i;
  }
  // The whole region in one item, and its last byte.
  Future r = ep_.read({{local_, remote_, 0, 0, kRegion}, {local_, remote_, kRegion - 1, 0, 1}});
  ASSERT_TRUE(r.wait_for(10s));
  ASSERT_TRUE(r.result().is_ok()) << r.result().message();
}

TEST_F(NvlinkTwoProcesses, OutOfRangeAndUnknownHandlesFailOnlyTheirOp) {
  Future past = ep_.read({{local_, remote_, kRegion - 10, 0, 11}});  // past the owner's published length
  ASSERT_TRUE(past.wait_for(10s));
  EXPECT_EQ(past.result().code(), StatusCode::kOutOfBounds) << past.result().message();
  Future past_local = ep_.write({{local_, remote_, 0, kRegion, 1}});
  ASSERT_TRUE(past_local.wait_for(10s));
  EXPECT_EQ(past_local.result().code(), StatusCode::kOutOfBounds);
  Future unknown = ep_.write({{local_, remote_ + 100, 0, 0, 8}});
  ASSERT_TRUE(unknown.wait_for(10s));
  EXPECT_EQ(unknown.result().code(), StatusCode::kUnknownHandle);
  Future unknown_local = ep_.write({{local_ + 100, remote_, 0, 0, 8}});
  ASSERT_TRUE(unknown_local.wait_for(10s));
  EXPECT_EQ(unknown_local.result().code(), StatusCode::kUnknownHandle);
  // A bad item fails its whole op before anything of it is queued.
  Future mixed = ep_.write({{local_, remote_, 0, 0, 64}, {local_, remote_, kRegion, 0, 1}});
  ASSERT_TRUE(mixed.wait_for(10s));
  EXPECT_EQ(mixed.result().code(), StatusCode::kOutOfBounds);
  EXPECT_EQ(peer_.dump(0, 64), patterned(64, 1, kRegionOffset));
  // The endpoint is still connected and moves bytes.
  Future ok = ep_.write({{local_, remote_, 0, 0, 64}});
  ASSERT_TRUE(ok.wait_for(10s));
  EXPECT_TRUE(ok.result().is_ok());
  EXPECT_EQ(peer_.dump(0, 64), buf_.read(kRegionOffset, 64));
  EXPECT_THROW(ep_.send(Chunk{buf_.addr(), 0, 8}), NotImplementedError);
  EXPECT_THROW(ep_.imm_recv(), NotImplementedError);
  EXPECT_THROW(ep_.write_with_imm({{local_, remote_, 0, 0, 8}}, 1), NotImplementedError);
}

TEST_F(NvlinkTwoProcesses, AHandleThatCannotBeOpenedOrALengthPastTheAllocationFailsAlone) {
  nlohmann::json bogus = peer_info_["mr_info"]["weights"];
  bogus["ipc_handle"] = gpu::IpcHandle{}.to_hex();
  EXPECT_THROW(ep_.register_remote_memory_region("bogus", bogus), InvalidArgumentError);
  nlohmann::json too_long = peer_info_["mr_info"]["weights"];
  too_long["length"] = kAlloc;  // from alloc_offset kRegionOffset: past the end of the allocation
  EXPECT_THROW(ep_.register_remote_memory_region("too_long", too_long), InvalidArgumentError);
  // Through connect (a peer's info), they are kept, and only their ops fail.
  NVLinkEndpoint other;
  other.register_memory_region("local", buf_.addr(), 0, kRegion);
  nlohmann::json info = peer_info_;
  info["mr_info"]["bogus"] = bogus;
  info["mr_info"]["too_long"] = too_long;
  other.connect(info);
  const int32_t local = *other.local_handle("local");
  for (const char* name : {"bogus", "too_long"}) {
    Future f = other.read({{local, *other.remote_handle(name), 0, 0, 8}});
    ASSERT_TRUE(f.wait_for(10s));
    EXPECT_EQ(f.result().code(), StatusCode::kUnknownHandle) << name;
    EXPECT_NE(f.result().message().find("could not be opened"), std::string::npos) << f.result().message();
  }
  Future good = other.read({{local, *other.remote_handle("weights"), 0, 0, 8}});
  ASSERT_TRUE(good.wait_for(10s));
  EXPECT_TRUE(good.result().is_ok()) << good.result().message();
}

TEST_F(NvlinkTwoProcesses, ShutdownWithOpsPendingCompletesThemCancelledOnceTheirCopiesRan) {
  gpu::sim::hold_streams(true);  // the copies stay queued
  Future pending = ep_.write({{local_, remote_, 0, 0, 4096}});
  Future pending_read = ep_.read({{local_, remote_, 0, 0, 4096}});
  ep_.shutdown();
  EXPECT_FALSE(pending.done());  // a queued GPU copy cannot be taken back
  Future after = ep_.write({{local_, remote_, 0, 0, 8}});
  ASSERT_TRUE(after.done());
  EXPECT_EQ(after.result().code(), StatusCode::kCancelled);
  EXPECT_FALSE(ep_.is_connected());
  gpu::sim::hold_streams(false);
  ASSERT_TRUE(pending.wait_for(10s));
  ASSERT_TRUE(pending_read.wait_for(10s));
  EXPECT_EQ(pending.result().code(), StatusCode::kCancelled);
  EXPECT_EQ(pending_read.result().code(), StatusCode::kCancelled);
  ep_.shutdown();  // idempotent
}

TEST_F(NvlinkTwoProcesses, AKilledPeerFailsNewOpsWithoutACrash) {
  Future before = ep_.read({{local_, remote_, 0, 0, 4096}});
  ASSERT_TRUE(before.wait_for(10s));
  ASSERT_TRUE(before.result().is_ok());
  peer_.kill_now();
  EXPECT_FALSE(ep_.is_connected());
  Future after = ep_.read({{local_, remote_, 0, 0, 4096}});
  ASSERT_TRUE(after.wait_for(10s));
  EXPECT_EQ(after.result().code(), StatusCode::kPeerClosed) << after.result().message();
  ep_.shutdown();
}

TEST_F(NvlinkTwoProcesses, AfterThePeerDiedItConnectsToAFreshPeer) {
  Peer fresh("fresh");
  const nlohmann::json fresh_info = nlohmann::json::parse(fresh.hear());
  EXPECT_THROW(ep_.connect(fresh_info), ConnectionError);  // the first peer is alive
  EXPECT_TRUE(ep_.is_connected());
  // A copy queued on the dead peer's mapping: connect() does not wait for it, and it
  // completes as it would have once it has run.
  gpu::sim::hold_streams(true);
  struct Release {
    ~Release() { gpu::sim::hold_streams(false); }  // also if a check below throws
  } release;
  Future queued = ep_.write({{local_, remote_, 0, 0, 4096}});
  peer_.kill_now();
  EXPECT_FALSE(ep_.is_connected());
  fresh.say(ep_.endpoint_info().dump());
  ep_.connect(fresh_info);
  EXPECT_TRUE(ep_.is_connected());
  EXPECT_FALSE(queued.done());
  gpu::sim::hold_streams(false);
  ASSERT_TRUE(queued.wait_for(10s));
  EXPECT_TRUE(queued.result().is_ok()) << queued.result().message();
  // Bytes move to and from the fresh peer.
  const int32_t h = *ep_.remote_handle("fresh");
  EXPECT_NE(h, remote_);
  Future w = ep_.write({{local_, h, 10, 20, 5000}});
  ASSERT_TRUE(w.wait_for(10s));
  ASSERT_TRUE(w.result().is_ok()) << w.result().message();
  EXPECT_EQ(fresh.dump(10, 5000), buf_.read(kRegionOffset + 20, 5000));
  Future r = ep_.read({{local_, h, 6000, 0, 64}});  // beyond what the write changed
  ASSERT_TRUE(r.wait_for(10s));
  ASSERT_TRUE(r.result().is_ok()) << r.result().message();
  EXPECT_EQ(buf_.read(kRegionOffset, 64), patterned(64, 1, kRegionOffset + 6000));
  // The dead peer's handle is dropped.
  Future stale = ep_.write({{local_, remote_, 0, 0, 8}});
  ASSERT_TRUE(stale.wait_for(10s));
  EXPECT_EQ(stale.result().code(), StatusCode::kUnknownHandle) << stale.result().message();
  EXPECT_NE(stale.result().message().find("has exited"), std::string::npos) << stale.result().message();
}

TEST_F(NvlinkTwoProcesses, TheOwnerFreeingItsRegionCrashesNoOne) {
  peer_.say("free");
  ASSERT_EQ(peer_.hear(), "freed");
  // The mapping keeps the simulated allocation alive: the copy lands in memory nobody uses.
  Future f = ep_.write({{local_, remote_, 0, 0, 4096}});
  ASSERT_TRUE(f.wait_for(10s));
  EXPECT_TRUE(f.result().is_ok()) << f.result().message();
}

TEST_F(NvlinkTwoProcesses, OpsRunOnTheStreamTheyAreGiven) {
  gpu::Runtime& rt = gpu::runtime();
  gpu::Stream s = rt.stream_create(0);
  Future w = ep_.write_on({{local_, remote_, 100, 200, 1000}}, s);
  Future d = ep_.read_on({{local_, remote_, 0, 0, 16}}, nullptr);  // the default stream
  ASSERT_TRUE(w.wait_for(10s));
  ASSERT_TRUE(d.wait_for(10s));
  EXPECT_TRUE(w.result().is_ok()) << w.result().message();
  EXPECT_TRUE(d.result().is_ok()) << d.result().message();
  EXPECT_EQ(peer_.dump(100, 1000), buf_.read(kRegionOffset + 200, 1000));
  rt.stream_destroy(s);
}

TEST(Nvlink, OneProcessUsesItsOwnPointersInsteadOfIpcHandles) {
  DeviceBuffer a(kAlloc, 1), b(kAlloc, 2);
  NVLinkEndpoint x, y;
  const int32_t ha = x.register_memory_region("a", a.addr(), 16, 8192);
  y.register_memory_region("b", b.addr(), 32, 8192);
  x.connect(y.endpoint_info());
  y.connect(x.endpoint_info());
  const int32_t hb = *x.remote_handle("b");
  Future w = x.write({{ha, hb, 10, 20, 100}});
  ASSERT_TRUE(w.wait_for(10s));
  ASSERT_TRUE(w.result().is_ok()) << w.result().message();
  EXPECT_EQ(b.read(32 + 10, 100), patterned(100, 1, 16 + 20));
  Future r = x.read({{ha, hb, 0, 0, 8192}});
  ASSERT_TRUE(r.wait_for(10s));
  EXPECT_EQ(a.read(16, 8192), b.read(32, 8192));
}

// A device whose context faulted (a sticky CUDA error; here a stray copy past an
// allocation on the op's own stream, as a user's kernel would fault) fails the ops on it
// with that error and hangs none: the op queued behind the fault (its copies never run,
// nor its host function, as cudaLaunchHostFunc documents) completes through the completion
// thread's safety poll; an op submitted after the fault fails at once. Shutdown returns.
// In a process of its own: nothing clears the fault. Prints what broke and exits 1.
void ops_after_a_device_fault() {
  const auto require = test_support::require_in_child;
  // Leaked on purpose: freeing device memory in a faulted context fails.
  auto* a = new DeviceBuffer(kAlloc, 1);
  auto* b = new DeviceBuffer(kAlloc, 2);
  gpu::Runtime& rt = gpu::runtime();
  gpu::Stream s = rt.stream_create(0);
  void* stray = rt.device_alloc(0, 64);
  std::vector<uint8_t> stray_bytes(128);
  {
    NVLinkEndpoint x, y;
    const int32_t ha = x.register_memory_region("a", a->addr(), 0, 8192);
    y.register_memory_region("b", b->addr(), 0, 8192);
    x.connect(y.endpoint_info());
    y.connect(x.endpoint_info());
    const int32_t hb = *x.remote_handle("b");
    Future before = x.write({{ha, hb, 0, 0, 4096}});
    require(before.wait_for(10s) && before.result().is_ok(), "the write before the fault");

    gpu::sim::hold_streams(true);  // the fault and the op queue before either runs
    rt.memcpy_async(stray, stray_bytes.data(), stray_bytes.size(), s);
    Future queued = x.write_on({{ha, hb, 0, 0, 4096}}, s);
    gpu::sim::hold_streams(false);
    require(queued.wait_for(10s).has_value(), "the op queued behind the fault hung");
    require(!queued.result().is_ok() &&
                queued.result().message().find("cudaErrorIllegalAddress") != std::string::npos,
            "the queued op fails with the sticky error: " + queued.result().message());

    Future after = x.read({{ha, hb, 0, 0, 4096}});
    require(after.wait_for(10s).has_value(), "an op after the fault hung");
    require(!after.result().is_ok() && after.result().message().find("cudaErrorIllegalAddress") != std::string::npos,
            "an op after the fault fails with the sticky error: " + after.result().message());
    x.shutdown();
    y.shutdown();
  }
  std::_Exit(0);
}

TEST(NvlinkDeathTest, AFaultedDeviceFailsItsOpsWithTheCudaErrorAndNothingHangs) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: nothing clears the fault
  EXPECT_EXIT(ops_after_a_device_fault(), ::testing::ExitedWithCode(0), "");
}

TEST(Nvlink, ARecordNamingThisProcessNeverChoosesWhereCopiesLand) {
  // Issue 21, N1: a peer copies our public process token into its records, with an address
  // of its choosing (here: an allocation this process never registered, and host memory).
  DeviceBuffer mine(kAlloc, 1), secret(kAlloc, 2), theirs(kAlloc, 3);
  NVLinkEndpoint victim, peer;
  const int32_t local = victim.register_memory_region("local", mine.addr(), 0, kAlloc);
  peer.register_memory_region("theirs", theirs.addr(), 0, kAlloc);
  std::vector<uint8_t> host(4096, 0x11);
  const nlohmann::json victim_info = victim.endpoint_info();
  nlohmann::json forged = victim_info["mr_info"]["local"];  // our own record: process, domain, handle
  forged["addr"] = secret.addr();
  nlohmann::json to_host = forged;
  to_host["addr"] = reinterpret_cast<uintptr_t>(host.data());
  nlohmann::json too_long = forged;
  too_long["length"] = 2 * kAlloc;
  nlohmann::json no_such = forged;
  no_such["handle"] = local + 1000;

  // From a peer that is another process (its info says so), such records are refused.
  nlohmann::json other_process = peer.endpoint_info();
  other_process["process"] = "not-this-process";
  other_process["mr_info"]["forged"] = forged;
  victim.connect(other_process);
  const int32_t forged2 = victim.register_remote_memory_region("forged2", forged);  // kept, unusable
  for (int32_t remote : {*victim.remote_handle("forged"), forged2}) {
    for (bool write : {true, false}) {
      Future f = write ? victim.write({{local, remote, 0, 0, 4096}}) : victim.read({{local, remote, 0, 0, 4096}});
      ASSERT_TRUE(f.wait_for(10s));
      EXPECT_EQ(f.result().code(), StatusCode::kUnknownHandle) << f.result().message();
      EXPECT_NE(f.result().message().find("names this process"), std::string::npos) << f.result().message();
    }
  }
  EXPECT_EQ(mine.read(0, 4096), patterned(4096, 1, 0)) << "a read through the forged record was copied";
  EXPECT_EQ(secret.read(0, 4096), patterned(4096, 2, 0)) << "the forged record's address was written";

  // From a peer in this process, a record resolves only by handle in the exporting
  // endpoint's registry: its address is ignored, its length may not exceed the region's.
  NVLinkEndpoint victim2;
  const int32_t local2 = victim2.register_memory_region("local", theirs.addr(), 0, kAlloc);
  nlohmann::json same = victim_info;
  same["mr_info"] = {{"forged", forged}, {"to_host", to_host}, {"too_long", too_long}, {"no_such", no_such}};
  victim2.connect(same);
  for (const char* name : {"too_long", "no_such"}) {
    Future bad = victim2.write({{local2, *victim2.remote_handle(name), 0, 0, 8}});
    ASSERT_TRUE(bad.wait_for(10s));
    EXPECT_EQ(bad.result().code(), StatusCode::kUnknownHandle) << name << ": " << bad.result().message();
  }
  for (const char* name : {"forged", "to_host"}) {
    Future w = victim2.write({{local2, *victim2.remote_handle(name), 100, 0, 4096}});
    ASSERT_TRUE(w.wait_for(10s));
    ASSERT_TRUE(w.result().is_ok()) << name << ": " << w.result().message();
  }
  EXPECT_EQ(mine.read(100, 4096), patterned(4096, 3, 0)) << "the write did not land in the registered region";
  EXPECT_EQ(secret.read(0, 4096), patterned(4096, 2, 0));
  EXPECT_TRUE(std::all_of(host.begin(), host.end(), [](uint8_t b) { return b == 0x11; }));
  Future past = victim2.write({{local2, *victim2.remote_handle("forged"), kAlloc - 8, 0, 16}});
  ASSERT_TRUE(past.wait_for(10s));
  EXPECT_EQ(past.result().code(), StatusCode::kOutOfBounds) << past.result().message();
  // Unregistered by its owner: the next op fails, nothing lands.
  victim.unregister_memory_region("local");
  Future gone = victim2.write({{local2, *victim2.remote_handle("forged"), 0, 0, 8}});
  ASSERT_TRUE(gone.wait_for(10s));
  EXPECT_EQ(gone.result().code(), StatusCode::kUnknownHandle) << gone.result().message();
}

TEST(Nvlink, HostMemoryIsRefusedClearly) {
  NVLinkEndpoint ep;
  std::vector<uint8_t> host(4096);
  try {
    ep.register_memory_region("host", reinterpret_cast<uintptr_t>(host.data()), 0, host.size());
    FAIL() << "host memory was registered";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("GPU memory only"), std::string::npos) << e.what();
  }
  DeviceBuffer dev(4096, 1);
  EXPECT_THROW(ep.register_memory_region("long", dev.addr(), 0, 8192), InvalidArgumentError);  // past its allocation
  EXPECT_THROW(NVLinkEndpoint(NvlinkOptions::from_json({{"device", 7}})), InvalidArgumentError);
  EXPECT_THROW(NvlinkOptions::from_json({{"bogus", 1}}), InvalidArgumentError);
  EXPECT_THROW(ep.connect({{"transport", "tcp"}}), ConnectionError);
  nlohmann::json other_host = ep.endpoint_info();
  other_host["host"] = "another-boot-id";
  EXPECT_THROW(ep.connect(other_host), ConnectionError);
  for (const int64_t pid : {int64_t{-5}, int64_t{0}, int64_t{1} << 40}) {  // not a process id (hostile review N12)
    nlohmann::json bad_pid = ep.endpoint_info();
    bad_pid["pid"] = pid;
    try {
      ep.connect(bad_pid);
      ADD_FAILURE() << "connected to pid " << pid;
    } catch (const ConnectionError& e) {
      EXPECT_NE(std::string(e.what()).find("is not a process id"), std::string::npos) << e.what();
    }
  }
  Future f = ep.read({{0, 0, 0, 0, 8}});
  ASSERT_TRUE(f.done());
  EXPECT_EQ(f.result().code(), StatusCode::kNotConnected);
}

// Review F10: memory CUDA IPC cannot share (VMM memory, as PyTorch's expandable_segments
// allocates) is not NVLink's to export. A registry shared with other transports (a
// PeerAgent's) still registers it for them; NVLink's ops on it fail alone, saying why.
TEST(Nvlink, MemoryWithoutAnIpcHandleFailsOnlyNvlinkAndStillRegistersForTcp) {
  const size_t n = 64 * 1024;
  DeviceBuffer vmm(n, 1, gpu::sim::AllocationKind::kVmm);
  auto shared = std::make_shared<MemoryRegistry>();
  const TransportRegistry& transports = TransportRegistry::instance();
  std::shared_ptr<Endpoint> nv_ep = transports.make("nvlink", nlohmann::json::object(), shared);
  std::shared_ptr<Endpoint> tcp_ep = transports.make("tcp", {{"ip", "127.0.0.1"}}, shared);
  auto& nv = dynamic_cast<NVLinkEndpoint&>(*nv_ep);
  auto& tcp = dynamic_cast<TcpEndpoint&>(*tcp_ep);
  const int32_t h = shared->add("kv", vmm.addr(), 0, n);
  const nlohmann::json entry = nv.mr_info()["kv"];
  EXPECT_FALSE(entry.contains("ipc_handle")) << entry.dump();
  EXPECT_NE(entry.value("not_exported", "").find("VMM"), std::string::npos) << entry.dump();

  // TCP moves its bytes.
  TcpEndpoint peer{"127.0.0.1", 0, TcpOptions{}};
  std::vector<uint8_t> src = patterned(n, 9);
  const int32_t hs = peer.register_memory_region("src", reinterpret_cast<uintptr_t>(src.data()), 0, n);
  peer.connect(tcp.endpoint_info());
  tcp.connect(peer.endpoint_info());
  const int32_t remote_kv = peer.register_remote_memory_region("kv", tcp.endpoint_info()["mr_info"]["kv"]);
  Future w = peer.write({{hs, remote_kv, 0, 0, n}});
  ASSERT_TRUE(w.wait_for(30s));
  ASSERT_TRUE(w.result().is_ok()) << w.result().message();
  EXPECT_EQ(vmm.read(0, n), src);

  // NVLink: the peer's ops on it, and this side's ops from it, fail naming VMM memory.
  DeviceBuffer other(n, 2);
  NVLinkEndpoint y;
  const int32_t hy = y.register_memory_region("y", other.addr(), 0, n);
  nv.connect(y.endpoint_info());
  y.connect(nv.endpoint_info());
  Future to_kv = y.write({{hy, *y.remote_handle("kv"), 0, 0, 8}});
  Future from_kv = nv.write({{h, *nv.remote_handle("y"), 0, 0, 8}});
  for (auto [f, code] : {std::pair{&to_kv, StatusCode::kUnknownHandle}, std::pair{&from_kv, StatusCode::kInvalidArgument}}) {
    ASSERT_TRUE(f->wait_for(10s));
    EXPECT_EQ(f->result().code(), code) << f->result().message();
    EXPECT_NE(f->result().message().find("VMM memory"), std::string::npos) << f->result().message();
  }
  EXPECT_EQ(other.read(0, n), patterned(n, 2));
  EXPECT_EQ(vmm.read(0, n), src);

  // Registered on an NVLinkEndpoint itself, it is refused at once, and nothing stays.
  try {
    y.register_memory_region("vmm", vmm.addr(), 0, n);
    ADD_FAILURE() << "NVLinkEndpoint registered VMM memory";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("expandable_segments"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(y.mr_info().contains("vmm"));
  peer.shutdown();
  tcp_ep->shutdown();
  nv_ep->shutdown();
  shared->remove(h);
}

TEST(Nvlink, WithoutAGpuOrTheVariableItSaysSo) {
  unsetenv("DLSLIME_GPU_SIM");
  struct Restore {
    ~Restore() { setenv("DLSLIME_GPU_SIM", "1", 1); }
  } restore;
  if (gpu::unavailable_reason().empty()) {
    GTEST_SKIP() << "this host has a GPU";  // CI has none: this runs there
  }
  try {
    NVLinkEndpoint ep;
    FAIL() << "NVLinkEndpoint was made without a GPU";
  } catch (const gpu::GpuUnavailableError& e) {
    EXPECT_NE(std::string(e.what()).find("GPU"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("DLSLIME_GPU_SIM"), std::string::npos) << e.what();
  }
  const auto& registry = TransportRegistry::instance();
  bool listed = false;
  for (const TransportInfo& t : registry.list()) {
    if (t.name != "nvlink") continue;
    listed = true;
    EXPECT_TRUE(t.built);
    EXPECT_FALSE(t.available);
    EXPECT_NE(t.reason.find("DLSLIME_GPU_SIM"), std::string::npos) << t.reason;
  }
  EXPECT_TRUE(listed);
  EXPECT_THROW(registry.make("nvlink", nlohmann::json::object(), std::make_shared<MemoryRegistry>()),
               NotImplementedError);
}

TEST(Nvlink, TheRegistryMakesOneWithTheVariable) {
  const auto& registry = TransportRegistry::instance();
  auto ep = registry.make("nvlink", {{"op_timeout_ms", 500}}, std::make_shared<MemoryRegistry>());
  ASSERT_NE(dynamic_cast<NVLinkEndpoint*>(ep.get()), nullptr);
  EXPECT_EQ(dynamic_cast<NVLinkEndpoint*>(ep.get())->options().op_timeout, 500ms);
}

}  // namespace
}  // namespace dlslime

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--nvlink-peer") == 0) return dlslime::peer_main(argv[2]);
  setenv("DLSLIME_GPU_SIM", "1", 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
