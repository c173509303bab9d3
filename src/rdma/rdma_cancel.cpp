// Future::cancel over RDMA (docs/api.md "Cancellation"): what the NIC has not been handed
// can be withdrawn; a work request posted to a QP cannot be taken back.
#include <algorithm>

#include "rdma/rdma_endpoint.h"

namespace dlslime {

bool RdmaEndpointImpl::cancel_op(OpState& state, uint64_t op_id) {
  // Everything below is under mu_, which continuations never run under: safe from any
  // thread, the completion thread's continuations included. What is withdrawn here was
  // never handed to the NIC, so its memory is not referenced once it is out of the tables.
  std::vector<Done> done;
  std::shared_ptr<OpState> withdrawn;
  {
    std::lock_guard lock(mu_);
    if (closed_) return false;  // shutdown ends every op itself
    auto same = [&](const std::shared_ptr<OpState>& s) { return s.get() == &state; };
    switch (state.kind()) {
      case OpKind::kRecv: {
        auto it = std::find_if(recvs_.begin(), recvs_.end(), [&](const PostedRecv& r) { return same(r.state); });
        if (it == recvs_.end()) return false;  // matched (its message is being read), or ended
        withdrawn = std::move(it->state);
        recvs_.erase(it);
        break;
      }
      case OpKind::kImmRecv: {
        auto it = std::find_if(imm_waiters_.begin(), imm_waiters_.end(),
                               [&](const ImmWaiter& w) { return same(w.state); });
        if (it == imm_waiters_.end()) return false;
        withdrawn = std::move(it->state);
        imm_waiters_.erase(it);
        break;
      }
      case OpKind::kRecvNotify: {
        NotificationInbox::EndedList ended;
        if (!notes_.withdraw(state, ended)) return false;
        withdrawn = std::move(ended.front().state);
        break;
      }
      case OpKind::kSend:
      case OpKind::kSendNotify: {
        // Only while it waits for credit: once its EAGER or RTS is posted, the peer may
        // match it (and read its buffer).
        auto it = std::find_if(pending_sends_.begin(), pending_sends_.end(),
                               [&](const PendingSend& p) { return p.op_id == op_id; });
        if (it == pending_sends_.end() || !ops_.contains(op_id)) return false;
        pending_sends_.erase(it);
        Op op = std::move(*ops_.take(op_id));
        op.uses.clear();
        withdrawn = std::move(op.state);
        break;
      }
      default: {  // read, write, write_with_imm
        Op* op = ops_.find(op_id);
        if (op == nullptr) return false;
        for (const Lane& lane : lanes_) {
          for (const PostedWr& w : lane.posted) {
            if (w.op_id == op_id) return false;  // on the NIC: its completion decides
          }
        }
        for (Lane& lane : lanes_) {
          std::erase_if(lane.waiting, [&](const QueuedWr& q) { return q.op_id == op_id; });
        }
        Op taken = std::move(*ops_.take(op_id));
        taken.uses.clear();
        withdrawn = std::move(taken.state);
        check_revokes(done);  // a REVOKE answer may have waited for this op to end
        break;
      }
    }
  }
  CompletionScope scope;  // continuations run once this call's bookkeeping is done
  const bool cancelled = withdrawn->complete(OpState::cancelled_by_user());
  complete_all(done);
  return cancelled;
}

}  // namespace dlslime
