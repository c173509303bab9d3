#pragma once

#include <cstdint>
#include <span>

#include "core/batch_planner.h"
#include "dlslime/endpoint.h"

namespace dlslime {

// A one-sided op (read or write) as planned on the submitting thread: its items, each
// item's first local byte (resolved against the local region table), and the plan that
// cut the items into pieces and grouped them by lane (core/batch_planner.h).
struct PlannedOp {
  uint64_t op_id = 0;
  OpKind kind = OpKind::kWrite;
  std::span<const Assignment> items;
  std::span<uint8_t* const> local;  // by item
  const BatchPlan& plan;
};

// Moves the bytes of some pieces of a planned op. When the op is prepared, a mover claims
// a lane's pieces and says how many parts it will report done; the transport's pending
// entry for the op counts those parts down and completes the op when none is left, so
// several movers can finish one op together.
//
// Why it exists: TCP moves an op's pieces either as frames on the lanes (LaneWriter) or,
// to a peer process on this host, as pull requests the peer copies itself (PullWriter,
// docs/tcp.md "Same-host path"), both in tcp_submit.cpp. Movers are chosen by the
// transport that owns the op; this is not a plugin API.
class DataMover {
 public:
  // Claims the pieces of `op` planned for `lane` (op.plan.lane(lane), not empty) and
  // returns the number of parts of the op it will report done (at least 1).
  virtual uint32_t claim(const PlannedOp& op, uint16_t lane) = 0;

 protected:
  ~DataMover() = default;
};

}  // namespace dlslime
