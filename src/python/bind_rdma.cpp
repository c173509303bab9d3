// dlslime.RDMAEndpoint and dlslime.available_nic(): the RDMA transport's constructor,
// options and device list. Everything else it inherits from dlslime.Endpoint
// (bind_endpoint.cpp). Compiled only with BUILD_RDMA.
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pybind11/stl.h>

#include "bindings.h"
#include "convert.h"
#include "dlslime/rdma_endpoint.h"
#include "dlslime/transport.h"
#include "gil.h"

namespace py = pybind11;

namespace dlslime::py_bind {

void bind_rdma(py::module_& m) {
  py::class_<RDMAEndpoint, Endpoint, std::shared_ptr<RDMAEndpoint>>(
      m, "RDMAEndpoint", "Peer-to-peer transfers over RDMA RC queue pairs. See docs/rdma.md.")
      .def(py::init([](py::handle device_name, py::handle ib_port, py::handle link_type, py::handle num_qp,
                       const py::kwargs& kwargs) {
             // The keywords are RdmaOptions' keys; RdmaOptions::from_json rejects unknown ones.
             nlohmann::json options = kwargs.empty() ? nlohmann::json::object() : to_json(kwargs, "options");
             options["device_name"] = str_arg(device_name, "device_name");
             options["ib_port"] = int_arg<int64_t>(ib_port, "ib_port");
             options["link_type"] = str_arg(link_type, "link_type");
             options["num_qp"] = int_arg<int64_t>(num_qp, "num_qp");
             return make_without_gil<RDMAEndpoint>(RdmaOptions::from_json(options));
           }),
           py::arg("device_name") = "", py::arg("ib_port") = 1, py::arg("link_type") = "auto", py::arg("num_qp") = 1)
      .def_property_readonly("options",
                             [](const RDMAEndpoint& ep) { return from_json(ep.options().to_json(), "options"); })
      .def("__repr__", [](const RDMAEndpoint& ep) {
        return fmt::format("<dlslime.RDMAEndpoint {} num_qp={}{}>", ep.options().device_name.empty()
                                                                         ? std::string("(first active device)")
                                                                         : ep.options().device_name,
                           ep.options().num_qp, ep.is_connected() ? " connected" : "");
      });

  m.def(
      "available_nic",
      [] {
        // The registry's probe: the selected provider's devices, filtered by SLIME_VISIBLE_DEVICES.
        for (const TransportInfo& t : available_transports()) {
          if (t.name == "rdma") return t.devices;
        }
        return std::vector<std::string>{};
      },
      "Names of the RDMA devices this process may use (SLIME_VISIBLE_DEVICES respected).");
}

}  // namespace dlslime::py_bind
