// A transport defined only here, in the test tree, registered at run time: PeerAgent serves
// it, publishes it, and selects it by name and through transport="auto" by its hooks alone
// (core/transport_registry.h, AgentHooks), with nothing about it in src/agent/. It is TCP
// under FaultyEndpoint (an empty plan: every call forwarded), ranked above every built-in
// transport so that "auto" prefers it. Its own executable: the registration is process-wide.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent_fixtures.h"
#include "core/faulty_endpoint.h"
#include "core/transport_registry.h"
#include "dlslime/errors.h"
#include "dlslime/peer_agent.h"
#include "dlslime/transport.h"

using namespace dlslime;
using namespace dlslime::test_support;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

constexpr const char* kName = "faulty_tcp";

// What the plug-in saw, to show the agent went through its hooks.
std::atomic<int> g_reached{0};
std::atomic<int> g_configured{0};

void register_plugin() {
  static const bool done = [] {
    const TransportEntry& tcp = TransportRegistry::instance().require("tcp");
    TransportEntry e;
    e.name = kName;
    e.probe = [] { return TransportProbe{true, "", {}}; };
    e.make = [](const json& options, std::shared_ptr<MemoryRegistry> memory) -> std::shared_ptr<Endpoint> {
      auto inner = TransportRegistry::instance().make("tcp", options, std::move(memory));
      return std::make_shared<FaultyEndpoint>(inner, std::make_shared<FaultPlan>());
    };
    e.agent = tcp.agent;  // TCP's options on both sides
    e.agent.rank = 1000;
    e.agent.configure = [configure = tcp.agent.configure](const json& settings, const std::string& device) {
      ++g_configured;
      return configure(settings, device);
    };
    e.agent.advertise = [](const json&) { return json{{"flavour", "plug-in"}}; };
    // Reaches a peer whose entry carries the flavour it advertises.
    e.agent.reach = [](const ReachQuery& q) {
      ++g_reached;
      TransportReach r{false, "", true, q.request};
      if (q.theirs.is_object() && q.theirs.value("flavour", "") == "plug-in") {
        r.ok = true;
        r.reason = "the test tree's transport, on '" + q.peer + "' too";
      } else {
        r.reason = "the peer agent '" + q.peer + "' publishes no flavour";
      }
      return r;
    };
    TransportRegistry::register_transport(std::move(e));
    return true;
  }();
  (void)done;
}

uintptr_t addr_of(std::vector<uint8_t>& v) { return reinterpret_cast<uintptr_t>(v.data()); }

int named_write(PeerAgent& from, const std::string& peer, uint64_t length) {
  auto w = from.write(peer, std::vector<NamedAssignment>{{"src", "dst", 0, 0, length}});
  auto st = w.wait_for(10s);
  EXPECT_TRUE(st.has_value()) << "named write hung";
  if (st && *st != 0) ADD_FAILURE() << w.message();
  return st.value_or(-1);
}

ConnectOptions over(const std::string& transport) {
  ConnectOptions o;
  o.transport = transport;
  return o;
}

}  // namespace

TEST(AgentPlugin, ATransportRegisteredAtRunTimeIsSelectedByAutoAndByName) {
  StartedCtrl ctrl;
  const std::string url = ctrl.server.url();
  PeerAgent before(agent(url, "pl_before"));  // made before the transport existed: does not serve it
  register_plugin();
  bool listed = false;
  for (const auto& t : available_transports()) listed = listed || (t.name == kName && t.available);
  EXPECT_TRUE(listed);

  PeerAgentOptions ao = agent(url, "pl_a");
  ao.transport_options[kName] = {{"lanes", 1}};  // the plug-in's own settings, checked by it
  const int configured = g_configured.load();
  PeerAgent a(ao);
  PeerAgent b(agent(url, "pl_b"));
  EXPECT_EQ(g_configured.load(), configured + 2);
  bool published = false;
  const json record = a.agent_record("pl_a").value();  // held: the loop reads into it
  for (const auto& t : record.at("metadata").at("transports")) {
    published = published || (t.value("name", "") == kName && t.value("flavour", "") == "plug-in");
  }
  EXPECT_TRUE(published) << record.dump();

  std::vector<uint8_t> src(64 << 10), dst(src.size(), 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  a.register_memory_region("src", addr_of(src), 0, src.size());
  b.register_memory_region("dst", addr_of(dst), 0, dst.size());

  const int reached = g_reached.load();
  PeerConnection ca = a.connect_to("pl_b", over("auto"));
  PeerConnection cb = b.connect_to("pl_a", over("auto"));
  ca.wait(10s);
  cb.wait(10s);
  EXPECT_GT(g_reached.load(), reached) << "auto did not ask the plug-in's reach()";
  EXPECT_EQ(ca.transport(), kName) << ca.selection_reason();
  EXPECT_EQ(cb.transport(), kName) << cb.selection_reason();
  EXPECT_EQ(ca.selection_reason(), std::string(kName) + ": the test tree's transport, on 'pl_b' too");
  EXPECT_NE(std::dynamic_pointer_cast<FaultyEndpoint>(ca.endpoint()), nullptr);
  EXPECT_EQ(named_write(a, "pl_b", src.size()), 0);
  EXPECT_EQ(dst, src);

  // An agent that does not serve it: "auto" passes it over and says why.
  PeerConnection old = a.connect_to("pl_before", over("auto"));
  old.wait(10s);
  EXPECT_EQ(old.transport(), "tcp");
  EXPECT_NE(old.selection_reason().find("(faulty_tcp: the peer agent 'pl_before' does not serve it)"),
            std::string::npos)
      << old.selection_reason();
  // By name, to a peer it reaches: connects; to one whose record rules it out: fails at once.
  PeerAgent c(agent(url, "pl_c"));
  PeerConnection named = a.connect_to("pl_c", over(kName));
  named.wait(10s);
  EXPECT_EQ(named.transport(), kName);
  // An agent made before the transport existed does not serve it, and says so.
  EXPECT_THROW(before.connect_to("pl_a", over(kName)), NotImplementedError);
}

TEST(AgentPlugin, TransportOptionsAreCheckedByTheirTransport) {
  StartedCtrl ctrl;
  register_plugin();
  PeerAgentOptions bad = agent(ctrl.server.url(), "pl_bad");
  bad.transport_options[kName] = {{"no_such_option", 1}};
  EXPECT_THROW(PeerAgent{bad}, InvalidArgumentError);  // TCP's configure, which the plug-in uses
  PeerAgentOptions unknown = agent(ctrl.server.url(), "pl_unknown");
  unknown.transport_options["carrier-pigeon"] = json::object();
  try {
    PeerAgent{unknown};
    ADD_FAILURE() << "an unknown transport's options were taken";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("names no transport: 'carrier-pigeon'"), std::string::npos) << e.what();
  }
  PeerAgentOptions not_object = agent(ctrl.server.url(), "pl_not_object");
  not_object.transport_options["tcp"] = 5;
  EXPECT_THROW(PeerAgent{not_object}, InvalidArgumentError);
}

TEST(AgentPlugin, ANameThatIsTakenOrAnEntryWithoutAFactoryIsRefused) {
  register_plugin();
  TransportEntry again;
  again.name = kName;
  again.probe = [] { return TransportProbe{true, "", {}}; };
  again.make = [](const json&, std::shared_ptr<MemoryRegistry>) -> std::shared_ptr<Endpoint> { return nullptr; };
  EXPECT_THROW(TransportRegistry::register_transport(again), InvalidArgumentError);
  TransportEntry auto_named = again;
  auto_named.name = "auto";
  EXPECT_THROW(TransportRegistry::register_transport(auto_named), InvalidArgumentError);
  TransportEntry no_factory;
  no_factory.name = "pl_no_factory";
  no_factory.probe = again.probe;
  EXPECT_THROW(TransportRegistry::register_transport(no_factory), InvalidArgumentError);
}
