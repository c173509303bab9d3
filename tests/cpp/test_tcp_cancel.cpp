// Future::cancel on TCP where the timing matters (docs/api.md "Cancellation"): a read whose
// request is out and whose target is slow is cancelled, and its late answer never lands.
// The target is held deterministically: a continuation on its I/O thread waits (with a
// deadline) until the test lets it go, and the two endpoints run on different I/O threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/io_runtime.h"
#include "dlslime/future.h"
#include "dlslime/tcp_endpoint.h"
#include "test_support.h"

using namespace dlslime;
using namespace dlslime::test_support;
using namespace std::chrono_literals;

namespace {

Chunk chunk_of(std::vector<uint8_t>& buf) { return {addr_of(buf), 0, buf.size()}; }

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + 5);
  return v;
}

// Two endpoints on different I/O threads (a runtime of two, round robin), connected.
struct SplitPair {
  std::shared_ptr<IoRuntime> runtime = IoRuntime::shared(two_threads());
  TcpEndpoint a{"127.0.0.1", 0}, b{"127.0.0.1", 0};
  static IoRuntimeOptions two_threads() {
    IoRuntimeOptions o;
    o.threads = 2;
    return o;
  }
  void connect() {
    a.connect(b.endpoint_info());
    b.connect(a.endpoint_info());
  }
  ~SplitPair() {
    a.shutdown();
    b.shutdown();
  }
};

// Holds b's I/O thread in a continuation (of a recv that a's message completes) until
// open() (at the latest when the gate is destroyed). The message's acknowledgement, queued
// by that same handler, goes out once b's thread is free again.
class Gate {
 public:
  explicit Gate(SplitPair& p) : box_(16), msg_(16, 1) {
    Future hold = p.b.recv(chunk_of(box_));
    hold.on_complete([held = held_, opened = opened_](const Future&) {
      held->set_value();
      opened.wait_for(20s);  // a deadline: a failing test never hangs here
    });
    sent_ = p.a.send(chunk_of(msg_));
    closed_ = held_->get_future().wait_for(10s) == std::future_status::ready;
  }
  ~Gate() { open(); }
  bool closed() const { return closed_; }
  void open() {
    if (!std::exchange(open_, true)) release_.set_value();
  }
  const Future& sent() const { return sent_; }

 private:
  std::shared_ptr<std::promise<void>> held_ = std::make_shared<std::promise<void>>();
  std::promise<void> release_;
  std::shared_future<void> opened_ = release_.get_future().share();
  bool open_ = false, closed_ = false;
  std::vector<uint8_t> box_, msg_;
  Future sent_;
};

// Returns once a's I/O thread has run everything posted to it before, and what that
// posted in turn (frames queued by a submit are flushed by a handler the drain posts):
// each cancel of a fresh recv is one hop to that thread, queued behind it.
void let_a_flush(TcpEndpoint& a) {
  for (int i = 0; i < 2; ++i) {
    std::vector<uint8_t> unused(8);
    ASSERT_TRUE(a.recv(chunk_of(unused)).cancel());
  }
}

}  // namespace

TEST(TcpCancel, AReadWhoseTargetIsSlowIsCancelledAfterItsRequestIsOutAndItsLateAnswerNeverLands) {
  // The memory outlives the endpoints (declared first): only their shutdown says that
  // nothing reads or writes it any more.
  constexpr size_t size = 4 << 20;
  std::vector<uint8_t> src = pattern(size), dst(size, 0), other(size, 0);
  SplitPair p;
  ASSERT_EQ(p.runtime->size(), 2u) << "an I/O runtime of another test is still alive; this test needs two threads";
  p.connect();
  p.b.register_memory_region("src", addr_of(src), 0, size);
  const int32_t h_dst = p.a.register_memory_region("dst", addr_of(dst), 0, size);
  const int32_t h_other = p.a.register_memory_region("other", addr_of(other), 0, size);
  const int32_t h_src = p.a.register_remote_memory_region("src", p.b.endpoint_info()["mr_info"]["src"]);
  Gate gate(p);
  ASSERT_TRUE(gate.closed());

  // The read's requests go out; b cannot answer them yet.
  Future rd = p.a.read({{h_dst, h_src, 0, 0, size}});
  let_a_flush(p.a);
  ASSERT_TRUE(rd.cancel()) << "a read whose answer has not started must be withdrawn";
  EXPECT_EQ(rd.status(), static_cast<int>(StatusCode::kCancelled)) << rd.message();
  std::fill(dst.begin(), dst.end(), 0xEE);  // from here on no byte of the read may land

  gate.open();
  EXPECT_EQ(gate.sent().wait_for(20s), std::optional<int>(0)) << gate.sent().message();
  // b answers the request now; later reads on both lanes complete after that answer.
  std::vector<Future> later;
  for (int i = 0; i < 2; ++i) later.push_back(p.a.read({{h_other, h_src, 0, 0, size}}));
  for (auto& f : later) ASSERT_EQ(f.wait_for(20s), std::optional<int>(0)) << f.message();
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](uint8_t x) { return x == 0xEE; }))
      << "the late answer to the cancelled read landed in its buffer";
  EXPECT_EQ(other, src);
  EXPECT_TRUE(p.a.is_connected()) << "cancelling must not close a lane";
}

// A write and a send whose frames are all on the wire (small enough for the sockets'
// buffers) are cancelled while the target cannot take them: they end CANCELLED, their
// memory is not read again, the target places the write's bytes (the docs: the target may
// hold them) and receives the message whole; the late acknowledgements are ignored.
TEST(TcpCancel, AWriteAndASendWhoseFramesAreOnTheWireAreCancelledAndTheReceiverGetsTheMessageWhole) {
  constexpr size_t size = 16 << 10;  // with the message, well within the sockets' buffers
  const std::vector<uint8_t> bytes = pattern(size);
  std::vector<uint8_t> src = bytes, dst(size, 0), msg = bytes, inbox(size, 0), src2(16, 7);
  SplitPair p;  // after the memory: shut down before it goes
  ASSERT_EQ(p.runtime->size(), 2u) << "an I/O runtime of another test is still alive; this test needs two threads";
  p.connect();
  const int32_t h_src = p.a.register_memory_region("src", addr_of(src), 0, size);
  p.b.register_memory_region("dst", addr_of(dst), 0, size);
  const int32_t h_dst = p.a.register_remote_memory_region("dst", p.b.endpoint_info()["mr_info"]["dst"]);
  Gate gate(p);
  ASSERT_TRUE(gate.closed());
  Future rv = p.b.recv(chunk_of(inbox));  // taken by b's thread once it is free

  Future w = p.a.write({{h_src, h_dst, 0, 0, size}});
  Future sd = p.a.send(chunk_of(msg));
  let_a_flush(p.a);
  ASSERT_TRUE(w.cancel()) << "a write whose frames are all on the wire must end now";
  ASSERT_TRUE(sd.cancel()) << "a send whose frames are all on the wire must end now";
  EXPECT_EQ(w.status(), static_cast<int>(StatusCode::kCancelled)) << w.message();
  EXPECT_EQ(sd.status(), static_cast<int>(StatusCode::kCancelled)) << sd.message();
  std::fill(src.begin(), src.end(), 0xEE);  // read after the cancel, these would arrive
  std::fill(msg.begin(), msg.end(), 0xEE);

  gate.open();
  EXPECT_EQ(gate.sent().wait_for(20s), std::optional<int>(0)) << gate.sent().message();
  ASSERT_EQ(rv.wait_for(20s), std::optional<int>(0)) << rv.message();
  EXPECT_EQ(rv.nbytes(), size);
  EXPECT_EQ(inbox, bytes) << "the receiver did not get the cancelled message whole";
  // A later write on the same lanes is acknowledged after the cancelled one's frames.
  const int32_t h_src2 = p.a.register_memory_region("src2", addr_of(src2), 0, src2.size());
  for (int i = 0; i < 2; ++i) {
    auto later = p.a.write({{h_src2, h_dst, size - 16, 0, 16}});
    ASSERT_EQ(later.wait_for(20s), std::optional<int>(0)) << later.message();
  }
  EXPECT_TRUE(std::equal(dst.begin(), dst.end() - 16, bytes.begin())) << "the write's bytes were not the original";
  EXPECT_EQ(w.status(), static_cast<int>(StatusCode::kCancelled));
  EXPECT_EQ(sd.status(), static_cast<int>(StatusCode::kCancelled));
  EXPECT_TRUE(p.a.is_connected());
}
