// The embedded server and the C++ client, against both stores.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "dlslime/errors.h"
#include "dlslime/nanoctrl.h"
#include "dlslime/nanoctrl_client.h"
#include "redis_process.h"

using namespace std::chrono_literals;
using dlslime::NanoCtrlClient;
using dlslime::NanoCtrlConfig;
using dlslime::NanoCtrlServer;
using nlohmann::json;
using nanoctrl_test::RedisProcess;

namespace {

template <typename F>
bool eventually(F cond, std::chrono::milliseconds limit = 10000ms) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return cond();
}

// Mailbox receives the server holds blocked right now (its /metrics gauge); -1 if unreadable.
int64_t blocked_receives(const std::string& url) {
  httplib::Client http(url);
  auto res = http.Get("/metrics");
  if (!res || res->status != 200) return -1;
  const std::string key = "\nnanoctrl_mailbox_waiters ";
  const auto at = res->body.find(key);
  if (at == std::string::npos) return -1;
  return std::stoll(res->body.substr(at + key.size()));
}

NanoCtrlConfig config(const std::string& redis_url = "") {
  NanoCtrlConfig c;
  c.port = 0;
  c.redis_url = redis_url;
  c.ttl = 1000ms;
  c.redis_timeout = 500ms;
  return c;
}

class ServerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "redis") redis_ = std::make_unique<RedisProcess>();
    server_ = std::make_unique<NanoCtrlServer>(config(redis_ ? redis_->url() : ""));
    server_->start();
  }
  void TearDown() override {
    server_->stop();
    server_.reset();
    redis_.reset();
  }

  std::unique_ptr<RedisProcess> redis_;
  std::unique_ptr<NanoCtrlServer> server_;
};

}  // namespace

TEST_P(ServerTest, AgentLifecycleThroughClient) {
  NanoCtrlClient c(server_->url());
  EXPECT_EQ(c.healthz()["status"], "ok");
  EXPECT_EQ(c.healthz()["store"], GetParam());
  json a = c.start_peer_agent({{"alias", "a"}, {"address", "10.0.0.1"}});
  EXPECT_EQ(a["name"], "a");
  EXPECT_THROW(c.start_peer_agent({{"alias", "a"}}), dlslime::Error);  // 409
  std::string auto_name = c.start_peer_agent(json::object())["name"];
  EXPECT_EQ(auto_name.rfind("agent-", 0), 0u);
  EXPECT_EQ(c.query().size(), 2u);
  EXPECT_EQ(c.heartbeat("a"), "ok");
  EXPECT_EQ(c.heartbeat("ghost"), "not_found");

  c.register_mr("a", "kv", {{"addr", 4096}, {"length", 64}});
  EXPECT_EQ(c.get_mr_info("a", "kv")->at("length"), 64);
  EXPECT_FALSE(c.get_mr_info("a", "nope").has_value());
  EXPECT_EQ(c.get_peer_agent("a")->at("memory_keys"), json::array({"kv"}));
  EXPECT_THROW(c.register_mr("ghost", "kv", json::object()), dlslime::NotFoundError);

  // The record expires without heartbeats (ttl 1 s).
  EXPECT_TRUE(eventually([&] { return !c.get_peer_agent(auto_name).has_value(); }));
  EXPECT_EQ(c.heartbeat(auto_name), "not_found");
}

TEST_P(ServerTest, MailboxDeliversToWaiterPromptly) {
  NanoCtrlClient c(server_->url());
  c.start_peer_agent({{"alias", "rx"}});
  c.start_peer_agent({{"alias", "tx"}});
  auto waiter = std::async(std::launch::async, [&] { return c.recv("rx", 10s, 4); });
  // Post only once the server holds the receive: this measures the wake-up of a waiter.
  ASSERT_TRUE(eventually([&] { return blocked_receives(server_->url()) == 1; }));
  auto sent = std::chrono::steady_clock::now();
  EXPECT_EQ(c.post("rx", {{"hello", 1}}, "tx"), 1u);
  auto got = waiter.get();
  auto latency = std::chrono::steady_clock::now() - sent;
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0]["from"], "tx");
  EXPECT_EQ(got[0]["message"]["hello"], 1);
  EXPECT_LT(latency, 2000ms);
  EXPECT_TRUE(c.recv("rx", 50ms).empty());  // times out empty

  // cleanup of tx notifies rx, its mailbox peer
  json r = c.cleanup("tx");
  EXPECT_EQ(r["notified"], json::array({"rx"}));
  auto note = c.recv("rx", 1s);
  ASSERT_EQ(note.size(), 1u);
  EXPECT_EQ(note[0]["message"], (json{{"type", "cleanup"}, {"peer", "tx"}}));
}

TEST_P(ServerTest, ScopesAreIsolated) {
  NanoCtrlClient s1(server_->url(), "team1");
  NanoCtrlClient s2(server_->url(), "team2");
  s1.start_peer_agent({{"alias", "same"}});
  s2.start_peer_agent({{"alias", "same"}});  // no conflict across scopes
  s1.start_peer_agent({{"alias", "only1"}});
  EXPECT_EQ(s1.query().size(), 2u);
  EXPECT_EQ(s2.query().size(), 1u);
  EXPECT_FALSE(s2.get_peer_agent("only1").has_value());
  EXPECT_THROW(s2.post("only1", "hi"), dlslime::NotFoundError);
}

TEST_P(ServerTest, ClientMapsErrors) {
  NanoCtrlClient c(server_->url());
  EXPECT_THROW(c.call("/start_peer_agent", {{"alias", 5}}), dlslime::InvalidArgumentError);
  EXPECT_THROW(c.call("/no_such_route", json::object()), dlslime::NotFoundError);
  NanoCtrlClient dead("http://127.0.0.1:" + std::to_string(nanoctrl_test::free_port()), "", 500ms);
  EXPECT_THROW(dead.query(), dlslime::ConnectionError);
}

INSTANTIATE_TEST_SUITE_P(Stores, ServerTest, ::testing::Values("memory", "redis"),
                         [](const auto& info) { return info.param; });

TEST(RedisOutage, Answers503AndRecovers) {
  RedisProcess redis;
  NanoCtrlServer server(config(redis.url()));
  server.start();
  NanoCtrlClient c(server.url());
  c.start_peer_agent({{"alias", "a"}});
  redis.stop();
  EXPECT_THROW(c.query(), dlslime::ConnectionError);  // 503
  EXPECT_THROW(c.healthz(), dlslime::ConnectionError);
  redis.start();  // same port, empty data
  EXPECT_TRUE(eventually([&] {
    try {
      return c.healthz()["status"] == "ok";
    } catch (const dlslime::Error&) {
      return false;
    }
  }));
  EXPECT_EQ(c.start_peer_agent({{"alias", "b"}})["name"], "b");
  server.stop();
}

TEST(ServerConfig, RejectsBadValues) {
  NanoCtrlConfig c;
  c.redis_url = "http://nope";
  EXPECT_THROW(NanoCtrlServer{c}, dlslime::InvalidArgumentError);
  c = {};
  c.max_waiters = 5000;
  EXPECT_THROW(NanoCtrlServer{c}, dlslime::InvalidArgumentError);
  c = {};
  c.port = 0;
  c.redis_url = "redis://127.0.0.1:" + std::to_string(nanoctrl_test::free_port());
  NanoCtrlServer s(c);
  EXPECT_THROW(s.start(), dlslime::ConnectionError);  // Redis not there
}

TEST(ServerConfig, PortInUseIsReported) {
  NanoCtrlServer a(config());
  a.start();
  NanoCtrlConfig c = config();
  c.port = a.port();
  NanoCtrlServer b(c);
  EXPECT_THROW(b.start(), dlslime::ConnectionError);
}
