#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "bindings.h"
#include "dlslime/errors.h"
#include "dlslime/tcp_endpoint.h"
#include "convert.h"
#include "gil.h"

namespace py = pybind11;

namespace dlslime::py_bind {

namespace {

int32_t handle_arg(py::handle v, const char* what) { return int_arg<int32_t>(v, what); }

// TcpEndpoint(name=...) and register_memory_region(name): DLSlime accepts an int key too
// and names it "mr_<key>".
std::string region_name_arg(py::handle name) {
  if (PyLong_Check(name.ptr())) return "mr_" + py::str(name).cast<std::string>();
  if (!PyUnicode_Check(name.ptr())) {
    throw py::type_error(fmt::format("name must be a str or an int key, not {}", Py_TYPE(name.ptr())->tp_name));
  }
  return name.cast<std::string>();
}

}  // namespace

void bind_tcp(py::module_& m) {
  py::class_<TcpEndpoint, std::shared_ptr<TcpEndpoint>>(m, "TcpEndpoint",
                                                        "Peer-to-peer transfers over TCP. See docs/tcp.md.")
      .def(py::init([](py::handle ip, py::handle port, const py::kwargs& kwargs) {
             const std::string host = str_arg(ip, "ip");
             const auto p = int_arg<uint16_t>(port, "port");
             TcpOptions options = tcp_options_from_kwargs(kwargs);
             return make_without_gil<TcpEndpoint>(host, p, std::move(options));
           }),
           py::arg("ip") = "0.0.0.0", py::arg("port") = 0)
      .def("endpoint_info", [](const TcpEndpoint& ep) { return from_json(ep.endpoint_info(), "endpoint_info"); })
      .def(
          "connect",
          [](TcpEndpoint& ep, py::handle peer_info) {
            auto info = to_json(peer_info, "peer_info");
            ReleaseGil release;
            ep.connect(info);
          },
          py::arg("peer_info"))
      .def("is_connected", &TcpEndpoint::is_connected)
      .def(
          "register_memory_region",
          [](TcpEndpoint& ep, py::handle name, py::handle addr, py::handle offset, py::handle length) {
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
          [](TcpEndpoint& ep, py::handle name, py::handle entry) {
            return ep.register_remote_memory_region(str_arg(name, "name"), to_json(entry, "mr_info"));
          },
          py::arg("name"), py::arg("mr_info"))
      .def(
          "unregister_memory_region",
          [](TcpEndpoint& ep, py::handle name_or_handle) {
            // Unregistering waits for the region's transfers in flight: without the GIL.
            if (PyLong_Check(name_or_handle.ptr())) {
              const int32_t handle = handle_arg(name_or_handle, "name_or_handle");
              ReleaseGil release;
              ep.unregister_memory_region(handle);
            } else if (PyUnicode_Check(name_or_handle.ptr())) {
              const auto name = name_or_handle.cast<std::string>();
              ReleaseGil release;
              ep.unregister_memory_region(name);
            } else {
              throw py::type_error(fmt::format("name_or_handle must be a str name or an int handle, not {}",
                                               Py_TYPE(name_or_handle.ptr())->tp_name));
            }
          },
          py::arg("name_or_handle"))
      .def("mr_info", [](const TcpEndpoint& ep) { return from_json(ep.mr_info(), "mr_info"); })
      .def(
          "send",
          [](TcpEndpoint& ep, py::handle chunk) {
            const Chunk c = to_chunk(chunk);
            ReleaseGil release;
            return ep.send(c);
          },
          py::arg("chunk"), "Two-sided send of (addr, offset, length); FIFO-matched to the peer's recvs.")
      .def(
          "recv",
          [](TcpEndpoint& ep, py::handle chunk) {
            const Chunk c = to_chunk(chunk);
            ReleaseGil release;
            return ep.recv(c);
          },
          py::arg("chunk"), "Post a receive buffer (addr, offset, length); future.nbytes tells the message size.")
      .def(
          "read",
          [](TcpEndpoint& ep, py::handle assignments) {
            auto batch = to_assignments(assignments);
            ReleaseGil release;
            return ep.read(std::move(batch));
          },
          py::arg("assignments"))
      .def(
          "write",
          [](TcpEndpoint& ep, py::handle assignments) {
            auto batch = to_assignments(assignments);
            ReleaseGil release;
            return ep.write(std::move(batch));
          },
          py::arg("assignments"))
      .def(
          "write_with_imm",
          [](TcpEndpoint& ep, py::handle assignments, py::handle imm_data) {
            auto batch = to_assignments(assignments);
            const auto imm = int_arg<uint32_t>(imm_data, "imm_data");
            ReleaseGil release;
            return ep.write_with_imm(std::move(batch), imm);
          },
          py::arg("assignments"), py::arg("imm_data") = 0)
      .def("imm_recv", [](TcpEndpoint& ep) { return ep.imm_recv(); })
      .def("shutdown", &TcpEndpoint::shutdown, py::call_guard<ReleaseGil>())
      .def("capabilities",
           [](const TcpEndpoint& ep) {
             const Capabilities c = ep.capabilities();
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
           })
      .def_property_readonly("host", &TcpEndpoint::host)
      .def_property_readonly("port", &TcpEndpoint::port)
      .def_property_readonly("options",
                             [](const TcpEndpoint& ep) { return from_json(ep.options().to_json(), "options"); })
      .def("__enter__", [](std::shared_ptr<TcpEndpoint> ep) { return ep; })
      .def(
          "__exit__",
          [](TcpEndpoint& ep, py::handle, py::handle, py::handle) {
            ReleaseGil release;
            ep.shutdown();
          })
      .def("__repr__", [](const TcpEndpoint& ep) {
        return fmt::format("<dlslime.TcpEndpoint {}:{}{}>", ep.host(), ep.port(),
                           ep.is_connected() ? " connected" : "");
      });
}

}  // namespace dlslime::py_bind
