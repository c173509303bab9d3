// AscendDirectEndpoint on the simulated HIXL (docs/ascend.md): what the conformance suite does
// not cover because it is this transport's own: ops to the engine of each region, deadlines
// that disconnect the link and a next op that relinks, memory the peer registered after the
// link was made, the library without async transfers or notifies, options, and the error
// without the simulation or CANN.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ascend/npu_memory.h"
#include "core/memory_registry.h"
#include "dlslime/ascend_endpoint.h"
#include "dlslime/errors.h"
#include "dlslime/transport.h"
#include "test_support.h"

using namespace dlslime;
using namespace std::chrono_literals;

namespace {

// Sets an environment variable for one scope (the simulation reads its variables when an
// engine is made, and DLSLIME_ASCEND_SIM on every call).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + seed);
  return v;
}

AscendOptions quick() {
  AscendOptions o;
  o.connect_timeout = 2000ms;
  o.op_timeout = 10000ms;
  return o;
}

int wait_status(const Future& f, std::chrono::seconds limit = 20s) { return f.wait_for(limit).value_or(-1); }

class AscendEndpointTest : public ::testing::Test {
 protected:
  ScopedEnv sim_{"DLSLIME_ASCEND_SIM", "1"};
};

TEST_F(AscendEndpointTest, OneBatchGoesToTheEngineOfEachRegion) {
  AscendDirectEndpoint a(quick()), b(quick()), c(quick());
  std::vector<uint8_t> src = pattern(8192, 3), at_b(4096, 0), at_c(4096, 0);
  const int32_t h_src = a.register_memory_region("src", reinterpret_cast<uintptr_t>(src.data()), 0, src.size());
  b.register_memory_region("dst", reinterpret_cast<uintptr_t>(at_b.data()), 0, at_b.size());
  c.register_memory_region("dst", reinterpret_cast<uintptr_t>(at_c.data()), 0, at_c.size());
  a.connect(b.endpoint_info());
  a.connect(c.endpoint_info());  // a second peer: b's regions and link stay
  const int32_t h_b = a.register_remote_memory_region("b.dst", b.endpoint_info()["mr_info"]["dst"]);
  const int32_t h_c = a.register_remote_memory_region("c.dst", c.endpoint_info()["mr_info"]["dst"]);
  Future f = a.write({{h_src, h_b, 0, 0, 4096}, {h_src, h_c, 0, 4096, 4096}});
  ASSERT_EQ(wait_status(f), 0) << f.message();
  EXPECT_EQ(f.nbytes(), 8192u);
  EXPECT_EQ(at_b, std::vector<uint8_t>(src.begin(), src.begin() + 4096));
  EXPECT_EQ(at_c, std::vector<uint8_t>(src.begin() + 4096, src.end()));
}

TEST_F(AscendEndpointTest, AnOpPastItsDeadlineFailsTimeoutAndTheNextOpRelinks) {
  AscendDirectEndpoint a(quick());
  std::unique_ptr<AscendDirectEndpoint> hung;
  {
    ScopedEnv fault("DLSLIME_ASCEND_SIM_FAULT", "hang=1");  // b serves no transfer
    hung = std::make_unique<AscendDirectEndpoint>(quick());
  }
  std::vector<uint8_t> src = pattern(4096, 1), dst(4096, 0);
  const int32_t h_src = a.register_memory_region("src", reinterpret_cast<uintptr_t>(src.data()), 0, src.size());
  hung->register_memory_region("dst", reinterpret_cast<uintptr_t>(dst.data()), 0, dst.size());
  a.connect(hung->endpoint_info());
  const int32_t h_dst = a.register_remote_memory_region("dst", hung->endpoint_info()["mr_info"]["dst"]);
  const auto t0 = std::chrono::steady_clock::now();
  Future f = a.write({{h_src, h_dst, 0, 0, 4096}}, 300ms);
  ASSERT_EQ(wait_status(f), static_cast<int>(StatusCode::kTimeout)) << f.message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_NE(f.message().find("300 ms (its timeout)"), std::string::npos) << f.message();
  // A healthy peer under the same name: the next op relinks (the library requires the link
  // to be remade after a timeout) and moves its bytes.
  const nlohmann::json old_info = hung->endpoint_info();
  hung.reset();
  AscendOptions same = quick();
  same.port = std::stoi(old_info["engine"].get<std::string>().substr(10));
  AscendDirectEndpoint healthy(same);
  healthy.register_memory_region("dst", reinterpret_cast<uintptr_t>(dst.data()), 0, dst.size());
  const int32_t h_new = a.register_remote_memory_region("dst", healthy.endpoint_info()["mr_info"]["dst"]);
  Future g = a.write({{h_src, h_new, 0, 0, 4096}});
  ASSERT_EQ(wait_status(g), 0) << g.message();
  EXPECT_EQ(dst, src);
}

TEST_F(AscendEndpointTest, MemoryThePeerRegisteredAfterTheLinkIsReachedByRelinking) {
  AscendDirectEndpoint a(quick()), b(quick());
  std::vector<uint8_t> src = pattern(4096, 5), late(4096, 0);
  const int32_t h_src = a.register_memory_region("src", reinterpret_cast<uintptr_t>(src.data()), 0, src.size());
  a.connect(b.endpoint_info());  // b has no region yet: the link's snapshot is empty
  b.register_memory_region("late", reinterpret_cast<uintptr_t>(late.data()), 0, late.size());
  const int32_t h_late = a.register_remote_memory_region("late", b.endpoint_info()["mr_info"]["late"]);
  Future f = a.write({{h_src, h_late, 0, 0, 4096}});
  ASSERT_EQ(wait_status(f), 0) << f.message();
  EXPECT_EQ(late, src);
}

TEST_F(AscendEndpointTest, WithoutAsyncTransfersOrNotifiesItUsesTransferSyncAndOffersNoNotifications) {
  ScopedEnv caps("DLSLIME_ASCEND_SIM_CAPS", "async=0,notify=0");  // ADXL before 8.3
  AscendDirectEndpoint a(quick()), b(quick());
  EXPECT_FALSE(a.capabilities().notify);
  EXPECT_THROW(a.send_notify("x"), NotImplementedError);
  std::vector<uint8_t> src = pattern(65536, 9), dst(65536, 0);
  const int32_t h_src = a.register_memory_region("src", reinterpret_cast<uintptr_t>(src.data()), 0, src.size());
  b.register_memory_region("dst", reinterpret_cast<uintptr_t>(dst.data()), 0, dst.size());
  a.connect(b.endpoint_info());
  const int32_t h_dst = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"]);
  Future w = a.write({{h_src, h_dst, 100, 0, 30000}});
  ASSERT_EQ(wait_status(w), 0) << w.message();
  std::fill(src.begin(), src.end(), 0);
  Future r = a.read({{h_src, h_dst, 100, 5, 30000}});
  ASSERT_EQ(wait_status(r), 0) << r.message();
  EXPECT_EQ(std::vector<uint8_t>(src.begin() + 5, src.begin() + 30005),
            std::vector<uint8_t>(dst.begin() + 100, dst.begin() + 30100));
}

// NPU memory is known to the memory registry (TransportEntry::device_memory) as NPU memory,
// which only the ascend transport moves: another transport's resolve refuses it.
TEST_F(AscendEndpointTest, NpuMemoryIsKnownToTheRegistryAndOnlyAscendMovesIt) {
  ascend::NpuMemory& npu = ascend::npu_memory();
  void* p = npu.alloc(0, 4096);
  AscendDirectEndpoint a(quick());
  a.register_memory_region("npu", reinterpret_cast<uintptr_t>(p), 0, 4096);
  EXPECT_EQ(a.mr_info()["npu"]["memory"], "npu");
  MemoryRegistry shared;
  const int32_t h = shared.add("npu", reinterpret_cast<uintptr_t>(p), 0, 4096);
  EXPECT_EQ(shared.get(h)->kind, MemoryKind::kNpu);
  EXPECT_TRUE(shared.mr_info().contains("npu")) << "the registry's own view lists every region";
  uintptr_t addr = 0;
  const Status refused = shared.resolve(h, 0, 8, &addr);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("only the ascend transport moves"), std::string::npos) << refused.message();
  {
    ResolveCache mine;  // holds a use of the region while it lives
    mine.npu = true;
    EXPECT_TRUE(shared.resolve(h, 0, 8, &addr, mine).is_ok());
  }
  shared.remove(h);
  // A range running past its allocation is refused, naming it.
  try {
    a.register_memory_region("past", reinterpret_cast<uintptr_t>(p), 0, 8192);
    ADD_FAILURE() << "a region past its NPU allocation was registered";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("memory region 'past'"), std::string::npos) << e.what();
  }
  a.shutdown();
  npu.free(p);
}

TEST_F(AscendEndpointTest, OptionsAreCheckedAgainstWhatTheLibraryDocuments) {
  auto refused = [](const nlohmann::json& o, const std::string& says) {
    try {
      AscendOptions::from_json(o);
      ADD_FAILURE() << o.dump() << " was taken";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused({{"RdmaTrafficClass", 130}}, "a multiple of 4");
  refused({{"RdmaServiceLevel", "8"}}, "0..7");
  refused({{"BufferPool", "4:0"}}, "both 0 for none");
  refused({{"AutoConnect", "yes"}}, "\"0\" or \"1\"");
  refused({{"LocalCommRes", "{not json"}}, "JSON");
  refused({{"EnableUseFabricMem", "1"}, {"BufferPool", "4:8"}}, "exclude each other");
  refused({{"op_timeout", 5}}, "unknown AscendDirectEndpoint option 'op_timeout'");
  refused({{"host", "localhost"}}, "IPv4");
  const AscendOptions o = AscendOptions::from_json({{"RdmaTrafficClass", 132}, {"engine_options", {{"BufferPool", "0:0"}}}});
  EXPECT_EQ(o.engine_options.at("RdmaTrafficClass"), "132");
  EXPECT_EQ(o.engine_options.at("BufferPool"), "0:0");
  EXPECT_EQ(o.to_json()["BufferPool"], "0:0");
}

TEST(AscendWithoutTheSimulation, SaysWhatIsMissingAndNeverAborts) {
  ScopedEnv off("DLSLIME_ASCEND_SIM", nullptr);
  for (const TransportInfo& t : available_transports()) {
    if (t.name != "ascend") continue;
    EXPECT_TRUE(t.built);
    if (t.available) GTEST_SKIP() << "this host has the CANN runtime and an NPU";
    EXPECT_NE(t.reason.find("DLSLIME_ASCEND_SIM"), std::string::npos) << t.reason;
  }
  try {
    AscendDirectEndpoint ep;
    ADD_FAILURE() << "an endpoint was made without CANN or the simulation";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("DLSLIME_ASCEND_SIM"), std::string::npos) << e.what();
  }
}

}  // namespace
