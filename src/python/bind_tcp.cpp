// dlslime.TcpEndpoint: the TCP transport's constructor and options. Everything else it
// inherits from dlslime.Endpoint (bind_endpoint.cpp). Compiled only with BUILD_TCP.
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bindings.h"
#include "dlslime/tcp_endpoint.h"
#include "convert.h"
#include "gil.h"

namespace py = pybind11;

namespace dlslime::py_bind {

void bind_tcp(py::module_& m) {
  py::class_<TcpEndpoint, Endpoint, std::shared_ptr<TcpEndpoint>>(m, "TcpEndpoint",
                                                                  "Peer-to-peer transfers over TCP. See docs/tcp.md.")
      .def(py::init([](py::handle ip, py::handle port, py::handle pool, const py::kwargs& kwargs)
                        -> std::shared_ptr<TcpEndpoint> {
             const std::string host = str_arg(ip, "ip");
             const auto p = int_arg<uint16_t>(port, "port");
             if (pool.is_none()) {
               TcpOptions options = tcp_options_from_kwargs(kwargs);
               return make_without_gil<TcpEndpoint>(host, p, std::move(options));
             }
             // On a pool: the tcp transport's factory (the same options) over the pool's registry.
             auto shared = pool_arg(pool, "pool");
             nlohmann::json options = tcp_options_json_from_kwargs(kwargs);
             options["ip"] = host;
             options["port"] = p;
             return std::static_pointer_cast<TcpEndpoint>(make_endpoint_on_pool("tcp", options, std::move(shared)));
           }),
           py::arg("ip") = "0.0.0.0", py::arg("port") = 0, py::kw_only(), py::arg("pool") = py::none(),
           "Binds and listens on ip:port (0: any free port). pool: a MemoryPool (TcpMemoryPool) whose regions "
           "this endpoint shares. The other keywords are TcpOptions (docs/tcp.md).")
      .def_property_readonly("host", &TcpEndpoint::host)
      .def_property_readonly("port", &TcpEndpoint::port)
      .def(
          "listener_stats", [](const TcpEndpoint& ep) { return from_json(ep.listener_stats(), "listener_stats"); },
          "The listener's counters since construction (dict): accepted, accept_failures, "
          "handshakes_completed, handshakes_refused, handshakes_timed_out, handshakes_evicted.")
      .def_property_readonly("options",
                             [](const TcpEndpoint& ep) { return from_json(ep.options().to_json(), "options"); })
      .def_property_readonly(
          "same_host", [](const TcpEndpoint& ep) { return from_json(ep.same_host(), "same_host"); },
          "Which path this endpoint's writes take to the connected peer, and why: {'path': 'cma' or 'tcp', "
          "'reason': str} (docs/tcp.md, \"Same-host path\").")
      .def("__repr__", [](const TcpEndpoint& ep) {
        return fmt::format("<dlslime.TcpEndpoint {}:{}{}>", ep.host(), ep.port(),
                           ep.is_connected() ? " connected" : "");
      });
}

}  // namespace dlslime::py_bind
