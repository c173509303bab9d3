#pragma once

#include <cstdint>

#include "dlslime/status.h"

// A buffer lent to another process on this host, which copies it out itself with
// process_vm_readv (docs/tcp.md "Same-host path", messages). The lender cannot know when
// the borrower's copy runs, and the owner may reuse the buffer as soon as the op that lent
// it ends (a deadline, a cancel, a lost connection). So each loan has a word in this
// process that the borrower reads right after its copy: the lender changes the word before
// it ends the op, and a borrower that reads the value it was given knows the buffer was
// still lent while it copied. The words sit in a table that is never freed, so a late read
// always finds a word, never unmapped memory.
namespace dlslime {

class BufferLease {
 public:
  BufferLease() = default;  // no loan
  // A fresh loan: a word of the table and its current value.
  static BufferLease take();
  BufferLease(BufferLease&& other) noexcept { *this = std::move(other); }
  BufferLease& operator=(BufferLease&& other) noexcept;
  BufferLease(const BufferLease&) = delete;
  BufferLease& operator=(const BufferLease&) = delete;
  ~BufferLease() { end(); }

  // Where the borrower reads the word, and the value that means "still lent".
  uint64_t address() const { return reinterpret_cast<uintptr_t>(word_); }
  uint64_t value() const { return value_; }
  bool held() const { return word_ != nullptr; }
  // The buffer goes back to its owner: the word changes (before the caller completes the
  // op) and returns to the table. Idempotent.
  void end();

 private:
  uint64_t* word_ = nullptr;
  uint64_t value_ = 0;
};

// The borrower's check, after its copy out of process `pid`: OK if the word at `address`
// there still holds `value`; kCancelled if the loan ended (the bytes copied may be from
// after the owner took the buffer back); the copy error if the word cannot be read.
Status check_lease(int pid, uint64_t address, uint64_t value);

}  // namespace dlslime
