// dlslime.NVLinkEndpoint: the NVLink transport's constructor and options, and upstream
// DLSlime's NVLink forms (docs/nvlink.md): register_memory_region(ptr, offset, length, name),
// named assignments (local_name, remote_name, target_offset, source_offset, length) and the
// `stream` the copies are queued on. Everything else it inherits from dlslime.Endpoint
// (bind_endpoint.cpp). Compiled only with BUILD_NVLINK.
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pybind11/stl.h>

#include "bindings.h"
#include "convert.h"
#include "dlslime/errors.h"
#include "dlslime/nvlink_endpoint.h"
#include "gil.h"

namespace py = pybind11;

namespace dlslime::py_bind {

namespace {

// `stream`: None (the endpoint's own stream), a cudaStream_t as an int (0: the default
// stream), or an object with a `cuda_stream` int (torch.cuda.Stream).
std::optional<void*> stream_arg(py::handle stream) {
  if (stream.is_none()) return std::nullopt;
  py::handle v = stream;
  py::object attr;
  if (!PyLong_Check(stream.ptr()) && py::hasattr(stream, "cuda_stream")) {
    attr = stream.attr("cuda_stream");
    v = attr;
  }
  if (!PyLong_Check(v.ptr())) {
    throw py::type_error(fmt::format("stream must be None, an int (a cudaStream_t) or have .cuda_stream, not {}",
                                     Py_TYPE(stream.ptr())->tp_name));
  }
  return reinterpret_cast<void*>(int_arg<uintptr_t>(v, "stream"));
}

template <OpKind Kind>
Future one_sided(NVLinkEndpoint& ep, py::handle assignments, py::handle stream, py::handle timeout_ms,
                 py::handle assign, py::handle notify) {
  const char* call = Kind == OpKind::kRead ? "read" : "write";
  auto batch = named_assignments(renamed_arg(assignments, assign, call, "assignments", "assign"),
                                 [&](const std::string& n) { return ep.local_handle(n); },
                                 [&](const std::string& n) { return ep.remote_handle(n); });
  const auto s = stream_arg(stream);
  const auto timeout = op_timeout_arg(timeout_ms);
  std::optional<std::string> note;
  if (Kind == OpKind::kWrite) {
    note = notification_arg(notify, "notify", /*optional=*/true);
  } else if (!notify.is_none()) {
    throw py::type_error("read() takes no notify: notifications ride on writes (or send_notify)");
  }
  ReleaseGil release;
  if (s) {
    return Kind == OpKind::kRead ? ep.read_on(std::move(batch), *s, timeout)
                                 : ep.write_on(std::move(batch), *s, timeout, std::move(note));
  }
  return Kind == OpKind::kRead ? ep.read(std::move(batch), timeout) : ep.write(std::move(batch), timeout, std::move(note));
}

template <OpKind Kind>
void def_one_sided(py::class_<NVLinkEndpoint, Endpoint, std::shared_ptr<NVLinkEndpoint>>& cls, const char* name) {
  cls.def(name, &one_sided<Kind>, py::arg_v("assignments", missing_arg(), "<required>"),
          py::arg("stream") = py::none(), py::arg("timeout_ms") = py::none(), py::kw_only(),
          py::arg_v("assign", missing_arg(), "<unset>"), py::arg("notify") = py::none(),
          "A batch of (local_handle, remote_handle, target_offset, source_offset, length) items, or upstream's "
          "(local_name, remote_name, target_offset, source_offset, length). stream: None (the endpoint's own), "
          "a cudaStream_t int or a torch.cuda.Stream: the copies run after the work queued on it. The future "
          "completes once the copies have finished. write only: notify=b\"...\" (at most 4 KiB) reaches the peer's "
          "recv_notify() after the copies.");
}

}  // namespace

void bind_nvlink(py::module_& m) {
  py::class_<NVLinkEndpoint, Endpoint, std::shared_ptr<NVLinkEndpoint>> cls(
      m, "NVLinkEndpoint",
      "One-sided reads and writes between GPU memory of processes on one host (CUDA IPC). See docs/nvlink.md.");
  cls.def(py::init([](py::handle device, const py::kwargs& kwargs) {
            // The keywords are NvlinkOptions' keys; NvlinkOptions::from_json rejects unknown ones.
            nlohmann::json options = kwargs.empty() ? nlohmann::json::object() : to_json(kwargs, "options");
            options["device"] = int_arg<int64_t>(device, "device");
            return make_without_gil<NVLinkEndpoint>(NvlinkOptions::from_json(options));
          }),
          py::arg("device") = 0)
      .def(
          "register_memory_region",
          [base = py::object(m.attr("Endpoint").attr("register_memory_region"))](
              py::object self, py::args args, py::kwargs kwargs) -> py::object {
            // Upstream's order (ptr, offset, length, name): its name comes last, as a str.
            const bool upstream = (args.size() == 4 && PyUnicode_Check(args[3].ptr()) && kwargs.empty()) ||
                                  (args.size() == 3 && kwargs.size() == 1 && kwargs.contains("name") &&
                                   PyLong_Check(args[0].ptr()));
            if (!upstream) return base(self, *args, **kwargs);
            py::object name = args.size() == 4 ? py::object(args[3]) : py::object(kwargs["name"]);
            return base(self, name, args[0], args[1], args[2]);
          },
          "register_memory_region(name, addr, offset, length) or upstream's (ptr, offset, length, name): registers "
          "GPU memory [addr+offset, +length); host memory raises ValueError.")
      .def_property_readonly("options",
                             [](const NVLinkEndpoint& ep) { return from_json(ep.options().to_json(), "options"); })
      .def("__repr__", [](const NVLinkEndpoint& ep) {
        return fmt::format("<dlslime.NVLinkEndpoint device={}{}>", ep.options().device,
                           ep.is_connected() ? " connected" : "");
      });
  def_one_sided<OpKind::kRead>(cls, "read");
  def_one_sided<OpKind::kRead>(cls, "async_read");
  def_one_sided<OpKind::kWrite>(cls, "write");
  def_one_sided<OpKind::kWrite>(cls, "async_write");
}

}  // namespace dlslime::py_bind
