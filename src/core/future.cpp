#include "dlslime/future.h"

#include <condition_variable>
#include <mutex>
#include <string>
#include <utility>

#include "core/op_state.h"
#include "dlslime/errors.h"

namespace dlslime {

namespace {
const OpState& checked(const std::shared_ptr<OpState>& state) {
  if (!state) throw InvalidArgumentError("Future is empty (default-constructed)");
  return *state;
}
}  // namespace

int Future::wait() const {
  checked(state_).wait();
  return state_->status().raw_code();
}

std::optional<int> Future::wait_for(std::chrono::nanoseconds timeout) const {
  if (!checked(state_).wait_for(timeout)) return std::nullopt;
  return state_->status().raw_code();
}

bool Future::done() const { return checked(state_).done(); }

int Future::status() const { return result().raw_code(); }

std::string Future::message() const { return result().message(); }

Status Future::result() const {
  if (!checked(state_).done()) return Status(StatusCode::kPending, "operation still running");
  return state_->status();
}

bool Future::cancel() const {
  checked(state_);
  return state_->cancel();
}

uint64_t Future::nbytes() const { return checked(state_).nbytes(); }

uint32_t Future::imm_data() const { return checked(state_).imm_data(); }
std::string Future::notification() const {
  const OpState& s = checked(state_);
  return s.done() ? s.notification() : std::string();
}

void Future::on_complete(std::function<void(const Future&)> callback) const {
  checked(state_);
  if (!callback) throw InvalidArgumentError("Future::on_complete: the callback is empty");
  // The continuation holds the op weakly: an op that never ends must not keep itself alive
  // through its own continuation. It runs while the op is alive (the completing code or
  // the deferred queue holds a reference), so the lock succeeds there.
  std::weak_ptr<OpState> weak = state_;
  state_->on_complete([weak = std::move(weak), callback = std::move(callback)](const OpState&) {
    if (auto state = weak.lock()) callback(Future(std::move(state)));
  });
}

namespace {

void check_all_valid(const std::vector<Future>& futures, const char* call) {
  for (size_t i = 0; i < futures.size(); ++i) {
    if (!futures[i].valid()) {
      throw InvalidArgumentError(std::string(call) + ": futures[" + std::to_string(i) +
                                 "] is empty (default-constructed)");
    }
  }
}

std::optional<size_t> first_done(const std::vector<Future>& futures) {
  for (size_t i = 0; i < futures.size(); ++i) {
    if (futures[i].state()->done()) return i;
  }
  return std::nullopt;
}

// wait_any's meeting point: the first continuation to run records its index and wakes the
// waiter. Shared with the continuations, which may outlive the wait (one already running
// when the wait gives up).
struct AnyDone {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<size_t> index;  // guarded by mu
};

// Blocks until one op ends or `deadline` (nullptr: none) passes.
std::optional<size_t> wait_any_until(const std::vector<Future>& futures,
                                     const std::chrono::steady_clock::time_point* deadline) {
  if (futures.empty()) throw InvalidArgumentError("wait_any: no futures to wait for");
  check_all_valid(futures, "wait_any");
  if (auto i = first_done(futures)) return i;
  if (deadline != nullptr && std::chrono::steady_clock::now() >= *deadline) return std::nullopt;

  auto any = std::make_shared<AnyDone>();
  std::vector<uint64_t> keys(futures.size(), 0);
  for (size_t i = 0; i < futures.size(); ++i) {
    keys[i] = futures[i].state()->add_continuation([any, i](const OpState&) {
      {
        std::lock_guard lock(any->mu);
        if (!any->index) any->index = i;
      }
      any->cv.notify_one();
    });
    if (keys[i] == 0) break;  // it had ended already and its continuation has run
  }
  std::optional<size_t> result;
  {
    std::unique_lock lock(any->mu);
    auto ready = [&] { return any->index.has_value(); };
    if (deadline == nullptr) {
      any->cv.wait(lock, ready);
    } else {
      any->cv.wait_until(lock, *deadline, ready);
    }
    result = any->index;
  }
  // Take back what has not run, so that waiting again and again on an op that stays
  // pending does not pile continuations onto it.
  for (size_t i = 0; i < futures.size(); ++i) {
    if (keys[i] != 0) futures[i].state()->remove_continuation(keys[i]);
  }
  return result;
}

// nullopt: no deadline (the timeout is too far to represent, as OpState::wait_for does).
std::optional<std::chrono::steady_clock::time_point> deadline_after(std::chrono::nanoseconds timeout) {
  const auto now = std::chrono::steady_clock::now();
  if (timeout <= std::chrono::nanoseconds::zero()) return now;
  if (timeout >= std::chrono::steady_clock::time_point::max() - now) return std::nullopt;
  return now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout);
}

}  // namespace

std::optional<size_t> wait_any(const std::vector<Future>& futures, std::chrono::nanoseconds timeout) {
  const auto deadline = deadline_after(timeout);
  return wait_any_until(futures, deadline ? &*deadline : nullptr);
}

size_t wait_any(const std::vector<Future>& futures) { return *wait_any_until(futures, nullptr); }

// One op after the other, each on its own futex (OpState::wait_for): the whole wait ends
// when the last op does, and ops already done cost one load each.
bool wait_all(const std::vector<Future>& futures, std::chrono::nanoseconds timeout) {
  check_all_valid(futures, "wait_all");
  const auto deadline = deadline_after(timeout);
  for (const auto& f : futures) {
    const OpState& state = *f.state();
    if (state.done()) continue;
    if (!deadline) {
      state.wait();
      continue;
    }
    const auto left = *deadline - std::chrono::steady_clock::now();
    if (!state.wait_for(std::chrono::duration_cast<std::chrono::nanoseconds>(left))) return false;
  }
  return true;
}

void wait_all(const std::vector<Future>& futures) {
  check_all_valid(futures, "wait_all");
  for (const auto& f : futures) f.state()->wait();
}

}  // namespace dlslime
