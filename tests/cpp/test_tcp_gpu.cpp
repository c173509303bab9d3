// GPU memory over TCP (docs/tcp.md "GPU memory") on the strict simulated GPU: device
// regions on either side, staged through bounded pinned pools. Internal (links the object
// library) for the simulated runtime's allocator; transfers go through TcpEndpoint's public
// API. The simulated device memory is PROT_NONE to host code, so a host touch of it in the
// library kills the test. Run under ASan/TSan too: the staging has its own waiter thread.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/memory_registry.h"
#include "core/transport_registry.h"
#include "dlslime/dlslime.h"
#include "device_buffer.h"
#include "gpu/device_runtime.h"

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
