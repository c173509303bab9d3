#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/memory_registry.h"
#include "core/remote_regions.h"
#include "dlslime/errors.h"

using namespace dlslime;

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

TEST(RangeWithin, Edges) {
  EXPECT_TRUE(range_within(100, 0, 0));
  EXPECT_TRUE(range_within(100, 0, 100));    // the whole region
  EXPECT_TRUE(range_within(100, 100, 0));    // empty range at the exact end
  EXPECT_TRUE(range_within(100, 99, 1));     // last byte
  EXPECT_FALSE(range_within(100, 99, 2));    // one past the end
  EXPECT_FALSE(range_within(100, 101, 0));   // starts past the end
  EXPECT_FALSE(range_within(100, 0, 101));
  EXPECT_TRUE(range_within(0, 0, 0));
  EXPECT_FALSE(range_within(0, 0, 1));
  // offset + length would wrap around to a small number.
  EXPECT_FALSE(range_within(100, 50, kMax));
  EXPECT_FALSE(range_within(100, kMax, 2));
  EXPECT_FALSE(range_within(kMax - 1, kMax - 1, 1));
  EXPECT_TRUE(range_within(kMax, kMax - 1, 1));
}

TEST(MemoryRegistry, ResolvesInsideAndRejectsOutside) {
  std::vector<uint8_t> buf(256);
  MemoryRegistry t;
  const auto base = reinterpret_cast<uintptr_t>(buf.data());
  int32_t h = t.add("kv", base, 16, 128);  // bytes [16, 144)
  uintptr_t addr = 0;
  ASSERT_TRUE(t.resolve(h, 0, 128, &addr).is_ok());
  EXPECT_EQ(addr, base + 16);
  ASSERT_TRUE(t.resolve(h, 128, 0, &addr).is_ok());
  EXPECT_EQ(t.resolve(h, 120, 9, &addr).code(), StatusCode::kOutOfBounds);
  EXPECT_EQ(t.resolve(h, kMax, 1, &addr).code(), StatusCode::kOutOfBounds);
  EXPECT_EQ(t.resolve(h + 1, 0, 1, &addr).code(), StatusCode::kUnknownHandle);
  EXPECT_EQ(t.resolve(-1, 0, 1, &addr).code(), StatusCode::kUnknownHandle);
}

TEST(MemoryRegistry, RejectsAddressOverflowAndNull) {
  MemoryRegistry t;
  EXPECT_THROW(t.add("x", std::numeric_limits<uintptr_t>::max() - 10, 5, 10), InvalidArgumentError);
  EXPECT_THROW(t.add("x", 0x1000, kMax, 1), InvalidArgumentError);
  EXPECT_THROW(t.add("x", 0, 0, 16), InvalidArgumentError);
  EXPECT_THROW(t.add("", 0x1000, 0, 16), InvalidArgumentError);
}

// Host memory the process cannot read (a guard page, an unmapped page) is refused at
// registration, naming the first bad address, rather than faulting an I/O thread on first
// use (hostile review 16m). Read-only memory is taken (a NIC registers it for remote reads).
// What is left is the caller's: keeping the mapping alive while it is registered.
TEST(MemoryRegistry, RefusesHostMemoryTheProcessCannotRead) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* p = ::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  const auto base = reinterpret_cast<uintptr_t>(p);
  ASSERT_EQ(::mprotect(reinterpret_cast<void*>(base + page), page, PROT_READ), 0);
  ASSERT_EQ(::mprotect(reinterpret_cast<void*>(base + 2 * page), page, PROT_NONE), 0);
  MemoryRegistry t;
  EXPECT_GE(t.add("rw", base, 0, page), 0);
  EXPECT_GE(t.add("read_only", base + page, 0, page), 0);
  EXPECT_GE(t.add("rw_and_read_only", base, 0, 2 * page), 0);
  auto refused = [&](const char* name, uintptr_t addr, uint64_t length, const std::string& why) {
    try {
      t.add(name, addr, 0, length);
      ADD_FAILURE() << name << " was registered";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
    EXPECT_TRUE(t.mr_info_of(name).is_null()) << name;
  };
  refused("prot_none", base + 2 * page, 16, fmt::format("memory at {:#x} is not readable (PROT_NONE", base + 2 * page));
  refused("into_prot_none", base, 3 * page, fmt::format("memory at {:#x} is not readable", base + 2 * page));
  refused("never_mapped", 0x1000, 16, "memory at 0x1000 is not mapped");
  ::munmap(p, 3 * page);
}

TEST(MemoryRegistry, HandlesAreNeverReused) {
  std::vector<uint8_t> a(64), b(64);
  MemoryRegistry t;
  int32_t h1 = t.add("r", reinterpret_cast<uintptr_t>(a.data()), 0, 64);
  EXPECT_EQ(t.add("r", reinterpret_cast<uintptr_t>(a.data()), 0, 64), h1);  // same bytes: same handle
  int32_t h2 = t.add("r", reinterpret_cast<uintptr_t>(b.data()), 0, 64);      // replaced
  EXPECT_NE(h1, h2);
  uintptr_t addr = 0;
  EXPECT_EQ(t.resolve(h1, 0, 1, &addr).code(), StatusCode::kUnknownHandle);
  t.remove("r");
  EXPECT_EQ(t.resolve(h2, 0, 1, &addr).code(), StatusCode::kUnknownHandle);
  int32_t h3 = t.add("r", reinterpret_cast<uintptr_t>(a.data()), 0, 64);
  EXPECT_NE(h3, h1);
  EXPECT_NE(h3, h2);
  EXPECT_THROW(t.remove("nope"), NotFoundError);
  EXPECT_THROW(t.remove(12345), NotFoundError);
}

TEST(MemoryRegistry, MrInfoDescribesRegions) {
  std::vector<uint8_t> a(64);
  MemoryRegistry t;
  int32_t h = t.add("a", reinterpret_cast<uintptr_t>(a.data()), 8, 32);
  auto info = t.mr_info();
  ASSERT_TRUE(info.contains("a"));
  EXPECT_EQ(info["a"]["handle"], h);
  EXPECT_EQ(info["a"]["length"], 32);
  EXPECT_EQ(info["a"]["addr"].get<uint64_t>(), reinterpret_cast<uintptr_t>(a.data()) + 8);
}

TEST(OwnerRemoteRegions, AddResolveAndValidate) {
  OwnerRemoteRegions t;
  auto add = [&](const std::string& name, const nlohmann::json& entry) { return add_owner_resolved(t, name, entry); };
  int32_t h = add("peer_kv", {{"handle", 5}, {"addr", 4096}, {"length", 100}});
  int32_t peer = -1;
  ASSERT_TRUE(t.resolve(h, 10, 90, &peer).is_ok());
  EXPECT_EQ(peer, 5);
  EXPECT_EQ(t.resolve(h, 10, 91, &peer).code(), StatusCode::kOutOfBounds);
  EXPECT_EQ(t.resolve(h + 7, 0, 1, &peer).code(), StatusCode::kUnknownHandle);
  // Same name: updated in place, same handle (DLSlime behaviour).
  EXPECT_EQ(add("peer_kv", {{"handle", 6}, {"length", 200}}), h);
  ASSERT_TRUE(t.resolve(h, 150, 50, &peer).is_ok());
  EXPECT_EQ(peer, 6);

  EXPECT_THROW(add("bad", nlohmann::json::object()), InvalidArgumentError);
  EXPECT_THROW(add("bad", {{"handle", "x"}, {"length", 1}}), InvalidArgumentError);
  EXPECT_THROW(add("bad", {{"handle", -1}, {"length", 1}}), InvalidArgumentError);
  EXPECT_THROW(add("bad", {{"handle", 1}, {"length", -5}}), InvalidArgumentError);
  EXPECT_THROW(add("bad", nlohmann::json::array()), InvalidArgumentError);
}

TEST(MemoryRegistry, CachedResolveMatchesUncached) {
  MemoryRegistry t;
  std::vector<uint8_t> a(128), b(64);
  const int32_t ha = t.add("a", reinterpret_cast<uintptr_t>(a.data()), 0, a.size());
  const int32_t hb = t.add("b", reinterpret_cast<uintptr_t>(b.data()), 16, 48);
  ResolveCache cache;
  uintptr_t got = 0, want = 0;
  // Switching between regions, and back: each answer is the uncached one.
  for (auto [h, off, len] : {std::tuple{ha, 0, 128}, std::tuple{hb, 8, 40}, std::tuple{ha, 100, 28},
                             std::tuple{ha, 128, 0}, std::tuple{hb, 48, 0}}) {
    ASSERT_TRUE(t.resolve(h, off, len, &got, cache).is_ok()) << h << " " << off;
    ASSERT_TRUE(t.resolve(h, off, len, &want).is_ok());
    EXPECT_EQ(got, want);
  }
  // Errors come with the same code and message, and do not poison the cache.
  const Status oob = t.resolve(ha, 120, 9, &got, cache);
  EXPECT_EQ(oob.code(), StatusCode::kOutOfBounds);
  EXPECT_EQ(oob.message(), t.resolve(ha, 120, 9, &want).message());
  EXPECT_EQ(t.resolve(ha + 100, 0, 1, &got, cache).code(), StatusCode::kUnknownHandle);
  EXPECT_EQ(t.resolve(hb, UINT64_MAX, 2, &got, cache).code(), StatusCode::kOutOfBounds);
  ASSERT_TRUE(t.resolve(hb, 0, 1, &got, cache).is_ok());
  EXPECT_EQ(got, reinterpret_cast<uintptr_t>(b.data()) + 16);
}

TEST(OwnerRemoteRegions, CachedResolveMatchesUncached) {
  OwnerRemoteRegions t;
  const int32_t h1 = t.add("x", 100, 5);
  const int32_t h2 = t.add("y", 10, 9);
  OwnerRemoteRegions::Cache cache;
  int32_t peer = -1;
  ASSERT_TRUE(t.resolve(h1, 0, 100, &peer, cache).is_ok());
  EXPECT_EQ(peer, 5);
  ASSERT_TRUE(t.resolve(h2, 9, 1, &peer, cache).is_ok());
  EXPECT_EQ(peer, 9);
  EXPECT_EQ(t.resolve(h2, 9, 2, &peer, cache).code(), StatusCode::kOutOfBounds);
  EXPECT_EQ(t.resolve(h2 + 50, 0, 1, &peer, cache).code(), StatusCode::kUnknownHandle);
  ASSERT_TRUE(t.resolve(h1, 99, 1, &peer, cache).is_ok());
  EXPECT_EQ(peer, 5);
}

// A transport's memory domain sees every region (those registered before it attached
// too), publishes its own mr_info entry, and can refuse a region for every transport.
namespace {
struct RecordingDomain final : MemoryDomain {
  std::vector<std::string> events;
  std::string refuse;  // a region name region_added throws for
  void region_added(int32_t h, const LocalRegion& r) override {
    if (r.name == refuse) throw InvalidArgumentError("cannot register " + r.name);
    events.push_back(fmt::format("+{}:{}:{}", r.name, h, memory_kind_name(r.kind)));
  }
  void region_removed(int32_t h, const LocalRegion& r) override { events.push_back(fmt::format("-{}:{}", r.name, h)); }
  nlohmann::json describe(int32_t h, const LocalRegion& r) const override {
    return {{"key", h * 10}, {"length", r.length}};
  }
};
}  // namespace

TEST(MemoryRegistry, DomainsObserveRegistrationsAndPublishTheirEntries) {
  MemoryRegistry reg;
  std::vector<uint8_t> a(64), b(64);
  const int32_t ha = reg.add("a", reinterpret_cast<uintptr_t>(a.data()), 0, 64);
  auto domain = std::make_shared<RecordingDomain>();
  reg.attach(domain);
  const int32_t hb = reg.add("b", reinterpret_cast<uintptr_t>(b.data()), 0, 32);
  EXPECT_EQ(domain->events, (std::vector<std::string>{fmt::format("+a:{}:host", ha), fmt::format("+b:{}:host", hb)}));
  EXPECT_EQ(reg.get(hb)->device, -1);  // host memory: the device memory cases are in test_tcp_gpu.cpp
  EXPECT_NE(reg.get(ha)->generation, reg.get(hb)->generation);

  const nlohmann::json info = reg.mr_info(*domain);
  EXPECT_EQ(info["b"]["key"], hb * 10);
  EXPECT_EQ(reg.mr_info()["b"]["handle"], hb);  // the owner-resolved (TCP) entry

  reg.remove("a");
  EXPECT_EQ(domain->events.back(), fmt::format("-a:{}", ha));

  // A domain refusing a region fails the registration for everyone: nothing is left.
  domain->refuse = "c";
  EXPECT_THROW(reg.add("c", reinterpret_cast<uintptr_t>(a.data()), 0, 8), InvalidArgumentError);
  EXPECT_FALSE(reg.find("c").has_value());
  EXPECT_FALSE(reg.find_containing(reinterpret_cast<uintptr_t>(a.data()), 8).has_value());
}

TEST(MemoryRegistry, FindContainingNamesTheRegionOfABuffer) {
  MemoryRegistry reg;
  std::vector<uint8_t> big(4096), other(128);
  const auto base = reinterpret_cast<uintptr_t>(big.data());
  const int32_t whole = reg.add("whole", base, 0, 4096);
  const int32_t o = reg.add("other", reinterpret_cast<uintptr_t>(other.data()), 0, 128);
  auto m = reg.find_containing(base + 100, 200);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->handle, whole);
  EXPECT_EQ(m->offset, 100u);
  EXPECT_EQ(reg.find_containing(reinterpret_cast<uintptr_t>(other.data()) + 127, 1)->handle, o);
  EXPECT_FALSE(reg.find_containing(base + 4000, 200).has_value());  // runs past the end
  EXPECT_FALSE(reg.find_containing(base - 1, 2).has_value());
  // Overlapping registrations: the newest that holds the whole range.
  const int32_t inner = reg.add("inner", base, 1024, 1024);
  EXPECT_EQ(reg.find_containing(base + 1500, 100)->handle, inner);
  EXPECT_EQ(reg.find_containing(base + 1500, 100)->offset, 476u);
  EXPECT_EQ(reg.find_containing(base + 1500, 1000)->handle, whole);
  reg.remove("inner");
  EXPECT_EQ(reg.find_containing(base + 1500, 100)->handle, whole);
}
