#pragma once

#include <sys/uio.h>

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "dlslime/status.h"

// Cross-memory attach between two processes on one host (docs/tcp.md "Same-host path"):
// who this process is as another process on the host sees it, and the one copy primitive,
// process_vm_readv, wrapped so that a partial copy is finished and every failure is a
// Status that names its cause. Transports decide when to use it; this file only moves
// bytes and describes the process.
namespace dlslime {

struct ProcessIdentity {
  uint32_t pid = 0;
  uint32_t uid = 0;              // the effective uid
  uint64_t pid_namespace = 0;    // inode of /proc/self/ns/pid (0: unknown)
  std::array<uint8_t, 16> boot_id{};  // /proc/sys/kernel/random/boot_id, as 16 bytes

  // Why a copy between this process and `peer` cannot even be tried (empty: it can):
  // another boot (another host), another pid namespace (the pid names another process), or
  // another uid (the peer's table of regions is not this user's to trust).
  std::string mismatch(const ProcessIdentity& peer) const;
};

// This process, read afresh (a fork() child has another pid).
ProcessIdentity this_process_identity();

// One piece of a cross-process copy: `length` bytes between `local` in this process and
// `remote` in the other one.
struct CrossCopy {
  uint8_t* local = nullptr;
  uint64_t remote = 0;
  uint64_t length = 0;
};

// Copies every piece from process `pid` into this process (`into_local`) or from this
// process into `pid` (!into_local), in batches of at most IOV_MAX pieces, finishing partial
// copies. The Status names the cause: ESRCH -> kPeerClosed (the process is gone), EFAULT ->
// kInvalidArgument (a piece's memory is not mapped on one side), EPERM -> kAccessDenied
// (no ptrace permission, with the Yama scope), anything else -> kFailed.
Status cross_copy(int pid, std::span<const CrossCopy> pieces, bool into_local);

// "EPERM (ptrace_scope 1)" and the like: errno's name, with what explains it here.
std::string cross_copy_errno_text(int err);

}  // namespace dlslime
