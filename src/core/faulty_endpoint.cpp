#include "core/faulty_endpoint.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/op_state.h"
#include "dlslime/errors.h"

namespace dlslime {

using Clock = std::chrono::steady_clock;

// --- FaultRule / FaultPlan -------------------------------------------------------------

FaultRule FaultRule::delay_ops(std::optional<OpKind> kind, std::chrono::milliseconds by, uint32_t times) {
  FaultRule r;
  r.action = Action::kDelay;
  r.kind = kind;
  r.delay = by;
  r.times = times;
  return r;
}

FaultRule FaultRule::drop_ops(std::optional<OpKind> kind, std::chrono::milliseconds deadline, uint32_t times) {
  FaultRule r;
  r.action = Action::kDrop;
  r.kind = kind;
  r.deadline = deadline;
  r.times = times;
  return r;
}

FaultRule FaultRule::fail_ops(std::optional<OpKind> kind, StatusCode status, uint32_t times) {
  FaultRule r;
  r.action = Action::kFail;
  r.kind = kind;
  r.status = status;
  r.times = times;
  return r;
}

FaultRule FaultRule::fail_connect(uint32_t times, std::string message) {
  FaultRule r;
  r.action = Action::kFail;
  r.on_connect = true;
  r.times = times;
  r.message = std::move(message);
  return r;
}

void FaultPlan::add(FaultRule rule) {
  if (rule.times == 0) throw InvalidArgumentError("fault rule: times must be at least 1");
  if (rule.delay.count() < 0 || rule.deadline.count() < 0) {
    throw InvalidArgumentError("fault rule: delay and deadline must not be negative");
  }
  // An injected failure that reports success would be a future claiming work it never did.
  if (rule.action == FaultRule::Action::kFail &&
      (rule.status == StatusCode::kSuccess || rule.status == StatusCode::kPending)) {
    throw InvalidArgumentError(fmt::format("fault rule: cannot fail with status {}", status_code_name(rule.status)));
  }
  if (rule.on_connect && rule.kind) throw InvalidArgumentError("fault rule: a connect rule has no op kind");
  std::lock_guard lock(mu_);
  rules_.push_back(std::move(rule));
}

void FaultPlan::clear() {
  std::lock_guard lock(mu_);
  rules_.clear();
}

FaultPlan::Counts FaultPlan::counts() const {
  std::lock_guard lock(mu_);
  return counts_;
}

std::optional<FaultRule> FaultPlan::take_op(OpKind kind) { return take(false, kind); }

std::optional<FaultRule> FaultPlan::take_connect() { return take(true, OpKind::kRead); }

std::optional<FaultRule> FaultPlan::take(bool connect, OpKind kind) {
  std::lock_guard lock(mu_);
  for (auto it = rules_.begin(); it != rules_.end(); ++it) {
    if (it->on_connect != connect || (!connect && it->kind && *it->kind != kind)) continue;
    FaultRule rule = *it;
    if (it->times != FaultRule::kAlways && --it->times == 0) rules_.erase(it);
    switch (rule.action) {
      case FaultRule::Action::kDelay: ++counts_.delayed; break;
      case FaultRule::Action::kDrop: ++counts_.dropped; break;
      case FaultRule::Action::kFail: ++counts_.failed; break;
    }
    return rule;
  }
  ++counts_.passed;
  return std::nullopt;
}

// --- the timer -------------------------------------------------------------------------

namespace {

// An op held by the decorator: released to the inner endpoint when due (`request` set),
// or expired with kTimeout (a dropped op).
struct HeldOp {
  Clock::time_point due;
  std::shared_ptr<OpState> state;
  std::optional<OpRequest> request;
  std::string expiry;  // the timeout message of a dropped op
};

bool later(const std::shared_ptr<HeldOp>& a, const std::shared_ptr<HeldOp>& b) { return a->due > b->due; }

// Submits a delayed op to the inner endpoint; its result becomes the held op's result.
void forward(Endpoint& inner, HeldOp& held) {
  try {
    Future inner_future = inner.submit(std::move(*held.request));
    // Future::cancel from now on cancels the inner op.
    auto cancel = forward_cancel(*held.state, inner_future.state());
    inner_future.state()->on_complete([state = held.state, cancel](const OpState& done) {
      state->complete(done.status(), done.nbytes());
    });
  } catch (const Error& e) {
    // The caller's submit returned already: a synchronous refusal can only be its status now.
    held.state->complete(Status(e.code(), e.what()));
  } catch (const std::exception& e) {
    held.state->complete(Status::failed(e.what()));
  }
}

}  // namespace

struct FaultyEndpoint::Timer final : OpCanceller {
  std::shared_ptr<Endpoint> inner;
  std::mutex mu;
  std::condition_variable cv;                  // wakes the thread and held connect() calls
  std::vector<std::shared_ptr<HeldOp>> heap;  // min-heap on `due`; guarded by mu
  bool shut_down = false;                      // guarded by mu
  std::thread thread;

  // Holds `op` until it is due; false (nothing queued) once shut down.
  bool schedule(std::shared_ptr<HeldOp> op) {
    {
      std::lock_guard lock(mu);
      if (shut_down) return false;
      heap.push_back(std::move(op));
      std::push_heap(heap.begin(), heap.end(), later);
    }
    cv.notify_all();
    return true;
  }

  // Marks shut down and hands back every op still held.
  std::vector<std::shared_ptr<HeldOp>> stop() {
    std::vector<std::shared_ptr<HeldOp>> held;
    {
      std::lock_guard lock(mu);
      shut_down = true;
      held.swap(heap);
    }
    cv.notify_all();
    return held;
  }

  void run() {
    std::unique_lock lock(mu);
    while (!shut_down) {
      if (heap.empty()) {
        cv.wait(lock);
        continue;
      }
      const auto now = Clock::now();
      if (heap.front()->due > now) {
        // Copy the deadline: stop() may swap the heap out and free its op while we wait,
        // and wait_until reads the time point again after waking.
        const Clock::time_point next = heap.front()->due;
        cv.wait_until(lock, next);
        continue;
      }
      std::vector<std::shared_ptr<HeldOp>> due;
      while (!heap.empty() && heap.front()->due <= now) {
        std::pop_heap(heap.begin(), heap.end(), later);
        due.push_back(std::move(heap.back()));
        heap.pop_back();
      }
      lock.unlock();
      {
        // Continuations of the ops completed here run after the loop, not inside it.
        CompletionScope scope;
        for (auto& op : due) {
          if (op->request) {
            forward(*inner, *op);
          } else {
            op->state->complete(Status::timeout(op->expiry));
          }
        }
      }
      lock.lock();
    }
  }

  // Future::cancel of an op still held (delayed or dropped): it never reaches the inner
  // endpoint. One already forwarded is the inner op's to cancel (forward_cancel).
  bool cancel_op(OpState& state, uint64_t) override {
    std::shared_ptr<HeldOp> found;
    {
      std::lock_guard lock(mu);
      auto it = std::find_if(heap.begin(), heap.end(), [&](const auto& op) { return op->state.get() == &state; });
      if (it == heap.end()) return false;
      found = std::move(*it);
      heap.erase(it);
      std::make_heap(heap.begin(), heap.end(), later);
    }
    cv.notify_all();
    return found->state->complete(OpState::cancelled_by_user());
  }

  // Blocks for `wait`; false if shut down first.
  bool hold(std::chrono::milliseconds wait) {
    std::unique_lock lock(mu);
    return !cv.wait_for(lock, wait, [this] { return shut_down; });
  }
};

// --- FaultyEndpoint --------------------------------------------------------------------

FaultyEndpoint::FaultyEndpoint(std::shared_ptr<Endpoint> inner, std::shared_ptr<FaultPlan> plan)
    : inner_(std::move(inner)), plan_(std::move(plan)), timer_(std::make_shared<Timer>()) {
  if (!inner_) throw InvalidArgumentError("FaultyEndpoint: the inner endpoint is null");
  if (!plan_) throw InvalidArgumentError("FaultyEndpoint: the fault plan is null");
  timer_->inner = inner_;
  timer_->thread = std::thread([timer = timer_] { timer->run(); });
}

FaultyEndpoint::~FaultyEndpoint() {
  shutdown();
  // The last reference may go on the timer thread itself (from a continuation it ran);
  // it only touches the Timer it shares, so it may finish on its own.
  if (timer_->thread.get_id() == std::this_thread::get_id()) {
    timer_->thread.detach();
  } else {
    timer_->thread.join();
  }
}

nlohmann::json FaultyEndpoint::endpoint_info() const { return inner_->endpoint_info(); }

void FaultyEndpoint::connect(const nlohmann::json& peer_info) {
  if (auto rule = plan_->take_connect()) {
    switch (rule->action) {
      case FaultRule::Action::kFail: throw ConnectionError(rule->message, rule->status);
      case FaultRule::Action::kDrop:
        if (!timer_->hold(rule->deadline)) throw ConnectionError("connect: the endpoint was shut down");
        throw ConnectionError(
            fmt::format("connect: {} (dropped; no answer within {} ms)", rule->message, rule->deadline.count()),
            StatusCode::kTimeout);
      case FaultRule::Action::kDelay:
        if (!timer_->hold(rule->delay)) throw ConnectionError("connect: the endpoint was shut down");
        break;
    }
  }
  inner_->connect(peer_info);
}

bool FaultyEndpoint::is_connected() const { return inner_->is_connected(); }

int32_t FaultyEndpoint::register_memory_region(const std::string& name, uintptr_t addr, uint64_t offset,
                                               uint64_t length) {
  return inner_->register_memory_region(name, addr, offset, length);
}

int32_t FaultyEndpoint::register_remote_memory_region(const std::string& name, const nlohmann::json& mr_info_entry) {
  return inner_->register_remote_memory_region(name, mr_info_entry);
}

void FaultyEndpoint::unregister_memory_region(const std::string& name) { inner_->unregister_memory_region(name); }

void FaultyEndpoint::unregister_memory_region(int32_t handle) { inner_->unregister_memory_region(handle); }

nlohmann::json FaultyEndpoint::mr_info() const { return inner_->mr_info(); }
nlohmann::json FaultyEndpoint::mr_info_of(const std::string& name) const { return inner_->mr_info_of(name); }

Capabilities FaultyEndpoint::capabilities() const { return inner_->capabilities(); }

void FaultyEndpoint::shutdown() {
  for (auto& op : timer_->stop()) {
    op->state->complete(Status::cancelled("the endpoint was shut down"));
  }
  inner_->shutdown();
}

Future FaultyEndpoint::do_submit(OpRequest request) {
  auto rule = plan_->take_op(request.kind);
  if (!rule) return inner_->submit(std::move(request));
  auto state = std::make_shared<OpState>(request.kind);
  auto held = std::make_shared<HeldOp>();
  held->state = state;
  switch (rule->action) {
    case FaultRule::Action::kFail:
      state->complete(Status(rule->status, rule->message));
      return Future(state);
    case FaultRule::Action::kDelay:
      held->due = Clock::now() + rule->delay;
      held->request = std::move(request);
      break;
    case FaultRule::Action::kDrop:
      held->due = Clock::now() + rule->deadline;
      held->expiry = fmt::format("{} (dropped; deadline {} ms)", rule->message, rule->deadline.count());
      break;
  }
  state->set_canceller(std::static_pointer_cast<OpCanceller>(timer_), 0);
  if (!timer_->schedule(held)) state->complete(Status::cancelled("the endpoint was shut down"));
  return Future(state);
}

}  // namespace dlslime
