// dlslime.TcpEndpoint: the TCP transport's constructor and options. Everything else it
// inherits from dlslime.Endpoint (bind_endpoint.cpp). Compiled only with BUILD_TCP.
#include <memory>
#include <string>

#include <fmt/format.h>

#include "bindings.h"
#include "dlslime/tcp_endpoint.h"
#include "convert.h"
#include "gil.h"

namespace py = pybind11;

namespace dlslime::py_bind {

void bind_tcp(py::module_& m) {
  py::class_<TcpEndpoint, Endpoint, std::shared_ptr<TcpEndpoint>>(m, "TcpEndpoint",
                                                                  "Peer-to-peer transfers over TCP. See docs/tcp.md.")
      .def(py::init([](py::handle ip, py::handle port, const py::kwargs& kwargs) {
             const std::string host = str_arg(ip, "ip");
             const auto p = int_arg<uint16_t>(port, "port");
             TcpOptions options = tcp_options_from_kwargs(kwargs);
             return make_without_gil<TcpEndpoint>(host, p, std::move(options));
           }),
           py::arg("ip") = "0.0.0.0", py::arg("port") = 0)
      .def_property_readonly("host", &TcpEndpoint::host)
      .def_property_readonly("port", &TcpEndpoint::port)
      .def(
          "listener_stats", [](const TcpEndpoint& ep) { return from_json(ep.listener_stats(), "listener_stats"); },
          "The listener's counters since construction (dict): accepted, accept_failures, "
          "handshakes_completed, handshakes_refused, handshakes_timed_out, handshakes_evicted.")
      .def_property_readonly("options",
                             [](const TcpEndpoint& ep) { return from_json(ep.options().to_json(), "options"); })
      .def("__repr__", [](const TcpEndpoint& ep) {
        return fmt::format("<dlslime.TcpEndpoint {}:{}{}>", ep.host(), ep.port(),
                           ep.is_connected() ? " connected" : "");
      });
}

}  // namespace dlslime::py_bind
