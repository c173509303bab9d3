#include "core/same_host.h"

#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <vector>

#include <fmt/format.h>

namespace dlslime {

namespace {

std::array<uint8_t, 16> read_boot_id() {
  std::array<uint8_t, 16> id{};
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string text;
  if (!(in >> text)) return id;
  size_t n = 0;
  for (size_t i = 0; i + 1 < text.size() && n < id.size();) {
    if (text[i] == '-') {
      ++i;
      continue;
    }
    id[n++] = static_cast<uint8_t>(std::stoi(text.substr(i, 2), nullptr, 16));
    i += 2;
  }
  return id;
}

int yama_scope() {
  std::ifstream in("/proc/sys/kernel/yama/ptrace_scope");
  int scope = -1;
  if (!(in >> scope)) return -1;
  return scope;
}

}  // namespace

std::string ProcessIdentity::mismatch(const ProcessIdentity& peer) const {
  if (peer.boot_id != boot_id) return "the peer runs on another host (its boot id differs)";
  if (peer.pid_namespace != pid_namespace || pid_namespace == 0) {
    return "the peer is in another pid namespace (its pid would name another process here)";
  }
  if (peer.uid != uid) return fmt::format("the peer runs as another uid ({}, this process {})", peer.uid, uid);
  return {};
}

ProcessIdentity this_process_identity() {
  ProcessIdentity me;
  me.pid = static_cast<uint32_t>(::getpid());
  me.uid = static_cast<uint32_t>(::geteuid());
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) == 0) me.pid_namespace = st.st_ino;
  static const std::array<uint8_t, 16> boot = read_boot_id();  // one per boot: read once
  me.boot_id = boot;
  return me;
}

std::string cross_copy_errno_text(int err) {
  switch (err) {
    case EPERM: {
      const int scope = yama_scope();
      return scope >= 0 ? fmt::format("EPERM (ptrace_scope {})", scope) : std::string("EPERM (no ptrace permission)");
    }
    case ESRCH: return "ESRCH (no such process)";
    case EFAULT: return "EFAULT (memory not mapped)";
    case ENOSYS: return "ENOSYS (no cross-memory attach in this kernel)";
    default: return fmt::format("{} ({})", err, std::strerror(err));
  }
}

Status cross_copy(int pid, std::span<const CrossCopy> pieces, bool into_local) {
  constexpr size_t kMaxIov = IOV_MAX;
  std::vector<iovec> local, remote;
  size_t at = 0;       // first piece not fully copied
  uint64_t done = 0;   // bytes of pieces[at] already copied
  while (at < pieces.size()) {
    local.clear();
    remote.clear();
    for (size_t i = at; i < pieces.size() && local.size() < kMaxIov; ++i) {
      const uint64_t skip = i == at ? done : 0;
      if (pieces[i].length == skip) continue;
      local.push_back({pieces[i].local + skip, pieces[i].length - skip});
      remote.push_back({reinterpret_cast<void*>(pieces[i].remote + skip), pieces[i].length - skip});
    }
    if (local.empty()) break;
    // The raw system call, not the libc wrapper: the kernel moves these bytes between two
    // address spaces, as a NIC's DMA does, and ThreadSanitizer (which intercepts the
    // wrapper) would otherwise check every 8 bytes of every copy against the other
    // process's ordering, which it cannot see; that made a 1 MiB copy take seconds there.
    const long n = ::syscall(into_local ? SYS_process_vm_readv : SYS_process_vm_writev, pid, local.data(),
                             local.size(), remote.data(), remote.size(), 0UL);
    if (n <= 0) {
      const int err = n < 0 ? errno : EFAULT;  // 0 bytes of a non-empty copy: nothing mapped there
      if (err == EINTR) continue;
      const std::string what = fmt::format("cross-memory {} process {} failed: {}", into_local ? "read from" : "write to", pid,
                                           cross_copy_errno_text(err));
      switch (err) {
        case ESRCH: return Status::peer_closed(fmt::format("the peer process {} is gone", pid));
        case EFAULT: return Status::invalid_argument(what);
        case EPERM: return Status(StatusCode::kAccessDenied, what);
        default: return Status::failed(what);
      }
    }
    // A partial copy stops at a piece boundary or inside a piece: go on from there.
    uint64_t left = static_cast<uint64_t>(n);
    while (at < pieces.size() && left >= pieces[at].length - done) {
      left -= pieces[at].length - done;
      done = 0;
      ++at;
    }
    done += left;
  }
  return Status::ok();
}

}  // namespace dlslime
