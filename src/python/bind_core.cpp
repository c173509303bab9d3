#include <pybind11/stl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "dlslime/errors.h"
#include "dlslime/future.h"
#include "dlslime/logging.h"
#include "dlslime/status.h"
#include "convert.h"
#include "gil.h"

namespace py = pybind11;

namespace dlslime::py_bind {

namespace {

// The one mapping from a library error to a Python exception, by status code (the C++
// class only disambiguates FAILED, which a ConnectionError also carries). Each code maps
// to one class; docs/api.md lists the table.
PyObject* exception_for(const Error& e) {
  switch (e.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfBounds:
    case StatusCode::kMessageTooLarge: return PyExc_ValueError;
    case StatusCode::kUnknownHandle: return PyExc_KeyError;
    case StatusCode::kNotImplemented: return PyExc_NotImplementedError;
    case StatusCode::kTimeout: return PyExc_TimeoutError;
    case StatusCode::kAuthenticationFailed: return PyExc_PermissionError;
    case StatusCode::kNotConnected:
    case StatusCode::kPeerClosed:
    case StatusCode::kAccessDenied:
    case StatusCode::kCancelled:
    case StatusCode::kProtocolError:
    case StatusCode::kUnknownOpcode: return PyExc_ConnectionError;
    case StatusCode::kFailed:
      return dynamic_cast<const ConnectionError*>(&e) != nullptr ? PyExc_ConnectionError : PyExc_RuntimeError;
    case StatusCode::kSuccess:
    case StatusCode::kPending:
    case StatusCode::kBatchOverflow: return PyExc_RuntimeError;
  }
  return PyExc_RuntimeError;
}

// Future.wait()/wait_for(): see gil.h for how the wait lets Ctrl-C through and survives
// interpreter exit.
bool wait_future(const Future& f, std::optional<std::chrono::nanoseconds> timeout) {
  if (f.done()) return true;
  return wait_interruptibly(timeout, [&](std::chrono::nanoseconds d) { return f.wait_for(d).has_value(); });
}

// The timeout argument of wait_any()/wait_all(): None is no limit.
std::optional<std::chrono::nanoseconds> timeout_arg(py::handle timeout) {
  if (timeout.is_none()) return std::nullopt;
  return seconds_arg(timeout, "timeout");
}

// Future._exception(): the exception `await future` raises for a failed op (None on
// success and while running), of the class a library error with the same code raises.
py::object exception_of(const Future& f) {
  const Status s = f.result();
  if (s.is_ok() || s.code() == StatusCode::kPending) return py::none();
  py::object exc = py::handle(exception_for(Error(s.code(), s.to_string())))(s.to_string());
  exc.attr("status") = s.raw_code();
  exc.attr("future") = f;
  return exc;
}

// Future.as_asyncio() and __await__ live in Python (dlslime/_asyncio.py), on top of
// on_complete().
py::object asyncio_adapter(const char* name) { return py::module_::import("dlslime._asyncio").attr(name); }

// set_log_level(level): our names (trace ... off) in any case, Python's "WARNING"/"FATAL",
// or a Python logging level number (logging.INFO = 20), as upstream DLSlime scripts pass.
// A number maps to the most verbose level it still shows: below DEBUG (10) is trace.
std::string log_level_arg(py::handle level) {
  if (PyUnicode_Check(level.ptr())) {
    std::string name = level.cast<std::string>();
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    if (name == "warning") return "warn";
    if (name == "fatal") return "critical";
    return name;  // an unknown name: set_log_level says which are known
  }
  if (PyBool_Check(level.ptr()) || !PyIndex_Check(level.ptr())) {
    throw py::type_error(fmt::format("level must be a str or a logging level int, not {}", Py_TYPE(level.ptr())->tp_name));
  }
  const auto n = int_arg<int64_t>(level, "level");
  if (n < 10) return "trace";
  if (n < 20) return "debug";
  if (n < 30) return "info";
  if (n < 40) return "warn";
  if (n < 50) return "error";
  return "critical";
}

}  // namespace

void bind_core(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(exception_for(e), e.what());
    } catch (const nlohmann::json::exception& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  install_exit_gate();  // no library thread takes the GIL once the interpreter is finalizing

  py::enum_<StatusCode> codes(m, "StatusCode", "Completion status codes (docs/api.md).");
  for (StatusCode c : {StatusCode::kSuccess, StatusCode::kPending, StatusCode::kBatchOverflow,
                       StatusCode::kUnknownOpcode,
                       StatusCode::kTimeout, StatusCode::kFailed, StatusCode::kOutOfBounds,
                       StatusCode::kUnknownHandle, StatusCode::kCancelled, StatusCode::kPeerClosed,
                       StatusCode::kMessageTooLarge, StatusCode::kInvalidArgument, StatusCode::kNotConnected,
                       StatusCode::kProtocolError, StatusCode::kNotImplemented, StatusCode::kAccessDenied,
                       StatusCode::kAuthenticationFailed}) {
    codes.value(status_code_name(c), c);
  }
  codes.def("__int__", [](StatusCode c) { return static_cast<int>(c); });

  py::class_<Future>(m, "Future", "Completion handle of one operation (a whole batch for read/write).")
      .def(
          "wait",
          [](const Future& f) {
            wait_future(f, std::nullopt);
            return f.status();
          },
          "Block until done; return the status code (0 = success). Ctrl-C raises KeyboardInterrupt.")
      .def(
          "wait_for",
          [](const Future& f, py::handle seconds, py::handle timeout_seconds) -> std::optional<int> {
            // timeout_seconds: upstream DLSlime's name of the argument.
            py::handle s = renamed_arg(seconds, timeout_seconds, "wait_for", "seconds", "timeout_seconds");
            std::optional<std::chrono::nanoseconds> timeout;
            if (!s.is_none()) timeout = seconds_arg(s, "seconds");
            if (!wait_future(f, timeout)) return std::nullopt;
            return f.status();
          },
          py::arg_v("seconds", missing_arg(), "<required>"), py::kw_only(),
          py::arg_v("timeout_seconds", missing_arg(), "<unset>"),
          "Wait up to `seconds` (None or inf: no limit); None if still running, else the status code.")
      .def("done", &Future::done)
      .def("cancel", &Future::cancel, py::call_guard<py::gil_scoped_release>(),
           "Withdraw the op if the transport still can. True only if it ended with StatusCode.CANCELLED "
           "because of this call; its local memory is then no longer touched (it may be reused or freed). "
           "False if it has ended already (its status stays) or cannot be withdrawn now (it ends as it "
           "would have). Releases the GIL; may be called from an on_complete callback.")
      .def_property_readonly("status", &Future::status,
                             "Status code: 0 = success once done, StatusCode.PENDING (1) while running.")
      .def_property_readonly("message", &Future::message, "Why it failed; empty on success.")
      .def_property_readonly("nbytes", &Future::nbytes, "Bytes that arrived (recv) or were placed (read).")
      .def("imm_data", &Future::imm_data, "The immediate value an imm_recv() received (0 for other ops).")
      .def(
          "notification", [](const Future& f) { return py::bytes(f.notification()); },
          "The bytes a recv_notify() received, once done (b\"\" for other ops).")
      .def(
          "on_complete",
          [](const Future& f, py::handle callback) {
            if (!PyCallable_Check(callback.ptr())) {
              throw py::type_error(fmt::format("on_complete: callback must be callable, not {}",
                                               Py_TYPE(callback.ptr())->tp_name));
            }
            auto fn = std::make_shared<const PyCallable>(callback);
            f.on_complete([fn](const Future& done) { (*fn)(done); });
          },
          py::arg("callback"),
          "Call callback(future) once the op ends (any status). If it has ended already, the call happens at "
          "once on this thread; otherwise on a library I/O thread, with the GIL held. It must not block. An "
          "exception it raises goes to sys.unraisablehook (printed) and no further.")
      .def("_exception", &exception_of,
           "The exception `await future` raises for this op's failure; None on success or while running.")
      .def(
          "as_asyncio", [](py::object self) { return asyncio_adapter("as_asyncio")(self); },
          "An asyncio.Future of the running loop that resolves to this Future once the op succeeds, or "
          "raises the op's error (see `await future`).")
      .def(
          "__await__", [](py::object self) { return asyncio_adapter("as_asyncio")(self).attr("__await__")(); },
          "`await future` in a coroutine: returns the Future on success, raises the op's error otherwise.")
      .def("__repr__", [](const Future& f) {
        if (!f.done()) return std::string("<dlslime.Future running>");
        return "<dlslime.Future " + f.result().to_string() + ">";
      });

  m.def(
      "wait_any",
      [](const std::vector<Future>& futures, py::handle timeout) -> std::optional<size_t> {
        const auto limit = timeout_arg(timeout);
        // Checks the arguments and takes an op that has ended already without releasing the GIL.
        std::optional<size_t> index = wait_any(futures, std::chrono::nanoseconds::zero());
        if (index) return index;
        wait_interruptibly(limit, [&](std::chrono::nanoseconds d) {
          index = wait_any(futures, d);
          return index.has_value();
        });
        return index;
      },
      py::arg("futures"), py::arg("timeout") = py::none(),
      "Block until one of `futures` has ended; return its index (the lowest among those already done), or "
      "None after `timeout` seconds (None: no limit). An empty list is a ValueError. Releases the GIL; "
      "Ctrl-C raises KeyboardInterrupt.");
  m.def(
      "wait_all",
      [](const std::vector<Future>& futures, py::handle timeout) {
        const auto limit = timeout_arg(timeout);
        if (wait_all(futures, std::chrono::nanoseconds::zero())) return true;
        return wait_interruptibly(limit, [&](std::chrono::nanoseconds d) { return wait_all(futures, d); });
      },
      py::arg("futures"), py::arg("timeout") = py::none(),
      "Block until every one of `futures` has ended (any status): True, or False if one still runs after "
      "`timeout` seconds (None: no limit). An empty list is True at once. Releases the GIL; Ctrl-C raises "
      "KeyboardInterrupt.");

  m.def(
      "set_log_level", [](py::handle level) { set_log_level(log_level_arg(level)); }, py::arg("level"),
      "Set the library log level: trace, debug, info, warn, error, critical or off (any case), or a Python "
      "logging level (logging.INFO).");
  m.def("get_log_level", &get_log_level);
}

}  // namespace dlslime::py_bind
