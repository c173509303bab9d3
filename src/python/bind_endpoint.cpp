// dlslime.Endpoint: the surface every transport shares (include/dlslime/endpoint.h), bound
// once. A transport's binding derives from it and adds only its constructor and options
// (bind_tcp.cpp); an Endpoint the library returns (make_endpoint, PeerConnection.endpoint)
// reaches Python as its transport's own class, because Endpoint is polymorphic and
// pybind11 looks the dynamic type up.
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include <fmt/format.h>

#include "bindings.h"
#include "dlslime/endpoint.h"
#include "convert.h"
#include "gil.h"

namespace py = pybind11;

namespace dlslime::py_bind {

namespace {

const char* type_name(py::handle v) { return Py_TYPE(v.ptr())->tp_name; }

// register_memory_region(name): DLSlime accepts an int key too and names it "mr_<key>".
std::string region_name_arg(py::handle name) {
  if (PyLong_Check(name.ptr())) return "mr_" + py::str(name).cast<std::string>();
  if (!PyUnicode_Check(name.ptr())) {
    throw py::type_error(fmt::format("name must be a str or an int key, not {}", type_name(name)));
  }
  return name.cast<std::string>();
}

py::dict capabilities_dict(const Capabilities& c) {
  py::dict d;
  d["transport"] = c.transport;
  d["read"] = c.read;
  d["write"] = c.write;
  d["send_recv"] = c.send_recv;
  d["write_with_imm"] = c.write_with_imm;
  d["imm_recv"] = c.imm_recv;
  d["host_memory"] = c.host_memory;
  d["device_memory"] = c.device_memory;
  return d;
}

}  // namespace

void bind_endpoint(py::module_& m) {
  // No constructor: an Endpoint is made by its transport's class or by make_endpoint().
  // Every call that can block on I/O or on transfers in flight runs without the GIL; the
  // arguments are converted before it is released.
  py::class_<Endpoint, std::shared_ptr<Endpoint>>(
      m, "Endpoint", "What every transport's endpoint can do (docs/api.md, \"Endpoint base class\").")
      .def("endpoint_info", [](const Endpoint& ep) { return from_json(ep.endpoint_info(), "endpoint_info"); })
      .def(
          "connect",
          [](Endpoint& ep, py::handle peer_info) {
            auto info = to_json(peer_info, "peer_info");
            ReleaseGil release;
            ep.connect(info);
          },
          py::arg("peer_info"))
      .def("is_connected", &Endpoint::is_connected)
      .def(
          "register_memory_region",
          [](Endpoint& ep, py::handle name, py::handle addr, py::handle offset, py::handle length) {
            const auto n = region_name_arg(name);
            const auto ad = int_arg<uintptr_t>(addr, "addr");
            const auto off = int_arg<uint64_t>(offset, "offset");
            const auto len = int_arg<uint64_t>(length, "length");
            ReleaseGil release;  // replacing a name waits for the old region's transfers
            return ep.register_memory_region(n, ad, off, len);
          },
          py::arg("name"), py::arg("addr"), py::arg("offset"), py::arg("length"))
      .def(
          "register_remote_memory_region",
          [](Endpoint& ep, py::handle name, py::handle entry) {
            return ep.register_remote_memory_region(str_arg(name, "name"), to_json(entry, "mr_info"));
          },
          py::arg("name"), py::arg("mr_info"))
      .def(
          "unregister_memory_region",
          [](Endpoint& ep, py::handle name_or_handle) {
            // Unregistering waits for the region's transfers in flight: without the GIL.
            if (PyLong_Check(name_or_handle.ptr())) {
              const auto handle = int_arg<int32_t>(name_or_handle, "name_or_handle");
              ReleaseGil release;
              ep.unregister_memory_region(handle);
            } else if (PyUnicode_Check(name_or_handle.ptr())) {
              const auto name = name_or_handle.cast<std::string>();
              ReleaseGil release;
              ep.unregister_memory_region(name);
            } else {
              throw py::type_error(fmt::format("name_or_handle must be a str name or an int handle, not {}",
                                               type_name(name_or_handle)));
            }
          },
          py::arg("name_or_handle"))
      .def("mr_info", [](const Endpoint& ep) { return from_json(ep.mr_info(), "mr_info"); })
      .def(
          "send",
          [](Endpoint& ep, py::handle chunk) {
            const Chunk c = to_chunk(chunk);
            ReleaseGil release;
            return ep.send(c);
          },
          py::arg("chunk"), "Two-sided send of (addr, offset, length); FIFO-matched to the peer's recvs.")
      .def(
          "recv",
          [](Endpoint& ep, py::handle chunk) {
            const Chunk c = to_chunk(chunk);
            ReleaseGil release;
            return ep.recv(c);
          },
          py::arg("chunk"), "Post a receive buffer (addr, offset, length); future.nbytes tells the message size.")
      .def(
          "read",
          [](Endpoint& ep, py::handle assignments) {
            auto batch = to_assignments(assignments);
            ReleaseGil release;
            return ep.read(std::move(batch));
          },
          py::arg("assignments"))
      .def(
          "write",
          [](Endpoint& ep, py::handle assignments) {
            auto batch = to_assignments(assignments);
            ReleaseGil release;
            return ep.write(std::move(batch));
          },
          py::arg("assignments"))
      .def(
          "write_with_imm",
          [](Endpoint& ep, py::handle assignments, py::handle imm_data) {
            auto batch = to_assignments(assignments);
            const auto imm = int_arg<uint32_t>(imm_data, "imm_data");
            ReleaseGil release;
            return ep.write_with_imm(std::move(batch), imm);
          },
          py::arg("assignments"), py::arg("imm_data") = 0)
      .def("imm_recv", [](Endpoint& ep) { return ep.imm_recv(); })
      .def("capabilities", [](const Endpoint& ep) { return capabilities_dict(ep.capabilities()); })
      .def("shutdown", &Endpoint::shutdown, py::call_guard<ReleaseGil>())
      .def("__enter__", [](std::shared_ptr<Endpoint> ep) { return ep; })
      .def("__exit__", [](Endpoint& ep, py::handle, py::handle, py::handle) {
        ReleaseGil release;
        ep.shutdown();
      });
}

}  // namespace dlslime::py_bind
