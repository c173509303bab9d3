#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "bindings.h"
#include "convert.h"
#include "gil.h"
#include "dlslime/errors.h"
#include "dlslime/peer_agent.h"

namespace py = pybind11;

namespace dlslime::py_bind {

namespace {

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
    return {name, name, int_arg<uint64_t>(s[1], "local_offset"), int_arg<uint64_t>(s[2], "remote_offset"),
            int_arg<uint64_t>(s[3], "length")};
  }
  if (s.size() == 5 && is_str(s[0]) && is_str(s[1])) {
    return {s[0].cast<std::string>(), s[1].cast<std::string>(), int_arg<uint64_t>(s[2], "local_offset"),
            int_arg<uint64_t>(s[3], "remote_offset"), int_arg<uint64_t>(s[4], "length")};
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
    ReleaseGil release;
    return named(batch);
  }
  auto batch = to_assignments(assignments);
  ReleaseGil release;
  return numeric(std::move(batch));
}

// The C++ wait reports a timeout by throwing; here it only ends one slice.
bool wait_slice(const PeerConnection& c, std::chrono::nanoseconds slice, std::string* timeout_reason) {
  try {
    c.wait(std::chrono::ceil<std::chrono::milliseconds>(slice));
    return true;
  } catch (const TimeoutError& e) {
    *timeout_reason = e.what();
    return false;
  }
}

// PeerConnection::wait's TimeoutError names the slice's milliseconds; restate it with the
// whole timeout, keeping the reason that follows ("no agent 'x' has registered ...").
[[noreturn]] void throw_connect_timeout(const PeerConnection& c, double seconds, const std::string& reason) {
  const auto ms = reason.find(" ms");
  const std::string why = ms == std::string::npos ? ": " + reason : reason.substr(ms + 3);
  throw TimeoutError(fmt::format("connection to '{}' not established within {} s{}", c.peer_alias(), seconds, why));
}

// connect_to(min_bw=): upstream DLSlime reserves it (no bandwidth-based selection); it is
// accepted and checked the way NanoCtrl checks a topology's min_bw, a number or a string
// holding one, and selects nothing here either.
void check_min_bw(py::handle min_bw) {
  if (min_bw.is_none() || PyLong_Check(min_bw.ptr()) || PyFloat_Check(min_bw.ptr())) return;
  if (py::isinstance<py::str>(min_bw)) {
    const std::string text = min_bw.cast<std::string>();
    size_t used = 0;
    try {
      std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (!text.empty() && used == text.size()) return;
    throw py::value_error(fmt::format("min_bw must be a number or a string holding one, not '{}'", text));
  }
  throw py::type_error(fmt::format("min_bw must be a number, a str or None, not {}", Py_TYPE(min_bw.ptr())->tp_name));
}

// The peer of an I/O call: `peer`, or upstream DLSlime's name for it, `peer_alias`.
std::string peer_arg_of(py::handle peer, py::handle peer_alias, const char* call) {
  return str_arg(renamed_arg(peer, peer_alias, call, "peer", "peer_alias"), "peer");
}

py::object nic_or_none(const std::string& nic) { return nic.empty() ? py::object(py::none()) : py::object(py::str(nic)); }

// Upstream DLSlime's connection filters (local_nic=, remote_nic=; None: any).
ConnectionFilter filter_of(py::handle local_nic, py::handle remote_nic) {
  return {optional_str_arg(local_nic, "local_nic"), optional_str_arg(remote_nic, "remote_nic")};
}

// get_resource(): an agent's NanoCtrl record in upstream DLSlime's resource shape
// (schema_version, host, nics, memory_keys), plus the transports it publishes.
py::dict resource_of(const nlohmann::json& record) {
  nlohmann::json nics = nlohmann::json::array();
  nlohmann::json transports = nlohmann::json::array();
  if (record.contains("metadata") && record["metadata"].is_object() && record["metadata"].contains("transports")) {
    transports = record["metadata"]["transports"];
    for (const auto& t : transports) {
      if (!t.is_object() || t.value("name", "") != "rdma" || !t.contains("ports")) continue;
      for (const auto& p : t["ports"]) {
        const std::string layer = p.value("link_layer", "");
        nics.push_back({{"name", p.value("device", "")},
                        {"device", p.value("device", "")},
                        {"ib_port", p.value("ib_port", 1)},
                        {"link_type", layer == "Ethernet" ? "RoCE" : layer == "InfiniBand" ? "IB" : layer}});
      }
    }
  }
  nlohmann::json out = {{"schema_version", 1},
                        {"host", {{"address", record.value("address", "")}}},
                        {"nics", nics},
                        {"memory_keys", record.value("memory_keys", nlohmann::json::array())},
                        {"transports", transports}};
  return from_json(out, "resource").cast<py::dict>();
}

}  // namespace

void bind_agent(py::module_& m) {
  py::class_<PeerConnection>(m, "PeerConnection", "This agent's connection to one peer.")
      .def(
          "wait",
          [](const PeerConnection& c, py::handle timeout) {
            const auto total = seconds_arg(timeout, "timeout");
            std::string reason;
            if (!wait_interruptibly(total, [&](std::chrono::nanoseconds d) { return wait_slice(c, d, &reason); })) {
              throw_connect_timeout(c, std::chrono::duration<double>(total).count(), reason);
            }
            return c;
          },
          py::arg("timeout") = 60.0,
          "Wait for the handshake (inf: no limit); raises TimeoutError or ConnectionError. Ctrl-C raises "
          "KeyboardInterrupt.")
      .def("is_connected", &PeerConnection::is_connected)
      .def_property_readonly("state", &PeerConnection::state)
      .def_property_readonly("error", &PeerConnection::error)
      .def_property_readonly("conn_id", &PeerConnection::conn_id)
      .def_property_readonly("peer_alias", &PeerConnection::peer_alias)
      .def_property_readonly("transport", &PeerConnection::transport)
      .def_property_readonly("selection_reason", &PeerConnection::selection_reason)
      // The RDMA devices of each side (upstream DLSlime's); None for TCP.
      .def_property_readonly("local_nic", [](const PeerConnection& c) { return nic_or_none(c.local_nic()); })
      .def_property_readonly("remote_nic", [](const PeerConnection& c) { return nic_or_none(c.remote_nic()); })
      .def("sync_memory_regions", &PeerConnection::sync_memory_regions, py::call_guard<ReleaseGil>(),
           "Resolves every region the peer has published again; returns their names.")
      // pybind11 returns the endpoint as its own (most derived, bound) class: a TcpEndpoint
      // for transport "tcp".
      .def_property_readonly("endpoint", &PeerConnection::endpoint)
      .def_property_readonly("peer_endpoint_info",
                             [](const PeerConnection& c) {
                               return from_json(c.peer_endpoint_info(), "peer_endpoint_info");
                             })
      .def("__repr__", [](const PeerConnection& c) {
        return fmt::format("<dlslime.PeerConnection {} {}>", c.conn_id(), c.state());
      });

  py::class_<PeerAgent, std::shared_ptr<PeerAgent>>(m, "PeerAgent",
                                                     "Finds peers and connects them through NanoCtrl.")
      .def(py::init([](py::handle ctrl_url, py::handle alias, py::handle device, py::handle scope,
                       py::handle nanoctrl_url, py::handle heartbeat_interval, py::handle nvlink_device,
                       py::handle max_connecting, py::handle ctrl_timeout, const py::kwargs& kwargs) {
             PeerAgentOptions o;
             const std::string url = optional_str_arg(ctrl_url, "ctrl_url");
             const std::string url2 = optional_str_arg(nanoctrl_url, "nanoctrl_url");
             if (!url.empty() && !url2.empty() && url != url2) {
               throw py::value_error("ctrl_url and nanoctrl_url name different NanoCtrl servers");
             }
             if (!url.empty()) o.ctrl_url = url;
             if (!url2.empty()) o.ctrl_url = url2;
             o.alias = optional_str_arg(alias, "alias");
             o.scope = optional_str_arg(scope, "scope");
             o.device = optional_str_arg(device, "device");
             if (!heartbeat_interval.is_none()) {
               o.heartbeat_interval = millis_arg(heartbeat_interval, "heartbeat_interval");
             }
             // Seconds, as every timeout from Python; > 0: a request with no time to answer fails at once.
             if (!ctrl_timeout.is_none()) o.ctrl_timeout = positive_millis_arg(ctrl_timeout, "ctrl_timeout");
             if (!nvlink_device.is_none()) {
               // bool is an int in Python; a GPU ordinal is not a flag.
               if (!py::isinstance<py::int_>(nvlink_device) || py::isinstance<py::bool_>(nvlink_device)) {
                 throw py::type_error("nvlink_device must be an int (a GPU device ordinal) or None");
               }
               const auto gpu = nvlink_device.cast<int64_t>();
               if (gpu < 0) throw py::value_error(fmt::format("nvlink_device={} is not a GPU device ordinal", gpu));
               o.transport_options["nvlink"] = {{"device", gpu}};
             }
             if (!max_connecting.is_none()) {
               if (!py::isinstance<py::int_>(max_connecting) || py::isinstance<py::bool_>(max_connecting)) {
                 throw py::type_error("max_connecting must be an int or None");
               }
               const auto n = max_connecting.cast<int64_t>();
               if (n < 1) throw py::value_error("max_connecting must be >= 1");
               o.max_connecting = static_cast<size_t>(n);
             }
             // token= is the one secret for both planes; ctrl_token= (or nanoctrl_token=) and
             // tcp_token= set one of them alone. None keeps the environment's default.
             const std::vector<std::string> tokens = {"token", "ctrl_token", "nanoctrl_token", "tcp_token"};
#ifdef DLSLIME_WITH_TCP
             TcpOptions tcp = tcp_options_from_kwargs(kwargs, tokens);
#else
             // A build without TCP has no TCP options to set.
             for (auto item : kwargs) {
               const auto key = item.first.cast<std::string>();
               if (std::find(tokens.begin(), tokens.end(), key) == tokens.end()) {
                 throw py::type_error(fmt::format("got an unexpected keyword argument '{}' (this build has no TCP "
                                                  "transport, whose option it would be)",
                                                  key));
               }
             }
#endif
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
             std::optional<std::string> tcp_token;
             if (auto t = token_kw("token")) o.ctrl_token = *(tcp_token = *t);
             if (auto t = token_kw("nanoctrl_token")) o.ctrl_token = *t;
             if (auto t = token_kw("ctrl_token")) o.ctrl_token = *t;
             if (auto t = token_kw("tcp_token")) tcp_token = *t;
#ifdef DLSLIME_WITH_TCP
             if (tcp_token) tcp.token = *tcp_token;
             // The TCP transport's agent options (PeerAgentOptions::transport_options), the
             // token with them: to_json() leaves the secret out.
             nlohmann::json tcp_json = tcp.to_json();
             tcp_json.erase("authenticated");
             tcp_json["token"] = tcp.token;
             o.transport_options["tcp"] = std::move(tcp_json);
#endif
             return make_without_gil<PeerAgent>(std::move(o));
           }),
           // Upstream DLSlime's positional order: (nanoctrl_url, alias, device, scope).
           py::arg("ctrl_url") = py::none(), py::arg("alias") = py::none(), py::arg("device") = py::none(),
           py::arg("scope") = py::none(), py::kw_only(), py::arg("nanoctrl_url") = py::none(),
           py::arg("heartbeat_interval") = py::none(), py::arg("nvlink_device") = py::none(),
           py::arg("max_connecting") = py::none(), py::arg("ctrl_timeout") = py::none())
      .def_property_readonly("alias", &PeerAgent::alias)
      .def_property_readonly("scope", &PeerAgent::scope)
      .def_property_readonly("ctrl_url", &PeerAgent::ctrl_url)
      // Discovery (upstream DLSlime's names), from NanoCtrl.
      .def("list_agents", &PeerAgent::list_agents, py::call_guard<ReleaseGil>(),
           "The aliases registered in this agent's scope, sorted.")
      .def(
          "get_mr_info",
          [](const PeerAgent& a, py::handle peer, py::handle name) -> py::object {
            const auto p = str_arg(peer, "peer_alias");
            const auto n = str_arg(name, "mr_name");
            std::optional<nlohmann::json> info;
            {
              ReleaseGil release;
              info = a.get_mr_info(p, n);
            }
            return info ? from_json(*info, "mr_info") : py::object(py::none());
          },
          py::arg("peer_alias"), py::arg("mr_name"), "The published record of a peer's region; None if there is none.")
      .def(
          "list_mem_keys",
          [](const PeerAgent& a, py::handle peer) {
            std::vector<std::string> names;
            if (peer.is_none()) {
              names = a.local_region_names();
            } else {
              const auto p = str_arg(peer, "peer");
              std::optional<nlohmann::json> record;
              {
                ReleaseGil release;
                record = a.agent_record(p);
              }
              if (record && record->contains("memory_keys")) {
                for (const auto& k : (*record)["memory_keys"]) {
                  if (k.is_string()) names.push_back(k.get<std::string>());
                }
              }
            }
            std::sort(names.begin(), names.end());
            return names;
          },
          py::arg("peer") = py::none(), "Region names: this agent's (peer=None) or a peer's as published.")
      .def(
          "get_resource",
          [](const PeerAgent& a, py::handle peer) -> py::object {
            const std::string p = peer.is_none() ? a.alias() : str_arg(peer, "peer");
            std::optional<nlohmann::json> record;
            {
              ReleaseGil release;
              record = a.agent_record(p);
            }
            if (!record) return py::none();
            return resource_of(*record);
          },
          py::arg("peer") = py::none(),
          "An agent's published resources (upstream's shape: schema_version, host, nics, memory_keys, plus "
          "transports); None for an agent that is not registered.")
      .def(
          "register_memory_region",
          [](PeerAgent& a, py::handle name, py::handle addr, py::handle offset, py::handle length) {
            const auto n = str_arg(name, "name");
            const auto ad = int_arg<uintptr_t>(addr, "addr");
            const auto off = int_arg<uint64_t>(offset, "offset");
            const auto len = int_arg<uint64_t>(length, "length");
            ReleaseGil release;
            return a.register_memory_region(n, ad, off, len);
          },
          py::arg("name"), py::arg("addr"), py::arg("offset"), py::arg("length"))
      .def(
          "unregister_memory_region",
          [](PeerAgent& a, py::handle name) {
            // True once unregistered, False if no region has the name (upstream DLSlime's
            // convention; nothing is left half-unregistered either way).
            const auto n = str_arg(name, "name");
            ReleaseGil release;
            try {
              a.unregister_memory_region(n);
            } catch (const NotFoundError&) {
              return false;
            }
            return true;
          },
          py::arg("name"))
      .def(
          "connect_to",
          [](PeerAgent& a, py::handle peer, py::handle local_device, py::handle peer_device, py::handle ib_port,
             py::handle qp_num, py::handle min_bw, py::handle transport, py::handle local_host,
             py::handle local_port) {
            const auto name = str_arg(peer, "peer_alias");
            if (name.empty()) throw py::value_error("peer_alias must not be empty");
            ConnectOptions o;
            o.transport = str_arg(transport, "transport");
            // None (upstream DLSlime's defaults for these) keeps ours.
            if (!local_host.is_none()) o.local_host = str_arg(local_host, "local_host");
            o.local_port = int_arg<uint16_t>(local_port, "local_port");
            if (!ib_port.is_none()) o.ib_port = int_arg<int>(ib_port, "ib_port");
            if (!qp_num.is_none()) o.qp_num = int_arg<int>(qp_num, "qp_num");
            o.local_device = optional_str_arg(local_device, "local_device");
            o.peer_device = optional_str_arg(peer_device, "peer_device");
            // Earlier versions of this package took the transport second; that call now names
            // a device. Say so rather than look for an RDMA device called "tcp".
            for (const auto& d : {o.local_device, o.peer_device}) {
              if (d == "tcp" || d == "rdma" || d == "auto") {
                throw py::value_error(fmt::format(
                    "connect_to(): device '{}' is a transport name; the positional order is upstream DLSlime's "
                    "(peer_alias, local_device, peer_device, ib_port, qp_num, min_bw, transport, ...): pass "
                    "transport=\"{}\"",
                    d, d));
              }
            }
            check_min_bw(min_bw);
            ReleaseGil release;
            return a.connect_to(name, o);
          },
          // Upstream DLSlime 0.1.23's positional order: (peer_alias, local_device, peer_device,
          // ib_port, qp_num, min_bw, transport, local_host, local_port).
          py::arg("peer_alias"), py::arg("local_device") = py::none(), py::arg("peer_device") = py::none(),
          py::arg("ib_port") = 1, py::arg("qp_num") = 1, py::arg("min_bw") = py::none(),
          py::arg("transport") = "rdma", py::arg("local_host") = py::none(), py::arg("local_port") = 0)
      .def(
          "connection",
          [](const PeerAgent& a, py::handle peer, py::handle local_nic, py::handle remote_nic) {
            return a.connection(str_arg(peer, "peer_alias"), filter_of(local_nic, remote_nic));
          },
          py::arg("peer_alias"), py::kw_only(), py::arg("local_nic") = py::none(), py::arg("remote_nic") = py::none(),
          "The connection to the peer on those NICs; None if none; ValueError naming them if several match.")
      .def(
          "connections", [](const PeerAgent& a, py::handle peer) { return a.connections(str_arg(peer, "peer_alias")); },
          py::arg("peer_alias"), "Every connection to the peer (one per NIC pair), in the order made.")
      .def("peers", &PeerAgent::peers)
      // Upstream DLSlime's views of the same table: {peer: {conn_id: connection}}, and one
      // peer's connection or None.
      .def("get_connections",
           [](const PeerAgent& a) {
             py::dict out;
             for (const auto& peer : a.peers()) {
               py::dict by_id;
               for (const auto& c : a.connections(peer)) by_id[py::str(c.conn_id())] = py::cast(c);
               if (py::len(by_id) > 0) out[py::str(peer)] = by_id;
             }
             return out;
           })
      .def(
          "query_connection",
          [](const PeerAgent& a, py::handle peer, py::handle local_nic, py::handle remote_nic)
              -> std::optional<PeerConnection> {
            // Upstream's lookup: the first connection (in the order made) on those NICs, None
            // when none is; several matching is not an error here (I/O refuses to guess).
            const auto f = filter_of(local_nic, remote_nic);
            for (const auto& c : a.connections(str_arg(peer, "peer_alias"))) {
              if ((f.local_nic.empty() || c.local_nic() == f.local_nic) &&
                  (f.remote_nic.empty() || c.remote_nic() == f.remote_nic)) {
                return c;
              }
            }
            return std::nullopt;
          },
          py::arg("peer_alias"), py::kw_only(), py::arg("local_nic") = py::none(), py::arg("remote_nic") = py::none())
      .def(
          "sync_memory_regions",
          [](PeerAgent& a, py::handle peer, py::handle local_nic, py::handle remote_nic) {
            const auto p = str_arg(peer, "peer_alias");
            const auto on = filter_of(local_nic, remote_nic);
            ReleaseGil release;
            return a.sync_memory_regions(p, on);
          },
          py::arg("peer_alias"), py::kw_only(), py::arg("local_nic") = py::none(), py::arg("remote_nic") = py::none())
      // I/O. Upstream DLSlime's forms work too: `peer_alias=` for `peer`, `assign=` for
      // `assignments`, and a `stream` after the batch (unused: no device streams yet).
      .def(
          "send",
          [](PeerAgent& a, py::handle peer_arg, py::handle chunk, py::handle stream, py::handle peer_alias,
             py::handle local_nic, py::handle remote_nic, py::handle timeout_ms) {
            check_stream_arg(stream);
            const auto peer = peer_arg_of(peer_arg, peer_alias, "send");
            const auto on = filter_of(local_nic, remote_nic);
            const auto timeout = op_timeout_arg(timeout_ms);
            const Chunk c = to_chunk(chunk);
            ReleaseGil release;
            return a.send(peer, c, on, timeout);
          },
          py::arg_v("peer", missing_arg(), "<required>"), py::arg("chunk"), py::arg("stream") = py::none(),
          py::kw_only(), py::arg_v("peer_alias", missing_arg(), "<unset>"),
          py::arg("local_nic") = py::none(), py::arg("remote_nic") = py::none(), py::arg("timeout_ms") = py::none())
      .def(
          "recv",
          [](PeerAgent& a, py::handle peer_arg, py::handle chunk, py::handle stream, py::handle peer_alias,
             py::handle local_nic, py::handle remote_nic, py::handle timeout_ms, py::handle exact_size) {
            check_stream_arg(stream);
            const auto peer = peer_arg_of(peer_arg, peer_alias, "recv");
            const auto on = filter_of(local_nic, remote_nic);
            const auto timeout = op_timeout_arg(timeout_ms);
            const Chunk c = to_chunk(chunk);
            const bool exact = bool_arg(exact_size, "exact_size");
            ReleaseGil release;
            return a.recv(peer, c, on, exact, timeout);
          },
          py::arg_v("peer", missing_arg(), "<required>"), py::arg("chunk"), py::arg("stream") = py::none(),
          py::kw_only(), py::arg_v("peer_alias", missing_arg(), "<unset>"),
          py::arg("local_nic") = py::none(), py::arg("remote_nic") = py::none(), py::arg("timeout_ms") = py::none(),
          py::arg("exact_size") = false)
      .def(
          "read",
          [](PeerAgent& a, py::handle peer_arg, py::handle assignments, py::handle stream, py::handle peer_alias,
             py::handle assign, py::handle local_nic, py::handle remote_nic, py::handle timeout_ms) {
            check_stream_arg(stream);
            const auto peer = peer_arg_of(peer_arg, peer_alias, "read");
            const auto on = filter_of(local_nic, remote_nic);
            const auto timeout = op_timeout_arg(timeout_ms);
            return one_sided(
                renamed_arg(assignments, assign, "read", "assignments", "assign"),
                [&](const std::vector<NamedAssignment>& n) { return a.read(peer, n, on, timeout); },
                [&](std::vector<Assignment> b) { return a.read(peer, std::move(b), on, timeout); });
          },
          py::arg_v("peer", missing_arg(), "<required>"), py::arg_v("assignments", missing_arg(), "<required>"),
          py::arg("stream") = py::none(), py::kw_only(), py::arg_v("peer_alias", missing_arg(), "<unset>"),
          py::arg_v("assign", missing_arg(), "<unset>"),
          py::arg("local_nic") = py::none(), py::arg("remote_nic") = py::none(), py::arg("timeout_ms") = py::none())
      .def(
          "write",
          [](PeerAgent& a, py::handle peer_arg, py::handle assignments, py::handle stream, py::handle peer_alias,
             py::handle assign, py::handle local_nic, py::handle remote_nic, py::handle timeout_ms,
             py::handle notify) {
            check_stream_arg(stream);
            const auto peer = peer_arg_of(peer_arg, peer_alias, "write");
            const auto on = filter_of(local_nic, remote_nic);
            const auto timeout = op_timeout_arg(timeout_ms);
            const auto note = notification_arg(notify, "notify", /*optional=*/true);
            return one_sided(
                renamed_arg(assignments, assign, "write", "assignments", "assign"),
                [&](const std::vector<NamedAssignment>& n) { return a.write(peer, n, on, timeout, note); },
                [&](std::vector<Assignment> b) { return a.write(peer, std::move(b), on, timeout, note); });
          },
          py::arg_v("peer", missing_arg(), "<required>"), py::arg_v("assignments", missing_arg(), "<required>"),
          py::arg("stream") = py::none(), py::kw_only(), py::arg_v("peer_alias", missing_arg(), "<unset>"),
          py::arg_v("assign", missing_arg(), "<unset>"),
          py::arg("local_nic") = py::none(), py::arg("remote_nic") = py::none(), py::arg("timeout_ms") = py::none(),
          py::arg("notify") = py::none(),
          "notify=b\"...\" (at most 4 KiB): reaches the peer's recv_notify(alias) once every byte of this write "
          "is in place there.")
      .def(
          "write_with_imm",
          [](PeerAgent& a, py::handle peer_arg, py::handle assignments, py::handle imm_data, py::handle stream,
             py::handle peer_alias, py::handle assign, py::handle local_nic, py::handle remote_nic, py::handle timeout_ms) {
            check_stream_arg(stream);
            const auto peer = peer_arg_of(peer_arg, peer_alias, "write_with_imm");
            const auto on = filter_of(local_nic, remote_nic);
            const auto timeout = op_timeout_arg(timeout_ms);
            auto batch = to_assignments(renamed_arg(assignments, assign, "write_with_imm", "assignments", "assign"));
            const auto imm = int_arg<uint32_t>(imm_data, "imm_data");
            ReleaseGil release;
            return a.write_with_imm(peer, std::move(batch), imm, on, timeout);
          },
          py::arg_v("peer", missing_arg(), "<required>"), py::arg_v("assignments", missing_arg(), "<required>"),
          py::arg("imm_data") = 0, py::arg("stream") = py::none(), py::kw_only(),
          py::arg_v("peer_alias", missing_arg(), "<unset>"), py::arg_v("assign", missing_arg(), "<unset>"),
          py::arg("local_nic") = py::none(), py::arg("remote_nic") = py::none(), py::arg("timeout_ms") = py::none())
      .def(
          "imm_recv",
          [](PeerAgent& a, py::handle peer_arg, py::handle stream, py::handle peer_alias,
             py::handle local_nic, py::handle remote_nic, py::handle timeout_ms) {
            check_stream_arg(stream);
            const auto peer = peer_arg_of(peer_arg, peer_alias, "imm_recv");
            const auto on = filter_of(local_nic, remote_nic);
            const auto timeout = op_timeout_arg(timeout_ms);
            ReleaseGil release;
            return a.imm_recv(peer, on, timeout);
          },
          py::arg_v("peer", missing_arg(), "<required>"), py::arg("stream") = py::none(), py::kw_only(),
          py::arg_v("peer_alias", missing_arg(), "<unset>"),
          py::arg("local_nic") = py::none(), py::arg("remote_nic") = py::none(), py::arg("timeout_ms") = py::none())
      .def(
          "send_notify",
          [](PeerAgent& a, py::handle peer, py::handle data, py::handle local_nic, py::handle remote_nic,
             py::handle timeout_ms) {
            const auto p = str_arg(peer, "peer");
            auto note = *notification_arg(data, "data", /*optional=*/false);
            const auto on = filter_of(local_nic, remote_nic);
            const auto timeout = op_timeout_arg(timeout_ms);
            ReleaseGil release;
            return a.send_notify(p, std::move(note), on, timeout);
          },
          py::arg("peer"), py::arg("data"), py::kw_only(), py::arg("local_nic") = py::none(),
          py::arg("remote_nic") = py::none(), py::arg("timeout_ms") = py::none(),
          "A notification (bytes, at most 4 KiB) to the peer's recv_notify(), after every write to it submitted "
          "before this one has completed.")
      .def(
          "recv_notify",
          [](PeerAgent& a, py::handle peer, py::handle local_nic, py::handle remote_nic, py::handle timeout_ms) {
            const auto p = str_arg(peer, "peer");
            const auto on = filter_of(local_nic, remote_nic);
            const auto timeout = op_timeout_arg(timeout_ms);
            ReleaseGil release;
            return a.recv_notify(p, on, timeout);
          },
          py::arg("peer"), py::kw_only(), py::arg("local_nic") = py::none(), py::arg("remote_nic") = py::none(),
          py::arg("timeout_ms") = py::none(),
          "The peer's next notification (future.notification() once done), in the order the peer sent them.")
      .def("shutdown", &PeerAgent::shutdown, py::call_guard<ReleaseGil>())
      .def("__enter__", [](std::shared_ptr<PeerAgent> a) { return a; })
      .def("__exit__",
           [](PeerAgent& a, py::handle, py::handle, py::handle) {
             ReleaseGil release;
             a.shutdown();
           })
      .def("__repr__", [](const PeerAgent& a) {
        return fmt::format("<dlslime.PeerAgent '{}' at {}>", a.alias(), a.ctrl_url());
      });
}

}  // namespace dlslime::py_bind
