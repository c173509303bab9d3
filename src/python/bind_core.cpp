#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "dlslime/errors.h"
#include "dlslime/future.h"
#include "dlslime/logging.h"
#include "dlslime/status.h"
#include "convert.h"

namespace py = pybind11;

namespace dlslime::py_bind {

nlohmann::json to_json(py::handle obj) {
  if (obj.is_none()) return nullptr;
  if (py::isinstance<py::bool_>(obj)) return obj.cast<bool>();
  if (py::isinstance<py::int_>(obj)) {
    // Addresses and ids may exceed int64: non-negative ints become unsigned.
    if (obj.cast<py::int_>() >= py::int_(0)) return obj.cast<uint64_t>();
    return obj.cast<int64_t>();
  }
  if (py::isinstance<py::float_>(obj)) return obj.cast<double>();
  if (py::isinstance<py::str>(obj)) return obj.cast<std::string>();
  if (py::isinstance<py::bytes>(obj)) return obj.cast<std::string>();
  if (py::isinstance<py::dict>(obj)) {
    nlohmann::json out = nlohmann::json::object();
    for (auto item : obj.cast<py::dict>()) {
      if (!py::isinstance<py::str>(item.first)) throw py::type_error("dict keys must be str");
      out[item.first.cast<std::string>()] = to_json(item.second);
    }
    return out;
  }
  if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) {
    nlohmann::json out = nlohmann::json::array();
    for (auto item : obj) out.push_back(to_json(item));
    return out;
  }
  throw py::type_error("cannot convert " + std::string(py::str(py::type::of(obj))) + " to JSON");
}

py::object from_json(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return py::none();
    case nlohmann::json::value_t::boolean: return py::bool_(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return py::int_(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: return py::int_(j.get<uint64_t>());
    case nlohmann::json::value_t::number_float: return py::float_(j.get<double>());
    case nlohmann::json::value_t::string: return py::str(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      py::list out;
      for (const auto& v : j) out.append(from_json(v));
      return out;
    }
    case nlohmann::json::value_t::object: {
      py::dict out;
      for (const auto& [k, v] : j.items()) out[py::str(k)] = from_json(v);
      return out;
    }
    default: return py::none();
  }
}

void bind_core(py::module_& m) {
  // One mapping from C++ exception classes to Python exceptions.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const NotImplementedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    } catch (const InvalidArgumentError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const NotFoundError& e) {
      PyErr_SetString(PyExc_KeyError, e.what());
    } catch (const AuthenticationError& e) {
      PyErr_SetString(PyExc_PermissionError, e.what());
    } catch (const ConnectionError& e) {
      PyErr_SetString(PyExc_ConnectionError, e.what());
    } catch (const TimeoutError& e) {
      PyErr_SetString(PyExc_TimeoutError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const nlohmann::json::exception& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  py::enum_<StatusCode> codes(m, "StatusCode", "Completion status codes (docs/api.md).");
  for (StatusCode c : {StatusCode::kSuccess, StatusCode::kBatchOverflow, StatusCode::kUnknownOpcode,
                       StatusCode::kTimeout, StatusCode::kFailed, StatusCode::kOutOfBounds,
                       StatusCode::kUnknownHandle, StatusCode::kCancelled, StatusCode::kPeerClosed,
                       StatusCode::kMessageTooLarge, StatusCode::kInvalidArgument, StatusCode::kNotConnected,
                       StatusCode::kProtocolError, StatusCode::kNotImplemented, StatusCode::kAccessDenied,
                       StatusCode::kAuthenticationFailed}) {
    codes.value(status_code_name(c), c);
  }
  codes.def("__int__", [](StatusCode c) { return static_cast<int>(c); });

  py::class_<Future>(m, "Future", "Completion handle of one operation (a whole batch for read/write).")
      .def("wait", &Future::wait, py::call_guard<py::gil_scoped_release>(),
           "Block until done; return the status code (0 = success).")
      .def(
          "wait_for",
          [](const Future& f, double seconds) -> std::optional<int> {
            if (seconds < 0) seconds = 0;
            py::gil_scoped_release release;
            return f.wait_for(std::chrono::duration<double>(seconds));
          },
          py::arg("seconds"), "Wait up to `seconds`; None if still running, else the status code.")
      .def("done", &Future::done)
      .def_property_readonly("status", &Future::status, "Status code (0 = success) once done.")
      .def_property_readonly("message", &Future::message, "Why it failed; empty on success.")
      .def_property_readonly("nbytes", &Future::nbytes, "Bytes that arrived (recv) or were placed (read).")
      .def("__repr__", [](const Future& f) {
        if (!f.done()) return std::string("<dlslime.Future running>");
        return "<dlslime.Future " + f.result().to_string() + ">";
      });

  m.def("set_log_level", &set_log_level, py::arg("level"),
        "Set the library log level: trace, debug, info, warn, error, critical or off.");
  m.def("get_log_level", &get_log_level);
}

}  // namespace dlslime::py_bind
