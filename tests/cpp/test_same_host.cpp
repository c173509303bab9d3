// core/same_host: the identity a same-host peer is checked against, and cross_copy between
// two real processes (a fork()ed child holds the memory), including the kernel's refusals.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "core/buffer_lease.h"
#include "core/same_host.h"

namespace dlslime {
namespace {

TEST(SameHost, AnIdentityMatchesItselfAndNamesEachMismatch) {
  const ProcessIdentity me = this_process_identity();
  EXPECT_EQ(me.pid, static_cast<uint32_t>(getpid()));
  EXPECT_NE(me.pid_namespace, 0u);
  EXPECT_EQ(me.mismatch(me), "");
  ProcessIdentity other = me;
  other.uid = me.uid + 1;
  EXPECT_NE(me.mismatch(other).find("another uid"), std::string::npos);
  other = me;
  other.boot_id[0] ^= 1;
  EXPECT_NE(me.mismatch(other).find("another host"), std::string::npos);
  other = me;
  other.pid_namespace += 1;
  EXPECT_NE(me.mismatch(other).find("pid namespace"), std::string::npos);
}

// A child that keeps this process's memory (copy-on-write, at the same addresses) until
// the pipe closes.
struct Holder {
  pid_t pid = -1;
  int release = -1;
  explicit Holder(void (*in_child)() = nullptr) {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    pid = fork();
    if (pid == 0) {
      close(fds[1]);
      if (in_child) in_child();
      char c;
      (void)!read(fds[0], &c, 1);
      _exit(0);
    }
    close(fds[0]);
    release = fds[1];
  }
  void end() {
    if (release >= 0) close(release);
    release = -1;
    if (pid > 0) waitpid(pid, nullptr, 0);
    pid = -1;
  }
  ~Holder() { end(); }
};

TEST(SameHost, CrossCopyMovesMorePiecesThanOneSyscallTakesByteExactBothWays) {
  constexpr size_t kPieces = 3000;  // about three IOV_MAX batches
  std::vector<uint8_t> theirs(kPieces * 37 + 4096);
  for (size_t i = 0; i < theirs.size(); ++i) theirs[i] = static_cast<uint8_t>(i * 13 + 1);
  Holder child;
  std::vector<uint8_t> mine(theirs.size(), 0);
  std::vector<CrossCopy> pieces;
  size_t at = 0;
  for (size_t i = 0; i < kPieces; ++i) {
    const size_t n = i % 37;  // zero-length pieces among them
    pieces.push_back({mine.data() + at, reinterpret_cast<uint64_t>(theirs.data() + at), n});
    at += n;
  }
  ASSERT_TRUE(cross_copy(child.pid, pieces, true).is_ok());
  EXPECT_EQ(0, std::memcmp(mine.data(), theirs.data(), at));
  // Write different bytes into the child, then read them back.
  for (size_t i = 0; i < at; ++i) mine[i] = static_cast<uint8_t>(i * 7 + 5);
  ASSERT_TRUE(cross_copy(child.pid, pieces, false).is_ok());
  std::vector<uint8_t> back(at, 0);
  const CrossCopy whole{back.data(), reinterpret_cast<uint64_t>(theirs.data()), at};
  ASSERT_TRUE(cross_copy(child.pid, {&whole, 1}, true).is_ok());
  EXPECT_EQ(0, std::memcmp(back.data(), mine.data(), at));
  EXPECT_TRUE(cross_copy(child.pid, {}, true).is_ok());
}

TEST(SameHost, UnmappedMemoryFailsWithEfaultAndAGoneProcessWithPeerClosed) {
  void* mapped = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  ASSERT_EQ(munmap(static_cast<uint8_t*>(mapped) + 4096, 4096), 0);  // the child has a hole there too
  Holder child;
  uint8_t buf[8192];
  // Straddling the hole: the first page copies, then EFAULT.
  const CrossCopy straddle{buf, reinterpret_cast<uint64_t>(mapped), sizeof buf};
  Status st = cross_copy(child.pid, {&straddle, 1}, true);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("EFAULT"), std::string::npos) << st.message();
  // Our own side unmapped: EFAULT as well.
  const CrossCopy into_hole{static_cast<uint8_t*>(mapped) + 4096, reinterpret_cast<uint64_t>(buf), 16};
  EXPECT_EQ(cross_copy(child.pid, {&into_hole, 1}, true).code(), StatusCode::kInvalidArgument);
  const pid_t gone = child.pid;
  child.end();
  const CrossCopy one{buf, reinterpret_cast<uint64_t>(buf), 16};
  st = cross_copy(gone, {&one, 1}, true);
  EXPECT_EQ(st.code(), StatusCode::kPeerClosed) << st.message();
  munmap(mapped, 4096);
}

TEST(SameHost, TheKernelsPtraceRefusalIsAccessDeniedNamingEperm) {
  // A second child, as another uid, may not read the first (root's): the kernel's own
  // ptrace check refuses (no capability is involved for the unprivileged copier).
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run the copier as another uid";
  uint8_t secret[64] = {1, 2, 3};
  Holder child;
  const pid_t target = child.pid;
  const pid_t copier = fork();
  if (copier == 0) {
    if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) _exit(3);
    uint8_t out[64];
    const CrossCopy c{out, reinterpret_cast<uint64_t>(secret), sizeof out};
    const Status st = cross_copy(target, {&c, 1}, true);
    _exit(st.code() == StatusCode::kAccessDenied && st.message().find("EPERM") != std::string::npos ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(copier, &status, 0), copier);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the copier was not refused with EPERM (3: could not change uid)";
}

// A lease holds its value until it ends; the borrower's check (a real process_vm_readv of
// the word, here out of this very process) passes before and fails after, and a word is
// reused by a later loan with a new value, so an old borrower's check still fails.
TEST(BufferLease, TheCheckPassesWhileLentAndFailsOnceTheLoanEnded) {
  const int me = static_cast<int>(getpid());
  BufferLease lease = BufferLease::take();
  ASSERT_TRUE(lease.held());
  const uint64_t address = lease.address(), value = lease.value();
  EXPECT_TRUE(check_lease(me, address, value).is_ok());
  lease.end();
  EXPECT_FALSE(lease.held());
  const Status ended = check_lease(me, address, value);
  EXPECT_EQ(ended.code(), StatusCode::kCancelled) << ended.to_string();
  BufferLease again = BufferLease::take();  // the word just freed, with the next value
  EXPECT_EQ(again.address(), address);
  EXPECT_NE(again.value(), value);
  EXPECT_FALSE(check_lease(me, address, value).is_ok());
  EXPECT_TRUE(check_lease(me, again.address(), again.value()).is_ok());
  // Moved: one loan, ended once.
  BufferLease moved = std::move(again);
  EXPECT_FALSE(again.held());
  EXPECT_TRUE(check_lease(me, moved.address(), moved.value()).is_ok());
  // A word that is not there is the copy's error, not "still lent".
  EXPECT_EQ(check_lease(me, 8, 0).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dlslime
