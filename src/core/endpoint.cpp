#include "dlslime/endpoint.h"

#include <fmt/format.h>

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
  }
  return "unknown";
}

Endpoint::~Endpoint() = default;

bool Capabilities::supports(OpKind kind) const noexcept {
  switch (kind) {
    case OpKind::kRead: return read;
    case OpKind::kWrite: return write;
    case OpKind::kWriteWithImm: return write_with_imm;
    case OpKind::kSend:
    case OpKind::kRecv: return send_recv;
    case OpKind::kImmRecv: return imm_recv;
  }
  return false;
}

Future Endpoint::submit(OpRequest request) {
  const Capabilities caps = capabilities();
  if (!caps.supports(request.kind)) {
    throw NotImplementedError(fmt::format("{} is not supported by the {} transport", op_kind_name(request.kind),
                                          caps.transport));
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
      break;
    case OpKind::kImmRecv: break;
  }
  return do_submit(std::move(request));
}

Future Endpoint::read(std::vector<Assignment> assignments) {
  return submit({OpKind::kRead, std::move(assignments), {}, 0});
}

Future Endpoint::write(std::vector<Assignment> assignments) {
  return submit({OpKind::kWrite, std::move(assignments), {}, 0});
}

Future Endpoint::write_with_imm(std::vector<Assignment> assignments, uint32_t imm_data) {
  return submit({OpKind::kWriteWithImm, std::move(assignments), {}, imm_data});
}

Future Endpoint::send(const Chunk& chunk) { return submit({OpKind::kSend, {}, chunk, 0}); }

Future Endpoint::recv(const Chunk& chunk) { return submit({OpKind::kRecv, {}, chunk, 0}); }

Future Endpoint::imm_recv() { return submit({OpKind::kImmRecv, {}, {}, 0}); }

}  // namespace dlslime
