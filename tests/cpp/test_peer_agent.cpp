// PeerAgent from C++: an embedded NanoCtrl, two agents, a named write and a message.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dlslime/errors.h"
#include "dlslime/nanoctrl.h"
#include "dlslime/peer_agent.h"

using namespace dlslime;
using namespace std::chrono_literals;

namespace {

NanoCtrlConfig local_ctrl() {
  NanoCtrlConfig c;
  c.port = 0;
  return c;
}

PeerAgentOptions agent(const std::string& url, const std::string& alias) {
  PeerAgentOptions o;
  o.ctrl_url = url;
  o.alias = alias;
  return o;
}

ConnectOptions tcp() {
  ConnectOptions o;
  o.transport = "tcp";
  return o;
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

  EXPECT_THROW(a.connect_to("cpp_b", ConnectOptions{}), Error);  // rdma: not available
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
    o.tcp.token = tcp_token;
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
