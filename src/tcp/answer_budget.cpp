#include "tcp/answer_budget.h"

#include "tcp/tcp_connection.h"

namespace dlslime::tcp {

void AnswerBudget::on_drained() {
  if (stalled.empty() || bytes > limit / 2) return;
  auto waiting = std::move(stalled);
  stalled.clear();
  for (auto& w : waiting) {
    if (auto conn = w.lock()) conn->resume_answers();
  }
}

}  // namespace dlslime::tcp
