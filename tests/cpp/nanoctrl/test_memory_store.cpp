#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "nanoctrl/memory_store.h"

using namespace std::chrono_literals;
using dlslime::nanoctrl::glob_escape;
using dlslime::nanoctrl::glob_match;
using dlslime::nanoctrl::MemoryStore;
using dlslime::nanoctrl::Millis;

namespace {

// Polls `cond` until it holds or `limit` passes.
template <typename F>
bool eventually(F cond, std::chrono::milliseconds limit = 5000ms) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return cond();
}

}  // namespace

TEST(Glob, MatchesStarsAndEscapes) {
  EXPECT_TRUE(glob_match("a:*", "a:b"));
  EXPECT_TRUE(glob_match("a:*:c", "a:x:y:c"));
  EXPECT_FALSE(glob_match("a:*:c", "a:x:y:d"));
  EXPECT_TRUE(glob_match(glob_escape("a*b?[c]\\") + "*", "a*b?[c]\\tail"));
  EXPECT_FALSE(glob_match(glob_escape("a*b"), "axxb"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_FALSE(glob_match("", "x"));
}

TEST(MemoryStore, StringsExpireAndSetIfAbsent) {
  MemoryStore s;
  EXPECT_TRUE(s.set_if_absent("k", "v1", Millis(50)));
  EXPECT_FALSE(s.set_if_absent("k", "v2", Millis(50)));
  EXPECT_EQ(s.get("k"), "v1");
  EXPECT_TRUE(eventually([&] { return !s.get("k").has_value(); }));
  EXPECT_FALSE(s.expire("k", Millis(50)));
  EXPECT_TRUE(s.set_if_absent("k", "v3", Millis(0)));
  EXPECT_TRUE(s.expire("k", Millis(10000)));
  EXPECT_EQ(s.del({"k", "missing"}), 1u);
  EXPECT_EQ(s.incr("n"), 1);
  EXPECT_EQ(s.incr("n"), 2);
}

TEST(MemoryStore, KeysByPattern) {
  MemoryStore s;
  s.set("p:a:agent:x", "1", Millis(0));
  s.set("p:a:agent:y", "1", Millis(0));
  s.set("p:b:agent:z", "1", Millis(0));
  s.set("p:a:mr:x:m", "1", Millis(0));
  EXPECT_EQ(s.keys("p:a:agent:*"), (std::vector<std::string>{"p:a:agent:x", "p:a:agent:y"}));
  EXPECT_EQ(s.keys("p:*:agent:*").size(), 3u);
  auto m = s.mget({"p:a:agent:x", "nope"});
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], "1");
  EXPECT_FALSE(m[1].has_value());
}

TEST(MemoryStore, ListPopWakesWaiterPromptly) {
  MemoryStore s;
  auto waiter = std::async(std::launch::async, [&] {
    auto t0 = std::chrono::steady_clock::now();
    auto items = s.list_pop("box", 10, Millis(5000));
    return std::make_pair(items, std::chrono::steady_clock::now() - t0);
  });
  std::this_thread::sleep_for(50ms);  // let it block; correctness does not depend on this
  auto pushed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(s.list_push("box", "m1", 10, Millis(0)), 1u);
  auto [items, waited] = waiter.get();
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0], "m1");
  EXPECT_LT(std::chrono::steady_clock::now() - pushed_at, 1000ms);
  EXPECT_LT(waited, 4000ms);
}

TEST(MemoryStore, ListBoundsBatchesAndTimeouts) {
  MemoryStore s;
  EXPECT_EQ(s.list_push("q", "a", 2, Millis(0)), 1u);
  EXPECT_EQ(s.list_push("q", "b", 2, Millis(0)), 2u);
  EXPECT_FALSE(s.list_push("q", "c", 2, Millis(0)).has_value());
  EXPECT_EQ(s.list_len("q"), 2u);
  EXPECT_EQ(s.list_pop("q", 5, Millis(0)), (std::vector<std::string>{"a", "b"}));
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(s.list_pop("q", 1, Millis(30)).empty());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 25ms);
}

TEST(MemoryStore, InterruptReleasesWaiters) {
  MemoryStore s;
  auto waiter = std::async(std::launch::async, [&] { return s.list_pop("box", 1, Millis(60000)); });
  std::this_thread::sleep_for(20ms);
  s.interrupt();
  ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(waiter.get().empty());
  EXPECT_TRUE(s.list_pop("box", 1, Millis(60000)).empty());  // returns at once now
}

TEST(MemoryStore, Sets) {
  MemoryStore s;
  s.set_add("s", "b");
  s.set_add("s", "a");
  s.set_add("s", "a");
  EXPECT_EQ(s.set_members("s"), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(s.set_members("none").empty());
}
