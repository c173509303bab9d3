#include "loopback_pair.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "bench_config.h"

namespace dlslime::bench {

namespace {

// After one child fails, the other notices the closed control socket at once; this is only
// the bound on how long it may take to wind down before it is killed.
constexpr auto kWindDown = std::chrono::seconds(15);

pid_t spawn(int argc, char** argv, Role role, int keep_fd, int close_fd) {
  std::vector<std::string> args = child_arguments(argc, argv, role, keep_fd);
  std::vector<char*> cargv;
  std::string self = argv[0];
  cargv.push_back(self.data());
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(fmt::format("fork failed: {}", std::strerror(errno)));
  if (pid == 0) {
    ::close(close_fd);
    ::execv("/proc/self/exe", cargv.data());
    std::fprintf(stderr, "dlslime-bench: cannot re-execute itself: %s\n", std::strerror(errno));
    ::_exit(127);
  }
  return pid;
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

const char* role_of(pid_t pid, pid_t target) { return pid == target ? "target" : "initiator"; }

}  // namespace

int run_loopback_pair(int argc, char** argv) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    throw std::runtime_error(fmt::format("socketpair failed: {}", std::strerror(errno)));
  }
  const pid_t target = spawn(argc, argv, Role::kTarget, sv[0], sv[1]);
  const pid_t initiator = spawn(argc, argv, Role::kInitiator, sv[1], sv[0]);
  ::close(sv[0]);
  ::close(sv[1]);

  int status = 0;
  pid_t first = -1;
  while ((first = ::waitpid(-1, &status, 0)) < 0 && errno == EINTR) {
  }
  if (first != target && first != initiator) throw std::runtime_error("lost track of the benchmark processes");
  const int first_code = exit_code(status);
  const pid_t other = first == target ? initiator : target;
  if (first_code != 0) {
    std::fprintf(stderr, "dlslime-bench: the %s exited with status %d\n", role_of(first, target), first_code);
  }

  int other_code = -1;
  const auto deadline = std::chrono::steady_clock::now() + kWindDown;
  while (other_code < 0) {
    const pid_t r = ::waitpid(other, &status, first_code != 0 ? WNOHANG : 0);
    if (r == other) {
      other_code = exit_code(status);
    } else if (r < 0 && errno != EINTR) {
      other_code = 1;
    } else if (r == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "dlslime-bench: stopping the %s, which did not exit after the %s failed\n",
                     role_of(other, target), role_of(first, target));
        ::kill(other, SIGKILL);
        ::waitpid(other, &status, 0);
        other_code = 1;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  }
  if (other_code != 0 && first_code == 0) {
    std::fprintf(stderr, "dlslime-bench: the %s exited with status %d\n", role_of(other, target), other_code);
  }
  const int initiator_code = first == initiator ? first_code : other_code;
  const int target_code = first == target ? first_code : other_code;
  if (initiator_code != 0) return initiator_code;
  return target_code != 0 ? 1 : 0;
}

}  // namespace dlslime::bench
