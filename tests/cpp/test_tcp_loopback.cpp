// What only TCP owes, through the public API of libdlslime: dialing a closed port, and
// hostile byte streams against a live endpoint. What every transport owes (transfers,
// offsets, errors, shutdown) is in test_conformance.cpp. The raw-socket helpers below
// re-encode the wire format by hand from docs/tcp.md on purpose: they check the documented
// protocol, not the library's codec.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dlslime/dlslime.h"

#include "test_support.h"

using namespace dlslime;
using namespace dlslime::test_support;
using namespace std::chrono_literals;

namespace {

struct Pair {
  TcpEndpoint a{"127.0.0.1", 0};
  TcpEndpoint b{"127.0.0.1", 0};
  void connect() {
    a.connect(b.endpoint_info());
    b.connect(a.endpoint_info());
  }
};

// A blocking loopback client socket with a receive timeout, so a test never hangs.
class RawClient {
 public:
  explicit RawClient(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  }
  ~RawClient() { ::close(fd_); }
  bool connected() const { return connected_; }
  void send(const std::vector<uint8_t>& bytes) { ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size())); }
  void finish_sending() { ::shutdown(fd_, SHUT_WR); }
  // Reads exactly n bytes, or fewer if the peer closed or 5 s passed.
  std::vector<uint8_t> recv(size_t n) {
    std::vector<uint8_t> out(n);
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::recv(fd_, out.data() + got, n - got, 0);
      if (r <= 0) break;
      got += size_t(r);
    }
    out.resize(got);
    return out;
  }
  // True if the peer closed the connection (EOF) within the receive timeout.
  bool sees_eof() {
    uint8_t b;
    for (;;) {
      ssize_t r = ::recv(fd_, &b, 1, 0);
      if (r == 0) return true;
      if (r < 0) return errno == ECONNRESET;
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

void put(std::vector<uint8_t>& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(uint8_t(v >> (8 * i)));
}

std::vector<uint8_t> hello(uint16_t version, uint64_t sender) {
  std::vector<uint8_t> h = {'D', 'L', 'S', 'L', 'I', 'M', 'E', 'H'};
  put(h, version, 2);
  put(h, 0, 2);  // flags
  put(h, 0, 2);  // lane index
  put(h, 1, 2);  // lane count
  put(h, sender, 8);
  put(h, 0, 8);  // target: any
  h.resize(64, 0);
  return h;
}

std::vector<uint8_t> frame(uint8_t type, uint64_t op_id, int32_t handle, uint64_t offset, uint64_t length) {
  std::vector<uint8_t> f;
  put(f, 0x5D1E, 2);
  f.push_back(type);
  f.push_back(0x1);  // last
  put(f, 0, 4);      // status
  put(f, op_id, 8);
  put(f, uint32_t(handle), 4);
  put(f, 0, 4);  // index
  put(f, offset, 8);
  put(f, length, 8);
  return f;
}

// A write frame (protocol v2) for one piece of `length` bytes at (handle, offset): the
// header and the piece list; the caller appends the bytes.
std::vector<uint8_t> write_frame(uint64_t op_id, int32_t handle, uint64_t offset, uint64_t length) {
  auto f = frame(/*write*/ 1, op_id, 0, /*pieces*/ 1, 24 + length);
  put(f, uint32_t(handle), 4);
  put(f, 0, 4);  // reserved
  put(f, offset, 8);
  put(f, length, 8);
  return f;
}

// Opens a raw connection that completed the hello. Returns the status in the reply.
int handshake(RawClient& c, uint16_t version = 3 /* kProtocolVersion */, uint64_t sender = 0xabcdef) {
  c.send(hello(version, sender));
  auto reply = c.recv(32);
  if (reply.size() != 32) return -1;
  return reply[10] | (reply[11] << 8);
}

void expect_pair_still_works(Pair& p) {
  std::vector<uint8_t> src(4096), dst(4096, 0);
  std::iota(src.begin(), src.end(), uint8_t(7));
  auto hs = p.a.register_memory_region("check_src", addr_of(src), 0, src.size());
  auto hd = p.b.register_memory_region("check_dst", addr_of(dst), 0, dst.size());
  auto hr = p.a.register_remote_memory_region("check_dst", p.b.endpoint_info()["mr_info"]["check_dst"]);
  auto f = p.a.write({{hs, hr, 0, 0, src.size()}});
  ASSERT_EQ(f.wait_for(10s), std::optional<int>(0)) << f.message();
  EXPECT_EQ(src, dst);
  (void)hd;
}

}  // namespace

TEST(TcpLoopback, ConnectToClosedPortFailsClearly) {
  uint16_t port;
  {
    TcpEndpoint gone("127.0.0.1", 0);
    port = gone.port();
  }
  TcpEndpoint a("127.0.0.1", 0);
  try {
    a.connect({{"host", "127.0.0.1"}, {"port", port}});
    FAIL() << "connect to a closed port succeeded";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find("refused"), std::string::npos) << e.what();
  }
}

TEST(TcpHostile, WrongVersionHelloIsRefusedWithAReason) {
  Pair p;
  RawClient c(p.b.port());
  ASSERT_TRUE(c.connected());
  c.send(hello(99, 0x1234));
  auto reply = c.recv(32);
  ASSERT_EQ(reply.size(), 32u);
  const int status = reply[10] | (reply[11] << 8);
  const uint32_t reason_len = reply[12] | (reply[13] << 8) | (reply[14] << 16) | (uint32_t(reply[15]) << 24);
  EXPECT_NE(status, 0);
  auto reason = c.recv(reason_len);
  EXPECT_NE(std::string(reason.begin(), reason.end()).find("version 99"), std::string::npos);
  EXPECT_TRUE(c.sees_eof());
  p.connect();
  expect_pair_still_works(p);
}

TEST(TcpHostile, GarbageInsteadOfHelloIsClosed) {
  Pair p;
  RawClient c(p.b.port());
  std::vector<uint8_t> junk(64, 0x5a);
  c.send(junk);
  auto reply = c.recv(32);
  ASSERT_EQ(reply.size(), 32u);  // a refusal reply, then the close
  EXPECT_NE(reply[10] | (reply[11] << 8), 0);
  EXPECT_TRUE(c.sees_eof());
  p.connect();
  expect_pair_still_works(p);
}

TEST(TcpHostile, OversizedFrameClosesThatConnectionOnly) {
  Pair p;
  {
    RawClient c(p.b.port());
    ASSERT_EQ(handshake(c), 0);
    c.send(write_frame(1, 0, 0, uint64_t(1) << 40));  // 1 TiB payload announced
    EXPECT_TRUE(c.sees_eof());
  }
  p.connect();
  expect_pair_still_works(p);
}

TEST(TcpHostile, TruncatedFrameThenCloseLeavesEndpointServing) {
  Pair p;
  {
    RawClient c(p.b.port());
    ASSERT_EQ(handshake(c), 0);
    auto f = write_frame(1, 0, 0, 16);
    f.resize(20);
    c.send(f);
    c.finish_sending();
    EXPECT_TRUE(c.sees_eof());
  }
  p.connect();
  expect_pair_still_works(p);
}

TEST(TcpHostile, OutOfRangeWriteIsRejectedAndTheConnectionKeepsWorking) {
  Pair p;
  std::vector<uint8_t> region(64, 0);
  const int32_t h = p.b.register_memory_region("r", addr_of(region), 0, region.size());
  RawClient c(p.b.port());
  ASSERT_EQ(handshake(c), 0);
  // 16 bytes at offset 60 of a 64-byte region: rejected, payload drained, ack says why.
  auto f = write_frame(77, h, 60, 16);
  f.resize(f.size() + 16, 0xee);
  c.send(f);
  auto ack = c.recv(40);
  ASSERT_EQ(ack.size(), 40u);
  EXPECT_EQ(ack[2], 2);  // write ack
  const int status = ack[4] | (ack[5] << 8);
  EXPECT_EQ(status, int(StatusCode::kOutOfBounds));
  const uint64_t text_len = ack[32] | (ack[33] << 8);
  auto text = c.recv(text_len);
  EXPECT_NE(std::string(text.begin(), text.end()).find("outside"), std::string::npos);
  EXPECT_EQ(region, std::vector<uint8_t>(64, 0));

  // Same connection, a valid write now.
  auto ok = write_frame(78, h, 8, 4);
  for (uint8_t v : {1, 2, 3, 4}) ok.push_back(v);
  c.send(ok);
  ack = c.recv(40);
  ASSERT_EQ(ack.size(), 40u);
  EXPECT_EQ(ack[4] | (ack[5] << 8), 0);
  EXPECT_EQ(region[8], 1);
  EXPECT_EQ(region[11], 4);
  EXPECT_EQ(region[12], 0);
}
