// The device-runtime seam (src/gpu/device_runtime.h). What every runtime owes runs on the
// simulated GPU and on CUDA (which skips, naming the GPU, where there is none); the
// simulated runtime's own strictness (host access faults, bounds, handles) runs on it alone.
// Its own main(): the binary is also the other process of the IPC tests.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/device_runtime.h"
#include "gpu/sim_cudart.h"
#include "../test_support.h"

extern char** environ;

namespace dlslime::gpu {
namespace {

uint8_t pattern(size_t i, uint8_t seed) { return static_cast<uint8_t>((i * 131 + seed) ^ (i >> 9)); }

std::vector<uint8_t> patterned(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = pattern(i, seed);
  return v;
}

// One copy on `stream`, waited for through an event (the only way the host learns of it).
void copy_and_wait(Runtime& rt, void* dst, const void* src, size_t n, Stream stream) {
  Event done = rt.event_create(0);
  rt.memcpy_async(dst, src, n, stream);
  rt.event_record(done, stream);
  rt.event_synchronize(done);
  EXPECT_TRUE(rt.event_query(done));
  rt.event_destroy(done);
}

Runtime* runtime_named(const std::string& name) {
  if (name == "sim") return &sim_runtime();
  try {
    return &cuda_runtime();
  } catch (const GpuUnavailableError&) {
    return nullptr;
  }
}

// Runs this binary as the other process: `--gpu-ipc-peer <runtime> <mode> <hex> <size>`
// (`hex`: an IPC handle, or for mode "uuid" the UUID expected of device `size`).
int run_peer(const std::string& runtime, const std::string& mode, const std::string& hex, size_t size) {
  const std::string exe = "/proc/self/exe";
  const std::string size_arg = std::to_string(size);
  std::vector<char*> argv = {const_cast<char*>(exe.c_str()), const_cast<char*>("--gpu-ipc-peer"),
                             const_cast<char*>(runtime.c_str()), const_cast<char*>(mode.c_str()),
                             const_cast<char*>(hex.c_str()), const_cast<char*>(size_arg.c_str()), nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The peer's side: "rw" checks the owner's bytes (seed 1) and writes its own (seed 2) into
// the second half; "open" only opens (expecting it to fail: exit 3 with the reason); "uuid"
// checks that device `size` has UUID `hex` in this process too (exit 7 if not).
int peer_main(const std::string& runtime, const std::string& mode, const std::string& hex, size_t size) {
  Runtime* rt = runtime_named(runtime);
  if (!rt) return 10;
  if (mode == "uuid") return rt->device_uuid(static_cast<int>(size)) == hex ? 0 : 7;
  void* base = nullptr;
  try {
    base = rt->ipc_open(IpcHandle::from_hex(hex), 0);
  } catch (const GpuError& e) {
    std::fprintf(stderr, "peer: ipc_open failed: %s\n", e.what());
    return std::strstr(e.what(), "freed") ? 3 : 4;
  }
  if (mode != "rw") return 5;
  Stream s = rt->stream_create(0);
  std::vector<uint8_t> got(size);
  copy_and_wait(*rt, got.data(), base, size, s);
  if (got != patterned(size, 1)) return 6;
  std::vector<uint8_t> mine = patterned(size / 2, 2);
  copy_and_wait(*rt, static_cast<uint8_t*>(base) + size / 2, mine.data(), mine.size(), s);
  rt->stream_destroy(s);
  rt->ipc_close(base);
  return 0;
}

class DeviceRuntime : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    rt_ = runtime_named(GetParam());
    if (!rt_) GTEST_SKIP() << "no GPU on this host: " << unavailable_reason_of_cuda();
    stream_ = rt_->stream_create(0);
  }
  void TearDown() override {
    if (rt_) rt_->stream_destroy(stream_);
  }
  static std::string unavailable_reason_of_cuda() {
    try {
      cuda_runtime();
      return {};
    } catch (const GpuUnavailableError& e) {
      return e.what();
    }
  }
  Runtime* rt_ = nullptr;
  Stream stream_ = nullptr;
};

TEST_P(DeviceRuntime, PointerInfoTellsDeviceMemoryFromHostMemory) {
  void* dev = rt_->device_alloc(0, 10000);
  std::vector<uint8_t> heap(64);
  void* pinned = rt_->pinned_alloc(4096);
  EXPECT_EQ(rt_->pointer_info(dev).type, MemoryType::kDevice);
  EXPECT_EQ(rt_->pointer_info(dev).device, 0);
  EXPECT_EQ(rt_->pointer_info(static_cast<uint8_t*>(dev) + 9999).type, MemoryType::kDevice);
  EXPECT_EQ(rt_->pointer_info(heap.data()).type, MemoryType::kHost);
  EXPECT_EQ(rt_->pointer_info(pinned).type, MemoryType::kPinnedHost);
  // IPC handles name whole allocations: an interior address gives the allocation's base.
  AddressRange range = rt_->allocation_range(static_cast<uint8_t*>(dev) + 5000);
  EXPECT_EQ(range.base, reinterpret_cast<uintptr_t>(dev));
  EXPECT_GE(range.size, 10000u);
  EXPECT_THROW(rt_->allocation_range(heap.data()), InvalidArgumentError);
  rt_->pinned_free(pinned);
  rt_->device_free(dev);
}

TEST_P(DeviceRuntime, CopiesMoveBytesHostToDeviceDeviceToDeviceAndBack) {
  const size_t n = (1 << 20) + 13;  // not a page multiple
  void* a = rt_->device_alloc(0, n + 100);
  void* b = rt_->device_alloc(0, n + 100);
  std::vector<uint8_t> src = patterned(n, 7);
  std::vector<uint8_t> back(n, 0);
  copy_and_wait(*rt_, static_cast<uint8_t*>(a) + 11, src.data(), n, stream_);
  copy_and_wait(*rt_, static_cast<uint8_t*>(b) + 87, static_cast<uint8_t*>(a) + 11, n, stream_);
  copy_and_wait(*rt_, back.data(), static_cast<uint8_t*>(b) + 87, n, stream_);
  EXPECT_EQ(back, src);
  // Through pinned staging memory too.
  auto* pinned = static_cast<uint8_t*>(rt_->pinned_alloc(n));
  copy_and_wait(*rt_, pinned, static_cast<uint8_t*>(a) + 11, n, stream_);
  EXPECT_EQ(0, std::memcmp(pinned, src.data(), n));
  rt_->pinned_free(pinned);
  rt_->device_free(a);
  rt_->device_free(b);
}

TEST_P(DeviceRuntime, AStreamRunsItsWorkInOrderAndAnEventCompletesAfterIt) {
  const size_t n = 4 << 20;
  void* dev = rt_->device_alloc(0, n);
  std::vector<uint8_t> first = patterned(n, 1), second = patterned(4096, 2), back(n);
  Event done = rt_->event_create(0);
  EXPECT_TRUE(rt_->event_query(done));  // never recorded: complete, as in CUDA
  // Queued back to back with no wait between: the second overwrites the start of the first.
  rt_->memcpy_async(dev, first.data(), n, stream_);
  rt_->memcpy_async(dev, second.data(), second.size(), stream_);
  rt_->memcpy_async(back.data(), dev, n, stream_);
  rt_->event_record(done, stream_);
  rt_->event_synchronize(done);
  EXPECT_TRUE(rt_->event_query(done));
  std::vector<uint8_t> want = first;
  std::copy(second.begin(), second.end(), want.begin());
  EXPECT_EQ(back, want);
  rt_->event_destroy(done);
  rt_->device_free(dev);
}

TEST_P(DeviceRuntime, IpcHandlesShareAnAllocationWithAnotherProcessByteExact) {
  const size_t n = (256 << 10) + 4;
  void* dev = rt_->device_alloc(0, n);
  std::vector<uint8_t> mine = patterned(n, 1);
  copy_and_wait(*rt_, dev, mine.data(), n, stream_);
  // Taken at an interior address, the handle still names the whole allocation.
  IpcHandle handle = rt_->ipc_get_handle(static_cast<uint8_t*>(dev) + 4096);
  EXPECT_EQ(handle, rt_->ipc_get_handle(dev));
  ASSERT_EQ(run_peer(GetParam(), "rw", handle.to_hex(), n), 0);
  std::vector<uint8_t> back(n);
  copy_and_wait(*rt_, back.data(), dev, n, stream_);
  std::vector<uint8_t> want = mine;
  std::vector<uint8_t> theirs = patterned(n / 2, 2);
  std::copy(theirs.begin(), theirs.end(), want.begin() + n / 2);
  EXPECT_EQ(back, want);
  rt_->device_free(dev);
}

// Every device has a UUID (32 hex digits, the same in another process: what names it to a
// peer) and reaches itself; a device the runtime does not have is a bad argument.
TEST_P(DeviceRuntime, DevicesHaveStableHexUuidsAndReachThemselves) {
  const int count = rt_->device_count();
  ASSERT_GE(count, 1);
  std::vector<std::string> uuids;
  for (int d = 0; d < count; ++d) {
    const std::string uuid = rt_->device_uuid(d);
    EXPECT_EQ(uuid.size(), 32u) << uuid;
    EXPECT_EQ(uuid.find_first_not_of("0123456789abcdef"), std::string::npos) << uuid;
    EXPECT_EQ(rt_->device_uuid(d), uuid);
    EXPECT_TRUE(rt_->can_access_peer(d, d));
    for (const auto& other : uuids) EXPECT_NE(other, uuid) << "two devices with one UUID";
    uuids.push_back(uuid);
  }
  EXPECT_EQ(run_peer(GetParam(), "uuid", uuids[0], 0), 0) << "another process sees another UUID";
  for (int bad : {-1, count}) {
    EXPECT_THROW(rt_->device_uuid(bad), InvalidArgumentError);
    EXPECT_THROW(rt_->can_access_peer(bad, 0), InvalidArgumentError);
    EXPECT_THROW(rt_->can_access_peer(0, bad), InvalidArgumentError);
  }
}

INSTANTIATE_TEST_SUITE_P(Runtimes, DeviceRuntime, ::testing::Values("sim", "cuda"),
                         [](const auto& info) { return info.param; });

// --- The simulated runtime's own rules -------------------------------------------------

uintptr_t g_fault_lo = 0, g_fault_hi = 0;

void on_segv(int, siginfo_t* info, void*) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  _exit(addr >= g_fault_lo && addr < g_fault_hi ? 42 : 43);
}

// In the death-test child: touch device memory from host code; exit 42 if that faulted at
// the device address, 0 if it did not fault at all.
void touch_from_host(void* device_ptr, size_t n, bool write) {
  g_fault_lo = reinterpret_cast<uintptr_t>(device_ptr);
  g_fault_hi = g_fault_lo + n;
  struct sigaction sa {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
  volatile uint8_t* p = static_cast<volatile uint8_t*>(device_ptr) + n / 2;
  if (write) {
    *p = 1;
  } else {
    [[maybe_unused]] uint8_t v = *p;
  }
  _exit(0);
}

// The simulated GPUs all reach each other (one NVLink switch), both ways, unless
// DLSLIME_GPU_SIM_PEER_ACCESS says otherwise (on a GPU, topology decides per pair).
TEST(SimGpu, PeerAccessIsPerDevicePairAndSetByTheVariable) {
  Runtime& rt = sim_runtime();
  struct Restore {
    ~Restore() { unsetenv("DLSLIME_GPU_SIM_PEER_ACCESS"); }
  } restore;
  unsetenv("DLSLIME_GPU_SIM_PEER_ACCESS");
  EXPECT_TRUE(rt.can_access_peer(0, 1));
  EXPECT_TRUE(rt.can_access_peer(1, 0));
  setenv("DLSLIME_GPU_SIM_PEER_ACCESS", "none", 1);
  EXPECT_FALSE(rt.can_access_peer(0, 1));
  EXPECT_TRUE(rt.can_access_peer(1, 1));  // a device always reaches itself
  setenv("DLSLIME_GPU_SIM_PEER_ACCESS", "1-0", 1);
  EXPECT_TRUE(rt.can_access_peer(0, 1));
  setenv("DLSLIME_GPU_SIM_PEER_ACCESS", "0-7", 1);
  EXPECT_THROW(rt.can_access_peer(0, 1), InvalidArgumentError);
}

// Events and streams belong to a device; the null stream is the current device's default
// stream, and the current device is per thread (that of the adapter's last cudaSetDevice on
// the thread, which it calls before each stream, event or allocation it makes). A GPU refuses an
// event recorded on another device's stream (cudaErrorInvalidResourceHandle); the refusal
// is counted in the simulated GPU's errors, as is every other misuse.
TEST(SimGpu, AnEventIsRecordedOnlyOnAStreamOfItsDeviceAndMisuseIsCounted) {
  Runtime& rt = sim_runtime();
  const sim::ObjectCounts before = sim::object_counts();
  Stream s1 = rt.stream_create(1);
  Event e0 = rt.event_create(0);  // the thread's current device is now 0
  EXPECT_EQ(sim::object_counts().streams, before.streams + 1);
  EXPECT_EQ(sim::object_counts().events, before.events + 1);
  EXPECT_THROW(rt.event_record(e0, s1), InvalidArgumentError);
  rt.event_record(e0, nullptr);  // device 0's default stream
  rt.event_synchronize(e0);
  Event e1 = rt.event_create(1);
  rt.event_record(e1, s1);
  rt.event_record(e1, nullptr);  // the current device is 1 now: its default stream
  rt.event_synchronize(e1);
  std::thread other([&] { rt.event_destroy(rt.event_create(0)); });  // that thread's current device: 0
  other.join();
  rt.event_record(e1, nullptr);  // still 1 on this thread
  EXPECT_EQ(sim::object_counts().errors, before.errors + 1);
  void* dev = rt.device_alloc(0, 64);
  EXPECT_EQ(sim::object_counts().device_allocations, before.device_allocations + 1);
  EXPECT_THROW(rt.device_free(static_cast<uint8_t*>(dev) + 1), InvalidArgumentError);
  EXPECT_THROW(rt.event_destroy(reinterpret_cast<Event>(dev)), InvalidArgumentError);
  EXPECT_EQ(sim::object_counts().errors, before.errors + 3);
  rt.device_free(dev);
  rt.event_destroy(e0);
  rt.event_destroy(e1);
  rt.stream_destroy(s1);
  const sim::ObjectCounts after = sim::object_counts();
  EXPECT_EQ(after.device_allocations, before.device_allocations);
  EXPECT_EQ(after.streams, before.streams);
  EXPECT_EQ(after.events, before.events);
  EXPECT_EQ(after.errors, before.errors + 3);
}

TEST(SimGpu, HostLoadsAndStoresToDeviceMemoryFault) {
  Runtime& rt = sim_runtime();
  void* dev = rt.device_alloc(0, 3 * 4096 + 5);
  std::vector<uint8_t> data = patterned(3 * 4096 + 5, 3);
  copy_and_wait(rt, dev, data.data(), data.size(), nullptr);  // it holds data: still no host access
  EXPECT_EXIT(touch_from_host(dev, data.size(), false), ::testing::ExitedWithCode(42), "");
  EXPECT_EXIT(touch_from_host(dev, data.size(), true), ::testing::ExitedWithCode(42), "");
  rt.device_free(dev);
}

TEST(SimGpu, QueuedWorkHasNotHappenedUntilItsEventCompletes) {
  Runtime& rt = sim_runtime();
  Stream s = rt.stream_create(0);
  void* dev = rt.device_alloc(0, 4096);
  std::vector<uint8_t> src = patterned(4096, 9), back(4096, 0);
  Event done = rt.event_create(0);
  sim::hold_streams(true);
  rt.memcpy_async(dev, src.data(), src.size(), s);
  rt.memcpy_async(back.data(), dev, back.size(), s);
  rt.event_record(done, s);
  EXPECT_FALSE(rt.event_query(done));  // asynchronous: memcpy_async returned before copying
  EXPECT_EQ(back, std::vector<uint8_t>(4096, 0));
  sim::hold_streams(false);
  rt.event_synchronize(done);
  EXPECT_EQ(back, src);
  rt.event_destroy(done);
  rt.device_free(dev);
  rt.stream_destroy(s);
}

// launch_host_func: how NVLinkEndpoint's completion thread learns, without spinning, that
// the copies before it ran.
TEST(SimGpu, HostFunctionsRunOnlyAfterTheStreamsEarlierWork) {
  Runtime& rt = sim_runtime();
  Stream s = rt.stream_create(0);
  void* dev = rt.device_alloc(0, 4096);
  std::vector<uint8_t> src = patterned(4096, 6), back(4096);
  struct Seen {
    std::mutex mu;
    std::condition_variable cv;
    bool called = false;
    std::vector<uint8_t>* back = nullptr;
    std::vector<uint8_t> at_call;
  } seen;
  seen.back = &back;
  sim::hold_streams(true);
  rt.memcpy_async(dev, src.data(), src.size(), s);
  rt.memcpy_async(back.data(), dev, back.size(), s);
  rt.launch_host_func(
      s,
      [](void* arg) {
        auto* x = static_cast<Seen*>(arg);
        std::lock_guard lock(x->mu);
        x->at_call = *x->back;  // the copies before it have run
        x->called = true;
        x->cv.notify_all();
      },
      &seen);
  {
    std::lock_guard lock(seen.mu);
    EXPECT_FALSE(seen.called);  // queued behind the held copies
  }
  sim::hold_streams(false);
  {
    std::unique_lock lock(seen.mu);
    ASSERT_TRUE(seen.cv.wait_for(lock, std::chrono::seconds(10), [&] { return seen.called; }));
  }
  EXPECT_EQ(seen.at_call, src);
  EXPECT_THROW(rt.launch_host_func(s, nullptr, nullptr), InvalidArgumentError);
  rt.stream_destroy(s);
  rt.device_free(dev);
}

TEST(SimGpu, EventsOfOneStreamDoNotWaitForAnother) {
  Runtime& rt = sim_runtime();
  Stream a = rt.stream_create(0), b = rt.stream_create(1);
  void* dev = rt.device_alloc(1, 64);
  std::vector<uint8_t> src = patterned(64, 4), back(64);
  Event on_a = rt.event_create(0), on_b = rt.event_create(1);
  rt.event_record(on_a, a);
  rt.event_synchronize(on_a);
  rt.memcpy_async(dev, src.data(), src.size(), b);
  rt.memcpy_async(back.data(), dev, back.size(), b);
  rt.event_record(on_b, b);
  rt.event_record(on_a, a);  // recorded again: complete again only when a's work is
  rt.event_synchronize(on_b);
  rt.event_synchronize(on_a);
  EXPECT_EQ(back, src);
  EXPECT_EQ(rt.pointer_info(dev).device, 1);
  rt.event_destroy(on_a);
  rt.event_destroy(on_b);
  rt.device_free(dev);
  rt.stream_destroy(a);
  rt.stream_destroy(b);
}

// A copy is checked when it runs, as on a GPU: one past its allocation (either side), or
// a "host" range that runs into device memory, is queued without complaint and then faults
// its device's context with CUDA's sticky error. Through the adapter, the failure says so
// and that the process must restart; every later call on that device fails the same way.
// Nothing clears it, so each case runs in a process of its own.
void fault_then_check(int which) {
  const auto require = test_support::require_in_child;
  Runtime& rt = sim_runtime();
  void* dev = rt.device_alloc(0, 100);
  std::vector<uint8_t> host(200);
  Stream s = rt.stream_create(0);
  Event done = rt.event_create(0);
  auto* d = static_cast<uint8_t*>(dev);
  sim::hold_streams(true);  // queued before it runs: the fault is found at the event
  if (which == 0) rt.memcpy_async(dev, host.data(), 101, s);
  if (which == 1) rt.memcpy_async(host.data(), d + 50, 51, s);
  if (which == 2) rt.memcpy_async(host.data(), d - 8, 16, s);
  rt.event_record(done, s);
  sim::hold_streams(false);
  std::string message;
  try {
    rt.event_synchronize(done);
  } catch (const GpuError& e) {
    message = e.what();
  }
  require(message.find("cudaErrorIllegalAddress") != std::string::npos, "the fault surfaces at the event: " + message);
  require(message.find(which == 2 ? "ran from host into device memory" : "ran past the end of its device allocation") !=
              std::string::npos,
          "the detail names the copy: " + message);
  require(message.find("restart the process") != std::string::npos, "the adapter says it is sticky: " + message);
  bool refused = false;
  try {
    rt.device_alloc(0, 64);
  } catch (const GpuError& e) {
    refused = std::string(e.what()).find("cudaErrorIllegalAddress") != std::string::npos;
  }
  require(refused, "a later allocation on the faulted device fails with the sticky error");
  // Where memory lives cannot be told any more: asked, the runtime refuses rather than
  // calling device memory host memory (which host code would then touch).
  bool unknown = false;
  try {
    rt.pointer_info(dev);
  } catch (const GpuError& e) {
    unknown = std::string(e.what()).find("cudaErrorIllegalAddress") != std::string::npos;
  }
  require(unknown, "pointer_info in the faulted context fails with the sticky error");
  void* other = rt.device_alloc(1, 64);  // another device's context is fine
  rt.device_free(other);
  std::_Exit(0);
}

TEST(SimGpuDeathTest, ACopyPastItsAllocationFaultsTheDevicesContextWhenItRuns) {
  for (int which = 0; which < 3; ++which) {
    EXPECT_EXIT(fault_then_check(which), ::testing::ExitedWithCode(0), "") << "case " << which;
  }
}

TEST(SimGpu, BadDevicesAndFreesAreRefusedWhenCalled) {
  Runtime& rt = sim_runtime();
  void* dev = rt.device_alloc(0, 100);
  std::vector<uint8_t> host(200);
  EXPECT_THROW(rt.device_alloc(sim::kDeviceCount, 64), InvalidArgumentError);
  EXPECT_THROW(rt.stream_create(-1), InvalidArgumentError);
  EXPECT_THROW(rt.device_free(static_cast<uint8_t*>(dev) + 1), InvalidArgumentError);
  EXPECT_THROW(rt.device_free(host.data()), InvalidArgumentError);
  rt.device_free(dev);
  EXPECT_EQ(rt.pointer_info(dev).type, MemoryType::kHost);  // freed: no longer device memory
}

TEST(SimGpu, BadIpcHandlesFailClearly) {
  Runtime& rt = sim_runtime();
  void* dev = rt.device_alloc(0, 4096);
  IpcHandle handle = rt.ipc_get_handle(dev);
  // CUDA's rule: a process cannot open its own handle.
  EXPECT_THROW(rt.ipc_open(handle, 0), InvalidArgumentError);
  EXPECT_THROW(rt.ipc_open(IpcHandle{}, 0), InvalidArgumentError);
  EXPECT_THROW(IpcHandle::from_hex("zz"), InvalidArgumentError);
  EXPECT_THROW(IpcHandle::from_hex(std::string(128, 'g')), InvalidArgumentError);
  std::vector<uint8_t> host(16);
  EXPECT_THROW(rt.ipc_get_handle(host.data()), InvalidArgumentError);
  EXPECT_THROW(rt.ipc_close(dev), InvalidArgumentError);  // not opened from a handle
  rt.device_free(dev);
  // The allocation is gone: another process cannot open its handle (even if a new
  // allocation now has the same fd number).
  void* other = rt.device_alloc(0, 4096);
  EXPECT_EQ(run_peer("sim", "open", handle.to_hex(), 4096), 3);
  rt.device_free(other);
}

// Review F10: a dma-buf exports whole host pages of one allocation. The CUDA adapter widens
// a range with dmabuf_pages too, so these cases are the real path's.
TEST(DmabufPages, AreTheRangesHostPagesInsideItsAllocationOrAnErrorSayingWhy) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const AddressRange aligned{16 * page, 4 * page};
  PageRange r = dmabuf_pages(aligned, aligned.base + 100, 2 * page);  // widened at both ends
  EXPECT_EQ(r.start, aligned.base);
  EXPECT_EQ(r.size, 3 * page);
  r = dmabuf_pages(aligned, aligned.base + 3 * page, page);  // already whole pages: as it is
  EXPECT_EQ(r.start, aligned.base + 3 * page);
  EXPECT_EQ(r.size, page);
  auto gpu_error = [](const AddressRange& a, uintptr_t addr, size_t n) {
    try {
      dmabuf_pages(a, addr, n);
    } catch (const GpuUnavailableError&) {
      return std::string("GpuUnavailableError");
    } catch (const GpuError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // A small cudaMalloc allocation shares its page with its neighbours (packed at 512 bytes).
  const AddressRange small{16 * page + 512, 1024};
  std::string why = gpu_error(small, small.base, 1024);
  EXPECT_NE(why.find("whole host pages"), std::string::npos) << why;
  EXPECT_NE(why.find("not page-aligned"), std::string::npos) << why;
  // An aligned base with an unaligned end: the interior pages export, the last one does not.
  const AddressRange ragged{16 * page, 2 * page + 100};
  r = dmabuf_pages(ragged, ragged.base + 10, page - 10);
  EXPECT_EQ(r.start, ragged.base);
  EXPECT_EQ(r.size, page);
  EXPECT_NE(gpu_error(ragged, ragged.base + page, page + 1), "");
  // Arguments no export could take.
  EXPECT_THROW(dmabuf_pages(aligned, aligned.base, 0), InvalidArgumentError);
  EXPECT_THROW(dmabuf_pages(aligned, aligned.base + page, 3 * page + 1), InvalidArgumentError);
}

// As cuMemGetHandleForAddressRange: host-page-aligned ranges of one allocation only. The
// runtime's dmabuf_fd widens a caller's range to pages, and the buffer holds the bytes.
TEST(SimGpu, ADmabufExportNeedsHostPageAlignedRangesInsideOneAllocation) {
  Runtime& rt = sim_runtime();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* dev = rt.device_alloc(0, 3 * page);
  const auto base = reinterpret_cast<uintptr_t>(dev);
  const auto bytes = patterned(3 * page, 5);
  copy_and_wait(rt, dev, bytes.data(), bytes.size(), nullptr);
  for (auto [start, size] : {std::pair{base + 100, page}, std::pair{base, page + 1}, std::pair{base + page, size_t{0}}}) {
    try {
      ::close(sim::export_dmabuf(start, size));
      ADD_FAILURE() << "exported the unaligned range [" << start - base << ", +" << size << ")";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("aligned to the"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(sim::export_dmabuf(base, 4 * page), InvalidArgumentError);  // past the allocation
  const DmabufRange buf = rt.dmabuf_fd(static_cast<uint8_t*>(dev) + 100, page + 50);
  EXPECT_EQ(buf.offset, 100u);
  const sim::NicView view = sim::map_dmabuf(buf.fd, buf.offset, page + 50);
  ::close(buf.fd);
  EXPECT_EQ(std::vector<uint8_t>(view.data, view.data + page + 50),
            std::vector<uint8_t>(bytes.begin() + 100, bytes.begin() + 100 + page + 50));
  // A range further in: the buffer starts at the range's first page, as a real export's
  // does, and covers its pages only.
  const DmabufRange inner = rt.dmabuf_fd(static_cast<uint8_t*>(dev) + page + 100, 50);
  EXPECT_EQ(inner.offset, 100u);
  const sim::NicView inner_view = sim::map_dmabuf(inner.fd, inner.offset, 50);
  EXPECT_EQ(std::vector<uint8_t>(inner_view.data, inner_view.data + 50),
            std::vector<uint8_t>(bytes.begin() + page + 100, bytes.begin() + page + 150));
  EXPECT_NO_THROW(rt.check_dmabuf(inner.fd, inner.offset, 50, base + page + 100));
  EXPECT_THROW(rt.check_dmabuf(inner.fd, inner.offset, 50, base + 100), InvalidArgumentError);
  EXPECT_THROW(sim::map_dmabuf(inner.fd, 0, page + 1), InvalidArgumentError);  // past its one page
  ::close(inner.fd);
  rt.device_free(dev);
  // The last page of an allocation that does not fill it is not the allocation's to export.
  void* ragged = rt.device_alloc(0, page + 100);
  EXPECT_NO_THROW(::close(rt.dmabuf_fd(ragged, page).fd));
  EXPECT_THROW(rt.dmabuf_fd(static_cast<uint8_t*>(ragged) + page, 100), GpuError);
  rt.device_free(ragged);
}

// Review F10: cudaIpcGetMemHandle refuses what cudaMalloc did not allocate. Managed memory
// is no dma-buf either; VMM memory is.
TEST(SimGpu, ManagedAndVmmMemoryHaveNoIpcHandle) {
  Runtime& rt = sim_runtime();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (auto [kind, word] : {std::pair{sim::AllocationKind::kVmm, "VMM"}, std::pair{sim::AllocationKind::kManaged, "managed"}}) {
    void* p = sim::device_alloc(1, page, kind);
    EXPECT_EQ(rt.pointer_info(p).type, MemoryType::kDevice);
    EXPECT_EQ(rt.pointer_info(p).device, 1);
    try {
      rt.ipc_get_handle(p);
      ADD_FAILURE() << word << " memory has an IPC handle";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
    if (kind == sim::AllocationKind::kVmm) {
      EXPECT_NO_THROW(::close(rt.dmabuf_fd(p, page).fd));
    } else {
      EXPECT_THROW(rt.dmabuf_fd(p, page), GpuError);
    }
    rt.device_free(p);
  }
}

TEST(GpuRuntimeSelection, TheVariableSelectsTheSimulatedGpuAndNothingFallsBack) {
  // The variable is read on each call; the test leaves it as it found it.
  const char* was = std::getenv("DLSLIME_GPU_SIM");
  const std::string saved = was ? was : "";
  struct Restore {
    const char* was;
    std::string saved;
    ~Restore() { was ? setenv("DLSLIME_GPU_SIM", saved.c_str(), 1) : unsetenv("DLSLIME_GPU_SIM"); }
  } restore{was, saved};
  ASSERT_EQ(setenv("DLSLIME_GPU_SIM", "1", 1), 0);
  EXPECT_STREQ(runtime().name(), "sim");
  EXPECT_EQ(unavailable_reason(), "");
  ASSERT_EQ(unsetenv("DLSLIME_GPU_SIM"), 0);
  Runtime* cuda = runtime_named("cuda");
  if (cuda) {
    EXPECT_STREQ(runtime().name(), "cuda");
    return;
  }
  // No GPU and no variable: a clear error naming the GPU and the way to the simulated one.
  try {
    runtime();
    FAIL() << "runtime() returned without a GPU";
  } catch (const GpuUnavailableError& e) {
    EXPECT_NE(std::string(e.what()).find("GPU"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("DLSLIME_GPU_SIM=1"), std::string::npos) << e.what();
  }
  EXPECT_NE(unavailable_reason().find("GPU"), std::string::npos);
}

}  // namespace
}  // namespace dlslime::gpu

int main(int argc, char** argv) {
  if (argc == 6 && std::strcmp(argv[1], "--gpu-ipc-peer") == 0) {
    return dlslime::gpu::peer_main(argv[2], argv[3], argv[4], std::strtoull(argv[5], nullptr, 10));
  }
  ::testing::InitGoogleTest(&argc, argv);
  // The death tests run in a process with stream threads: re-exec rather than fork.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  return RUN_ALL_TESTS();
}
