// GPU memory over TCP (docs/tcp.md "GPU memory") on the strict simulated GPU: device
// regions on either side, staged through bounded pinned pools. Internal (links the object
// library) for the simulated runtime's allocator; transfers go through TcpEndpoint's public
// API. The simulated device memory is PROT_NONE to host code, so a host touch of it in the
// library kills the test. Run under ASan/TSan too: the staging has its own waiter thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <cstring>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/memory_registry.h"
#include "core/transport_registry.h"
#include "dlslime/dlslime.h"
#include "device_buffer.h"
#include "gpu/device_runtime.h"
#include "test_support.h"

using namespace dlslime;

namespace {

constexpr uint64_t kChunk = 64 * 1024;

TcpOptions small_chunks() {
  TcpOptions o;
  o.chunk_size = kChunk;
  return o;
}

using test_support::DeviceBuffer;

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed);
  return v;
}

class TcpGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("DLSLIME_GPU_SIM", "1", 1);  // read on each call of gpu::runtime()
    a_.connect(b_.endpoint_info());
    b_.connect(a_.endpoint_info());
  }
  TcpEndpoint a_{"127.0.0.1", 0, small_chunks()};
  TcpEndpoint b_{"127.0.0.1", 0, small_chunks()};
};

TEST_F(TcpGpu, DeviceToDeviceWriteAndReadAreByteExactAtOffsetsAndStagingIsBounded) {
  const size_t n = 3 * kChunk + 17, size = n + 16;
  DeviceBuffer src(size), dst(size);
  const auto fill_src = pattern(size, 1), fill_dst = pattern(size, 2);
  src.write(fill_src);
  dst.write(fill_dst);
  const int32_t ha = a_.register_memory_region("src", src.addr(), 0, size);
  b_.register_memory_region("dst", dst.addr(), 0, size);
  const int32_t hb = a_.register_remote_memory_region("dst", b_.endpoint_info()["mr_info"]["dst"]);
  ASSERT_TRUE(a_.capabilities().device_memory);

  // write: src[3, +n) -> dst[5, +n)
  Future w = a_.write({Assignment{ha, hb, 5, 3, n}});
  ASSERT_TRUE(w.wait_for(std::chrono::seconds(30)));
  ASSERT_EQ(w.status(), 0) << w.message();
  std::vector<uint8_t> want = fill_dst;
  std::memcpy(want.data() + 5, fill_src.data() + 3, n);
  EXPECT_EQ(dst.read(), want);

  // read: dst[0, +n) -> src[1, +n)
  Future r = a_.read({Assignment{ha, hb, 0, 1, n}});
  ASSERT_TRUE(r.wait_for(std::chrono::seconds(30)));
  ASSERT_EQ(r.status(), 0) << r.message();
  std::vector<uint8_t> want_src = fill_src;
  std::memcpy(want_src.data() + 1, want.data(), n);
  EXPECT_EQ(src.read(), want_src);

  for (TcpEndpoint* ep : {&a_, &b_}) {
    const auto stats = ep->listener_stats();
    const uint64_t slots = stats["gpu_staging_slots"];
    const uint64_t high = stats["gpu_staging_high_water_bytes"];
    EXPECT_GT(high, 0u);
    EXPECT_LE(high, 2 * slots * kChunk);
  }
}

TEST_F(TcpGpu, AWriteToAnUnknownRemoteHandleFailsAloneAndTheNextOneWorks) {
  const size_t n = 2 * kChunk;
  DeviceBuffer src(n), dst(n);
  src.write(pattern(n, 7));
  const int32_t ha = a_.register_memory_region("src", src.addr(), 0, n);
  b_.register_memory_region("dst", dst.addr(), 0, n);
  const int32_t hb = a_.register_remote_memory_region("dst", b_.endpoint_info()["mr_info"]["dst"]);
  const int32_t forged = a_.register_remote_memory_region("forged", {{"handle", 4242}, {"addr", 0}, {"length", n}});
  Future bad = a_.write({Assignment{ha, forged, 0, 0, n}});
  ASSERT_TRUE(bad.wait_for(std::chrono::seconds(30)));
  EXPECT_EQ(bad.status(), static_cast<int>(StatusCode::kUnknownHandle)) << bad.message();
  Future good = a_.write({Assignment{ha, hb, 0, 0, n}});
  ASSERT_TRUE(good.wait_for(std::chrono::seconds(30)));
  ASSERT_EQ(good.status(), 0) << good.message();
  EXPECT_EQ(dst.read(), pattern(n, 7));
}

// The registry, not the endpoint, asks where memory lives: regions a PeerAgent or a pool
// registers in a shared registry (before or after the endpoint exists) cross TCP through
// the staging too, never touched by host code.
TEST_F(TcpGpu, DeviceMemoryRegisteredInASharedRegistryIsStagedWhoeverRegisteredIt) {
  const size_t n = 2 * kChunk + 5;
  DeviceBuffer early(n), late(n), dst(2 * n);
  early.write(pattern(n, 3));
  late.write(pattern(n, 4));
  auto shared = std::make_shared<MemoryRegistry>();
  const int32_t he = shared->add("early", early.addr(), 0, n);  // before the endpoint
  // As a PeerAgent makes its endpoints: through the registry, over its memory registry.
  std::shared_ptr<Endpoint> ep = TransportRegistry::instance().make(
      "tcp", {{"ip", "127.0.0.1"}, {"chunk_size", kChunk}, {"gpu_staging_chunks", 2}}, shared);
  auto& c = dynamic_cast<TcpEndpoint&>(*ep);
  const int32_t hl = shared->add("late", late.addr(), 0, n);  // after
  EXPECT_EQ(shared->get(he)->kind, MemoryKind::kDevice);
  EXPECT_EQ(shared->get(hl)->device, 0);
  TcpEndpoint d{"127.0.0.1", 0, small_chunks()};
  c.connect(d.endpoint_info());
  d.connect(c.endpoint_info());
  d.register_memory_region("dst", dst.addr(), 0, 2 * n);
  const int32_t hb = c.register_remote_memory_region("dst", d.endpoint_info()["mr_info"]["dst"]);
  Future w = c.write({Assignment{he, hb, 0, 0, n}, Assignment{hl, hb, n, 0, n}});
  ASSERT_TRUE(w.wait_for(std::chrono::seconds(30)));
  ASSERT_EQ(w.status(), 0) << w.message();
  std::vector<uint8_t> want = pattern(n, 3), second = pattern(n, 4);
  want.insert(want.end(), second.begin(), second.end());
  EXPECT_EQ(dst.read(), want);
  const auto stats = c.listener_stats();
  EXPECT_EQ(stats["gpu_staging_slots"], 2u);  // TcpOptions::gpu_staging_chunks
  EXPECT_GT(static_cast<uint64_t>(stats["gpu_staging_high_water_bytes"]), 0u);
  EXPECT_LE(static_cast<uint64_t>(stats["gpu_staging_high_water_bytes"]), 2 * 2 * kChunk);
  ep->shutdown();
}

TEST_F(TcpGpu, SendAndRecvOfGpuMemoryAreByteExactAndKeepTheirOrderWithHostMessages) {
  // No region registered: message buffers are found to be GPU memory at the call.
  const size_t n = 3 * kChunk + 5;
  DeviceBuffer gsrc(n), gdst(n + 8);
  std::vector<uint8_t> hsrc = pattern(n, 7), hdst(n + 8, 0);
  gsrc.write(pattern(n, 3));
  gdst.write(std::vector<uint8_t>(n + 8, 0x5a));

  // GPU to GPU, the recv posted first (straight into device memory, at an offset).
  Future rv = b_.recv(Chunk{gdst.addr(), 8, n});
  Future sd = a_.send(Chunk{gsrc.addr(), 0, n});
  ASSERT_TRUE(sd.wait_for(std::chrono::seconds(30)) && rv.wait_for(std::chrono::seconds(30)));
  ASSERT_EQ(sd.status(), 0) << sd.message();
  ASSERT_EQ(rv.status(), 0) << rv.message();
  EXPECT_EQ(rv.nbytes(), n);
  std::vector<uint8_t> want(8, 0x5a);
  const auto src_bytes = pattern(n, 3);
  want.insert(want.end(), src_bytes.begin(), src_bytes.end());
  EXPECT_EQ(gdst.read(), want);

  // A burst: GPU, host, GPU, host; the host messages must not overtake the GPU ones
  // being staged. The first two are held by the receiver (no recv yet), then received
  // into GPU and host buffers.
  DeviceBuffer g2(kChunk + 1);
  g2.write(pattern(kChunk + 1, 9));
  std::vector<uint8_t> h2 = pattern(100, 11);
  std::vector<Future> sends = {a_.send(Chunk{gsrc.addr(), 0, n}),
                               a_.send(Chunk{reinterpret_cast<uintptr_t>(hsrc.data()), 0, n}),
                               a_.send(Chunk{g2.addr(), 0, kChunk + 1}),
                               a_.send(Chunk{reinterpret_cast<uintptr_t>(h2.data()), 0, 100})};
  for (Future& f : sends) {
    ASSERT_TRUE(f.wait_for(std::chrono::seconds(30)));
    ASSERT_EQ(f.status(), 0) << f.message();
  }
  DeviceBuffer r0(n), r1(n), r3(200);
  std::vector<uint8_t> r2(kChunk + 1);
  std::vector<Future> recvs = {b_.recv(Chunk{r0.addr(), 0, n}), b_.recv(Chunk{r1.addr(), 0, n}),
                               b_.recv(Chunk{reinterpret_cast<uintptr_t>(r2.data()), 0, r2.size()}),
                               b_.recv(Chunk{r3.addr(), 0, 200})};
  for (Future& f : recvs) {
    ASSERT_TRUE(f.wait_for(std::chrono::seconds(30)));
    ASSERT_EQ(f.status(), 0) << f.message();
  }
  EXPECT_EQ(r0.read(), pattern(n, 3));
  EXPECT_EQ(r1.read(), hsrc);
  EXPECT_EQ(r2, pattern(kChunk + 1, 9));
  EXPECT_EQ(r3.read(0, 100), h2);
  EXPECT_EQ(recvs[3].nbytes(), 100u);

  // Host to GPU and GPU to host.
  Future rv2 = b_.recv(Chunk{reinterpret_cast<uintptr_t>(hdst.data()), 0, hdst.size()});
  Future sd2 = a_.send(Chunk{gsrc.addr(), 0, n});
  ASSERT_TRUE(rv2.wait_for(std::chrono::seconds(30)));
  ASSERT_EQ(rv2.status(), 0) << rv2.message();
  EXPECT_TRUE(std::equal(src_bytes.begin(), src_bytes.end(), hdst.begin()));
  ASSERT_TRUE(sd2.wait_for(std::chrono::seconds(30)));

  for (TcpEndpoint* ep : {&a_, &b_}) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (ep->listener_stats()["gpu_staging_bytes_in_use"].get<uint64_t>() != 0) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "staging slots were not given back";
      std::this_thread::yield();
    }
  }
}

// A GPU whose context faulted (a sticky CUDA error; here a stray copy past an allocation,
// made outside the library, as a user's kernel would) fails each op that stages through it,
// alone, with that error, on either side: no future hangs, the connection lives (host
// memory still crosses it), and the endpoints shut down. In a process of its own: nothing
// clears the fault. Prints what broke and exits 1, or exits 0.
void transfers_after_a_device_fault() {
  const auto require = test_support::require_in_child;
  ::setenv("DLSLIME_GPU_SIM", "1", 1);
  const size_t n = 2 * kChunk;
  // Leaked on purpose: freeing device memory in a faulted context fails.
  auto* src = new DeviceBuffer(n);
  auto* dst = new DeviceBuffer(n);
  src->write(pattern(n, 3));
  {
    TcpEndpoint a{"127.0.0.1", 0, small_chunks()};
    TcpEndpoint b{"127.0.0.1", 0, small_chunks()};
    a.connect(b.endpoint_info());
    b.connect(a.endpoint_info());
    const int32_t ha = a.register_memory_region("src", src->addr(), 0, n);
    b.register_memory_region("dst", dst->addr(), 0, n);
    const int32_t hb = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"]);
    Future before = a.write({Assignment{ha, hb, 0, 0, n}});
    require(before.wait_for(std::chrono::seconds(30)) && before.status() == 0, "the write before the fault");

    // Host regions, registered while the GPU can still say where memory lives (after the
    // fault it cannot, and registration refuses: see test_device_runtime.cpp).
    std::vector<uint8_t> host_src = pattern(4096, 5), host_dst(4096, 0);
    const int32_t hs = a.register_memory_region("host_src", reinterpret_cast<uintptr_t>(host_src.data()), 0, 4096);
    b.register_memory_region("host_dst", reinterpret_cast<uintptr_t>(host_dst.data()), 0, 4096);
    const int32_t hd = a.register_remote_memory_region("host_dst", b.endpoint_info()["mr_info"]["host_dst"]);
    gpu::Runtime& rt = gpu::runtime();
    void* stray = rt.device_alloc(0, 64);
    std::vector<uint8_t> stray_bytes(128);
    gpu::Stream s = rt.stream_create(0);
    gpu::Event e = rt.event_create(0);
    rt.memcpy_async(stray, stray_bytes.data(), stray_bytes.size(), s);
    try {
      rt.event_record(e, s);  // refused already if the stray copy has run
      rt.event_synchronize(e);
      require(false, "the stray copy did not fault");
    } catch (const gpu::GpuError&) {
    }

    for (int round = 0; round < 2; ++round) {
      Future w = a.write({Assignment{ha, hb, 0, 0, n}});
      Future r = a.read({Assignment{ha, hb, 0, 0, n}});
      for (Future* f : {&w, &r}) {
        require(f->wait_for(std::chrono::seconds(30)).has_value(), "an op after the fault hung");
        require(f->status() != 0, "an op through the faulted GPU succeeded");
        require(std::string(f->message()).find("cudaErrorIllegalAddress") != std::string::npos,
                "the op's error names the sticky CUDA error: " + f->message());
      }
    }
    Future host = a.write({Assignment{hs, hd, 0, 0, 4096}});
    require(host.wait_for(std::chrono::seconds(30)).has_value() && host.status() == 0,
            "host memory crosses the same connection after the fault: " + host.message());
    require(host_dst == host_src, "the host write's bytes");
    a.shutdown();
    b.shutdown();
  }
  std::_Exit(0);
}

TEST(TcpGpuDeathTest, AFaultedGpuFailsItsOpsWithTheCudaErrorAndNothingHangs) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: nothing clears the fault
  EXPECT_EXIT(transfers_after_a_device_fault(), ::testing::ExitedWithCode(0), "");
}

TEST(MemoryRegistryGpu, DeviceMemoryMustLieInsideOneAllocation) {
  ::setenv("DLSLIME_GPU_SIM", "1", 1);
  DeviceBuffer buf(4096);
  MemoryRegistry reg;
  EXPECT_EQ(reg.get(reg.add("inside", buf.addr(), 96, 4000))->kind, MemoryKind::kDevice);
  EXPECT_THROW(reg.add("past", buf.addr(), 96, 4001), InvalidArgumentError);
  std::vector<uint8_t> host(64);
  EXPECT_EQ(reg.get(reg.add("host", reinterpret_cast<uintptr_t>(host.data()), 0, 64))->kind, MemoryKind::kHost);
}

}  // namespace
