#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "bindings.h"
#include "convert.h"
#include "dlslime/errors.h"
#include "dlslime/peer_agent.h"

namespace py = pybind11;

namespace dlslime::py_bind {

namespace {

uint64_t offset_of(py::handle v, const char* what) {
  if (!py::isinstance<py::int_>(v)) throw py::type_error(fmt::format("{} must be an int", what));
  if (v.cast<py::int_>() < py::int_(0)) throw py::value_error(fmt::format("{} must be >= 0", what));
  return v.cast<uint64_t>();
}

bool is_str(py::handle v) { return py::isinstance<py::str>(v); }

// A named batch: a tuple or a list of tuples whose first element is a str.
bool is_named(py::handle obj) {
  if (py::isinstance<py::tuple>(obj)) return py::len(obj) > 0 && is_str(obj.cast<py::tuple>()[0]);
  if (py::isinstance<py::list>(obj) && py::len(obj) > 0) {
    py::handle first = obj.cast<py::list>()[0];
    return (py::isinstance<py::tuple>(first) || py::isinstance<py::list>(first)) && py::len(first) > 0 &&
           is_str(first.cast<py::sequence>()[0]);
  }
  return false;
}

// ("name", local_off, remote_off, length) or (local_name, remote_name, local_off,
// remote_off, length): LOCAL offset first, as in DLSlime's PeerAgent.
NamedAssignment to_named_one(py::handle t) {
  if (!py::isinstance<py::tuple>(t) && !py::isinstance<py::list>(t)) {
    throw py::type_error("a named item is a tuple (name, local_offset, remote_offset, length)");
  }
  auto s = py::reinterpret_borrow<py::sequence>(t);
  if (s.size() == 4 && is_str(s[0])) {
    const auto name = s[0].cast<std::string>();
    return {name, name, offset_of(s[1], "local_offset"), offset_of(s[2], "remote_offset"), offset_of(s[3], "length")};
  }
  if (s.size() == 5 && is_str(s[0]) && is_str(s[1])) {
    return {s[0].cast<std::string>(), s[1].cast<std::string>(), offset_of(s[2], "local_offset"),
            offset_of(s[3], "remote_offset"), offset_of(s[4], "length")};
  }
  throw py::type_error(fmt::format(
      "a named item is (name, local_offset, remote_offset, length) or (local_name, remote_name, local_offset, "
      "remote_offset, length); got {} fields",
      s.size()));
}

std::vector<NamedAssignment> to_named(py::handle obj) {
  std::vector<NamedAssignment> out;
  if (py::isinstance<py::tuple>(obj)) {
    out.push_back(to_named_one(obj));
    return out;
  }
  for (auto item : obj) out.push_back(to_named_one(item));
  return out;
}

template <class Named, class Numeric>
Future one_sided(py::handle assignments, Named named, Numeric numeric) {
  if (is_named(assignments)) {
    auto batch = to_named(assignments);
    if (batch.empty()) throw py::value_error("the batch is empty");
    py::gil_scoped_release release;
    return named(batch);
  }
  auto batch = to_assignments(assignments);
  py::gil_scoped_release release;
  return numeric(std::move(batch));
}

std::string optional_str(py::handle v, const char* what) {
  if (v.is_none()) return "";
  if (!is_str(v)) throw py::type_error(fmt::format("{} must be a str or None", what));
  return v.cast<std::string>();
}

}  // namespace

void bind_agent(py::module_& m) {
  py::class_<PeerConnection>(m, "PeerConnection", "This agent's connection to one peer.")
      .def(
          "wait",
          [](const PeerConnection& c, double timeout) {
            {
              py::gil_scoped_release release;
              c.wait(std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000)));
            }
            return c;
          },
          py::arg("timeout") = 60.0, "Wait for the handshake; raises TimeoutError or ConnectionError.")
      .def("is_connected", &PeerConnection::is_connected)
      .def_property_readonly("state", &PeerConnection::state)
      .def_property_readonly("error", &PeerConnection::error)
      .def_property_readonly("conn_id", &PeerConnection::conn_id)
      .def_property_readonly("peer_alias", &PeerConnection::peer_alias)
      .def_property_readonly("transport", &PeerConnection::transport)
      .def_property_readonly("endpoint",
                             [](const PeerConnection& c) {
                               return std::dynamic_pointer_cast<TcpEndpoint>(c.endpoint());
                             })
      .def_property_readonly("peer_endpoint_info",
                             [](const PeerConnection& c) { return from_json(c.peer_endpoint_info()); })
      .def("__repr__", [](const PeerConnection& c) {
        return fmt::format("<dlslime.PeerConnection {} {}>", c.conn_id(), c.state());
      });

  py::class_<PeerAgent, std::shared_ptr<PeerAgent>>(m, "PeerAgent",
                                                     "Finds peers and connects them through NanoCtrl.")
      .def(py::init([](py::handle ctrl_url, py::handle alias, py::handle scope, py::handle nanoctrl_url,
                       py::handle heartbeat_interval, const py::kwargs& kwargs) {
             PeerAgentOptions o;
             const std::string url = optional_str(ctrl_url, "ctrl_url");
             const std::string url2 = optional_str(nanoctrl_url, "nanoctrl_url");
             if (!url.empty() && !url2.empty() && url != url2) {
               throw py::value_error("ctrl_url and nanoctrl_url name different NanoCtrl servers");
             }
             if (!url.empty()) o.ctrl_url = url;
             if (!url2.empty()) o.ctrl_url = url2;
             o.alias = optional_str(alias, "alias");
             o.scope = optional_str(scope, "scope");
             if (!heartbeat_interval.is_none()) {
               o.heartbeat_interval = std::chrono::milliseconds(
                   static_cast<int64_t>(heartbeat_interval.cast<double>() * 1000));
             }
             // token= is the one secret for both planes; ctrl_token= (or nanoctrl_token=) and
             // tcp_token= set one of them alone. None keeps the environment's default.
             const std::vector<std::string> tokens = {"token", "ctrl_token", "nanoctrl_token", "tcp_token"};
             o.tcp = tcp_options_from_kwargs(kwargs, tokens);
             auto token_kw = [&](const char* key) -> std::optional<std::string> {
               if (!kwargs.contains(key) || kwargs[key].is_none()) return std::nullopt;
               if (!py::isinstance<py::str>(kwargs[key])) throw py::type_error(fmt::format("{} must be a str", key));
               auto t = kwargs[key].cast<std::string>();
               // NanoCtrl's client reads "" as "use the environment"; TcpEndpoint as "off".
               // Rather than mean two things, an empty shared token is refused.
               if (t.empty() && std::string(key) != "tcp_token") {
                 throw py::value_error(fmt::format("{}=\"\" is empty; pass None for the default "
                                                   "(DLSLIME_NANOCTRL_TOKEN / DLSLIME_TCP_TOKEN)", key));
               }
               return t;
             };
             if (auto t = token_kw("token")) o.ctrl_token = o.tcp.token = *t;
             if (auto t = token_kw("nanoctrl_token")) o.ctrl_token = *t;
             if (auto t = token_kw("ctrl_token")) o.ctrl_token = *t;
             if (auto t = token_kw("tcp_token")) o.tcp.token = *t;
             py::gil_scoped_release release;
             return std::make_shared<PeerAgent>(std::move(o));
           }),
           py::arg("ctrl_url") = py::none(), py::arg("alias") = py::none(), py::arg("scope") = py::none(),
           py::arg("nanoctrl_url") = py::none(), py::arg("heartbeat_interval") = py::none())
      .def_property_readonly("alias", &PeerAgent::alias)
      .def_property_readonly("scope", &PeerAgent::scope)
      .def_property_readonly("ctrl_url", &PeerAgent::ctrl_url)
      .def(
          "register_memory_region",
          [](PeerAgent& a, const std::string& name, py::handle addr, py::handle offset, py::handle length) {
            const auto ad = offset_of(addr, "addr");
            const auto off = offset_of(offset, "offset");
            const auto len = offset_of(length, "length");
            py::gil_scoped_release release;
            return a.register_memory_region(name, static_cast<uintptr_t>(ad), off, len);
          },
          py::arg("name"), py::arg("addr"), py::arg("offset"), py::arg("length"))
      .def("unregister_memory_region", &PeerAgent::unregister_memory_region, py::arg("name"),
           py::call_guard<py::gil_scoped_release>())
      .def(
          "connect_to",
          [](PeerAgent& a, py::handle peer, const std::string& transport, const std::string& local_host,
             int local_port, int ib_port, int qp_num, py::handle local_device, py::handle peer_device) {
            if (!is_str(peer) || peer.cast<std::string>().empty()) {
              throw py::type_error("peer_alias must be a non-empty str");
            }
            if (local_port < 0 || local_port > 65535) throw py::value_error("local_port must be in 0..65535");
            ConnectOptions o;
            o.transport = transport;
            o.local_host = local_host;
            o.local_port = static_cast<uint16_t>(local_port);
            o.ib_port = ib_port;
            o.qp_num = qp_num;
            o.local_device = optional_str(local_device, "local_device");
            o.peer_device = optional_str(peer_device, "peer_device");
            const auto name = peer.cast<std::string>();
            py::gil_scoped_release release;
            return a.connect_to(name, o);
          },
          py::arg("peer_alias"), py::arg("transport") = "rdma", py::kw_only(), py::arg("local_host") = "0.0.0.0",
          py::arg("local_port") = 0, py::arg("ib_port") = 1, py::arg("qp_num") = 1,
          py::arg("local_device") = py::none(), py::arg("peer_device") = py::none())
      .def("connection", &PeerAgent::connection, py::arg("peer_alias"))
      .def("peers", &PeerAgent::peers)
      .def(
          "send",
          [](PeerAgent& a, const std::string& peer, py::handle chunk) {
            const Chunk c = to_chunk(chunk);
            py::gil_scoped_release release;
            return a.send(peer, c);
          },
          py::arg("peer"), py::arg("chunk"))
      .def(
          "recv",
          [](PeerAgent& a, const std::string& peer, py::handle chunk) {
            const Chunk c = to_chunk(chunk);
            py::gil_scoped_release release;
            return a.recv(peer, c);
          },
          py::arg("peer"), py::arg("chunk"))
      .def(
          "read",
          [](PeerAgent& a, const std::string& peer, py::handle assignments) {
            return one_sided(
                assignments, [&](const std::vector<NamedAssignment>& n) { return a.read(peer, n); },
                [&](std::vector<Assignment> b) { return a.read(peer, std::move(b)); });
          },
          py::arg("peer"), py::arg("assignments"))
      .def(
          "write",
          [](PeerAgent& a, const std::string& peer, py::handle assignments) {
            return one_sided(
                assignments, [&](const std::vector<NamedAssignment>& n) { return a.write(peer, n); },
                [&](std::vector<Assignment> b) { return a.write(peer, std::move(b)); });
          },
          py::arg("peer"), py::arg("assignments"))
      .def(
          "write_with_imm",
          [](PeerAgent& a, const std::string& peer, py::handle assignments, uint32_t imm_data) {
            return a.write_with_imm(peer, to_assignments(assignments), imm_data);
          },
          py::arg("peer"), py::arg("assignments"), py::arg("imm_data") = 0)
      .def("imm_recv", &PeerAgent::imm_recv, py::arg("peer"))
      .def("shutdown", &PeerAgent::shutdown, py::call_guard<py::gil_scoped_release>())
      .def("__enter__", [](std::shared_ptr<PeerAgent> a) { return a; })
      .def("__exit__",
           [](PeerAgent& a, py::handle, py::handle, py::handle) {
             py::gil_scoped_release release;
             a.shutdown();
           })
      .def("__repr__", [](const PeerAgent& a) {
        return fmt::format("<dlslime.PeerAgent '{}' at {}>", a.alias(), a.ctrl_url());
      });
}

}  // namespace dlslime::py_bind
