// Hostile HTTP clients (issue 10, items 13 and 14): bodies are capped whatever their
// encoding and never read for an unauthenticated client, and slow clients cannot take the
// worker threads from health checks and heartbeats.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "dlslime/errors.h"
#include "dlslime/nanoctrl.h"
#include "dlslime/nanoctrl_client.h"

using namespace std::chrono_literals;
using dlslime::NanoCtrlClient;
using dlslime::NanoCtrlConfig;
using dlslime::NanoCtrlServer;
using nlohmann::json;

namespace {

const std::string kToken = "limits-test-token-0123456789";

// A raw loopback connection to the server, for requests no HTTP library would send.
class RawConnection {
 public:
  explicit RawConnection(uint16_t port, std::chrono::seconds io_timeout = 5s) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{static_cast<time_t>(io_timeout.count()), 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~RawConnection() { ::close(fd_); }
  bool connected() const { return connected_; }

  // Sends all of `data`; false once the server has closed (or not read for io_timeout).
  bool send_all(const std::string& data) {
    std::size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<std::size_t>(n);
    }
    return true;
  }
  // What the server answers until it closes or io_timeout passes.
  std::string read_reply() {
    std::string out;
    char buf[4096];
    for (;;) {
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return out;
      out.append(buf, static_cast<std::size_t>(n));
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

NanoCtrlConfig base_config() {
  NanoCtrlConfig c;
  c.port = 0;
  c.max_body_bytes = 64 * 1024;
  return c;
}

std::string sample(const std::string& metrics, const std::string& name) {
  auto at = metrics.find("\n" + name + " ");
  if (at == std::string::npos) return "";
  auto begin = at + name.size() + 2;
  return metrics.substr(begin, metrics.find('\n', begin) - begin);
}

// Sends a chunked body of 64 KiB chunks after `head` until `limit` bytes are out or the
// server stops taking them; returns how much the server took.
std::size_t push_chunked(RawConnection& c, const std::string& head, std::size_t limit) {
  if (!c.send_all(head)) return 0;
  const std::string chunk = "10000\r\n" + std::string(0x10000, 'x') + "\r\n";
  std::size_t sent = 0;
  while (sent < limit && c.send_all(chunk)) sent += 0x10000;
  return sent;
}

}  // namespace

TEST(HttpBodyLimits, ChunkedBodyOverMaxBodyIs413AndNotStored) {
  NanoCtrlServer server(base_config());
  server.start();
  NanoCtrlClient client(server.url());
  client.start_peer_agent({{"alias", "a"}});

  // The same post as a chunked body: within the limit it is delivered...
  httplib::Client http(server.url());
  auto chunked_post = [&](std::size_t filler) {
    const std::string body = R"({"to":"a","message":")" + std::string(filler, 'x') + "\"}";
    return http.Post(
        "/mailbox/post",
        [body](size_t offset, httplib::DataSink& sink) {
          if (offset < body.size()) {
            sink.write(body.data() + offset, std::min<size_t>(4096, body.size() - offset));
          } else {
            sink.done();
          }
          return true;
        },
        "application/json");
  };
  auto small = chunked_post(100);
  ASSERT_TRUE(small);
  EXPECT_EQ(small->status, 200) << small->body;
  EXPECT_EQ(client.recv("a", 0ms).size(), 1u);

  // ...over it, refused with 413 and a JSON error naming the limit, and nothing is queued.
  auto big = chunked_post(256 * 1024);
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  json error = json::parse(big->body, nullptr, false);
  ASSERT_TRUE(error.is_object()) << big->body;
  EXPECT_EQ(error["status"], "error");
  EXPECT_NE(error["message"].get<std::string>().find("65536"), std::string::npos) << big->body;
  EXPECT_TRUE(client.recv("a", 0ms).empty());
  EXPECT_EQ(client.healthz()["status"], "ok");
}

TEST(HttpBodyLimits, UnauthenticatedHugeChunkedBodyIsRefusedBeforeItIsRead) {
  NanoCtrlConfig cfg = base_config();
  cfg.token = kToken;
  NanoCtrlServer server(cfg);
  server.start();
  constexpr std::size_t kHuge = 256u << 20;

  // Chunked, no token: the server answers 401 from the headers and stops reading, so the
  // client cannot push the body (the old server read all of it before answering).
  {
    RawConnection c(server.port());
    ASSERT_TRUE(c.connected());
    std::size_t taken = push_chunked(c,
                                     "POST /mailbox/post HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                     "Transfer-Encoding: chunked\r\n\r\n",
                                     kHuge);
    EXPECT_LT(taken, 32u << 20);
  }
  // Content-Length beyond max_body with the right token: 413 before the body.
  {
    RawConnection c(server.port());
    ASSERT_TRUE(c.send_all("POST /query HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + kToken +
                           "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(kHuge) +
                           "\r\n\r\n"));
    std::string reply = c.read_reply();
    EXPECT_EQ(reply.rfind("HTTP/1.1 413", 0), 0u) << reply;
    EXPECT_NE(reply.find("Connection: close"), std::string::npos) << reply;
  }
  // A small unauthenticated body still gets its readable 401.
  {
    RawConnection c(server.port());
    ASSERT_TRUE(c.send_all("POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           "Content-Length: 2\r\n\r\n{}"));
    std::string reply = c.read_reply();
    EXPECT_EQ(reply.rfind("HTTP/1.1 401", 0), 0u) << reply;
  }
  NanoCtrlClient client(server.url(), "", 10s, kToken);
  EXPECT_EQ(client.healthz()["status"], "ok");
  EXPECT_EQ(client.query().size(), 0u);
}

TEST(HttpSlowClients, SlowHeadersDoNotStarveHealthAndHeartbeats) {
  NanoCtrlConfig cfg = base_config();
  cfg.max_threads = 4;  // a handful of workers, so a handful of slow clients would take them all
  cfg.request_read_timeout = 600ms;
  cfg.ttl = 60s;
  NanoCtrlServer server(cfg);
  server.start();
  NanoCtrlClient client(server.url(), "", 2s);
  client.start_peer_agent({{"alias", "hb"}});

  // 40 clients, ten per worker, each sending its request head a byte at a time.
  constexpr int kSlow = 40;
  std::vector<std::unique_ptr<RawConnection>> slow;
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(std::make_unique<RawConnection>(server.port()));
    ASSERT_TRUE(slow.back()->connected());
  }
  const std::string head = "POST /heartbeat HTTP/1.1\r\nHost: x\r\nX-Padding: " + std::string(200, 'p') + "\r\n";
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    // The attack's pace, not a synchronisation: one byte per client every 50 ms.
    for (std::size_t i = 0; !stop && i < head.size(); ++i) {
      for (auto& c : slow) c->send_all(std::string(1, head[i]));
      std::this_thread::sleep_for(50ms);
    }
  });

  // While they trickle, health and heartbeats are answered at once, for longer than the
  // read deadline (so new slow requests keep arriving throughout).
  const auto until = std::chrono::steady_clock::now() + 1500ms;
  int rounds = 0;
  while (std::chrono::steady_clock::now() < until) {
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(client.healthz()["status"], "ok");
    EXPECT_EQ(client.heartbeat("hb"), "ok");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms);
    ++rounds;
  }
  EXPECT_GT(rounds, 3);
  stop = true;
  trickle.join();

  // Each slow request was cut at its deadline with a 408.
  std::string reply = slow.front()->read_reply();
  EXPECT_EQ(reply.rfind("HTTP/1.1 408", 0), 0u) << reply;
  httplib::Client http(server.url());
  auto m = http.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(sample(m->body, R"(nanoctrl_http_requests_dropped_total{reason="read_timeout"})"),
            std::to_string(kSlow));
}

TEST(HttpSlowClients, OverlongHeadIs431) {
  NanoCtrlServer server(base_config());
  server.start();
  RawConnection c(server.port());
  // Far more than the 16 KiB a request head may take, and no end of headers.
  c.send_all("GET /healthz HTTP/1.1\r\nX-Long: " + std::string(64 * 1024, 'a'));
  std::string reply = c.read_reply();
  EXPECT_EQ(reply.rfind("HTTP/1.1 431", 0), 0u) << reply.substr(0, 200);
  NanoCtrlClient client(server.url());
  EXPECT_EQ(client.healthz()["status"], "ok");
}

TEST(HttpSlowClients, PipelinedAndKeepAliveRequestsStillWork) {
  NanoCtrlServer server(base_config());
  server.start();
  RawConnection c(server.port());
  // Two requests in one write: both answered, in order, on one connection.
  const std::string get = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string post = "POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           "Content-Length: 2\r\nConnection: close\r\n\r\n{}";
  ASSERT_TRUE(c.send_all(get + post));
  std::string reply = c.read_reply();
  auto second = reply.find("HTTP/1.1 200", 1);
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  ASSERT_NE(second, std::string::npos) << reply;
  EXPECT_NE(reply.find("[]", second), std::string::npos) << reply;
}

TEST(HttpSlowClients, RequestReadTimeoutIsValidated) {
  NanoCtrlConfig cfg = base_config();
  cfg.request_read_timeout = 50ms;
  EXPECT_THROW(NanoCtrlServer{cfg}, dlslime::InvalidArgumentError);
  cfg.request_read_timeout = 100ms;
  EXPECT_NO_THROW(NanoCtrlServer{cfg});
}
