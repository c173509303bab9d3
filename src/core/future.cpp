#include "dlslime/future.h"

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

uint64_t Future::nbytes() const { return checked(state_).nbytes(); }

uint32_t Future::imm_data() const { return checked(state_).imm_data(); }

}  // namespace dlslime
