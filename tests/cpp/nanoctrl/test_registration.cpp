// Alias registration is atomic in both stores, and a cleanup removes only the registration
// that made it (issue 10, item 20).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "dlslime/nanoctrl.h"
#include "nanoctrl/control_service.h"
#include "nanoctrl/memory_store.h"
#include "nanoctrl/redis_store.h"
#include "nanoctrl/request.h"
#include "redis_process.h"

using namespace std::chrono_literals;
using dlslime::NanoCtrlConfig;
using dlslime::nanoctrl::ApiError;
using dlslime::nanoctrl::ControlService;
using nlohmann::json;
using nanoctrl_test::RedisProcess;

namespace {

class RegistrationTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    config_.ttl = 60000ms;
    if (GetParam() == "redis") {
      redis_ = std::make_unique<RedisProcess>();
      store_ = std::make_unique<dlslime::nanoctrl::RedisStore>(dlslime::nanoctrl::RedisUrl::parse(redis_->url()),
                                                               2000ms);
    } else {
      store_ = std::make_unique<dlslime::nanoctrl::MemoryStore>();
    }
    service_ = std::make_unique<ControlService>(*store_, config_);
  }

  // The HTTP status a call ends with (200 when it returns).
  template <typename F>
  static int status_of(F&& call) {
    try {
      call();
      return 200;
    } catch (const ApiError& e) {
      return e.status();
    }
  }

  NanoCtrlConfig config_;
  std::unique_ptr<RedisProcess> redis_;
  std::unique_ptr<dlslime::nanoctrl::Store> store_;
  std::unique_ptr<ControlService> service_;
};

}  // namespace

TEST_P(RegistrationTest, TwentyRacersForOneAliasExactlyOneWins) {
  constexpr int kThreads = 20;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<int> status(kThreads, 0);
  std::vector<std::string> incarnation(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      status[i] = status_of([&] {
        json reply = service_->start_peer_agent({{"alias", "x"}, {"address", std::to_string(i)}});
        incarnation[i] = reply.at("incarnation").get<std::string>();
      });
      // A loser cleans up as the buggy agent did, naming a registration it never had: this
      // must not delete the winner, or a later racer would "win" too.
      if (status[i] == 409) {
        status_of([&] { service_->cleanup({{"agent_name", "x"}, {"incarnation", "not-mine-" + std::to_string(i)}}); });
        status[i] = status_of([&] { service_->start_peer_agent({{"alias", "x"}}); });
      }
    });
  }
  while (ready.load() < kThreads) std::this_thread::yield();
  go = true;
  for (auto& t : threads) t.join();

  int winners = 0;
  std::string winning;
  for (int i = 0; i < kThreads; ++i) {
    if (status[i] == 200) {
      ++winners;
      winning = incarnation[i];
    } else {
      EXPECT_EQ(status[i], 409) << "racer " << i;
    }
  }
  ASSERT_EQ(winners, 1);
  EXPECT_EQ(winning.size(), 32u);
  json live = service_->get_peer_agent({{"name", "x"}});
  EXPECT_EQ(live["agent"]["incarnation"], winning);
}

TEST_P(RegistrationTest, CleanupWithAnotherIncarnationIsRefusedAndKeepsTheLiveAgent) {
  json first = service_->start_peer_agent({{"alias", "a"}});
  service_->register_mr({{"agent_name", "a"}, {"mr_name", "kv"}, {"addr", 1}, {"length", 2}});
  EXPECT_EQ(status_of([&] { service_->cleanup({{"agent_name", "a"}, {"incarnation", "0123"}}); }), 409);
  json live = service_->get_peer_agent({{"name", "a"}});
  EXPECT_EQ(live["agent"]["memory_keys"], json::array({"kv"}));
  EXPECT_FALSE(service_->get_mr_info({{"dst", "a"}, {"mr_name", "kv"}})["mr_info"].is_null());

  // A heartbeat naming another registration does not keep this one alive.
  EXPECT_EQ(service_->heartbeat({{"entity_id", "a"}, {"incarnation", "0123"}})["status"], "not_found");
  EXPECT_EQ(service_->heartbeat({{"entity_id", "a"}, {"incarnation", first["incarnation"]}})["status"], "ok");

  // Its own incarnation removes it; the alias then registers afresh with a new incarnation,
  // and the old incarnation cannot remove the new agent.
  json done = service_->cleanup({{"agent_name", "a"}, {"incarnation", first["incarnation"]}});
  EXPECT_EQ(done["existed"], true);
  json second = service_->start_peer_agent({{"alias", "a"}});
  EXPECT_NE(second["incarnation"], first["incarnation"]);
  EXPECT_EQ(status_of([&] { service_->cleanup({{"agent_name", "a"}, {"incarnation", first["incarnation"]}}); }), 409);
  EXPECT_EQ(service_->get_peer_agent({{"name", "a"}})["agent"]["incarnation"], second["incarnation"]);

  // Without an incarnation (upstream clients) a cleanup works as before.
  EXPECT_EQ(service_->cleanup({{"agent_name", "a"}})["existed"], true);
  EXPECT_EQ(status_of([&] { service_->get_peer_agent({{"name", "a"}}); }), 404);
  // A cleanup with an incarnation of an agent that is gone is a no-op success.
  EXPECT_EQ(service_->cleanup({{"agent_name", "a"}, {"incarnation", first["incarnation"]}})["existed"], false);
  EXPECT_EQ(status_of([&] { service_->cleanup({{"agent_name", "a"}, {"incarnation", ""}}); }), 400);
}

TEST_P(RegistrationTest, DelIfEqualComparesAndDeletesAtomically) {
  store_->set("k", "v1", 0ms);
  EXPECT_FALSE(store_->del_if_equal("k", "v2"));
  EXPECT_EQ(store_->get("k"), "v1");
  EXPECT_TRUE(store_->del_if_equal("k", "v1"));
  EXPECT_FALSE(store_->get("k").has_value());
  EXPECT_FALSE(store_->del_if_equal("k", "v1"));
}

INSTANTIATE_TEST_SUITE_P(Stores, RegistrationTest, ::testing::Values("memory", "redis"),
                         [](const auto& info) { return info.param; });
