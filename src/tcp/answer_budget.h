#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace dlslime::tcp {

class TcpConnection;

// Answers (acknowledgements, read responses) queued to one peer on all its connections: a
// peer that sends requests and never reads the answers may make them hold at most `limit`
// bytes. Past it the peer's connections stop reading requests until half has drained
// (bounded memory however many lanes the peer opens). Only answers count: requests are
// bounded by max_inflight_ops, and pausing on them could wait on the peer's own pause.
// Shared by the connections of one endpoint, on its I/O thread.
struct AnswerBudget {
  static constexpr size_t kDefaultLimit = 8 << 20;
  size_t bytes = 0;
  size_t limit = kDefaultLimit;
  std::vector<std::weak_ptr<TcpConnection>> stalled;  // stopped reading until bytes <= limit / 2
  bool full() const { return bytes > limit; }
  // Restarts the stalled connections once enough has drained.
  void on_drained();
};

}  // namespace dlslime::tcp
