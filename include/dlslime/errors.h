#pragma once

#include <stdexcept>
#include <string>

#include "dlslime/export.h"
#include "dlslime/status.h"

namespace dlslime {

// Exceptions thrown synchronously by API calls (construction, connect, registration,
// malformed arguments). Failures of submitted operations are reported through their
// future's status instead. The Python bindings choose the Python exception by code() (one
// class per StatusCode, docs/api.md), so throw the class, or Error with the code, that
// says what went wrong; a plain std::runtime_error reaches Python as RuntimeError.
class DLSLIME_API Error : public std::runtime_error {
 public:
  Error(StatusCode code, const std::string& what) : std::runtime_error(what), code_(code) {}
  StatusCode code() const noexcept { return code_; }

 private:
  StatusCode code_;
};

// The transport cannot do this operation (Python: NotImplementedError).
class DLSLIME_API NotImplementedError : public Error {
 public:
  explicit NotImplementedError(const std::string& what) : Error(StatusCode::kNotImplemented, what) {}
};

// An argument is malformed or out of range (Python: ValueError).
class DLSLIME_API InvalidArgumentError : public Error {
 public:
  explicit InvalidArgumentError(const std::string& what) : Error(StatusCode::kInvalidArgument, what) {}
};

// A name or handle is not registered (Python: KeyError).
class DLSLIME_API NotFoundError : public Error {
 public:
  explicit NotFoundError(const std::string& what) : Error(StatusCode::kUnknownHandle, what) {}
};

// Connecting to a peer failed: refused, unreachable, rejected handshake (Python: ConnectionError).
class DLSLIME_API ConnectionError : public Error {
 public:
  explicit ConnectionError(const std::string& what, StatusCode code = StatusCode::kFailed) : Error(code, what) {}
};

// The peer or the control plane refused our credentials: a missing or wrong shared-secret
// token (Python: PermissionError).
class DLSLIME_API AuthenticationError : public Error {
 public:
  explicit AuthenticationError(const std::string& what) : Error(StatusCode::kAuthenticationFailed, what) {}
};

// A blocking call ran past its deadline (Python: TimeoutError).
class DLSLIME_API TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& what) : Error(StatusCode::kTimeout, what) {}
};

}  // namespace dlslime
