// Core lifetime contracts every transport inherits (issue 10, items 1, 3, 10): a region
// is unregistered only once nothing in flight uses it; continuations run after the
// bookkeeping of the code that completed their op; an exception in an I/O handler closes
// that connection instead of leaving it without a read posted.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>

#include "core/op_state.h"
#include "core/memory_registry.h"
#include "dlslime/errors.h"
#include "dlslime/tcp_endpoint.h"
#include "tcp/frame_codec.h"
#include "tcp/tcp_connection.h"

using namespace dlslime;
using namespace std::chrono_literals;

namespace {

// Takes a use of region `handle` as a transport would (a cached resolve).
RegionUse use_of(MemoryRegistry& t, int32_t handle) {
  ResolveCache cache;
  uintptr_t addr = 0;
  EXPECT_TRUE(t.resolve(handle, 0, 1, &addr, cache).is_ok());
  return cache.use;
}

struct FakeRevoker : RegionRevoker {
  std::function<void()> on_revoke;
  bool own_thread = false;
  std::atomic<int> revoked{0};
  void revoke_region(const RegionLifetime&) override {
    ++revoked;
    if (on_revoke) on_revoke();
  }
  bool on_own_thread() const override { return own_thread; }
};

}  // namespace

TEST(RegionLifetime, UnregisterWaitsUntilTheLastUseIsDropped) {
  MemoryRegistry t;
  static uint8_t mem[64];
  const int32_t h = t.add("r", reinterpret_cast<uintptr_t>(mem), 0, sizeof mem);
  auto use = std::make_unique<RegionUse>(use_of(t, h));
  std::atomic<bool> returned{false};
  std::thread unregister([&] {
    t.remove("r");
    returned = true;
  });
  // New lookups fail at once, while the in-flight use still holds unregister.
  uintptr_t addr = 0;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (t.resolve(h, 0, 1, &addr).is_ok() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(t.resolve(h, 0, 1, &addr).code(), StatusCode::kUnknownHandle);
  EXPECT_FALSE(returned.load());
  use.reset();  // the transfer finished
  unregister.join();
  EXPECT_TRUE(returned.load());
}

TEST(RegionLifetime, UsesPastTheDrainTimeoutAreRevoked) {
  MemoryRegistry t;
  t.set_drain_timeout(50ms);
  static uint8_t mem[64];
  const int32_t h = t.add("r", reinterpret_cast<uintptr_t>(mem), 0, sizeof mem);
  auto use = std::make_unique<RegionUse>(use_of(t, h));
  auto revoker = std::make_shared<FakeRevoker>();
  revoker->on_revoke = [&] { use.reset(); };  // the transport fails the op holding it
  t.watch(revoker);
  t.remove(h);
  EXPECT_EQ(revoker->revoked.load(), 1);
}

TEST(RegionLifetime, OnTheTransportsOwnThreadRevokesWithoutWaiting) {
  MemoryRegistry t;  // default drain timeout: 5 s, which this must not wait out
  static uint8_t mem[64];
  const int32_t h = t.add("r", reinterpret_cast<uintptr_t>(mem), 0, sizeof mem);
  auto use = std::make_unique<RegionUse>(use_of(t, h));
  auto revoker = std::make_shared<FakeRevoker>();
  revoker->own_thread = true;
  revoker->on_revoke = [&] { use.reset(); };
  t.watch(revoker);
  const auto t0 = std::chrono::steady_clock::now();
  t.remove(h);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_EQ(revoker->revoked.load(), 1);
}

TEST(RegionLifetime, ReplacingANameDrainsTheOldRegion) {
  MemoryRegistry t;
  static uint8_t a[64], b[64];
  const int32_t h = t.add("r", reinterpret_cast<uintptr_t>(a), 0, sizeof a);
  auto use = std::make_unique<RegionUse>(use_of(t, h));
  std::atomic<bool> returned{false};
  std::thread replace([&] {
    t.add("r", reinterpret_cast<uintptr_t>(b), 0, sizeof b);
    returned = true;
  });
  uintptr_t addr = 0;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (t.resolve(h, 0, 1, &addr).is_ok() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_FALSE(returned.load()) << "re-registration returned with the old region in use";
  use.reset();
  replace.join();
  EXPECT_TRUE(returned.load());
  EXPECT_NE(t.find("r"), std::optional<int32_t>(h));
}

// Item 3: a continuation that shuts the endpoint down while the deadline sweep iterates
// the posted receives runs after the sweep, not inside it (ASan: heap-use-after-free
// before).
TEST(Continuations, ShutdownFromARecvTimeoutContinuationIsSafe) {
  TcpOptions o;
  o.recv_timeout = 20ms;
  auto ep = std::make_shared<TcpEndpoint>("127.0.0.1", 0, o);
  std::vector<uint8_t> box(64 * 8);
  std::vector<Future> recvs;
  for (int i = 0; i < 8; ++i) recvs.push_back(ep->recv({reinterpret_cast<uintptr_t>(box.data()), 64u * i, 64}));
  std::atomic<int> ran{0};
  recvs[0].state()->on_complete([&](const OpState&) {
    ep->shutdown();
    ++ran;
  });
  for (auto& f : recvs) ASSERT_TRUE(f.wait_for(10s).has_value());
  EXPECT_EQ(recvs[0].status(), static_cast<int>(StatusCode::kTimeout));
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (ran.load() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(ran.load(), 1);
  for (auto& f : recvs) EXPECT_NE(f.status(), 0);
}

// Item 10: an exception from a frame handler closes the connection with a status that
// says so (its ops fail) instead of leaving it with no read posted.
TEST(TcpConnection, AnExceptionInAFrameHandlerClosesTheConnection) {
  struct Throwing : tcp::FrameHandler {
    Status closed_with;
    int closes = 0;
    tcp::RxAction on_header(tcp::TcpConnection&, const tcp::FrameHeader&, tcp::PayloadSink&) override {
      throw std::runtime_error("handler bug");
    }
    void on_prefix(tcp::TcpConnection&, const tcp::FrameHeader&, std::string_view, tcp::PayloadSink&) override {}
    void on_frame(tcp::TcpConnection&, const tcp::FrameHeader&, const tcp::PayloadSink&, std::string_view) override {}
    void on_closed(tcp::TcpConnection&, const Status& why) override {
      closed_with = why;
      ++closes;
    }
  } handler;
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  socket.assign(asio::ip::tcp::v4(), sv[0]);
  auto conn = std::make_shared<tcp::TcpConnection>(std::move(socket), &handler, tcp::TcpConnection::Role::kAccepted, 0);
  conn->start();
  tcp::FrameHeader h;
  h.type = tcp::FrameType::kGoodbye;
  uint8_t raw[tcp::kFrameHeaderSize];
  tcp::encode_frame_header(h, raw);
  ASSERT_EQ(::write(sv[1], raw, sizeof raw), static_cast<ssize_t>(sizeof raw));
  for (int i = 0; i < 1000 && conn->is_open(); ++i) io.run_one_for(10ms);
  EXPECT_FALSE(conn->is_open());
  EXPECT_EQ(handler.closes, 1);
  EXPECT_EQ(handler.closed_with.code(), StatusCode::kFailed);
  EXPECT_NE(handler.closed_with.message().find("handler bug"), std::string::npos);
  ::close(sv[1]);
}
