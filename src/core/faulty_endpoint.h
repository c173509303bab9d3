#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "dlslime/endpoint.h"
#include "dlslime/status.h"

namespace dlslime {

// One fault: what it does, to which calls, how many times. Internal, for tests (Mooncake's
// fault-proxy transport and NIXL's mock backends play the same role): failure paths of
// PeerAgent and of callers run in CI without a broken network.
struct FaultRule {
  enum class Action : uint8_t {
    // Holds the call for `delay`, then lets it through to the inner endpoint.
    kDelay,
    // The call never reaches the inner endpoint. An op fails at `deadline` with kTimeout
    // (kCancelled if the endpoint shuts down first); connect() throws ConnectionError
    // (kTimeout) after `deadline`, as if the peer never answered.
    kDrop,
    // An op completes at once with `status` and `message`; connect() throws
    // ConnectionError(message, status) at once.
    kFail,
  };
  static constexpr uint32_t kAlways = std::numeric_limits<uint32_t>::max();

  Action action = Action::kFail;
  // The calls it applies to: connect() when `on_connect`, else ops of `kind` (every kind
  // when unset).
  bool on_connect = false;
  std::optional<OpKind> kind;
  // Matching calls it applies to before it is spent; kAlways: no limit.
  uint32_t times = kAlways;
  std::chrono::milliseconds delay{0};        // kDelay
  std::chrono::milliseconds deadline{1000};  // kDrop
  StatusCode status = StatusCode::kFailed;   // kFail
  std::string message = "injected fault";

  static FaultRule delay_ops(std::optional<OpKind> kind, std::chrono::milliseconds by, uint32_t times = kAlways);
  static FaultRule drop_ops(std::optional<OpKind> kind, std::chrono::milliseconds deadline, uint32_t times = kAlways);
  static FaultRule fail_ops(std::optional<OpKind> kind, StatusCode status, uint32_t times = kAlways);
  static FaultRule fail_connect(uint32_t times = kAlways, std::string message = "injected connect failure");
};

// The faults one or more FaultyEndpoints apply, changeable from any thread while they run
// (the next call sees the change). Rules are tried in the order they were added; the first
// that matches a call applies to it and uses up one of its `times`.
class FaultPlan {
 public:
  void add(FaultRule rule);
  // Removes every rule: later calls pass straight through.
  void clear();

  // What happened to how many calls so far, by action (tests check a fault really applied).
  struct Counts {
    uint64_t delayed = 0;
    uint64_t dropped = 0;
    uint64_t failed = 0;
    uint64_t passed = 0;
  };
  Counts counts() const;

  // Picks the rule for one call and uses it up (FaultyEndpoint only); nullopt: no fault.
  std::optional<FaultRule> take_op(OpKind kind);
  std::optional<FaultRule> take_connect();

 private:
  std::optional<FaultRule> take(bool connect, OpKind kind);

  mutable std::mutex mu_;
  std::vector<FaultRule> rules_;  // guarded by mu_
  Counts counts_;                 // guarded by mu_
};

// An Endpoint decorator that applies a FaultPlan to the calls it forwards to `inner`. Every
// virtual is forwarded; only ops (submit) and connect() are subject to faults. An op with
// no fault is the inner endpoint's own future. A delayed or dropped op gets a future of
// its own that completes exactly once: with the inner op's status and byte count, at its
// drop deadline, or with kCancelled when this endpoint shuts down. One timer thread per
// decorator releases delayed ops and expires dropped ones; it never calls back into the
// caller under a lock. Not final: a test may override is_connected() or shutdown() to model
// a transport that notices a loss late.
class FaultyEndpoint : public Endpoint {
 public:
  FaultyEndpoint(std::shared_ptr<Endpoint> inner, std::shared_ptr<FaultPlan> plan);
  ~FaultyEndpoint() override;

  const std::shared_ptr<Endpoint>& inner() const noexcept { return inner_; }
  const std::shared_ptr<FaultPlan>& plan() const noexcept { return plan_; }

  nlohmann::json endpoint_info() const override;
  void connect(const nlohmann::json& peer_info) override;
  bool is_connected() const override;

  int32_t register_memory_region(const std::string& name, uintptr_t addr, uint64_t offset,
                                 uint64_t length) override;
  int32_t register_remote_memory_region(const std::string& name, const nlohmann::json& mr_info_entry) override;
  void unregister_memory_region(const std::string& name) override;
  void unregister_memory_region(int32_t handle) override;
  nlohmann::json mr_info() const override;
  nlohmann::json mr_info_of(const std::string& name) const override;

  Capabilities capabilities() const override;
  // Completes every held (delayed or dropped) op with kCancelled, wakes a delayed or
  // dropped connect(), then shuts the inner endpoint down. Idempotent.
  void shutdown() override;

 protected:
  Future do_submit(OpRequest request) override;

 private:
  struct Timer;  // held ops, the thread that releases them, and the shutdown flag

  const std::shared_ptr<Endpoint> inner_;
  const std::shared_ptr<FaultPlan> plan_;
  // Shared with the timer thread, so the thread never touches this object: the last
  // reference to the decorator may be dropped on that thread (a continuation).
  const std::shared_ptr<Timer> timer_;
};

}  // namespace dlslime
