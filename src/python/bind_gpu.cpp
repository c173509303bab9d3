// dlslime._dlslime._gpu: device memory for tests and examples (dlslime.testing), in whichever
// GPU runtime this process uses (the CUDA runtime, or the simulated GPU with
// DLSLIME_GPU_SIM=1), and GpuUnavailableError, the exception every GPU feature raises where
// there is no GPU. Always built: the seam is (docs/nvlink.md).
#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "bindings.h"
#include "gpu/device_runtime.h"

namespace py = pybind11;

namespace dlslime::py_bind {
namespace {

// A device allocation with its own stream and event: every write and read is one copy,
// waited for (the host's bytes only live for the call).
class DeviceBuffer {
 public:
  DeviceBuffer(size_t nbytes, int device) : rt_(gpu::runtime()), nbytes_(nbytes), device_(device) {
    if (nbytes == 0) throw InvalidArgumentError("device_buffer: nbytes must be > 0");
    ptr_ = rt_.device_alloc(device, nbytes);
    try {
      stream_ = rt_.stream_create(device);
      event_ = rt_.event_create(device);
    } catch (...) {
      release();
      throw;
    }
  }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

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
    copy(static_cast<uint8_t*>(live()) + offset, view.buf, n);
  }

  py::bytes read(size_t offset, size_t n) {
    check_range(offset, n, "read");
    std::string out(n, '\0');
    copy(out.data(), static_cast<uint8_t*>(live()) + offset, n);
    return py::bytes(out);
  }

  void release() noexcept {
    try {
      if (event_) rt_.event_destroy(event_);
      if (stream_) rt_.stream_destroy(stream_);
      if (ptr_) rt_.device_free(ptr_);
    } catch (const std::exception&) {
      // Freeing only fails for a handle the runtime does not know: nothing left to free.
    }
    event_ = nullptr;
    stream_ = nullptr;
    ptr_ = nullptr;
  }

 private:
  void* live() const {
    if (!ptr_) throw InvalidArgumentError("device_buffer: used after close()");
    return ptr_;
  }
  void check_range(size_t offset, size_t n, const char* what) const {
    if (offset > nbytes_ || n > nbytes_ - offset) {
      throw InvalidArgumentError(
          fmt::format("device_buffer.{}: [{}, +{}) is outside the buffer's {} bytes", what, offset, n, nbytes_));
    }
  }
  void copy(void* dst, const void* src, size_t n) {
    py::gil_scoped_release nogil;
    rt_.memcpy_async(dst, src, n, stream_);
    rt_.event_record(event_, stream_);
    rt_.event_synchronize(event_);
  }

  gpu::Runtime& rt_;
  size_t nbytes_;
  int device_;
  void* ptr_ = nullptr;
  gpu::Stream stream_ = nullptr;
  gpu::Event event_ = nullptr;
};

}  // namespace

void bind_gpu(py::module_& m) {
  py::module_ gpu = m.def_submodule("_gpu", "The device-memory runtime (docs/nvlink.md); use dlslime.testing.");
  // Registered after bind_core's translator, so it is tried first: GpuUnavailableError is a
  // RuntimeError that says which GPU is missing, not a plain RuntimeError.
  py::register_exception<gpu::GpuUnavailableError>(gpu, "GpuUnavailableError", PyExc_RuntimeError);

  py::class_<DeviceBuffer>(gpu, "DeviceBuffer",
                           "Device memory in the process's GPU runtime (dlslime.testing.device_buffer).")
      .def(py::init<size_t, int>(), py::arg("nbytes"), py::arg("device") = 0)
      .def_property_readonly("ptr", &DeviceBuffer::ptr, "The device address (an int, for register_memory_region).")
      .def_property_readonly("nbytes", &DeviceBuffer::nbytes)
      .def_property_readonly("device", &DeviceBuffer::device)
      .def_property_readonly("closed", &DeviceBuffer::closed)
      .def("write", &DeviceBuffer::write, py::arg("offset"), py::arg("data"),
           "Copies a bytes-like object into the buffer at offset (waits for the copy).")
      .def("read", &DeviceBuffer::read, py::arg("offset"), py::arg("n"), "Copies n bytes at offset out as bytes.")
      .def("close", &DeviceBuffer::release, "Frees the device memory (also done when the object goes away).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](DeviceBuffer& b, py::args) { b.release(); })
      .def("__repr__", [](const DeviceBuffer& b) {
        return b.closed() ? std::string("<dlslime.testing.DeviceBuffer closed>")
                          : fmt::format("<dlslime.testing.DeviceBuffer {} bytes on device {} at {:#x}>", b.nbytes(),
                                        b.device(), b.ptr());
      });

  gpu.def(
      "runtime_name", [] { return std::string(gpu::runtime().name()); },
      "'cuda' or 'sim' (DLSLIME_GPU_SIM=1); raises GpuUnavailableError without a GPU.");
  gpu.def("unavailable_reason", &gpu::unavailable_reason, "'' when a GPU runtime is usable, else why not.");
  gpu.def(
      "pointer_type",
      [](uintptr_t ptr) { return std::string(gpu::memory_type_name(gpu::runtime().pointer_info(reinterpret_cast<void*>(ptr)).type)); },
      py::arg("ptr"), "'host', 'pinned host' or 'device': where an address lives.");
  gpu.def(
      "sim_objects",
      [] {
        const gpu::SimObjectCounts c = gpu::sim_object_counts();
        py::dict d;
        d["device_allocations"] = c.device_allocations;
        d["host_allocations"] = c.host_allocations;
        d["streams"] = c.streams;
        d["events"] = c.events;
        d["ipc_mappings"] = c.ipc_mappings;
        d["errors"] = c.errors;
        return d;
      },
      "The simulated GPU's live objects and refused calls (dlslime.testing.sim_gpu_objects).");
}

}  // namespace dlslime::py_bind
