#include "dlslime/status.h"

#include <fmt/format.h>

namespace dlslime {

const char* status_code_name(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::kSuccess: return "SUCCESS";
    case StatusCode::kPending: return "PENDING";
    case StatusCode::kBatchOverflow: return "BATCH_OVERFLOW";
    case StatusCode::kUnknownOpcode: return "UNKNOWN_OPCODE";
    case StatusCode::kTimeout: return "TIMEOUT";
    case StatusCode::kFailed: return "FAILED";
    case StatusCode::kOutOfBounds: return "OUT_OF_BOUNDS";
    case StatusCode::kUnknownHandle: return "UNKNOWN_HANDLE";
    case StatusCode::kCancelled: return "CANCELLED";
    case StatusCode::kPeerClosed: return "PEER_CLOSED";
    case StatusCode::kMessageTooLarge: return "MESSAGE_TOO_LARGE";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotConnected: return "NOT_CONNECTED";
    case StatusCode::kProtocolError: return "PROTOCOL_ERROR";
    case StatusCode::kNotImplemented: return "NOT_IMPLEMENTED";
    case StatusCode::kAccessDenied: return "ACCESS_DENIED";
    case StatusCode::kAuthenticationFailed: return "AUTHENTICATION_FAILED";
  }
  return "UNKNOWN_STATUS";
}

std::string Status::to_string() const {
  if (is_ok()) return "SUCCESS";
  return fmt::format("{} ({}): {}", status_code_name(code_), raw_code(), message_);
}

}  // namespace dlslime
