// Limits at the socket level: option and environment ranges, the listener's behaviour
// under descriptor exhaustion and handshake floods, and the I/O runtime across fork().
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>

#include "dlslime/errors.h"
#include "dlslime/tcp_endpoint.h"
#include "tcp/handshake.h"
#include "core/env.h"
#include "core/io_runtime.h"
#include "tcp/tcp_socket.h"

#include "test_support.h"

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DLSLIME_TEST_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) || defined(DLSLIME_TEST_TSAN)
// The fork test's child starts a runtime's threads, which TSan refuses after a fork of a
// multi-threaded process unless told otherwise (the child runs no racy code).
extern "C" const char* __tsan_default_options() { return "die_after_fork=0"; }
#endif

using namespace std::chrono_literals;
using namespace dlslime;
using namespace dlslime::test_support;
using namespace dlslime::tcp;

namespace {

// Sets (or, with nullptr, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "(no InvalidArgumentError)";
}

// A listener on an io_context of its own, as an endpoint's would be.
class ListenerHarness {
 public:
  explicit ListenerHarness(TcpOptions options) : options_(std::move(options)) {
    listener_ = std::make_shared<TcpListener>(
        ctx_, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0), options_, 0xACCE);
    thread_ = std::thread([this] { ctx_.run(); });
    on_io([this] {
      listener_->start([](const Hello&) { return Status::ok(); },
                       [this](asio::ip::tcp::socket s, const Hello&) {
                         accepted_sockets_.push_back(std::move(s));
                         accepted_.fetch_add(1);
                       });
    });
  }
  ~ListenerHarness() {
    on_io([this] {
      listener_->close();
      accepted_sockets_.clear();
    });
    guard_.reset();
    ctx_.stop();
    thread_.join();
  }

  void on_io(std::function<void()> fn) {
    std::promise<void> done;
    asio::post(ctx_, [&] {
      fn();
      done.set_value();
    });
    done.get_future().wait();
  }

  // One connect() to the listener, through the real dialer.
  DialResult dial(uint16_t lanes, std::chrono::milliseconds timeout) {
    DialRequest req;
    req.addresses = {asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port())};
    req.peer_label = "127.0.0.1:" + std::to_string(port());
    req.lanes = lanes;
    req.sender_id = 0x5E7D;
    req.timeout = timeout;
    std::promise<DialResult> result;
    asio::post(ctx_, [&] { dial_lanes(ctx_, req, options_, [&](DialResult r) { result.set_value(std::move(r)); }); });
    return result.get_future().get();
  }

  uint16_t port() const { return listener_->port(); }
  TcpListener::Stats stats() const { return listener_->stats(); }
  int accepted() const { return accepted_.load(); }

 private:
  TcpOptions options_;
  asio::io_context ctx_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_{ctx_.get_executor()};
  std::shared_ptr<TcpListener> listener_;
  std::vector<asio::ip::tcp::socket> accepted_sockets_;  // I/O thread only
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

int connect_raw(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ADD_FAILURE() << "connect to the listener failed";
  }
  return fd;
}

// Reads until the peer closes or `timeout` passes; nullopt on timeout.
std::optional<std::string> read_until_closed(int fd, std::chrono::milliseconds timeout) {
  timeval tv{0, 20000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string got;
  char buf[1024];
  while (std::chrono::steady_clock::now() < deadline) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) return got;
    if (n > 0) got.append(buf, static_cast<size_t>(n));
    else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return got;  // reset
  }
  return std::nullopt;
}

// The hello reply and reason a dropped connection was sent.
std::pair<HelloReply, std::string> parse_refusal(const std::string& bytes) {
  HelloReply reply;
  if (bytes.size() < kHelloReplySize) {
    ADD_FAILURE() << "no hello reply before the close (" << bytes.size() << " bytes)";
    return {reply, ""};
  }
  EXPECT_TRUE(parse_hello_reply(reinterpret_cast<const uint8_t*>(bytes.data()), &reply).is_ok());
  return {reply, bytes.substr(kHelloReplySize)};
}

std::string partial_hello(size_t n) {
  Hello h;
  h.sender_id = 0xBAD;
  std::array<uint8_t, kHelloSize> raw{};
  encode_hello(h, raw.data());
  return std::string(reinterpret_cast<const char*>(raw.data()), n);
}

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

}  // namespace

// --- option and environment ranges (issue 10, item 7) ---------------------------------

TEST(TcpOptionsEnv, OutOfRangeValuesNameTheVariableValueAndRange) {
  {
    ScopedEnv env("DLSLIME_TCP_LANES", "4294967298");  // used to wrap to 2
    const std::string e = error_of([] { TcpOptions::from_env(); });
    EXPECT_NE(e.find("DLSLIME_TCP_LANES='4294967298'"), std::string::npos) << e;
    EXPECT_NE(e.find("1..64"), std::string::npos) << e;
  }
  {
    ScopedEnv env("DLSLIME_TCP_MAX_INFLIGHT_OPS", "-1");  // used to become 4294967295
    const std::string e = error_of([] { TcpOptions::from_env(); });
    EXPECT_NE(e.find("DLSLIME_TCP_MAX_INFLIGHT_OPS='-1'"), std::string::npos) << e;
    EXPECT_NE(e.find("out of range"), std::string::npos) << e;
  }
  {
    ScopedEnv env("DLSLIME_TCP_KEEPALIVE_IDLE_S", "100000");
    const std::string e = error_of([] { TcpOptions::from_env(); });
    EXPECT_NE(e.find("1..32767"), std::string::npos) << e;
  }
  {
    ScopedEnv env("DLSLIME_TCP_OP_TIMEOUT_MS", "99999999999999999999");  // past int64
    EXPECT_NE(error_of([] { TcpOptions::from_env(); }).find("out of range"), std::string::npos);
  }
  for (const char* bad : {"2x", " 2", "+2", "0x10", "2.0"}) {
    ScopedEnv env("DLSLIME_TCP_LANES", bad);
    const std::string e = error_of([] { TcpOptions::from_env(); });
    EXPECT_NE(e.find("is not an integer"), std::string::npos) << bad << ": " << e;
  }
  ScopedEnv ok("DLSLIME_TCP_LANES", "64");
  EXPECT_EQ(TcpOptions::from_env().lanes, 64u);
}

TEST(TcpOptionsEnv, ValidateHoldsKeywordOptionsToTheKernelsKeepaliveLimits) {
  TcpOptions o;
  o.keepalive_idle_s = 100000;
  std::string e = error_of([&] { o.validate(); });
  EXPECT_NE(e.find("keepalive_idle=100000"), std::string::npos) << e;
  EXPECT_NE(e.find("1..32767"), std::string::npos) << e;
  o = TcpOptions{};
  o.keepalive_count = 128;
  EXPECT_NE(error_of([&] { o.validate(); }).find("1..127"), std::string::npos);
  o = TcpOptions{};
  o.max_inflight_ops = 4294967295u;
  EXPECT_NE(error_of([&] { o.validate(); }).find("max_inflight_ops"), std::string::npos);
  EXPECT_NO_THROW(TcpOptions{}.validate());
}

TEST(TcpOptionsEnv, ARefusedSocketOptionIsAnErrorNotIgnored) {
  asio::io_context ctx;
  asio::ip::tcp::socket s(ctx);
  s.open(asio::ip::tcp::v4());
  TcpOptions o;
  o.keepalive_idle_s = 100000;  // past the kernel's limit (validate() would refuse it)
  const Status st = apply_socket_options(s, o);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("TCP_KEEPIDLE=100000"), std::string::npos) << st.message();
  EXPECT_TRUE(apply_socket_options(s, TcpOptions{}).is_ok());
}

TEST(IoRuntimeEnv, BadIoThreadsThrowsInsteadOfAborting) {
  for (const char* bad : {"-1", "0", "257", "many"}) {
    ScopedEnv env("DLSLIME_IO_THREADS", bad);
    const std::string e = error_of([] { IoRuntime::shared(); });
    EXPECT_NE(e.find("DLSLIME_IO_THREADS"), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find("1..256"), std::string::npos) << bad << ": " << e;
  }
  ScopedEnv env("DLSLIME_IO_THREADS", "3");
  EXPECT_EQ(IoRuntime::shared()->size(), 3u);
}

TEST(Env, AFlagIsOneOrZeroAndAnythingElseIsAnErrorNamingTheVariable) {
  {
    ScopedEnv env("DLSLIME_TEST_FLAG", nullptr);
    EXPECT_FALSE(env_flag("DLSLIME_TEST_FLAG"));
  }
  for (const char* off : {"", "0"}) {
    ScopedEnv env("DLSLIME_TEST_FLAG", off);
    EXPECT_FALSE(env_flag("DLSLIME_TEST_FLAG")) << off;
  }
  ScopedEnv on("DLSLIME_TEST_FLAG", "1");
  EXPECT_TRUE(env_flag("DLSLIME_TEST_FLAG"));
  // "true" or "yes" silently meaning "off" would hide a simulation the user asked for.
  for (const char* bad : {"true", "yes", "01", " 1", "2"}) {
    ScopedEnv env("DLSLIME_TEST_FLAG", bad);
    const std::string e = error_of([] { env_flag("DLSLIME_TEST_FLAG"); });
    EXPECT_NE(e.find("DLSLIME_TEST_FLAG='"), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find("must be 1 or 0"), std::string::npos) << bad << ": " << e;
  }
}

TEST(IoRuntimeOptions, ThreadsAreValidatedAndConfigurableWithoutTheEnvironment) {
  for (unsigned bad : {0u, IoRuntimeOptions::kMaxThreads + 1}) {
    const std::string e = error_of([&] { IoRuntime rt(IoRuntimeOptions{.threads = bad}); });
    EXPECT_NE(e.find("1..256"), std::string::npos) << bad << ": " << e;
  }
  {
    ScopedEnv env("DLSLIME_IO_THREADS", "many");  // not read: the options are given
    auto rt = IoRuntime::shared(IoRuntimeOptions{.threads = 2});
    EXPECT_EQ(rt->size(), 2u);
    // While it lives, every user shares it (one pool per process).
    EXPECT_EQ(IoRuntime::shared(), rt);
    EXPECT_EQ(IoRuntime::shared(IoRuntimeOptions{.threads = 5}), rt);
    std::promise<void> ran;
    asio::post(rt->next_context(), [&] { ran.set_value(); });
    EXPECT_EQ(ran.get_future().wait_for(5s), std::future_status::ready);
  }
  EXPECT_EQ(IoRuntimeOptions::from_env().threads, 1u);  // the default
}

// --- fork (item 8) ----------------------------------------------------------------------

TEST(IoRuntimeFork, TheChildGetsARuntimeOfItsOwnAndTheParentKeepsItsOwn) {
  auto parent_rt = IoRuntime::shared();
  ASSERT_TRUE(parent_rt->usable());
  // Fork only once every I/O thread has reached its loop. A thread that is still starting
  // may hold the sanitizer runtime's thread-registry lock (GCC's ASan has no fork handlers),
  // and the child's first thread would then wait on it forever: the CI failure of stop 16.
  for (unsigned i = 0; i < parent_rt->size(); ++i) {
    std::promise<void> started;
    asio::post(parent_rt->next_context(), [&] { started.set_value(); });
    ASSERT_EQ(started.get_future().wait_for(5s), std::future_status::ready);
  }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // No gtest macros here: report through the exit status.
    int code = 0;
    if (parent_rt->usable()) code = 10;
    auto own = IoRuntime::shared();
    if (own == parent_rt || !own->usable()) code = 11;
    std::promise<void> ran;
    asio::post(own->next_context(), [&] { ran.set_value(); });
    if (ran.get_future().wait_for(5s) != std::future_status::ready) code = 12;
    parent_rt.reset();  // the inherited runtime's destructor must return (it leaks)
    own.reset();        // the child's own one stops and joins normally
    ::_exit(code);
  }
  int status = 0;
  const bool exited = wait_until([&] { return ::waitpid(child, &status, WNOHANG) == child; }, 10s);
  if (!exited) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
  }
  ASSERT_TRUE(exited) << "the forked child hung";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // The parent's runtime still runs handlers.
  EXPECT_TRUE(parent_rt->usable());
  std::promise<void> ran;
  asio::post(parent_rt->next_context(), [&] { ran.set_value(); });
  EXPECT_EQ(ran.get_future().wait_for(5s), std::future_status::ready);
}

// --- handshake floods (item 17) -----------------------------------------------------------

TEST(TcpListenerLimits, HandshakeDeadlineIsTotalNotPerByte) {
  TcpOptions o;
  o.connect_timeout = 400ms;
  ListenerHarness h(o);
  const int fd = connect_raw(h.port());
  const std::string hello = partial_hello(kHelloSize);
  std::atomic<bool> stop{false};
  // One byte every 50 ms: the hello would take 3.2 s, each byte well inside any per-byte
  // timeout.
  std::thread trickle([&] {
    for (size_t i = 0; i < hello.size() && !stop; ++i) {
      if (::send(fd, &hello[i], 1, MSG_NOSIGNAL) != 1) return;
      std::this_thread::sleep_for(50ms);
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  const auto got = read_until_closed(fd, 5s);
  const auto took = std::chrono::steady_clock::now() - t0;
  stop = true;
  trickle.join();
  ::close(fd);
  ASSERT_TRUE(got.has_value()) << "the trickling connection was never closed";
  EXPECT_LT(took, 2s) << "closed only after the trickle ended, not at the 400 ms deadline";
  const auto [reply, reason] = parse_refusal(*got);
  EXPECT_EQ(reply.status, StatusCode::kTimeout);
  EXPECT_NE(reason.find("not completed within 400 ms"), std::string::npos) << reason;
  EXPECT_EQ(h.stats().handshakes_timed_out, 1u);
}

TEST(TcpListenerLimits, SlowHandshakesDoNotLockOutALegitimateDialer) {
  TcpOptions o;
  o.connect_timeout = 10s;  // long: eviction, not the deadline, must make room
  ListenerHarness h(o);
  constexpr int kSlow = static_cast<int>(TcpListener::kMaxPendingHandshakes) + 6;
  std::vector<int> slow;
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(connect_raw(h.port()));
    ASSERT_EQ(::send(slow.back(), partial_hello(10).data(), 10, MSG_NOSIGNAL), 10);
  }
  ASSERT_TRUE(wait_until([&] { return h.stats().accepted >= static_cast<uint64_t>(kSlow); }));
  // The oldest slow connection was dropped for a newer one, and told why.
  const auto got = read_until_closed(slow.front(), 5s);
  ASSERT_TRUE(got.has_value()) << "the oldest incomplete handshake was not dropped";
  const auto [reply, reason] = parse_refusal(*got);
  EXPECT_EQ(reply.status, StatusCode::kAccessDenied);
  EXPECT_NE(reason.find("incomplete handshakes"), std::string::npos) << reason;

  const DialResult r = h.dial(2, 3s);
  EXPECT_TRUE(r.status.is_ok()) << r.status.message();
  EXPECT_EQ(r.sockets.size(), 2u);
  EXPECT_TRUE(wait_until([&] { return h.accepted() == 2; }));
  EXPECT_GE(h.stats().handshakes_evicted, 6u);
  for (int fd : slow) ::close(fd);
}

// --- descriptor exhaustion (item 15) ------------------------------------------------------

TEST(TcpListenerLimits, AcceptBacksOffOnEmfileAndRecovers) {
  ListenerHarness h(TcpOptions{});
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(client, 0);

  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = 256;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> filler{::open("/dev/null", O_RDONLY)};
  ASSERT_GE(filler.front(), 0);
  for (int fd; (fd = ::dup(filler.front())) >= 0;) filler.push_back(fd);
  ASSERT_EQ(errno, EMFILE);

  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(h.port());
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);  // lands in the backlog

  ASSERT_TRUE(wait_until([&] { return h.stats().accept_failures >= 1; }));
  const double cpu0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t failures0 = h.stats().accept_failures;
  // Backing off 10, 20, 40, 80 ms: five more failures take about 300 ms; a retry loop
  // makes thousands in that time and burns the whole window on the CPU.
  ASSERT_TRUE(wait_until([&] { return h.stats().accept_failures >= failures0 + 5; }));
  const double cpu = cpu_seconds() - cpu0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(wall, 0.1) << "accept() was retried without backing off";
  EXPECT_LT(cpu, 0.25 * wall + 0.02) << "cpu " << cpu << " s over " << wall << " s";
  EXPECT_EQ(h.stats().accepted, 0u);

  for (int fd : filler) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  // The backlogged connection is accepted once descriptors are free again (at most one
  // back-off later), and a real dial completes its handshake.
  EXPECT_TRUE(wait_until([&] { return h.stats().accepted >= 1; }, 5s));
  const DialResult r = h.dial(1, 3s);
  EXPECT_TRUE(r.status.is_ok()) << r.status.message();
  ::close(client);
}
