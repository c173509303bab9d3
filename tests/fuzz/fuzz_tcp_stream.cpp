// libFuzzer target: an arbitrary byte stream arriving on an accepted TCP connection, after
// a valid hello, through the real receive path: TcpConnection (staging buffer, header
// validation, direct reads, pause/resume) and TcpEndpointImpl's frame handlers (region
// table resolve and bounds checks, write acks, read answers, two-sided message assembly,
// the unexpected-message buffer).
//
// Setup per input: a fresh TcpEndpointImpl (not started: it accepts no connections), the
// fuzz input written into one end of a socketpair whose other end is wrapped in an asio
// socket and handed to a TcpConnection as an accepted lane. Everything runs on this thread
// with a private io_context. The endpoint's regions are heap blocks of exactly the
// registered size, so a placement outside a region is an ASan report. The input is fed
// until the connection closes (protocol error, EOF) or stops making progress (paused by
// flow control), then the connection is closed, which fails and resets the endpoint.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>

#include "core/log.h"
#include "core/memory_registry.h"
#include "dlslime/logging.h"
#include "fuzz_common.h"
#include "core/io_runtime.h"
#include "tcp/tcp_connection.h"
#include "tcp/tcp_endpoint_impl.h"

using namespace dlslime;
using namespace dlslime::tcp;

namespace {

struct Fixture {
  Fixture() {
    set_log_level("off");
    regions = std::make_shared<MemoryRegistry>();
    // handle 0: 4 KiB; handle 1: 64 bytes; handle 2: unregistered (stale); handle 3: 1 byte.
    r0 = static_cast<uint8_t*>(std::malloc(4096));
    r1 = static_cast<uint8_t*>(std::malloc(64));
    r3 = static_cast<uint8_t*>(std::malloc(1));
    std::memset(r0, 0xA5, 4096);
    std::memset(r1, 0x5A, 64);
    r3[0] = 7;
    FUZZ_CHECK(regions->add("r0", reinterpret_cast<uintptr_t>(r0), 0, 4096) == 0);
    FUZZ_CHECK(regions->add("r1", reinterpret_cast<uintptr_t>(r1), 0, 64) == 1);
    static uint8_t gone[16];
    FUZZ_CHECK(regions->add("gone", reinterpret_cast<uintptr_t>(gone), 0, sizeof gone) == 2);
    regions->remove("gone");
    FUZZ_CHECK(regions->add("r3", reinterpret_cast<uintptr_t>(r3), 0, 1) == 3);
    options.unexpected_buffer_bytes = 64 * 1024;  // small, so flow control (pause) is reachable
    options.op_timeout = std::chrono::milliseconds(0);
    // Keeps the process-wide I/O pool alive between inputs (it stops with its last user,
    // and starting a thread per input would dominate the run time).
    runtime = IoRuntime::shared();
  }
  std::shared_ptr<IoRuntime> runtime;
  std::shared_ptr<MemoryRegistry> regions;
  uint8_t* r0;
  uint8_t* r1;
  uint8_t* r3;
  TcpOptions options;
  asio::io_context io;
};

Fixture& fixture() {
  static Fixture* f = new Fixture();  // never destroyed: the I/O runtime outlives inputs
  return *f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Fixture& fx = fixture();
  auto ep = std::make_shared<TcpEndpointImpl>("127.0.0.1", 0, fx.options, fx.regions);

  int sv[2];
  FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  const int feeder = sv[1];
  FUZZ_CHECK(::fcntl(feeder, F_SETFL, ::fcntl(feeder, F_GETFL) | O_NONBLOCK) == 0);

  asio::ip::tcp::socket socket(fx.io);
  std::error_code ec;
  socket.assign(asio::ip::tcp::v4(), sv[0], ec);
  FUZZ_CHECK(!ec);
  auto conn = std::make_shared<TcpConnection>(std::move(socket), ep.get(), TcpConnection::Role::kAccepted, 0);
  conn->start();

  size_t sent = 0;
  bool eof_sent = false;
  int idle_rounds = 0;
  static uint8_t sink[1 << 16];
  for (int round = 0; round < 1000000 && idle_rounds < 3; ++round) {
    bool progress = false;
    if (sent < size) {
      const ssize_t n = ::send(feeder, data + sent, size - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        progress = true;
      }
    } else if (!eof_sent) {
      ::shutdown(feeder, SHUT_WR);  // the peer finished sending: EOF after the last byte
      eof_sent = true;
      progress = true;
    }
    if (fx.io.stopped()) fx.io.restart();
    if (fx.io.poll() > 0) progress = true;
    // Read what the endpoint answers (acks, read data) so its writes never block.
    for (;;) {
      const ssize_t n = ::recv(feeder, sink, sizeof sink, 0);
      if (n <= 0) break;
      progress = true;
    }
    if (!conn->is_open() && !progress) break;
    idle_rounds = progress ? 0 : idle_rounds + 1;
  }
  // Paused (flow control) or stuck: closing fails the lane and resets the endpoint.
  if (conn->is_open()) conn->close(Status::peer_closed("fuzz input consumed"));
  if (fx.io.stopped()) fx.io.restart();
  while (fx.io.poll() > 0) {
  }
  ::close(feeder);
  conn.reset();
  ep->shutdown();
  return 0;
}
