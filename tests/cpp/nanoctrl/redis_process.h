#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <hiredis/hiredis.h>

extern char** environ;

namespace nanoctrl_test {

// A free loopback TCP port (bound once and released).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// A throwaway redis-server on 127.0.0.1 (no persistence), killed on destruction.
class RedisProcess {
 public:
  explicit RedisProcess(int port = 0) : port_(port ? port : free_port()) { start(); }
  ~RedisProcess() { stop(); }

  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

  void start() {
    std::string p = std::to_string(port_);
    std::vector<std::string> args = {"redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "",
                                     "--appendonly", "no", "--loglevel", "warning"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t quiet;
    posix_spawn_file_actions_init(&quiet);
    posix_spawn_file_actions_addopen(&quiet, 1, "/dev/null", O_WRONLY, 0);
    int rc = posix_spawnp(&pid_, "redis-server", &quiet, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&quiet);
    if (rc != 0) {
      throw std::runtime_error("cannot run redis-server (install redis-server)");
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (ping()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    stop();
    throw std::runtime_error("redis-server did not come up on port " + p);
  }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  bool ping() const {
    timeval tv{0, 200000};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    bool ok = false;
    if (c && !c->err) {
      auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
      ok = r && r->type == REDIS_REPLY_STATUS;
      if (r) freeReplyObject(r);
    }
    if (c) redisFree(c);
    return ok;
  }

 private:
  int port_;
  pid_t pid_ = -1;
};

}  // namespace nanoctrl_test
