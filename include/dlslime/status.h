#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "dlslime/export.h"

namespace dlslime {

// Completion status codes of every operation, on every transport. This enum is the one
// place they are defined; docs/api.md lists them. 0..403 keep DLSlime's numbering.
enum class StatusCode : int32_t {
  kSuccess = 0,
  kPending = 1,               // the op has not completed yet (Future::status() while running; never final)
  kBatchOverflow = 400,       // more items in a batch, or more ops in flight, than allowed
  kUnknownOpcode = 401,       // the peer sent a frame kind this side does not know
  kTimeout = 402,             // the op's deadline passed before it completed
  kFailed = 403,              // generic failure (e.g. the connection was lost)
  kOutOfBounds = 404,         // [offset, offset+length) is outside the registered region
  kUnknownHandle = 405,       // no region with this handle (local or at the peer)
  kCancelled = 406,           // the endpoint was shut down before the op completed
  kPeerClosed = 407,          // the peer closed or lost the connection
  kMessageTooLarge = 408,     // a sent message is longer than the posted receive buffer
  kInvalidArgument = 409,     // the op itself is malformed (zero-length item, bad address)
  kNotConnected = 410,        // the endpoint has no connection to a peer yet
  kProtocolError = 411,       // the byte stream from the peer is corrupt
  kNotImplemented = 412,      // the transport cannot do this op
  kAccessDenied = 413,        // the peer refused the connection (already paired, stale info, full)
  kAuthenticationFailed = 414,  // the shared-secret token is missing on one side or differs
};

DLSLIME_API const char* status_code_name(StatusCode code) noexcept;

// A code plus a human-readable reason. Successful statuses carry no message.
class DLSLIME_API Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  static Status timeout(std::string msg) { return {StatusCode::kTimeout, std::move(msg)}; }
  static Status failed(std::string msg) { return {StatusCode::kFailed, std::move(msg)}; }
  static Status out_of_bounds(std::string msg) { return {StatusCode::kOutOfBounds, std::move(msg)}; }
  static Status unknown_handle(std::string msg) { return {StatusCode::kUnknownHandle, std::move(msg)}; }
  static Status cancelled(std::string msg) { return {StatusCode::kCancelled, std::move(msg)}; }
  static Status peer_closed(std::string msg) { return {StatusCode::kPeerClosed, std::move(msg)}; }
  static Status invalid_argument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status not_connected(std::string msg) { return {StatusCode::kNotConnected, std::move(msg)}; }
  static Status protocol_error(std::string msg) { return {StatusCode::kProtocolError, std::move(msg)}; }

  bool is_ok() const noexcept { return code_ == StatusCode::kSuccess; }
  explicit operator bool() const noexcept { return is_ok(); }
  StatusCode code() const noexcept { return code_; }
  int32_t raw_code() const noexcept { return static_cast<int32_t>(code_); }
  const std::string& message() const noexcept { return message_; }
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kSuccess;
  std::string message_;
};

}  // namespace dlslime
