// PeerAgent from C++: an embedded NanoCtrl, two agents, a named write and a message.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "dlslime/errors.h"
#include "dlslime/nanoctrl.h"
#include "dlslime/nanoctrl_client.h"
#include "dlslime/peer_agent.h"
#include "dlslime/tcp_endpoint.h"
#include "dlslime/transport.h"

#include "agent_fixtures.h"
#include "test_support.h"

using namespace dlslime;
using namespace dlslime::test_support;
using namespace std::chrono_literals;

namespace {

size_t fd_count() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// A well-formed connect-message incarnation (16 hex digits) for forged messages.
std::string fmt_incarnation(uint64_t n) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(n));
  return buf;
}

// Connects a and b (both sides call connect_to) and waits for both.
void connect_both(PeerAgent& a, PeerAgent& b) {
  PeerConnection ca = a.connect_to(b.alias(), tcp());
  PeerConnection cb = b.connect_to(a.alias(), tcp());
  ca.wait(10s);
  cb.wait(10s);
}

// A named write of all of `src` into the peer's region `remote`; returns the status.
int named_write(PeerAgent& from, const std::string& peer, const std::string& local, const std::string& remote,
                uint64_t length) {
  auto w = from.write(peer, std::vector<NamedAssignment>{{local, remote, 0, 0, length}});
  auto st = w.wait_for(10s);
  EXPECT_TRUE(st.has_value()) << "named write hung";
  if (st && *st != 0) ADD_FAILURE() << w.message();
  return st.value_or(-1);
}

}  // namespace

TEST(PeerAgentCpp, ConnectWriteNamedAndSend) {
  NanoCtrlServer ctrl(local_ctrl());
  ctrl.start();
  PeerAgent a(agent(ctrl.url(), "cpp_a"));
  PeerAgent b(agent(ctrl.url(), "cpp_b"));
  std::vector<uint8_t> src(1 << 16), dst(1 << 16, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7);
  a.register_memory_region("src", reinterpret_cast<uintptr_t>(src.data()), 0, src.size());
  b.register_memory_region("dst", reinterpret_cast<uintptr_t>(dst.data()), 0, dst.size());

  PeerConnection ca = a.connect_to("cpp_b", tcp());
  PeerConnection cb = b.connect_to("cpp_a", tcp());
  ca.wait(10s);
  cb.wait(10s);
  EXPECT_TRUE(ca.is_connected());
  EXPECT_EQ(ca.peer_endpoint_info()["mr_info"].contains("dst"), true);

  auto w = a.write("cpp_b", std::vector<NamedAssignment>{{"src", "dst", 0, 0, src.size()}});
  ASSERT_EQ(w.wait_for(10s), std::optional<int>(0)) << w.message();
  EXPECT_EQ(src, dst);

  std::string msg = "from a";
  std::vector<char> inbox(16, 0);
  auto rv = b.recv("cpp_a", {reinterpret_cast<uintptr_t>(inbox.data()), 0, inbox.size()});
  ASSERT_EQ(a.send("cpp_b", {reinterpret_cast<uintptr_t>(msg.data()), 0, msg.size()}).wait_for(10s),
            std::optional<int>(0));
  ASSERT_EQ(rv.wait_for(10s), std::optional<int>(0));
  EXPECT_EQ(std::string(inbox.data(), rv.nbytes()), msg);

  EXPECT_THROW(a.connect_to("cpp_b", ConnectOptions{}), NotImplementedError);  // rdma: not built
  EXPECT_THROW(a.connect_to("cpp_a", tcp()), InvalidArgumentError);
  EXPECT_THROW(a.imm_recv("cpp_b"), NotImplementedError);
  a.shutdown();
  b.shutdown();
}

// Tokens from C++: one secret for NanoCtrl (ctrl_token) and TCP (tcp.token); an agent
// without the NanoCtrl token is refused, and agents whose TCP tokens differ fail the
// connection on both sides with AuthenticationError.
TEST(PeerAgentCpp, TokensGuardBothPlanes) {
  const std::string secret = "cpp-shared-secret-0123456789";
  NanoCtrlConfig cc = local_ctrl();
  cc.token = secret;
  NanoCtrlServer ctrl(cc);
  ctrl.start();
  auto with_tokens = [&](const std::string& alias, const std::string& tcp_token) {
    PeerAgentOptions o = agent(ctrl.url(), alias);
    o.ctrl_token = secret;
    o.transport_options["tcp"]["token"] = tcp_token;
    return o;
  };
  PeerAgentOptions anonymous = agent(ctrl.url(), "cpp_anon");
  anonymous.ctrl_token = "not-the-secret-at-all";
  EXPECT_THROW(PeerAgent{anonymous}, AuthenticationError);

  PeerAgent a(with_tokens("cpp_ta", secret));
  PeerAgent b(with_tokens("cpp_tb", secret));
  std::vector<uint8_t> src(4096, 0x5A), dst(4096, 0);
  a.register_memory_region("src", reinterpret_cast<uintptr_t>(src.data()), 0, src.size());
  b.register_memory_region("dst", reinterpret_cast<uintptr_t>(dst.data()), 0, dst.size());
  PeerConnection ca = a.connect_to("cpp_tb", tcp());
  PeerConnection cb = b.connect_to("cpp_ta", tcp());
  ca.wait(10s);
  cb.wait(10s);
  auto w = a.write("cpp_tb", std::vector<NamedAssignment>{{"src", "dst", 0, 0, src.size()}});
  ASSERT_EQ(w.wait_for(10s), std::optional<int>(0)) << w.message();
  EXPECT_EQ(src, dst);

  PeerAgent c(with_tokens("cpp_tc", "a-different-tcp-token"));
  PeerConnection ac = a.connect_to("cpp_tc", tcp());
  PeerConnection ca2 = c.connect_to("cpp_ta", tcp());
  EXPECT_THROW(ac.wait(10s), AuthenticationError);
  EXPECT_THROW(ca2.wait(10s), AuthenticationError);
  EXPECT_EQ(ac.state(), "failed");
  a.shutdown();
  b.shutdown();
  c.shutdown();
}

// Item 4: after NanoCtrl forgot the agent (memory store restarted), the heartbeat registers it
// again and publishes its regions again; a peer that connects afterwards writes by name.
TEST(PeerAgentCpp, RepublishesRegionsAfterNanoCtrlRestart) {
  auto ctrl = std::make_unique<NanoCtrlServer>(local_ctrl());
  ctrl->start();
  NanoCtrlConfig again = local_ctrl();
  again.port = ctrl->port();
  const std::string url = ctrl->url();
  PeerAgentOptions ao = agent(url, "rp_a");
  ao.heartbeat_interval = 20ms;
  PeerAgent a(ao);
  std::vector<uint8_t> dst(4096, 0), src(4096, 0x3C);
  a.register_memory_region("dst", addr_of(dst), 0, dst.size());

  ctrl->stop();
  ctrl = std::make_unique<NanoCtrlServer>(again);
  ctrl->start();
  NanoCtrlClient client(url);
  ASSERT_TRUE(wait_until([&] { return client.get_mr_info("rp_a", "dst").has_value(); }))
      << "the region was not published again after NanoCtrl restarted";
  EXPECT_EQ((*client.get_mr_info("rp_a", "dst"))["length"], 4096);

  PeerAgent b(agent(url, "rp_b"));
  b.register_memory_region("src", addr_of(src), 0, src.size());
  connect_both(a, b);
  EXPECT_EQ(named_write(b, "rp_a", "src", "dst", src.size()), 0);
  EXPECT_EQ(dst, src);
}

// Item 20: a PeerAgent refused because its alias is taken (409) cleans up nothing: the
// live agent keeps its record and regions, and a peer still writes to it by name.
TEST(PeerAgentCpp, RefusedDuplicateAliasLeavesTheFirstAgentWorking) {
  NanoCtrlServer ctrl(local_ctrl());
  ctrl.start();
  PeerAgent first(agent(ctrl.url(), "dup_x"));
  std::vector<uint8_t> dst(4096, 0), src(4096, 0x77);
  first.register_memory_region("dst", addr_of(dst), 0, dst.size());
  for (int i = 0; i < 3; ++i) {
    try {
      PeerAgent second(agent(ctrl.url(), "dup_x"));
      ADD_FAILURE() << "a second agent under a taken alias was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("409"), std::string::npos) << e.what();
    }
  }
  NanoCtrlClient client(ctrl.url());
  auto record = client.get_peer_agent("dup_x");
  ASSERT_TRUE(record.has_value()) << "the refused agent removed the live agent's record";
  ASSERT_TRUE(client.get_mr_info("dup_x", "dst").has_value()) << "the refused agent removed the live agent's regions";

  // A region registered after the handshake resolves through NanoCtrl only.
  PeerAgent peer(agent(ctrl.url(), "dup_peer"));
  peer.register_memory_region("src", addr_of(src), 0, src.size());
  connect_both(first, peer);
  std::vector<uint8_t> late(4096, 0);
  first.register_memory_region("late", addr_of(late), 0, late.size());
  EXPECT_EQ(named_write(peer, "dup_x", "src", "dst", src.size()), 0);
  EXPECT_EQ(named_write(peer, "dup_x", "src", "late", src.size()), 0);
  EXPECT_EQ(dst, src);
  EXPECT_EQ(late, src);
}

// Item 22: the peer registers a name again at a new buffer (a new handle); the next named
// write resolves the name again and lands in the new buffer.
TEST(PeerAgentCpp, NamedWriteFollowsARegionRegisteredAgain) {
  NanoCtrlServer ctrl(local_ctrl());
  ctrl.start();
  PeerAgent a(agent(ctrl.url(), "rr_a"));
  PeerAgent b(agent(ctrl.url(), "rr_b"));
  std::vector<uint8_t> src(4096, 0x11), old_buf(4096, 0), new_buf(4096, 0);
  a.register_memory_region("src", addr_of(src), 0, src.size());
  b.register_memory_region("buf", addr_of(old_buf), 0, old_buf.size());
  connect_both(a, b);
  EXPECT_EQ(named_write(a, "rr_b", "src", "buf", src.size()), 0);
  EXPECT_EQ(old_buf, src);

  b.register_memory_region("buf", addr_of(new_buf), 0, new_buf.size());
  std::fill(src.begin(), src.end(), 0x22);
  for (int i = 0; i < 2; ++i) {  // the first one retries; the second uses the refreshed handle
    std::fill(new_buf.begin(), new_buf.end(), 0);
    EXPECT_EQ(named_write(a, "rr_b", "src", "buf", src.size()), 0);
    EXPECT_EQ(new_buf, src);
  }
  EXPECT_EQ(old_buf, std::vector<uint8_t>(4096, 0x11)) << "a write landed in the unregistered buffer";
  // A name the peer no longer has still fails, with the unknown-handle status.
  b.unregister_memory_region("buf");
  auto w = a.write("rr_b", std::vector<NamedAssignment>{{"src", "buf", 0, 0, src.size()}});
  ASSERT_TRUE(w.wait_for(10s).has_value());
  EXPECT_EQ(w.status(), static_cast<int>(StatusCode::kUnknownHandle)) << w.message();
}

// Item 16: connect messages forged under made-up aliases (the mailbox takes posts from
// anyone without a NanoCtrl token), each pointing at a socket that accepts and never
// answers, neither keep descriptors after their handshakes fail nor hold up a real peer.
TEST(PeerAgentCpp, ForgedConnectMessagesReleaseTheirResourcesAndDoNotBlockRealPeers) {
  NanoCtrlServer ctrl(local_ctrl());
  ctrl.start();
  const int silent = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(silent, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(::listen(silent, 1024), 0);
  socklen_t len = sizeof sa;
  ASSERT_EQ(::getsockname(silent, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  const int silent_port = ntohs(sa.sin_port);

  PeerAgentOptions vo = agent(ctrl.url(), "fv_victim");
  vo.transport_options["tcp"]["connect_timeout_ms"] = 1000;  // each forged handshake ends within a second
  PeerAgent victim(vo);
  PeerAgent real(agent(ctrl.url(), "fv_real"));
  std::vector<uint8_t> dst(4096, 0), src(4096, 0x42);
  victim.register_memory_region("dst", addr_of(dst), 0, dst.size());
  real.register_memory_region("src", addr_of(src), 0, src.size());
  const size_t baseline = fd_count();

  constexpr int kForged = 60;
  NanoCtrlClient forger(ctrl.url());
  // Half the forged senders are registered agents too (anyone may register), so the victim
  // can answer them and dials each; the other half it cannot even answer.
  for (int i = 0; i < kForged; i += 2) forger.start_peer_agent({{"alias", "forged_" + std::to_string(i)}});
  for (int i = 0; i < kForged; ++i) {
    const nlohmann::json info = {{"transport", "tcp"}, {"host", "127.0.0.1"}, {"port", silent_port},
                                 {"endpoint_id", 1000 + i}, {"lanes", 1}, {"mr_info", nlohmann::json::object()}};
    forger.post("fv_victim", {{"type", "connect"}, {"transport", "tcp"}, {"conn_id", "forged#" + std::to_string(i)},
                              {"incarnation", fmt_incarnation(i)}, {"have_peer_info", true}, {"endpoint_info", info}},
                "forged_" + std::to_string(i));
  }
  // The real peer connects while the forged handshakes dial; the victim side is passive.
  PeerConnection conn = real.connect_to("fv_victim", tcp());
  EXPECT_NO_THROW(conn.wait(10s));
  EXPECT_EQ(named_write(real, "fv_victim", "src", "dst", src.size()), 0);
  EXPECT_EQ(dst, src);

  // Every forged connection fails and is forgotten; the descriptors come back.
  EXPECT_TRUE(wait_until([&] { return victim.peers() == std::vector<std::string>{"fv_real"}; }, 15s))
      << victim.peers().size() << " connections kept";
  // Slack: the real connection's listener and lanes on both sides, and pooled HTTP connections.
  EXPECT_TRUE(wait_until([&] { return fd_count() <= baseline + 24; }, 15s))
      << fd_count() << " fds open, " << baseline << " before the forged messages";
  ::close(silent);
}


// Transports come from the registry: an unknown name lists the known ones, a known one that
// is not available says why, and the agent publishes what it serves.
TEST(PeerAgentCpp, ConnectToValidatesTheTransportAgainstTheRegistry) {
  NanoCtrlServer ctrl(local_ctrl());
  ctrl.start();
  PeerAgent a(agent(ctrl.url(), "tv_a"));
  PeerAgent b(agent(ctrl.url(), "tv_b"));
  ConnectOptions bogus;
  bogus.transport = "bogus";
  try {
    a.connect_to("tv_b", bogus);
    ADD_FAILURE() << "an unknown transport was accepted";
  } catch (const InvalidArgumentError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("unknown transport \"bogus\""), std::string::npos) << what;
    EXPECT_NE(what.find("tcp"), std::string::npos) << what;
    EXPECT_NE(what.find("rdma"), std::string::npos) << what;
  }
  ConnectOptions rdma;  // the default transport; this build has none
  rdma.qp_num = 4;
  std::string reason;
  for (const auto& t : available_transports()) {
    if (t.name == "rdma") reason = t.reason;
  }
  ASSERT_FALSE(reason.empty());
  try {
    a.connect_to("tv_b", rdma);
    ADD_FAILURE() << "rdma was accepted on a build without it";
  } catch (const NotImplementedError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("transport \"rdma\" is not available here: " + reason), std::string::npos) << what;
    EXPECT_NE(what.find("available here: tcp"), std::string::npos) << what;
  }
  EXPECT_TRUE(a.peers().empty()) << "a refused connect_to kept a connection";

  NanoCtrlClient client(ctrl.url());
  auto record = client.get_peer_agent("tv_a");
  ASSERT_TRUE(record.has_value());
  const auto& published = (*record)["metadata"]["transports"];
  ASSERT_TRUE(published.is_array()) << record->dump();
  ASSERT_FALSE(published.empty()) << record->dump();
  EXPECT_EQ(published[0]["name"], "tcp") << record->dump();
  EXPECT_TRUE(published[0]["devices"].is_array()) << record->dump();
  for (const auto& t : published) EXPECT_NE(t["name"], "rdma") << "an unavailable transport was published";
}

// A peer whose record does not list the transport fails the connection at once, saying
// which it serves (instead of a handshake timeout).
TEST(PeerAgentCpp, APeerThatDoesNotServeTheTransportFailsTheConnection) {
  NanoCtrlServer ctrl(local_ctrl());
  ctrl.start();
  PeerAgent a(agent(ctrl.url(), "ns_a"));
  NanoCtrlClient other(ctrl.url());
  other.start_peer_agent({{"alias", "ns_rdma_only"}, {"metadata", {{"transports", {{{"name", "rdma"}}}}}}});
  PeerConnection c = a.connect_to("ns_rdma_only", tcp());
  try {
    c.wait(10s);
    ADD_FAILURE() << "connected to a peer that does not serve tcp";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("does not serve transport \"tcp\" (it serves: rdma)"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(c.state(), "failed");
}

// Connect messages without a well-formed incarnation are dropped (logged), not crashed on
// and not dialled; one with an incarnation from another sender still connects.
TEST(PeerAgentCpp, ConnectMessagesWithoutAValidIncarnationAreRejected) {
  NanoCtrlServer ctrl(local_ctrl());
  ctrl.start();
  PeerAgent victim(agent(ctrl.url(), "inc_victim"));
  // A live endpoint for the messages to point at: the old code dialled it for each.
  auto target = make_endpoint("tcp", {{"ip", "127.0.0.1"}});
  const nlohmann::json info = target->endpoint_info();
  NanoCtrlClient forger(ctrl.url());
  const std::vector<nlohmann::json> bad = {nullptr, 12345, "", "not-hex-at-all!!", "0123456789abcde",
                                           "0123456789ABCDEF", nlohmann::json::object()};
  for (size_t i = 0; i < bad.size() + 1; ++i) forger.start_peer_agent({{"alias", "inc_" + std::to_string(i)}});
  for (size_t i = 0; i < bad.size(); ++i) {
    nlohmann::json msg = {{"type", "connect"}, {"transport", "tcp"}, {"conn_id", "x#" + std::to_string(i)},
                          {"have_peer_info", true}, {"endpoint_info", info}};
    if (!bad[i].is_null()) msg["incarnation"] = bad[i];
    forger.post("inc_victim", msg, "inc_" + std::to_string(i));
  }
  const std::string good = "inc_" + std::to_string(bad.size());
  forger.post("inc_victim",
              {{"type", "connect"}, {"transport", "tcp"}, {"conn_id", "good#0"}, {"incarnation", fmt_incarnation(7)},
               {"have_peer_info", true}, {"endpoint_info", info}},
              good);
  // The mailbox is read in order: once the good message made its connection, the bad ones
  // before it were handled.
  ASSERT_TRUE(wait_until([&] {
    auto p = victim.peers();
    return std::find(p.begin(), p.end(), good) != p.end();
  })) << "a connect message with a valid incarnation was not handled";
  EXPECT_EQ(victim.peers(), std::vector<std::string>{good});

  // The agent still works: a real peer connects and writes.
  PeerAgent real(agent(ctrl.url(), "inc_real"));
  std::vector<uint8_t> dst(4096, 0), src(4096, 0x6B);
  victim.register_memory_region("dst", addr_of(dst), 0, dst.size());
  real.register_memory_region("src", addr_of(src), 0, src.size());
  real.connect_to("inc_victim", tcp()).wait(10s);
  EXPECT_EQ(named_write(real, "inc_victim", "src", "dst", src.size()), 0);
  EXPECT_EQ(dst, src);
  target->shutdown();
}

// PeerAgentOptions::wrap_endpoint sees every endpoint the agent makes, the connect_to side's
// and the passive side's, and the agent uses the endpoint it returns.
TEST(PeerAgentCpp, WrapEndpointIsAppliedOnBothSides) {
  NanoCtrlServer ctrl(local_ctrl());
  ctrl.start();
  struct Seen {
    std::mutex mu;
    std::vector<std::shared_ptr<Endpoint>> endpoints;
  };
  auto wrapping = [&](const std::string& alias, Seen& seen) {
    PeerAgentOptions o = agent(ctrl.url(), alias);
    o.wrap_endpoint = [&seen](std::shared_ptr<Endpoint> ep) {
      std::lock_guard lock(seen.mu);
      seen.endpoints.push_back(ep);
      return ep;
    };
    return o;
  };
  Seen seen_a, seen_b;
  PeerAgentOptions ao = wrapping("we_a", seen_a);
  ao.transport_options["tcp"] = {{"lanes", 3}, {"op_timeout_ms", 1234}};  // the passive side mirrors the shape only
  PeerAgent a(ao);
  PeerAgent b(wrapping("we_b", seen_b));
  std::vector<uint8_t> src(1 << 20), dst(1 << 20, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 13 + 1);
  a.register_memory_region("src", addr_of(src), 0, src.size());
  b.register_memory_region("dst", addr_of(dst), 0, dst.size());

  PeerConnection ca = a.connect_to("we_b", tcp());  // b never calls connect_to: its side is passive
  ca.wait(10s);
  ASSERT_TRUE(wait_until([&] {
    auto cb = b.connection("we_a");
    return cb && cb->is_connected();
  }));
  PeerConnection cb = *b.connection("we_a");
  {
    std::lock_guard la(seen_a.mu), lb(seen_b.mu);
    ASSERT_EQ(seen_a.endpoints.size(), 1u);
    ASSERT_EQ(seen_b.endpoints.size(), 1u);
    EXPECT_EQ(ca.endpoint(), seen_a.endpoints[0]);
    EXPECT_EQ(cb.endpoint(), seen_b.endpoints[0]);
  }
  EXPECT_EQ(cb.transport(), "tcp");
  auto passive_tcp = std::dynamic_pointer_cast<TcpEndpoint>(cb.endpoint());
  ASSERT_NE(passive_tcp, nullptr);
  EXPECT_EQ(passive_tcp->options().lanes, 3u);
  // Only the shape is mirrored; the rest is the passive agent's own.
  EXPECT_EQ(passive_tcp->options().op_timeout, TcpOptions::from_env().op_timeout);

  EXPECT_EQ(named_write(a, "we_b", "src", "dst", src.size()), 0);
  EXPECT_EQ(dst, src);

  // A wrapper that returns no endpoint is a clear error, not a crash.
  PeerAgentOptions broken = agent(ctrl.url(), "we_null");
  broken.wrap_endpoint = [](std::shared_ptr<Endpoint>) { return std::shared_ptr<Endpoint>(); };
  PeerAgent c(broken);
  EXPECT_THROW(c.connect_to("we_b", tcp()), InvalidArgumentError);
  EXPECT_TRUE(c.peers().empty());
}

namespace {

// DLSLIME_RDMA_SIM=1 (the simulated RDMA device) for the agents made while it lives: each
// agent probes its transports when it is made. The previous value comes back after.
class SimRdmaDevice {
 public:
  SimRdmaDevice() {
    if (const char* v = std::getenv("DLSLIME_RDMA_SIM")) saved_ = v;
    ::setenv("DLSLIME_RDMA_SIM", "1", 1);
  }
  ~SimRdmaDevice() {
    if (saved_) {
      ::setenv("DLSLIME_RDMA_SIM", saved_->c_str(), 1);
    } else {
      ::unsetenv("DLSLIME_RDMA_SIM");
    }
  }

 private:
  std::optional<std::string> saved_;
};

bool rdma_built() {
  for (const auto& t : available_transports()) {
    if (t.name == "rdma") return t.built;
  }
  return false;
}

ConnectOptions with_transport(const std::string& transport) {
  ConnectOptions o;
  o.transport = transport;
  return o;
}

}  // namespace

// transport="rdma" over the mailbox handshake, on the simulated device: named regions
// resolve to the peer endpoint's rkeys, from the handshake and, for a region registered
// later, from its published record; bytes, messages and immediates arrive.
TEST(PeerAgentCpp, RdmaConnectionOnTheSimulatedDeviceMovesNamedRegionsMessagesAndImmediates) {
  SimRdmaDevice sim;
  StartedCtrl ctrl;
  PeerAgent a(agent(ctrl.server.url(), "rd_a"));
  PeerAgent b(agent(ctrl.server.url(), "rd_b"));
  ConnectOptions o = with_transport("rdma");
  o.local_device = "sim_rdma0";
  o.peer_device = "sim_rdma0";
  o.qp_num = 2;
  if (!rdma_built()) {
    // A build without RDMA keeps the clear error.
    EXPECT_THROW(a.connect_to("rd_b", o), NotImplementedError);
    return;
  }
  std::vector<uint8_t> src(1 << 16), dst(1 << 16, 0), late(4096, 0), back(4096, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 13 + 1);
  a.register_memory_region("src", addr_of(src), 0, src.size());
  a.register_memory_region("back", addr_of(back), 0, back.size());
  b.register_memory_region("dst", addr_of(dst), 0, dst.size());

  PeerConnection ca = a.connect_to("rd_b", o);  // b never calls connect_to: its side is passive
  ca.wait(10s);
  ASSERT_TRUE(wait_until([&] { return b.connection("rd_a") && b.connection("rd_a")->is_connected(); }));
  PeerConnection cb = *b.connection("rd_a");
  EXPECT_EQ(ca.transport(), "rdma");
  EXPECT_EQ(cb.transport(), "rdma");
  EXPECT_EQ(ca.selection_reason(), "rdma: requested");
  EXPECT_NE(cb.selection_reason().find("the peer agent 'rd_a' connected over it"), std::string::npos)
      << cb.selection_reason();
  EXPECT_EQ(ca.local_nic(), "sim_rdma0");
  EXPECT_EQ(ca.remote_nic(), "sim_rdma0");
  EXPECT_EQ(ca.peer_endpoint_info()["num_qp"], 2) << "qp_num did not reach the passive side";
  EXPECT_TRUE(ca.peer_endpoint_info()["mr_info"]["dst"].contains("rkey")) << ca.peer_endpoint_info().dump();

  EXPECT_EQ(named_write(a, "rd_b", "src", "dst", src.size()), 0);
  EXPECT_EQ(src, dst);

  // Registered after the handshake: resolved from NanoCtrl, with the rkey of the endpoint
  // a is connected to (each RDMA endpoint has its own).
  b.register_memory_region("late", addr_of(late), 0, late.size());
  EXPECT_EQ(named_write(a, "rd_b", "src", "late", late.size()), 0);
  EXPECT_TRUE(std::equal(late.begin(), late.end(), src.begin()));
  auto rd = a.read("rd_b", std::vector<NamedAssignment>{{"back", "late", 0, 0, back.size()}});
  ASSERT_EQ(rd.wait_for(10s), std::optional<int>(0)) << rd.message();
  EXPECT_EQ(back, late);
  EXPECT_EQ(a.sync_memory_regions("rd_b"), (std::vector<std::string>{"dst", "late"}));

  std::string msg = "over rdma";
  std::vector<char> inbox(32, 0);
  auto rv = b.recv("rd_a", {reinterpret_cast<uintptr_t>(inbox.data()), 0, inbox.size()});
  ASSERT_EQ(a.send("rd_b", {reinterpret_cast<uintptr_t>(msg.data()), 0, msg.size()}).wait_for(10s),
            std::optional<int>(0));
  ASSERT_EQ(rv.wait_for(10s), std::optional<int>(0)) << rv.message();
  EXPECT_EQ(std::string(inbox.data(), rv.nbytes()), msg);

  auto imm = b.imm_recv("rd_a");
  auto local = a.connection("rd_b")->endpoint()->mr_info();
  const int32_t src_handle = local["src"]["handle"].get<int32_t>();
  const int32_t dst_handle = a.connection("rd_b")->endpoint()->register_remote_memory_region(
      "dst", ca.peer_endpoint_info()["mr_info"]["dst"]);
  ASSERT_EQ(a.write_with_imm("rd_b", {{src_handle, dst_handle, 0, 0, 64}}, 0xabcd).wait_for(10s),
            std::optional<int>(0));
  ASSERT_EQ(imm.wait_for(10s), std::optional<int>(0)) << imm.message();
  EXPECT_EQ(imm.imm_data(), 0xabcdu);
}

// transport="auto": RDMA when both agents publish a usable device with the same link
// layer; TCP otherwise, saying why, in both directions.
TEST(PeerAgentCpp, AutoPicksRdmaWhenBothAgentsServeTheSameLinkLayerAndTcpOtherwise) {
  StartedCtrl ctrl;
  PeerAgent plain(agent(ctrl.server.url(), "au_tcp"));  // made before the device exists
  SimRdmaDevice sim;
  PeerAgent a(agent(ctrl.server.url(), "au_a"));
  PeerAgent b(agent(ctrl.server.url(), "au_b"));

  PeerConnection to_plain = a.connect_to("au_tcp", with_transport("auto"));
  to_plain.wait(10s);
  EXPECT_EQ(to_plain.transport(), "tcp");
  EXPECT_EQ(to_plain.selection_reason().rfind("tcp: both agents serve it (", 0), 0u) << to_plain.selection_reason();
  EXPECT_NE(to_plain.selection_reason().find(rdma_built() ? "(rdma: the peer agent 'au_tcp' does not serve it)"
                                                           : "(rdma: not available here ("),
            std::string::npos)
      << to_plain.selection_reason();
  PeerConnection from_plain = plain.connect_to("au_b", with_transport("auto"));
  from_plain.wait(10s);
  EXPECT_EQ(from_plain.transport(), "tcp");
  EXPECT_EQ(from_plain.selection_reason().rfind("tcp: both agents serve it (", 0), 0u) << from_plain.selection_reason();
  EXPECT_NE(from_plain.selection_reason().find(rdma_built() ? "(rdma: this agent does not serve it)"
                                                             : "(rdma: not available here ("),
            std::string::npos)
      << from_plain.selection_reason();

  std::vector<uint8_t> src(8192), dst(8192, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i ^ 0x5a);
  a.register_memory_region("src", addr_of(src), 0, src.size());
  b.register_memory_region("dst", addr_of(dst), 0, dst.size());
  // Both call it: both choose from the same records, so they agree.
  PeerConnection ca = a.connect_to("au_b", with_transport("auto"));
  PeerConnection cb = b.connect_to("au_a", with_transport("auto"));
  ca.wait(10s);
  cb.wait(10s);
  const std::string expected = rdma_built() ? "rdma" : "tcp";
  EXPECT_EQ(ca.transport(), expected);
  EXPECT_EQ(cb.transport(), expected);
  if (rdma_built()) {
    EXPECT_EQ(ca.selection_reason().rfind("rdma: both agents serve RoCE (sim_rdma0 here, sim_rdma0 on 'au_b')", 0), 0u)
        << ca.selection_reason();
  }
  EXPECT_EQ(named_write(a, "au_b", "src", "dst", src.size()), 0);
  EXPECT_EQ(src, dst);

  if (rdma_built()) {
    // The published record: each RDMA device with its port and link layer.
    NanoCtrlClient client(ctrl.server.url());
    auto record = client.get_peer_agent("au_a");
    ASSERT_TRUE(record.has_value());
    bool found = false;
    for (const auto& t : (*record)["metadata"]["transports"]) {
      if (t["name"] != "rdma") continue;
      found = true;
      EXPECT_EQ(t["ports"], nlohmann::json::parse(R"([{"device":"sim_rdma0","ib_port":1,"link_layer":"Ethernet"}])"))
          << t.dump();
    }
    EXPECT_TRUE(found) << record->dump();
  }
}

// "auto" towards a peer that registers only later: chosen once its record appears.
TEST(PeerAgentCpp, AutoWaitsForAPeerThatRegistersLater) {
  SimRdmaDevice sim;
  StartedCtrl ctrl;
  PeerAgent a(agent(ctrl.server.url(), "al_a"));
  PeerConnection ca = a.connect_to("al_b", with_transport("auto"));
  EXPECT_EQ(ca.transport(), "auto");
  EXPECT_EQ(ca.selection_reason(), "");
  EXPECT_EQ(ca.endpoint(), nullptr);
  PeerAgent b(agent(ctrl.server.url(), "al_b"));
  ca.wait(10s);
  EXPECT_EQ(ca.transport(), rdma_built() ? "rdma" : "tcp") << ca.selection_reason();
  EXPECT_FALSE(ca.selection_reason().empty());
}

namespace {

// Reports a NIC of its own in endpoint_info() ("device", as an RDMA endpoint does) and
// forwards everything else to the TCP endpoint it wraps: two NIC pairs between two agents
// on a host whose only RDMA device is the simulated one.
class NicLabelled final : public Endpoint {
 public:
  NicLabelled(std::shared_ptr<Endpoint> inner, std::string nic) : inner_(std::move(inner)), nic_(std::move(nic)) {}
  nlohmann::json endpoint_info() const override {
    nlohmann::json info = inner_->endpoint_info();
    info["device"] = nic_;
    return info;
  }
  void connect(const nlohmann::json& peer_info) override { inner_->connect(peer_info); }
  bool is_connected() const override { return inner_->is_connected(); }
  int32_t register_memory_region(const std::string& name, uintptr_t addr, uint64_t offset, uint64_t length) override {
    return inner_->register_memory_region(name, addr, offset, length);
  }
  int32_t register_remote_memory_region(const std::string& name, const nlohmann::json& entry) override {
    return inner_->register_remote_memory_region(name, entry);
  }
  void unregister_memory_region(const std::string& name) override { inner_->unregister_memory_region(name); }
  void unregister_memory_region(int32_t handle) override { inner_->unregister_memory_region(handle); }
  nlohmann::json mr_info() const override { return inner_->mr_info(); }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  void shutdown() override { inner_->shutdown(); }

 protected:
  Future do_submit(OpRequest request) override { return inner_->submit(std::move(request)); }

 private:
  std::shared_ptr<Endpoint> inner_;
  std::string nic_;
};

// An agent whose endpoints report the NICs <prefix>0, <prefix>1, ... in the order made.
PeerAgentOptions labelled(const std::string& url, const std::string& alias, const std::string& prefix) {
  PeerAgentOptions o = agent(url, alias);
  auto next = std::make_shared<std::atomic<int>>(0);
  o.wrap_endpoint = [prefix, next](std::shared_ptr<Endpoint> ep) -> std::shared_ptr<Endpoint> {
    return std::make_shared<NicLabelled>(std::move(ep), prefix + std::to_string(next->fetch_add(1)));
  };
  return o;
}

}  // namespace

// Connections are keyed by peer and NIC pair (upstream DLSlime's): connect_to on another
// local_device makes a second connection to the same peer, the passive side makes its
// mirror, and each carries its own bytes. Without local_nic/remote_nic, I/O and
// connection() refuse to guess between them, naming each pair.
TEST(PeerAgentCpp, SeveralConnectionsToOnePeerAreKeyedByTheirNicPair) {
  StartedCtrl ctrl;
  PeerAgent a(labelled(ctrl.server.url(), "np_a", "anic"));
  PeerAgent b(labelled(ctrl.server.url(), "np_b", "bnic"));
  std::vector<uint8_t> src(8192), dst0(8192, 0), dst1(8192, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 31 + 7);
  a.register_memory_region("src", addr_of(src), 0, src.size());
  b.register_memory_region("dst0", addr_of(dst0), 0, dst0.size());
  b.register_memory_region("dst1", addr_of(dst1), 0, dst1.size());

  ConnectOptions on0 = tcp(), on1 = tcp();
  on0.local_device = "anic0";
  on1.local_device = "anic1";
  PeerConnection c0 = a.connect_to("np_b", on0);
  c0.wait(10s);
  PeerConnection c1 = a.connect_to("np_b", on1);
  c1.wait(10s);
  EXPECT_NE(c0.conn_id(), c1.conn_id());
  EXPECT_EQ(c0.local_nic(), "anic0");
  EXPECT_EQ(c1.local_nic(), "anic1");
  EXPECT_EQ(c0.remote_nic(), "bnic0");
  EXPECT_EQ(c1.remote_nic(), "bnic1");
  ASSERT_TRUE(wait_until([&] {
    auto all = b.connections("np_a");
    return all.size() == 2 && all[0].is_connected() && all[1].is_connected();
  }));
  EXPECT_EQ(a.connections("np_b").size(), 2u);
  EXPECT_EQ(a.peers(), std::vector<std::string>{"np_b"});
  // The same pair again is the live connection, not a third.
  EXPECT_EQ(a.connect_to("np_b", on1).conn_id(), c1.conn_id());
  EXPECT_EQ(a.connections("np_b").size(), 2u);

  // Ambiguous: the error names both pairs.
  try {
    a.send("np_b", {addr_of(src), 0, 8});
    FAIL() << "an ambiguous send was accepted";
  } catch (const InvalidArgumentError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("local_nic='anic0' remote_nic='bnic0'"), std::string::npos) << what;
    EXPECT_NE(what.find("local_nic='anic1' remote_nic='bnic1'"), std::string::npos) << what;
  }
  EXPECT_THROW(a.connection("np_b"), InvalidArgumentError);
  EXPECT_EQ(a.connection("np_b", {"anic1", ""})->conn_id(), c1.conn_id());
  EXPECT_EQ(a.connection("np_b", {"", "bnic0"})->conn_id(), c0.conn_id());
  EXPECT_FALSE(a.connection("np_b", {"anic0", "bnic1"}).has_value());
  EXPECT_THROW(a.write("np_b", std::vector<NamedAssignment>{{"src", "dst0", 0, 0, 8}}, {"anic0", "bnic1"}),
               ConnectionError);

  // Each connection moves its own bytes.
  auto w0 = a.write("np_b", std::vector<NamedAssignment>{{"src", "dst0", 0, 0, src.size()}}, {"anic0", ""});
  auto w1 = a.write("np_b", std::vector<NamedAssignment>{{"src", "dst1", 0, 0, 4096}}, {"", "bnic1"});
  ASSERT_EQ(w0.wait_for(10s), std::optional<int>(0)) << w0.message();
  ASSERT_EQ(w1.wait_for(10s), std::optional<int>(0)) << w1.message();
  EXPECT_EQ(dst0, src);
  EXPECT_TRUE(std::equal(src.begin(), src.begin() + 4096, dst1.begin()));
  // A message sent on one pair arrives at the recv posted on that pair's mirror.
  std::string msg = "on pair one";
  std::vector<char> inbox0(32, 0), inbox1(32, 0);
  auto r0 = b.recv("np_a", {reinterpret_cast<uintptr_t>(inbox0.data()), 0, inbox0.size()}, {"bnic0", ""});
  auto r1 = b.recv("np_a", {reinterpret_cast<uintptr_t>(inbox1.data()), 0, inbox1.size()}, {"bnic1", "anic1"});
  ASSERT_EQ(a.send("np_b", {reinterpret_cast<uintptr_t>(msg.data()), 0, msg.size()}, {"anic1", ""}).wait_for(10s),
            std::optional<int>(0));
  ASSERT_EQ(r1.wait_for(10s), std::optional<int>(0)) << r1.message();
  EXPECT_EQ(std::string(inbox1.data(), r1.nbytes()), msg);
  EXPECT_FALSE(r0.done()) << "the message reached the other pair's recv";
  a.shutdown();
  EXPECT_TRUE(r0.wait_for(10s).has_value()) << "the other pair's recv hung after the peer left";
}

// An agent publishes its RDMA ports from the transport registry's port listing (the device
// layer), not by opening an endpoint on each device: making one allocates no QP. (QP
// numbers are handed out in sequence by the device, so an endpoint made in between shows as
// a gap.)
TEST(PeerAgentCpp, PublishingRdmaPortsMakesNoEndpoint) {
  SimRdmaDevice sim;
  StartedCtrl ctrl;
  if (!rdma_built()) {
    // Nothing to list: the record names no rdma transport.
    PeerAgent a(agent(ctrl.server.url(), "pp_a"));
    const nlohmann::json record = a.agent_record("pp_a").value();  // held: the loop reads into it
    for (const auto& t : record.at("metadata")["transports"]) EXPECT_NE(t["name"], "rdma");
    return;
  }
  auto first_qpn = [](const std::shared_ptr<Endpoint>& e) {
    return e->endpoint_info()["qp_info"][0]["qpn"].get<uint32_t>();
  };
  auto e1 = make_endpoint("rdma", nlohmann::json::object());
  auto e2 = make_endpoint("rdma", nlohmann::json::object());
  const uint32_t step = first_qpn(e2) - first_qpn(e1);
  {
    PeerAgent a(agent(ctrl.server.url(), "pp_a"));
    auto record = a.agent_record("pp_a");
    ASSERT_TRUE(record.has_value());
    bool published = false;
    for (const auto& t : (*record)["metadata"]["transports"]) {
      if (t["name"] == "rdma") {
        published = true;
        EXPECT_EQ(t["ports"], nlohmann::json::parse(R"([{"device":"sim_rdma0","ib_port":1,"link_layer":"Ethernet"}])"));
      }
    }
    EXPECT_TRUE(published) << record->dump();
  }
  auto e3 = make_endpoint("rdma", nlohmann::json::object());
  EXPECT_EQ(first_qpn(e3) - first_qpn(e2), step) << "making the agent made an endpoint (QPs)";
  for (auto& e : {e1, e2, e3}) e->shutdown();
}

namespace {

// DLSLIME_GPU_SIM=1 (the simulated GPU, so nvlink is available) for the agents made while it
// lives; the previous value comes back after.
class SimGpu {
 public:
  SimGpu() {
    if (const char* v = std::getenv("DLSLIME_GPU_SIM")) saved_ = v;
    ::setenv("DLSLIME_GPU_SIM", "1", 1);
  }
  ~SimGpu() { saved_ ? ::setenv("DLSLIME_GPU_SIM", saved_->c_str(), 1) : ::unsetenv("DLSLIME_GPU_SIM"); }

 private:
  std::optional<std::string> saved_;
};

bool nvlink_built() {
  for (const auto& t : available_transports()) {
    if (t.name == "nvlink") return t.built;
  }
  return false;
}

std::string boot_id() {
  std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r");
  char buf[64] = {};
  if (f) {
    if (!std::fgets(buf, sizeof buf, f)) buf[0] = 0;
    std::fclose(f);
  }
  std::string id(buf);
  while (!id.empty() && id.back() == '\n') id.pop_back();
  return id;
}

// Registers a fabricated agent record (no agent behind it, so it never answers a handshake):
// what transport="auto" chooses from. `nvlink`: its nvlink entry, or null for none.
void fake_peer(const std::string& url, const std::string& alias, const nlohmann::json& nvlink,
               bool with_rdma = false) {
  nlohmann::json transports = {{{"name", "tcp"}, {"devices", nlohmann::json::array()}}};
  if (with_rdma) {
    transports.push_back({{"name", "rdma"},
                          {"devices", {"sim_rdma0"}},
                          {"ports", {{{"device", "sim_rdma0"}, {"ib_port", 1}, {"link_layer", "Ethernet"}}}}});
  }
  if (!nvlink.is_null()) transports.push_back(nvlink);
  NanoCtrlClient(url).start_peer_agent(
      {{"alias", alias}, {"address", "127.0.0.1"}, {"metadata", {{"transports", transports}}}});
}

// An nvlink entry as agents published it before `uuid` and `reaches` (peer access unknown).
nlohmann::json nvlink_entry(const std::string& host, const std::string& runtime, int device) {
  return {{"name", "nvlink"}, {"devices", {"sim:0", "sim:1"}}, {"host", host}, {"runtime", runtime}, {"device", device}};
}

// One as agents publish it now: its GPU's UUID and the UUIDs of the GPUs that GPU can access.
nlohmann::json nvlink_entry(const std::string& host, int device, const nlohmann::json& uuid,
                            const nlohmann::json& reaches) {
  nlohmann::json e = nvlink_entry(host, "sim", device);
  e["uuid"] = uuid;
  e["reaches"] = reaches;
  return e;
}

// The nvlink entry agent `alias` publishes (null when it publishes none).
nlohmann::json published_nvlink(PeerAgent& a, const std::string& alias) {
  const nlohmann::json record = a.agent_record(alias).value();
  for (const auto& t : record.at("metadata")["transports"]) {
    if (t["name"] == "nvlink") return t;
  }
  return nullptr;
}

// selection_reason names the chosen transport's reason first, then each transport ranked
// above it with why it was passed over, "(name: why)", in rank order.
bool mentions(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

// The agent publishes what transport="auto" compares for NVLink: the host's boot id, the GPU
// runtime, its GPU (nvlink_device), that GPU's UUID and the UUIDs it can access (on the
// simulated GPU: both devices); a GPU the runtime does not have is refused.
TEST(PeerAgentCpp, AgentsPublishTheirNvlinkHostRuntimeAndGpu) {
  StartedCtrl ctrl;
  SimGpu gpu;
  PeerAgentOptions o = agent(ctrl.server.url(), "nv_pub");
  o.transport_options["nvlink"]["device"] = 1;
  PeerAgent a(o);
  const nlohmann::json entry = published_nvlink(a, "nv_pub");
  if (!nvlink_built()) {
    EXPECT_TRUE(entry.is_null()) << entry.dump();
    return;
  }
  ASSERT_TRUE(entry.is_object());
  EXPECT_EQ(entry["host"], boot_id());
  EXPECT_EQ(entry["runtime"], "sim");
  EXPECT_EQ(entry["device"], 1);
  EXPECT_EQ(entry["devices"], nlohmann::json({"sim:0", "sim:1"}));
  ASSERT_TRUE(entry["uuid"].is_string()) << entry.dump();
  const std::string uuid = entry["uuid"];
  EXPECT_EQ(uuid.size(), 32u) << uuid;
  EXPECT_EQ(uuid.find_first_not_of("0123456789abcdef"), std::string::npos) << uuid;
  PeerAgentOptions o0 = agent(ctrl.server.url(), "nv_pub0");  // GPU 0
  PeerAgent a0(o0);
  const nlohmann::json entry0 = published_nvlink(a0, "nv_pub0");
  ASSERT_TRUE(entry0["uuid"].is_string()) << entry0.dump();
  EXPECT_NE(entry0["uuid"], entry["uuid"]);
  EXPECT_EQ(entry["reaches"], nlohmann::json({entry0["uuid"], entry["uuid"]}));
  EXPECT_EQ(entry0["reaches"], entry["reaches"]);
  PeerAgentOptions bad = agent(ctrl.server.url(), "nv_bad");
  bad.transport_options["nvlink"]["device"] = 2;  // the simulated GPU has devices 0 and 1
  try {
    PeerAgent refused(bad);
    ADD_FAILURE() << "an agent on a GPU the runtime does not have";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("nvlink device 2 is not a GPU of this process (the sim runtime has 2)"),
              std::string::npos)
        << e.what();
  }
}

// transport="auto" with NVLink, from fabricated peer records (the choice is made as soon as
// the peer's record is known, before any handshake): NVLink on one host with the same GPU
// runtime, else RDMA or TCP, the reason saying why NVLink was not taken. These records are
// an older agent's (no `uuid`/`reaches`): peer access is taken, and said not to be checked.
TEST(PeerAgentCpp, AutoPrefersNvlinkOnOneHostAndSaysWhyNotOtherwise) {
  StartedCtrl ctrl;
  SimGpu gpu;
  SimRdmaDevice rdma;
  const std::string url = ctrl.server.url();
  PeerAgent a(agent(url, "na_a"));  // GPU 0
  fake_peer(url, "na_same", nvlink_entry(boot_id(), "sim", 1));
  fake_peer(url, "na_gpu0", nvlink_entry(boot_id(), "sim", 0));
  fake_peer(url, "na_far", nvlink_entry("another-boot-id", "sim", 0), /*with_rdma=*/true);
  fake_peer(url, "na_cuda", nvlink_entry(boot_id(), "cuda", 0));
  fake_peer(url, "na_none", nullptr);
  auto reason = [&](const std::string& peer) {
    PeerConnection c = a.connect_to(peer, with_transport("auto"));
    return std::make_pair(c.transport(), c.selection_reason());
  };
  if (!nvlink_built()) {
    // Not built: nothing about NVLink is published, compared, or said.
    auto [t, why] = reason("na_same");
    EXPECT_EQ(t, "tcp") << why;
    EXPECT_EQ(why.find("nvlink"), std::string::npos) << why;
    return;
  }
  const std::string host = a.agent_record("na_a")->at("address").get<std::string>();
  auto [t1, why1] = reason("na_same");
  EXPECT_EQ(t1, "nvlink");
  EXPECT_EQ(why1, "nvlink: both agents on host " + host +
                      ", GPU 0 -> GPU 1 via the simulated GPU's IPC (peer access between the GPUs is not checked)");
  EXPECT_EQ(std::string(a.connection("na_same")->endpoint()->capabilities().transport), "nvlink");
  auto [t2, why2] = reason("na_gpu0");
  EXPECT_EQ(t2, "nvlink");
  EXPECT_EQ(why2, "nvlink: both agents on host " + host + ", GPU 0 -> GPU 0 via the simulated GPU's IPC");
  auto [t3, why3] = reason("na_far");
  EXPECT_EQ(t3, rdma_built() ? "rdma" : "tcp") << why3;
  EXPECT_TRUE(mentions(why3, " (nvlink: the peer agent 'na_far' is on another host)")) << why3;
  if (rdma_built()) EXPECT_EQ(why3.rfind("rdma: both agents serve RoCE (sim_rdma0 here, sim_rdma0 on 'na_far')", 0), 0u);
  auto [t4, why4] = reason("na_cuda");
  EXPECT_EQ(t4, "tcp");
  EXPECT_TRUE(mentions(why4, " (nvlink: the peer agent 'na_cuda' uses the cuda GPU runtime, this agent the sim one)"))
      << why4;
  auto [t5, why5] = reason("na_none");
  EXPECT_EQ(t5, "tcp");
  EXPECT_EQ(why5.rfind("tcp: both agents serve it (", 0), 0u) << why5;
  EXPECT_TRUE(mentions(why5, rdma_built() ? "(rdma: the peer agent 'na_none' does not serve it)"
                                          : "(rdma: not available here ("))
      << why5;
  EXPECT_TRUE(mentions(why5, " (nvlink: the peer agent 'na_none' does not serve it)")) << why5;
}

// With `uuid` and `reaches` published, "auto" takes NVLink only when each GPU can access the
// other (both sides compare the same two entries, so they agree), else says which GPU cannot
// reach which and falls to RDMA or TCP.
TEST(PeerAgentCpp, AutoTakesNvlinkOnlyBetweenGpusThatReachEachOther) {
  StartedCtrl ctrl;
  SimGpu gpu;
  const std::string url = ctrl.server.url();
  PeerAgent a(agent(url, "nr_a"));  // GPU 0
  if (!nvlink_built()) return;      // nothing about NVLink is published (the test above)
  const nlohmann::json mine = published_nvlink(a, "nr_a");
  const std::string u0 = mine.at("uuid"), u1 = mine.at("reaches").at(1);
  ASSERT_NE(u0, u1);
  const std::string far(32, 'f');  // a GPU this one cannot access
  fake_peer(url, "nr_reach", nvlink_entry(boot_id(), 1, u1, {u0, u1}));
  fake_peer(url, "nr_unreached", nvlink_entry(boot_id(), 1, far, {far, u0}));
  fake_peer(url, "nr_noreach", nvlink_entry(boot_id(), 1, u1, nlohmann::json::array({u1})));
  fake_peer(url, "nr_malformed", nvlink_entry(boot_id(), 1, 5, "everything"));
  auto reason = [&](const std::string& peer) {
    PeerConnection c = a.connect_to(peer, with_transport("auto"));
    return std::make_pair(c.transport(), c.selection_reason());
  };
  const std::string host = a.agent_record("nr_a")->at("address").get<std::string>();
  auto [t1, why1] = reason("nr_reach");
  EXPECT_EQ(t1, "nvlink");
  EXPECT_EQ(why1, "nvlink: both agents on host " + host + ", GPU 0 -> GPU 1 via the simulated GPU's IPC");
  auto [t2, why2] = reason("nr_unreached");
  EXPECT_EQ(t2, "tcp");
  EXPECT_TRUE(mentions(why2, " (nvlink: GPU " + u0.substr(0, 8) + " cannot access GPU ffffffff of 'nr_unreached')"))
      << why2;
  auto [t3, why3] = reason("nr_noreach");
  EXPECT_EQ(t3, "tcp");
  EXPECT_TRUE(mentions(why3, " (nvlink: GPU " + u1.substr(0, 8) + " of 'nr_noreach' cannot access GPU " +
                                   u0.substr(0, 8) + ")"))
      << why3;
  auto [t4, why4] = reason("nr_malformed");
  EXPECT_EQ(t4, "tcp");
  EXPECT_TRUE(mentions(why4, " (nvlink: the peer agent 'nr_malformed' publishes no valid GPU uuid and reaches)"))
      << why4;
}

// An explicit transport="nvlink" to a peer that cannot take it fails at once, saying why,
// instead of waiting for an answer that never comes.
// Hostile review N9: a record anyone may write (NanoCtrl without a token) with fields of the
// wrong type makes that transport unusable for that peer, with the reason in
// selection_reason, never a raw JSON error from connect_to.
TEST(PeerAgentCpp, MalformedPeerRecordsMakeATransportUnusableWithAReason) {
  StartedCtrl ctrl;
  SimRdmaDevice sim;
  SimGpu gpu;
  const std::string url = ctrl.server.url();
  PeerAgent a(agent(url, "mf_a"));
  const nlohmann::json tcp_entry = {{"name", "tcp"}, {"devices", nlohmann::json::array()}};
  NanoCtrlClient(url).start_peer_agent(
      {{"alias", "mf_port"},
       {"address", "127.0.0.1"},
       {"metadata",
        {{"transports",
          {tcp_entry,
           {{"name", "rdma"},
            {"devices", {"sim_rdma0"}},
            {"ports", {{{"device", "sim_rdma0"}, {"ib_port", "x"}, {"link_layer", "Ethernet"}}, 5}}}}}}}});
  NanoCtrlClient(url).start_peer_agent(
      {{"alias", "mf_names"},
       {"address", "127.0.0.1"},
       {"metadata", {{"transports", {5, nullptr, {{"name", 7}}, {{"name", "nvlink"}, {"host", 9}}, tcp_entry}}}}});
  for (const std::string peer : {"mf_port", "mf_names"}) {
    PeerConnection c = a.connect_to(peer, with_transport("auto"));  // used to throw a JSON type_error
    EXPECT_EQ(c.transport(), "tcp") << peer;
    if (rdma_built() && peer == "mf_port") {
      EXPECT_TRUE(mentions(c.selection_reason(), "(rdma: the peer agent 'mf_port' publishes 2 malformed RDMA port(s) "
                                                 "(each needs a string device and link_layer and an integer ib_port))"))
          << c.selection_reason();
    }
  }
  if (nvlink_built()) {
    PeerConnection c = a.connect_to("mf_names", with_transport("nvlink"));
    try {
      c.wait(5s);
      ADD_FAILURE() << "nvlink to a malformed record connected";
    } catch (const ConnectionError& e) {
      EXPECT_NE(std::string(e.what()).find("transport \"nvlink\" cannot reach the peer agent 'mf_names': the peer "
                                           "agent 'mf_names' is on another host"),
                std::string::npos)
          << e.what();
    }
  }
}

// Hostile review N10: each connect_to() towards a registered agent that never answers holds
// an endpoint while "connecting". The attempts are bounded (max_connecting): the one past
// the bound fails at once and holds nothing, and an attempt that ends frees its place.
TEST(PeerAgentCpp, ConnectAttemptsInProgressAreBoundedAndFreeTheirPlaceWhenTheyEnd) {
  StartedCtrl ctrl;
  const std::string url = ctrl.server.url();
  PeerAgentOptions options = agent(url, "mc_a");
  options.max_connecting = 3;
  PeerAgent a(options);
  // The real peer registers only after the descriptors are counted: its handshake with `a`
  // would open and close sockets in this process meanwhile.
  std::optional<PeerAgent> b;
  for (int i = 0; i < 3; ++i) fake_peer(url, "mc_ghost" + std::to_string(i), nullptr);
  std::vector<PeerConnection> held;
  for (const char* peer : {"mc_ghost0", "mc_ghost1", "mc_real"}) held.push_back(a.connect_to(peer, tcp()));
  for (const auto& c : held) EXPECT_EQ(c.state(), "connecting");
  const size_t fds = fd_count();
  try {
    a.connect_to("mc_ghost2", tcp());
    ADD_FAILURE() << "a fourth attempt was taken";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("3 connect_to() attempts in progress, the most it allows (max_connecting)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(fd_count(), fds) << "the refused attempt holds nothing";
  // The attempt to the real agent ends (connected) once it registers: its place is free again.
  b.emplace(agent(url, "mc_real"));
  b->connect_to("mc_a", tcp()).wait(10s);
  held[2].wait(10s);
  PeerConnection fourth = a.connect_to("mc_ghost2", tcp());
  EXPECT_EQ(fourth.state(), "connecting");
  PeerAgentOptions none = agent(url, "mc_zero");
  none.max_connecting = 0;
  EXPECT_THROW(PeerAgent{none}, InvalidArgumentError);
}

TEST(PeerAgentCpp, ACtrlTimeoutOfZeroOrLessIsRefusedBeforeAnythingIsDialed) {
  for (const auto t : {std::chrono::milliseconds(0), std::chrono::milliseconds(-5)}) {
    PeerAgentOptions o = agent("http://127.0.0.1:9", "ct_zero");  // never dialed
    o.ctrl_timeout = t;
    try {
      PeerAgent a(o);
      ADD_FAILURE() << "ctrl_timeout " << t.count() << " ms was accepted";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("ctrl_timeout must be positive"), std::string::npos) << e.what();
    }
  }
}

TEST(PeerAgentCpp, ExplicitNvlinkToAPeerThatCannotTakeItFailsAtOnce) {
  StartedCtrl ctrl;
  SimGpu gpu;
  const std::string url = ctrl.server.url();
  PeerAgent a(agent(url, "ne_a"));
  if (!nvlink_built()) {
    EXPECT_THROW(a.connect_to("ne_b", with_transport("nvlink")), NotImplementedError);
    return;
  }
  fake_peer(url, "ne_far", nvlink_entry("another-boot-id", "sim", 0));
  fake_peer(url, "ne_none", nullptr);
  const std::string far(32, 'f');
  fake_peer(url, "ne_unreached", nvlink_entry(boot_id(), 1, far, nlohmann::json::array({far})));
  auto failure = [&](const std::string& peer) -> std::string {
    PeerConnection c = a.connect_to(peer, with_transport("nvlink"));
    try {
      c.wait(5s);
    } catch (const ConnectionError& e) {
      EXPECT_EQ(c.state(), "failed");
      return e.what();
    }
    return "connected";
  };
  EXPECT_NE(failure("ne_far").find("transport \"nvlink\" cannot reach the peer agent 'ne_far': the peer agent 'ne_far' "
                                   "is on another host; choose another or transport=\"auto\""),
            std::string::npos);
  const std::string u0 = published_nvlink(a, "ne_a").at("uuid");
  EXPECT_NE(failure("ne_unreached")
                .find("transport \"nvlink\" cannot reach the peer agent 'ne_unreached': GPU " + u0.substr(0, 8) +
                      " cannot access GPU ffffffff of 'ne_unreached'; choose another or transport=\"auto\""),
            std::string::npos);
  EXPECT_NE(failure("ne_none").find("the peer agent 'ne_none' does not serve transport \"nvlink\" (it serves: tcp)"),
            std::string::npos);
}

// Issue 23: an agent that connects, writes and leaves at once does not break its peer. A
// connection is up once both directions are, so the writer cannot leave while the reader's
// dial to it is in flight (tests/python/test_peer_agent_leave_first.py runs that 50 times
// under load); and a reader that calls connect_to() only after the writer has left gets the
// connection the writer made with it, whose handshake completed, not a new attempt towards
// an agent that is gone. Once an agent registers under that alias again, connect_to()
// connects to it.
TEST(PeerAgentCpp, ConnectToAfterThePeerWroteAndLeftReturnsTheCompletedConnection) {
  StartedCtrl ctrl;
  const std::string url = ctrl.server.url();
  PeerAgent reader(agent(url, "lf_reader"));
  std::vector<uint8_t> dst(4096, 0), src(4096);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 13 + 5);
  reader.register_memory_region("dst", addr_of(dst), 0, dst.size());
  std::string passive_id;
  {
    PeerAgent writer(agent(url, "lf_writer"));
    writer.register_memory_region("src", addr_of(src), 0, src.size());
    PeerConnection c = writer.connect_to("lf_reader", tcp());
    c.wait(10s);
    // Up on the writer means the reader's side dialed; the reader's is up once the
    // writer's "dialed" reaches it.
    std::optional<PeerConnection> passive = reader.connection("lf_writer");
    ASSERT_TRUE(passive.has_value());
    EXPECT_TRUE(wait_until([&] { return passive->state() == "connected"; }, 10s)) << passive->state();
    passive_id = passive->conn_id();
    EXPECT_EQ(named_write(writer, "lf_reader", "src", "dst", src.size()), 0);
  }  // the writer leaves
  EXPECT_TRUE(wait_until([&] { return !reader.connection("lf_writer").has_value(); }, 10s))
      << "the writer's cleanup did not reach the reader";
  PeerConnection late = reader.connect_to("lf_writer", tcp());
  EXPECT_NO_THROW(late.wait(5s));
  EXPECT_EQ(late.conn_id(), passive_id);
  EXPECT_EQ(late.state(), "closed");
  EXPECT_EQ(dst, src);
  // A new agent under the alias: a new connection.
  PeerAgent again(agent(url, "lf_writer"));
  PeerConnection fresh = reader.connect_to("lf_writer", tcp());
  fresh.wait(10s);
  EXPECT_NE(fresh.conn_id(), passive_id);
  EXPECT_EQ(fresh.state(), "connected");
}
