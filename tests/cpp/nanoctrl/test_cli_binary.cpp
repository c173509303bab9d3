// The installed `nanoctrl` binary: start (daemon, waits for health), status, stop.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "dlslime/nanoctrl_client.h"
#include "redis_process.h"

namespace {

int run(const std::string& args) {
  std::string cmd = std::string(NANOCTRL_BINARY) + " " + args + " >/dev/null 2>&1";
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace

TEST(NanoCtrlBinary, StartStatusStop) {
  auto dir = std::filesystem::temp_directory_path() / ("nanoctrl-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string pid_file = (dir / "nc.pid").string();
  int port = nanoctrl_test::free_port();
  ASSERT_EQ(run("start --port " + std::to_string(port) + " --pid-file " + pid_file), 0);
  EXPECT_EQ(run("status --pid-file " + pid_file), 0);
  dlslime::NanoCtrlClient c("http://127.0.0.1:" + std::to_string(port));
  EXPECT_EQ(c.healthz()["status"], "ok");
  EXPECT_EQ(run("start --port " + std::to_string(port) + " --pid-file " + pid_file), 1);  // already running
  EXPECT_EQ(run("stop --pid-file " + pid_file), 0);
  EXPECT_EQ(run("status --pid-file " + pid_file), 3);
  EXPECT_EQ(run("bogus"), 2);
  std::filesystem::remove_all(dir);
}
