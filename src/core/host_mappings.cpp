#include "core/host_mappings.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>

#include <fmt/format.h>

namespace dlslime {

namespace {

// One line of /proc/self/maps: "start-end perms offset dev inode path".
struct Mapping {
  uintptr_t start = 0;
  uintptr_t end = 0;
  std::string_view perms;
};

bool parse_hex(std::string_view& s, uintptr_t* out) {
  uintptr_t v = 0;
  size_t i = 0;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) break;
    v = v * 16 + static_cast<uintptr_t>(d);
  }
  if (i == 0) return false;
  s.remove_prefix(i);
  *out = v;
  return true;
}

bool parse_line(std::string_view line, Mapping* m) {
  if (!parse_hex(line, &m->start) || line.empty() || line.front() != '-') return false;
  line.remove_prefix(1);
  if (!parse_hex(line, &m->end) || line.size() < 5 || line.front() != ' ') return false;
  m->perms = line.substr(1, 4);
  return true;
}

}  // namespace

std::optional<std::string> host_pages_problem(uintptr_t start, uint64_t length, bool write) {
  if (length == 0) return std::nullopt;
  const uintptr_t end = start + length;  // the caller checked that it does not overflow
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  // The file is sorted by address: read until the mappings cover `end`, or a gap or a
  // mapping without rw- shows up. Lines are carried across reads in `pending`.
  uintptr_t covered = start;  // [start, covered) is mapped as asked so far
  std::optional<std::string> why;
  bool done = false;
  std::string pending;
  char buf[16384];
  while (!done) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    size_t pos = 0;
    for (size_t nl; !done && (nl = pending.find('\n', pos)) != std::string::npos; pos = nl + 1) {
      Mapping m;
      if (!parse_line(std::string_view(pending).substr(pos, nl - pos), &m) || m.end <= covered) continue;
      if (m.start > covered) {
        why = fmt::format("memory at {:#x} is not mapped", covered);
        done = true;
      } else if (m.perms[0] != 'r') {
        why = fmt::format("memory at {:#x} is not readable (PROT_NONE: {})", covered, m.perms);
        done = true;
      } else if (write && m.perms[1] != 'w') {
        why = fmt::format("memory at {:#x} is read-only ({})", covered, m.perms);
        done = true;
      } else {
        covered = m.end;
        done = covered >= end;
      }
    }
    pending.erase(0, pos);
  }
  ::close(fd);
  if (!why && covered < end) why = fmt::format("memory at {:#x} is not mapped", covered);
  return why;
}

}  // namespace dlslime
