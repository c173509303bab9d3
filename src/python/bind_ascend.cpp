// dlslime.AscendDirectEndpoint: the Ascend transport's constructor and options, and
// upstream DLSlime's forms (docs/ascend.md): AscendDirectEndpoint() then init(host, port),
// register_memory_region(addr, offset, length, name=None), and named assignments
// (local_name, remote_name, target_offset, source_offset, length). Everything else it
// inherits from dlslime.Endpoint (bind_endpoint.cpp). Also the `_npu` module behind
// dlslime.testing.npu_buffer. Compiled only with BUILD_ASCEND.
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pybind11/stl.h>

#include "ascend/npu_memory.h"
#include "bindings.h"
#include "convert.h"
#include "dlslime/ascend_endpoint.h"
#include "dlslime/errors.h"
#include "gil.h"

namespace py = pybind11;

namespace dlslime::py_bind {

namespace {

template <OpKind Kind>
Future one_sided(AscendDirectEndpoint& ep, py::handle assignments, py::handle timeout_ms, py::handle assign,
                 py::handle notify) {
  const char* call = Kind == OpKind::kRead ? "read" : "write";
  auto batch = named_assignments(renamed_arg(assignments, assign, call, "assignments", "assign"),
                                 [&](const std::string& n) { return ep.local_handle(n); },
                                 [&](const std::string& n) { return ep.remote_handle(n); });
  const auto timeout = op_timeout_arg(timeout_ms);
  std::optional<std::string> note;
  if (Kind == OpKind::kWrite) {
    note = notification_arg(notify, "notify", /*optional=*/true);
  } else if (!notify.is_none()) {
    throw py::type_error("read() takes no notify: notifications ride on writes (or send_notify)");
  }
  ReleaseGil release;
  return Kind == OpKind::kRead ? ep.read(std::move(batch), timeout) : ep.write(std::move(batch), timeout, std::move(note));
}

template <OpKind Kind>
void def_one_sided(py::class_<AscendDirectEndpoint, Endpoint, std::shared_ptr<AscendDirectEndpoint>>& cls,
                   const char* name) {
  cls.def(name, &one_sided<Kind>, py::arg_v("assignments", missing_arg(), "<required>"),
          py::arg("timeout_ms") = py::none(), py::kw_only(), py::arg_v("assign", missing_arg(), "<unset>"),
          py::arg("notify") = py::none(),
          "A batch of (local_handle, remote_handle, target_offset, source_offset, length) items, or upstream's "
          "(local_name, remote_name, target_offset, source_offset, length). Each item goes to the engine of its "
          "remote region. write only: notify=b\"...\" (at most 4 KiB) reaches the peer's recv_notify() once the "
          "bytes are in place.");
}

// NPU memory for tests and examples (dlslime.testing.npu_buffer), in the process's NPU
// runtime: the simulated NPU's is memory host code cannot touch.
class NpuBuffer {
 public:
  NpuBuffer(size_t nbytes, int device) : npu_(ascend::npu_memory()), nbytes_(nbytes), device_(device) {
    if (nbytes == 0) throw InvalidArgumentError("npu_buffer: nbytes must be > 0");
    ptr_ = npu_.alloc(device, nbytes);
  }
  ~NpuBuffer() { release(); }
  NpuBuffer(const NpuBuffer&) = delete;
  NpuBuffer& operator=(const NpuBuffer&) = delete;

  uintptr_t ptr() const { return reinterpret_cast<uintptr_t>(live()); }
  size_t nbytes() const { return nbytes_; }
  int device() const { return device_; }
  bool closed() const { return ptr_ == nullptr; }

  void write(size_t offset, const py::buffer& data) {
    Py_buffer view;
    if (PyObject_GetBuffer(data.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) throw py::error_already_set();
    struct Release {
      Py_buffer* v;
      ~Release() { PyBuffer_Release(v); }
    } release_view{&view};
    const auto n = static_cast<size_t>(view.len);
    check_range(offset, n, "write");
    py::gil_scoped_release nogil;
    npu_.copy_to_device(static_cast<uint8_t*>(live()) + offset, view.buf, n);
  }

  py::bytes read(size_t offset, size_t n) {
    check_range(offset, n, "read");
    std::string out(n, '\0');
    {
      py::gil_scoped_release nogil;
      npu_.copy_to_host(out.data(), static_cast<uint8_t*>(live()) + offset, n);
    }
    return py::bytes(out);
  }

  void release() noexcept {
    try {
      if (ptr_) npu_.free(ptr_);
    } catch (const std::exception&) {
      // Freeing only fails for memory the runtime does not know: nothing left to free.
    }
    ptr_ = nullptr;
  }

 private:
  void* live() const {
    if (ptr_ == nullptr) throw InvalidArgumentError("npu_buffer is closed");
    return ptr_;
  }
  void check_range(size_t offset, size_t n, const char* what) const {
    if (offset > nbytes_ || n > nbytes_ - offset) {
      throw InvalidArgumentError(
          fmt::format("npu_buffer.{}: [{}, +{}) is outside the buffer's {} bytes", what, offset, n, nbytes_));
    }
  }

  ascend::NpuMemory& npu_;
  size_t nbytes_;
  int device_;
  void* ptr_ = nullptr;
};

}  // namespace

void bind_ascend(py::module_& m) {
  py::class_<AscendDirectEndpoint, Endpoint, std::shared_ptr<AscendDirectEndpoint>> cls(
      m, "AscendDirectEndpoint",
      "One-sided reads and writes, and notifications, between NPU or host memory over Huawei's HIXL (or the "
      "simulated HIXL with DLSLIME_ASCEND_SIM=1). See docs/ascend.md.");
  cls.def(py::init([](py::handle host, py::handle port, py::handle device, const py::kwargs& kwargs) {
            // The keywords are AscendOptions' keys (and the library's own option names);
            // AscendOptions::from_json rejects unknown ones.
            nlohmann::json options = kwargs.empty() ? nlohmann::json::object() : to_json(kwargs, "options");
            options["host"] = str_arg(host, "host");
            options["port"] = int_arg<int64_t>(port, "port", 0, 65535);
            options["device"] = int_arg<int64_t>(device, "device", 0);
            return make_without_gil<AscendDirectEndpoint>(AscendOptions::from_json(options));
          }),
          py::arg("host") = "127.0.0.1", py::arg("port") = 0, py::arg("device") = 0)
      .def(
          "init",
          [](AscendDirectEndpoint& ep, py::handle host, py::handle port) {
            const std::string h = str_arg(host, "host");
            const auto p = static_cast<int>(int_arg<int64_t>(port, "port", 0, 65535));
            ReleaseGil release;
            ep.init(h, p);
          },
          py::arg("host"), py::arg("port") = 0,
          "Upstream's two-step form: restarts the engine as host:port (0: a free port). Before any region and connect.")
      .def(
          "register_memory_region",
          [base = py::object(m.attr("Endpoint").attr("register_memory_region"))](
              py::object self, py::args args, py::kwargs kwargs) -> py::object {
            // Upstream's order (addr, offset, length, name=None): an int first. Without a
            // name the region is named after its address, as upstream does.
            const bool upstream = !args.empty() && PyLong_Check(args[0].ptr());
            if (!upstream) return base(self, *args, **kwargs);
            if (args.size() < 3 || args.size() > 4 || (args.size() == 4 && kwargs.contains("name")) ||
                kwargs.size() > (kwargs.contains("name") ? 1u : 0u)) {
              throw py::type_error("register_memory_region(addr, offset, length, name=None) or "
                                   "(name, addr, offset, length)");
            }
            py::object name = args.size() == 4 ? py::object(args[3])
                              : kwargs.contains("name") ? py::object(kwargs["name"])
                                                        : py::none();
            if (name.is_none()) {
              name = py::str(fmt::format("{}", int_arg<uint64_t>(args[0], "addr") + int_arg<uint64_t>(args[1], "offset")));
            }
            return base(self, name, args[0], args[1], args[2]);
          },
          "register_memory_region(name, addr, offset, length) or upstream's (addr, offset, length, name=None): "
          "registers NPU or host memory [addr+offset, +length) with the engine.")
      .def("register_remote_memory_region",
           [base = py::object(m.attr("Endpoint").attr("register_remote_memory_region"))](
               py::object self, py::args args, py::kwargs kwargs) -> py::object {
             // Upstream's order (mr_info, name=None): the entry first.
             if (!args.empty() && PyDict_Check(args[0].ptr())) {
               py::object name = args.size() > 1 ? py::object(args[1])
                                 : kwargs.contains("name") ? py::object(kwargs["name"])
                                                           : py::none();
               if (name.is_none()) {
                 const nlohmann::json entry = to_json(args[0], "mr_info");
                 name = py::str(fmt::format("{}", entry.value("addr", uint64_t{0})));
               }
               return base(self, name, args[0]);
             }
             return base(self, *args, **kwargs);
           },
           "register_remote_memory_region(name, mr_info) or upstream's (mr_info, name=None).")
      .def_property_readonly("engine_name", &AscendDirectEndpoint::engine_name, "This endpoint's engine, \"host:port\".")
      .def_property_readonly("options",
                             [](const AscendDirectEndpoint& ep) { return from_json(ep.options().to_json(), "options"); })
      .def("__repr__", [](const AscendDirectEndpoint& ep) {
        return fmt::format("<dlslime.AscendDirectEndpoint engine={}{}>", ep.engine_name(),
                           ep.is_connected() ? " connected" : "");
      });
  def_one_sided<OpKind::kRead>(cls, "read");
  def_one_sided<OpKind::kRead>(cls, "async_read");
  def_one_sided<OpKind::kWrite>(cls, "write");
  def_one_sided<OpKind::kWrite>(cls, "async_write");

  py::module_ npu = m.def_submodule("_npu", "NPU memory (docs/ascend.md); use dlslime.testing.");
  py::class_<NpuBuffer>(npu, "NpuBuffer", "NPU memory in the process's NPU runtime (dlslime.testing.npu_buffer).")
      .def(py::init<size_t, int>(), py::arg("nbytes"), py::arg("device") = 0)
      .def_property_readonly("ptr", &NpuBuffer::ptr, "The device address (an int, for register_memory_region).")
      .def_property_readonly("nbytes", &NpuBuffer::nbytes)
      .def_property_readonly("device", &NpuBuffer::device)
      .def_property_readonly("closed", &NpuBuffer::closed)
      .def("write", &NpuBuffer::write, py::arg("offset"), py::arg("data"),
           "Copies a bytes-like object into the buffer at offset.")
      .def("read", &NpuBuffer::read, py::arg("offset"), py::arg("n"), "Copies n bytes at offset out as bytes.")
      .def("close", &NpuBuffer::release, "Frees the NPU memory (also done when the object goes away).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](NpuBuffer& b, py::args) { b.release(); })
      .def("__repr__", [](const NpuBuffer& b) {
        return b.closed() ? std::string("<dlslime.testing.NpuBuffer closed>")
                          : fmt::format("<dlslime.testing.NpuBuffer {} bytes on NPU {} at {:#x}>", b.nbytes(),
                                        b.device(), b.ptr());
      });
  npu.def(
      "is_npu_memory",
      [](uintptr_t ptr) {
        // Only where an NPU runtime is usable; elsewhere no address is NPU memory.
        if (!ascend::unavailable_reason().empty()) return false;
        try {
          return ascend::npu_memory().classify(ptr, 1) == ascend::MemType::kDevice;
        } catch (const InvalidArgumentError&) {
          return false;
        }
      },
      py::arg("ptr"), "Whether ptr is NPU memory of this process's NPU runtime.");
  npu.def(
      "runtime_name", [] { return std::string(ascend::npu_memory().name()); },
      "'acl' or 'sim' (DLSLIME_ASCEND_SIM=1); raises ConnectionError without an NPU runtime.");
}

}  // namespace dlslime::py_bind
