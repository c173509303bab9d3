// dlslime.available_transports() and dlslime.make_endpoint(): the Python face of the
// transport registry (include/dlslime/transport.h). No transport is named here: a new one
// appears in both by registering itself in C++, and its endpoints reach Python as its own
// class once its binding file derives that class from Endpoint.
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "dlslime/transport.h"
#include "convert.h"
#include "gil.h"

namespace py = pybind11;

namespace dlslime::py_bind {

namespace {

py::dict transport_dict(const TransportInfo& t) {
  py::dict d;
  d["name"] = t.name;
  d["built"] = t.built;
  d["available"] = t.available;
  d["reason"] = t.reason;
  d["devices"] = t.devices;
  return d;
}

// The library's endpoint comes with its own deleter. Python's holder drops it with the GIL
// released, as make_without_gil's do: destroying an endpoint shuts it down, which joins
// I/O threads and closes connections.
std::shared_ptr<Endpoint> destroyed_without_gil(std::shared_ptr<Endpoint> ep) {
  Endpoint* raw = ep.get();
  auto* owner = new std::shared_ptr<Endpoint>(std::move(ep));
  return std::shared_ptr<Endpoint>(raw, [owner](Endpoint*) { DestroyWithoutGil{}(owner); });
}

}  // namespace

void bind_transports(py::module_& m) {
  m.def(
      "available_transports",
      [] {
        std::vector<TransportInfo> list;
        {
          ReleaseGil release;  // probes may query devices
          list = available_transports();
        }
        py::list out;
        for (const auto& t : list) out.append(transport_dict(t));
        return out;
      },
      "Every transport of the project, built or not: [{name, built, available, reason, devices}].");
  m.def(
      "make_endpoint",
      [](py::handle transport, const py::kwargs& options) {
        const std::string name = str_arg(transport, "transport");
        const nlohmann::json json = to_json(options, "options");
        std::shared_ptr<Endpoint> ep;
        {
          ReleaseGil release;  // binds, starts I/O threads
          ep = make_endpoint(name, json);
        }
        return destroyed_without_gil(std::move(ep));
      },
      py::arg("transport"),
      "An endpoint of `transport`, as that transport's class, from its options (the keys of its options "
      "struct; tcp: TcpOptions.to_json() keys, token, ip, port). ValueError for an unknown transport or "
      "option, NotImplementedError with the reason for one not available here.");
}

}  // namespace dlslime::py_bind
