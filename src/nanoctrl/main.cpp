#include <unistd.h>

#include <climits>
#include <string>
#include <vector>

#include "dlslime/nanoctrl.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  // `start` runs this same binary again as `nanoctrl server ...`.
  char exe[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string self = n > 0 ? std::string(exe, static_cast<std::size_t>(n)) : std::string(argv[0]);
  return dlslime::nanoctrl_main(args, {self});
}
