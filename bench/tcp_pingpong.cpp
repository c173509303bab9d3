// tcp_pingpong: the loopback TCP round-trip baseline of bench/compare.sh.
//
// Two processes (the client forks the echo server), one TCP connection over 127.0.0.1 with
// TCP_NODELAY, blocking send/recv of a SIZE-byte message and its echo, ITERS times after
// WARMUP untimed round trips. Prints one line of key=value pairs (times in microseconds):
//   size_b=8 iters=20000 min_us=... median_us=... avg_us=... p99_us=...
//
// usage: tcp_pingpong [--size 8] [--iters 20000] [--warmup 2000]

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "tcp_pingpong: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

bool io_exact(int fd, char* buf, size_t n, bool sending) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = sending ? ::send(fd, buf + done, n - done, MSG_NOSIGNAL) : ::recv(fd, buf + done, n - done, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    done += static_cast<size_t>(r);
  }
  return true;
}

void no_delay(int fd) {
  const int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) die("TCP_NODELAY");
}

unsigned long parse(const char* flag, const char* value) {
  char* end = nullptr;
  const unsigned long v = std::strtoul(value, &end, 10);
  if (!*value || *end || v == 0) {
    std::fprintf(stderr, "tcp_pingpong: %s needs a positive integer, not '%s'\n", flag, value);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  size_t size = 8;
  unsigned long iters = 20000;
  unsigned long warmup = 2000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::puts("usage: tcp_pingpong [--size BYTES] [--iters N] [--warmup N]");
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "tcp_pingpong: %s needs a value\n", a.c_str());
      return 2;
    }
    if (a == "--size") size = parse("--size", argv[++i]);
    else if (a == "--iters") iters = parse("--iters", argv[++i]);
    else if (a == "--warmup") warmup = parse("--warmup", argv[++i]);
    else {
      std::fprintf(stderr, "tcp_pingpong: unknown option %s\n", a.c_str());
      return 2;
    }
  }

  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (lfd < 0) die("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(lfd, 1) != 0 ||
      ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    die("listen on 127.0.0.1");
  }

  const unsigned long total = warmup + iters;
  std::vector<char> buf(size, 'x');
  const pid_t server = ::fork();
  if (server < 0) die("fork");
  if (server == 0) {  // echo server
    const int fd = ::accept(lfd, nullptr, nullptr);
    if (fd < 0) die("accept");
    no_delay(fd);
    for (unsigned long k = 0; k < total; ++k) {
      if (!io_exact(fd, buf.data(), size, false) || !io_exact(fd, buf.data(), size, true)) _exit(1);
    }
    _exit(0);
  }
  ::close(lfd);

  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) die("socket");
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) die("connect");
  no_delay(fd);
  std::vector<double> rtt;
  rtt.reserve(iters);
  for (unsigned long k = 0; k < total; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!io_exact(fd, buf.data(), size, true) || !io_exact(fd, buf.data(), size, false)) {
      std::fprintf(stderr, "tcp_pingpong: the echo server went away\n");
      return 1;
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (k >= warmup) rtt.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  ::close(fd);
  int status = 0;
  ::waitpid(server, &status, 0);

  std::sort(rtt.begin(), rtt.end());
  const double avg = std::accumulate(rtt.begin(), rtt.end(), 0.0) / static_cast<double>(rtt.size());
  const auto at = [&](double q) {
    const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(rtt.size())));
    return rtt[std::clamp<size_t>(rank, 1, rtt.size()) - 1];
  };
  std::printf("size_b=%zu iters=%lu min_us=%.2f median_us=%.2f avg_us=%.2f p99_us=%.2f\n", size, iters, rtt.front(),
              at(0.5), avg, at(0.99));
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
