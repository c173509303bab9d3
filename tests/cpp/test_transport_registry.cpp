#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/transport_registry.h"
#include "dlslime/errors.h"
#include "dlslime/tcp_endpoint.h"
#include "dlslime/transport.h"

using namespace dlslime;

namespace {
const TransportInfo* find(const std::vector<TransportInfo>& all, const std::string& name) {
  auto it = std::find_if(all.begin(), all.end(), [&](const TransportInfo& t) { return t.name == name; });
  return it == all.end() ? nullptr : &*it;
}
}  // namespace

// Every transport the project has is listed, built or not, with why it cannot be used.
TEST(TransportRegistry, ListsEveryTransportWithItsProbe) {
  const auto all = available_transports();
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[0].name, "tcp");
  for (const char* name : {"tcp", "rdma", "nvlink", "ascend"}) ASSERT_NE(find(all, name), nullptr) << name;
  for (const auto& t : all) {
    if (!t.available) EXPECT_FALSE(t.reason.empty()) << t.name;
    if (t.available) EXPECT_TRUE(t.built && t.reason.empty()) << t.name;
  }
  const TransportInfo* tcp = find(all, "tcp");
#ifdef DLSLIME_TEST_WITHOUT_TCP
  EXPECT_FALSE(tcp->built);
  EXPECT_NE(tcp->reason.find("BUILD_TCP"), std::string::npos) << tcp->reason;
#else
  EXPECT_TRUE(tcp->available) << tcp->reason;
#endif
}

TEST(TransportRegistry, RefusesUnknownAndUnavailableTransportsClearly) {
  try {
    make_endpoint("carrier-pigeon", nlohmann::json::object());
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::strstr(e.what(), "unknown transport \"carrier-pigeon\""), nullptr) << e.what();
    EXPECT_NE(std::strstr(e.what(), "tcp"), nullptr) << e.what();  // lists the known ones
  }
  for (const auto& t : available_transports()) {
    if (t.available) continue;
    try {
      make_endpoint(t.name, nlohmann::json::object());
      FAIL() << t.name;
    } catch (const NotImplementedError& e) {
      EXPECT_NE(std::string(e.what()).find(t.reason), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(TransportRegistry::instance().require("Tcp"), InvalidArgumentError);  // names are exact
}

#ifndef DLSLIME_TEST_WITHOUT_TCP
TEST(TransportRegistry, MakesATcpEndpointFromJsonOptions) {
  auto ep = make_endpoint("tcp", {{"ip", "127.0.0.1"}, {"port", 0}, {"lanes", 3}, {"op_timeout_ms", 1234}});
  ASSERT_NE(ep, nullptr);
  EXPECT_STREQ(ep->capabilities().transport, "tcp");
  auto* tcp = dynamic_cast<TcpEndpoint*>(ep.get());
  ASSERT_NE(tcp, nullptr);
  EXPECT_EQ(tcp->options().lanes, 3u);
  EXPECT_EQ(tcp->options().op_timeout.count(), 1234);
  EXPECT_EQ(tcp->host(), "127.0.0.1");
  ep->shutdown();

  // Endpoints made over one memory registry share its regions (the PeerAgent's case).
  auto memory = std::make_shared<MemoryRegistry>();
  std::vector<uint8_t> buf(64);
  memory->add("kv", reinterpret_cast<uintptr_t>(buf.data()), 0, buf.size());
  auto a = TransportRegistry::instance().make("tcp", {{"ip", "127.0.0.1"}}, memory);
  EXPECT_TRUE(a->mr_info().contains("kv"));
  a->shutdown();
}

TEST(TransportRegistry, TcpOptionsFromJsonAreStrict) {
  const auto bad = [](nlohmann::json j) { EXPECT_THROW(make_endpoint("tcp", j), InvalidArgumentError) << j.dump(); };
  bad({{"lanes", 0}});              // out of range (validate)
  bad({{"lanes", "2"}});            // wrong type
  bad({{"lanes", -1}});             // does not fit the field
  bad({{"no_such_option", 1}});     // unknown key
  bad({{"port", 70000}});
  bad({{"ip", 5}});
  bad({{"token", "short"}});        // below the minimum token size
  bad(nlohmann::json::array());     // not an object
  const TcpOptions o = TcpOptions::from_json({{"chunk_size", 65536}, {"token", std::string(16, 'k')}}, TcpOptions{});
  EXPECT_EQ(o.chunk_size, 65536u);
  EXPECT_EQ(o.token, std::string(16, 'k'));
  EXPECT_EQ(o.lanes, TcpOptions{}.lanes);  // untouched keys keep the base's value
}
#endif

namespace {
// DLSLIME_RDMA_SIM=1 while it lives (the RDMA provider reads it on each call).
class SimRdma {
 public:
  SimRdma() {
    if (const char* v = std::getenv("DLSLIME_RDMA_SIM")) saved_ = v;
    ::setenv("DLSLIME_RDMA_SIM", "1", 1);
  }
  ~SimRdma() {
    if (saved_.empty()) {
      ::unsetenv("DLSLIME_RDMA_SIM");
    } else {
      ::setenv("DLSLIME_RDMA_SIM", saved_.c_str(), 1);
    }
  }

 private:
  std::string saved_;
};
}  // namespace

// The per-transport port listing agents publish: RDMA lists each active port of each device
// from the device layer; transports without ports, unknown names and transports that are
// not built or not available list none (and never throw).
TEST(TransportRegistry, ListsTheActivePortsOfATransportsDevices) {
  const auto& registry = TransportRegistry::instance();
  EXPECT_TRUE(registry.ports("tcp").empty());
  EXPECT_TRUE(registry.ports("carrier-pigeon").empty());
  EXPECT_TRUE(registry.ports("ascend").empty());
  const auto all = available_transports();  // kept: find() points into it
  const TransportInfo* rdma = find(all, "rdma");
  ASSERT_NE(rdma, nullptr);
  if (!rdma->built) {
    EXPECT_TRUE(registry.ports("rdma").empty());
    return;
  }
  SimRdma sim;
  const std::vector<TransportPort> ports = registry.ports("rdma");
  ASSERT_EQ(ports.size(), 1u);  // sim_rdma0 has one port; the listing stops past it
  EXPECT_EQ(ports[0], (TransportPort{"sim_rdma0", 1, "Ethernet"}));
  // SLIME_VISIBLE_DEVICES hides it: nothing listed, no error.
  const char* before = std::getenv("SLIME_VISIBLE_DEVICES");
  const std::string saved = before ? before : "";
  ::setenv("SLIME_VISIBLE_DEVICES", "mlx5_9", 1);
  EXPECT_TRUE(registry.ports("rdma").empty());
  if (before) {
    ::setenv("SLIME_VISIBLE_DEVICES", saved.c_str(), 1);
  } else {
    ::unsetenv("SLIME_VISIBLE_DEVICES");
  }
}
