#include "dlslime/endpoint.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/fork_generation.h"
#include "core/notify_fence.h"
#include "dlslime/errors.h"

namespace dlslime {

const char* op_kind_name(OpKind kind) noexcept {
  switch (kind) {
    case OpKind::kRead: return "read";
    case OpKind::kWrite: return "write";
    case OpKind::kWriteWithImm: return "write_with_imm";
    case OpKind::kSend: return "send";
    case OpKind::kRecv: return "recv";
    case OpKind::kImmRecv: return "imm_recv";
    case OpKind::kSendNotify: return "send_notify";
    case OpKind::kRecvNotify: return "recv_notify";
  }
  return "unknown";
}

Status exact_size_mismatch(uint64_t message_bytes, uint64_t buffer_bytes) {
  return Status::failed(fmt::format("recv(exact_size): the message has {} bytes, the buffer {}", message_bytes,
                                    buffer_bytes));
}

Endpoint::Endpoint() : fork_generation_(fork_generation()) {}

Endpoint::~Endpoint() = default;

bool Endpoint::inherited_from_parent() const noexcept { return fork_generation_ != fork_generation(); }

nlohmann::json Endpoint::mr_info_of(const std::string& name) const {
  const nlohmann::json all = mr_info();
  return all.is_object() && all.contains(name) ? all[name] : nlohmann::json();
}

bool Endpoint::leave_if_inherited(std::shared_ptr<const void> impl) const {
  if (!inherited_from_parent()) return false;
  keep_inherited(std::move(impl));
  return true;
}

void Endpoint::require_own_process() const {
  if (!inherited_from_parent()) return;
  throw ConnectionError(fmt::format("this {} endpoint was created before fork() and cannot be used in the child "
                                    "process; create a new endpoint there",
                                    capabilities().transport));
}

void Endpoint::refuse_after_shutdown(const char* call) const {
  throw InvalidArgumentError(fmt::format("{}() on a {} endpoint that was shut down; create a new endpoint", call,
                                         capabilities().transport));
}

bool Capabilities::supports(OpKind kind) const noexcept {
  switch (kind) {
    case OpKind::kRead: return read;
    case OpKind::kWrite: return write;
    case OpKind::kWriteWithImm: return write_with_imm;
    case OpKind::kSend:
    case OpKind::kRecv: return send_recv;
    case OpKind::kImmRecv: return imm_recv;
    case OpKind::kSendNotify:
    case OpKind::kRecvNotify: return notify;
  }
  return false;
}

void Endpoint::order_notifications(std::function<Future(OpRequest)> submit_notify) {
  fence_ = std::make_shared<NotifyFence>(std::move(submit_notify));
}

Future Endpoint::submit(OpRequest request) {
  require_own_process();
  const Capabilities caps = capabilities();
  if (!caps.supports(request.kind)) {
    // Notifications are the completion signal at the target that every transport has.
    const bool imm = request.kind == OpKind::kWriteWithImm || request.kind == OpKind::kImmRecv;
    throw NotImplementedError(fmt::format("{} is not supported by the {} transport{}", op_kind_name(request.kind),
                                          caps.transport,
                                          imm && caps.notify ? "; for a signal at the target once a write's bytes "
                                                               "are in place, use write(..., notify=...) and "
                                                               "recv_notify()"
                                                             : ""));
  }
  const bool carries_notification = request.kind == OpKind::kSendNotify || request.kind == OpKind::kWrite;
  if (request.notification && carries_notification) {
    if (!caps.notify) {
      throw NotImplementedError(fmt::format("notifications are not supported by the {} transport", caps.transport));
    }
    if (request.notification->size() > OpRequest::kMaxNotificationBytes) {
      throw InvalidArgumentError(fmt::format("{}: a notification of {} bytes is larger than the limit of {} bytes",
                                             op_kind_name(request.kind), request.notification->size(),
                                             OpRequest::kMaxNotificationBytes));
    }
  } else if (request.kind == OpKind::kSendNotify) {
    throw InvalidArgumentError("send_notify: no notification given");
  }
  if (request.timeout.count() < 0 || request.timeout > OpRequest::kMaxOpTimeout) {
    throw InvalidArgumentError(fmt::format("{}: timeout {} ms is outside [0, {}] ms", op_kind_name(request.kind),
                                           request.timeout.count(), OpRequest::kMaxOpTimeout.count()));
  }
  switch (request.kind) {
    case OpKind::kRead:
    case OpKind::kWrite:
    case OpKind::kWriteWithImm:
      if (request.assignments.empty()) {
        throw InvalidArgumentError(fmt::format("{}: the batch is empty", op_kind_name(request.kind)));
      }
      break;
    case OpKind::kSend:
    case OpKind::kRecv:
      if (request.chunk.addr == 0 && request.chunk.length > 0) {
        throw InvalidArgumentError(fmt::format("{}: buffer address is null", op_kind_name(request.kind)));
      }
      if (const Chunk& c = request.chunk; c.offset > UINTPTR_MAX - c.addr || c.length > UINTPTR_MAX - c.addr - c.offset) {
        // A wrapped range would name other bytes, or none (hostile review N12).
        throw InvalidArgumentError(fmt::format("{}: buffer {:#x} + offset {} + length {} overflows the address space",
                                               op_kind_name(request.kind), c.addr, c.offset, c.length));
      }
      break;
    case OpKind::kImmRecv:
    case OpKind::kSendNotify:
    case OpKind::kRecvNotify: break;
  }
  if (!request.notification || !carries_notification) request.notification.reset();
  if (!fence_) return do_submit(std::move(request));  // the transport orders them itself
  const auto submit = [this](OpRequest r) { return do_submit(std::move(r)); };
  switch (request.kind) {
    case OpKind::kSendNotify: return fence_->send_notify(std::move(request));
    case OpKind::kWrite:
      if (request.notification) return fence_->write_then_notify(std::move(request), submit);
      return fence_->submit_write(std::move(request), submit);
    case OpKind::kWriteWithImm: return fence_->submit_write(std::move(request), submit);
    default: return do_submit(std::move(request));
  }
}

namespace {

OpRequest one_sided(OpKind kind, std::vector<Assignment> assignments, uint32_t imm_data,
                    std::chrono::milliseconds timeout) {
  OpRequest r;
  r.kind = kind;
  r.assignments = std::move(assignments);
  r.imm_data = imm_data;
  r.timeout = timeout;
  return r;
}

OpRequest two_sided(OpKind kind, const Chunk& chunk, std::chrono::milliseconds timeout, bool exact_size) {
  OpRequest r;
  r.kind = kind;
  r.chunk = chunk;
  r.timeout = timeout;
  r.exact_size = exact_size;
  return r;
}

}  // namespace

Future Endpoint::read(std::vector<Assignment> assignments, std::chrono::milliseconds timeout) {
  return submit(one_sided(OpKind::kRead, std::move(assignments), 0, timeout));
}

Future Endpoint::write(std::vector<Assignment> assignments, std::chrono::milliseconds timeout,
                       std::optional<std::string> notification) {
  OpRequest r = one_sided(OpKind::kWrite, std::move(assignments), 0, timeout);
  r.notification = std::move(notification);
  return submit(std::move(r));
}

Future Endpoint::write_with_imm(std::vector<Assignment> assignments, uint32_t imm_data,
                                std::chrono::milliseconds timeout) {
  return submit(one_sided(OpKind::kWriteWithImm, std::move(assignments), imm_data, timeout));
}

Future Endpoint::send(const Chunk& chunk, std::chrono::milliseconds timeout) {
  return submit(two_sided(OpKind::kSend, chunk, timeout, false));
}

Future Endpoint::recv(const Chunk& chunk, bool exact_size, std::chrono::milliseconds timeout) {
  return submit(two_sided(OpKind::kRecv, chunk, timeout, exact_size));
}

Future Endpoint::imm_recv(std::chrono::milliseconds timeout) {
  return submit(two_sided(OpKind::kImmRecv, Chunk{}, timeout, false));
}

Future Endpoint::send_notify(std::string notification, std::chrono::milliseconds timeout) {
  OpRequest r = two_sided(OpKind::kSendNotify, Chunk{}, timeout, false);
  r.notification = std::move(notification);
  return submit(std::move(r));
}

Future Endpoint::recv_notify(std::chrono::milliseconds timeout) {
  return submit(two_sided(OpKind::kRecvNotify, Chunk{}, timeout, false));
}

}  // namespace dlslime
