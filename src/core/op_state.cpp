#include "core/op_state.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <ctime>
#include <exception>
#include <utility>
#include <vector>

#include "core/log.h"

namespace dlslime {

namespace {

struct DeferredContinuation {
  std::shared_ptr<const OpState> state;
  std::function<void(const OpState&)> fn;
};
thread_local int scope_depth = 0;
thread_local std::vector<DeferredContinuation> deferred;

void run_continuation(const OpState& state, std::function<void(const OpState&)>& fn) noexcept {
  try {
    fn(state);
  } catch (const std::exception& e) {
    // A continuation must not take the completing thread (an I/O thread) down.
    DLSLIME_ERROR("an op continuation threw: {}", e.what());
  } catch (...) {
    DLSLIME_ERROR("an op continuation threw a non-standard exception");
  }
}

uint32_t* futex_word(const std::atomic<uint32_t>& a) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  return reinterpret_cast<uint32_t*>(const_cast<std::atomic<uint32_t>*>(&a));
}

// Sleeps while *word == expected, at most `timeout` (nullptr: no limit). Spurious and
// early returns are fine: the caller re-checks.
void futex_wait(const std::atomic<uint32_t>& word, uint32_t expected, const timespec* timeout) {
  (void)syscall(SYS_futex, futex_word(word), FUTEX_WAIT_PRIVATE, expected, timeout, nullptr, 0);
}

void futex_wake_all(const std::atomic<uint32_t>& word) {
  (void)syscall(SYS_futex, futex_word(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

void OpState::record_error(const Status& status) {
  std::lock_guard lock(mu_);
  if (first_error_.is_ok()) first_error_ = status;
}

bool OpState::finish_part(const Status& status, uint64_t nbytes) {
  if (!status.is_ok()) record_error(status);
  nbytes_.fetch_add(nbytes, std::memory_order_relaxed);
  if (parts_left_.fetch_sub(1, std::memory_order_acq_rel) != 1) return false;
  Status final_status;
  {
    std::lock_guard lock(mu_);
    final_status = first_error_;
  }
  return complete(std::move(final_status));
}

bool OpState::complete(Status status, uint64_t nbytes) {
  std::vector<std::pair<uint64_t, Continuation>> continuations;
  {
    std::lock_guard lock(mu_);
    if (done_.load(std::memory_order_relaxed) != 0) return false;
    canceller_.reset();
    status_ = std::move(status);
    nbytes_.fetch_add(nbytes, std::memory_order_relaxed);
    // seq_cst, as is the waiter's increment of waiters_ before it re-checks done_: either
    // this load sees the waiter, or the waiter sees done_ (and the futex refuses to sleep).
    done_.store(1, std::memory_order_seq_cst);
    continuations.swap(continuations_);
  }
  if (waiters_.load(std::memory_order_seq_cst) > 0) futex_wake_all(done_);
  if (continuations.empty()) return true;
  // Deferred ones queue in order behind each other; without a scope they run here, in order.
  auto self = weak_from_this().lock();
  for (auto& [key, fn] : continuations) {
    if (!CompletionScope::defer(self, fn)) run_continuation(*this, fn);
  }
  return true;
}

bool OpState::block(const std::chrono::steady_clock::time_point* deadline) const {
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  while (done_.load(std::memory_order_seq_cst) == 0) {
    if (deadline == nullptr) {
      futex_wait(done_, 0, nullptr);
      continue;
    }
    const auto left = *deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) break;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    futex_wait(done_, 0, &ts);
  }
  waiters_.fetch_sub(1, std::memory_order_relaxed);
  return done();
}

void OpState::wait() const {
  if (!done()) block(nullptr);
}

bool OpState::wait_for(std::chrono::nanoseconds timeout) const {
  if (done()) return true;
  if (timeout <= std::chrono::nanoseconds::zero()) return false;
  const auto now = std::chrono::steady_clock::now();
  // Far-future timeouts (Python's None becomes a huge value) must not overflow.
  if (timeout >= std::chrono::steady_clock::time_point::max() - now) return block(nullptr);
  const auto deadline = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout);
  return block(&deadline);
}

uint64_t OpState::add_continuation(Continuation fn) {
  if (!fn) return 0;
  {
    std::lock_guard lock(mu_);
    if (done_.load(std::memory_order_relaxed) == 0) {
      const uint64_t key = next_key_++;
      continuations_.emplace_back(key, std::move(fn));
      return key;
    }
  }
  if (!CompletionScope::defer(weak_from_this().lock(), fn)) run_continuation(*this, fn);
  return 0;
}

bool OpState::remove_continuation(uint64_t key) {
  Continuation removed;  // destroyed after the lock is released: it may own anything
  std::lock_guard lock(mu_);
  for (auto it = continuations_.begin(); it != continuations_.end(); ++it) {
    if (it->first == key) {
      removed = std::move(it->second);
      continuations_.erase(it);
      return true;
    }
  }
  return false;
}

void OpState::set_canceller(std::weak_ptr<OpCanceller> canceller, uint64_t op_id) {
  std::lock_guard lock(mu_);
  if (done_.load(std::memory_order_relaxed) != 0) return;  // nothing left to withdraw
  canceller_ = std::move(canceller);
  cancel_id_ = op_id;
}

bool OpState::cancel() {
  if (done()) return false;
  std::shared_ptr<OpCanceller> canceller;
  uint64_t op_id = 0;
  {
    // Called without mu_: the canceller completes the op, which takes mu_.
    std::lock_guard lock(mu_);
    if (done_.load(std::memory_order_relaxed) != 0) return false;
    canceller = canceller_.lock();
    op_id = cancel_id_;
  }
  if (!canceller || !canceller->cancel_op(*this, op_id)) return false;
  // The canceller says it completed the op; the status must say so too, else another
  // completion won and this call must not claim the op was withdrawn.
  return done() && status_.code() == StatusCode::kCancelled;
}

Status OpState::cancelled_by_user() {
  return Status::cancelled("the operation was cancelled by the user (Future.cancel)");
}

namespace {
struct ForwardedCancel final : OpCanceller {
  std::weak_ptr<OpState> inner;
  bool cancel_op(OpState& outer, uint64_t) override {
    auto state = inner.lock();
    if (!state || !state->cancel()) return false;
    outer.complete(state->status(), state->nbytes());
    return true;
  }
};
}  // namespace

std::shared_ptr<OpCanceller> forward_cancel(OpState& outer, const std::shared_ptr<OpState>& inner) {
  auto canceller = std::make_shared<ForwardedCancel>();
  canceller->inner = inner;
  outer.set_canceller(canceller, 0);
  return canceller;
}

CompletionScope::CompletionScope() noexcept { ++scope_depth; }

CompletionScope::~CompletionScope() {
  if (scope_depth > 1) {
    --scope_depth;
    return;
  }
  // The outermost scope: run what was deferred, including what those continuations
  // complete in turn (the scope stays open meanwhile, so they queue behind).
  while (!deferred.empty()) {
    std::vector<DeferredContinuation> batch;
    batch.swap(deferred);
    for (auto& d : batch) run_continuation(*d.state, d.fn);
  }
  --scope_depth;
}

bool CompletionScope::defer(std::shared_ptr<const OpState> state, std::function<void(const OpState&)>& fn) {
  if (scope_depth == 0 || !state) return false;  // no scope, or a state not owned by a shared_ptr
  deferred.push_back({std::move(state), std::move(fn)});
  return true;
}

}  // namespace dlslime
