#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "bindings.h"
#include "dlslime/errors.h"
#include "dlslime/tcp_endpoint.h"
#include "convert.h"

namespace py = pybind11;

namespace dlslime::py_bind {

namespace {

uint64_t non_negative(py::handle v, const char* what) {
  if (!py::isinstance<py::int_>(v)) throw py::type_error(fmt::format("{} must be an int", what));
  const auto i = v.cast<py::int_>();
  if (i < py::int_(0)) throw py::value_error(fmt::format("{} must be >= 0", what));
  return i.cast<uint64_t>();
}

int32_t handle_of(py::handle v, const char* what) {
  if (!py::isinstance<py::int_>(v)) throw py::type_error(fmt::format("{} must be an int handle", what));
  const auto i = v.cast<int64_t>();
  if (i < INT32_MIN || i > INT32_MAX) throw py::value_error(fmt::format("{} {} is out of range", what, i));
  return static_cast<int32_t>(i);
}

}  // namespace

std::vector<Assignment> to_assignments(py::handle obj) {
  auto one = [](py::handle t) {
    if (!py::isinstance<py::tuple>(t) && !py::isinstance<py::list>(t)) {
      throw py::type_error("an assignment is a tuple (local_handle, remote_handle, target_offset, source_offset, length)");
    }
    auto seq = py::reinterpret_borrow<py::sequence>(t);
    if (seq.size() != 5) {
      throw py::type_error(fmt::format(
          "an assignment has 5 fields (local_handle, remote_handle, target_offset, source_offset, length), got {}",
          seq.size()));
    }
    return Assignment{handle_of(seq[0], "local_handle"), handle_of(seq[1], "remote_handle"),
                      non_negative(seq[2], "target_offset"), non_negative(seq[3], "source_offset"),
                      non_negative(seq[4], "length")};
  };
  std::vector<Assignment> out;
  if (py::isinstance<py::tuple>(obj) && py::len(obj) == 5 && py::isinstance<py::int_>(obj.cast<py::tuple>()[0])) {
    out.push_back(one(obj));
    return out;
  }
  if (!py::isinstance<py::list>(obj) && !py::isinstance<py::tuple>(obj)) {
    throw py::type_error("assignments must be a list of 5-tuples");
  }
  out.reserve(py::len(obj));
  for (auto item : obj) out.push_back(one(item));
  return out;
}

Chunk to_chunk(py::handle obj) {
  if (!py::isinstance<py::tuple>(obj) && !py::isinstance<py::list>(obj)) {
    throw py::type_error("a chunk is a tuple (addr, offset, length)");
  }
  auto seq = py::reinterpret_borrow<py::sequence>(obj);
  if (seq.size() != 3) throw py::type_error(fmt::format("a chunk has 3 fields (addr, offset, length), got {}", seq.size()));
  return Chunk{static_cast<uintptr_t>(non_negative(seq[0], "addr")), non_negative(seq[1], "offset"),
               non_negative(seq[2], "length")};
}

namespace {

std::chrono::milliseconds seconds_option(py::handle v, const char* name) {
  const double s = v.cast<double>();
  if (s < 0) throw py::value_error(fmt::format("{} must be >= 0 seconds", name));
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0 + 0.5));
}

}  // namespace

TcpOptions tcp_options_from_kwargs(const py::kwargs& kwargs, const std::vector<std::string>& consumed) {
  TcpOptions o = TcpOptions::from_env();
  for (auto item : kwargs) {
    const auto key = item.first.cast<std::string>();
    if (std::find(consumed.begin(), consumed.end(), key) != consumed.end()) continue;
    py::handle v = item.second;
    if (key == "lanes") o.lanes = v.cast<uint32_t>();
    else if (key == "chunk_size") o.chunk_size = v.cast<uint64_t>();
    else if (key == "connect_timeout") o.connect_timeout = seconds_option(v, "connect_timeout");
    else if (key == "timeout" || key == "op_timeout") o.op_timeout = seconds_option(v, "timeout");
    else if (key == "recv_timeout") o.recv_timeout = seconds_option(v, "recv_timeout");
    else if (key == "sndbuf") o.sndbuf = v.cast<int>();
    else if (key == "rcvbuf") o.rcvbuf = v.cast<int>();
    else if (key == "advertise_host") o.advertise_host = v.is_none() ? "" : v.cast<std::string>();
    else if (key == "keepalive_idle") o.keepalive_idle_s = v.cast<int>();
    else if (key == "keepalive_interval") o.keepalive_interval_s = v.cast<int>();
    else if (key == "keepalive_count") o.keepalive_count = v.cast<int>();
    else if (key == "max_inflight_ops") o.max_inflight_ops = v.cast<uint32_t>();
    else if (key == "max_batch_items") o.max_batch_items = v.cast<uint32_t>();
    else if (key == "unexpected_buffer_bytes") o.unexpected_buffer_bytes = v.cast<uint64_t>();
    else if (key == "token") {
      // None keeps DLSLIME_TCP_TOKEN; "" turns authentication off; str or bytes set it.
      if (!v.is_none() && !py::isinstance<py::str>(v) && !py::isinstance<py::bytes>(v)) {
        throw py::type_error("token must be str, bytes or None");
      }
      if (!v.is_none()) o.token = v.cast<std::string>();
    }
    else throw py::type_error(fmt::format("got an unexpected keyword argument '{}'", key));
  }
  return o;
}

void bind_tcp(py::module_& m) {
  py::class_<TcpEndpoint, std::shared_ptr<TcpEndpoint>>(m, "TcpEndpoint",
                                                        "Peer-to-peer transfers over TCP. See docs/tcp.md.")
      .def(py::init([](const std::string& ip, int port, const py::kwargs& kwargs) {
             if (port < 0 || port > 65535) throw py::value_error("port must be in 0..65535");
             TcpOptions options = tcp_options_from_kwargs(kwargs);
             py::gil_scoped_release release;
             return std::make_shared<TcpEndpoint>(ip, static_cast<uint16_t>(port), std::move(options));
           }),
           py::arg("ip") = "0.0.0.0", py::arg("port") = 0)
      .def("endpoint_info", [](const TcpEndpoint& ep) { return from_json(ep.endpoint_info()); })
      .def(
          "connect",
          [](TcpEndpoint& ep, py::handle peer_info) {
            auto info = to_json(peer_info);
            py::gil_scoped_release release;
            ep.connect(info);
          },
          py::arg("peer_info"))
      .def("is_connected", &TcpEndpoint::is_connected)
      .def(
          "register_memory_region",
          [](TcpEndpoint& ep, py::handle name, py::handle addr, py::handle offset, py::handle length) {
            // DLSlime accepts an int key too and names it "mr_<key>".
            const std::string key =
                py::isinstance<py::int_>(name) ? "mr_" + py::str(name).cast<std::string>() : name.cast<std::string>();
            return ep.register_memory_region(key, static_cast<uintptr_t>(non_negative(addr, "addr")),
                                             non_negative(offset, "offset"), non_negative(length, "length"));
          },
          py::arg("name"), py::arg("addr"), py::arg("offset"), py::arg("length"))
      .def(
          "register_remote_memory_region",
          [](TcpEndpoint& ep, const std::string& name, py::handle entry) {
            return ep.register_remote_memory_region(name, to_json(entry));
          },
          py::arg("name"), py::arg("mr_info"))
      .def(
          "unregister_memory_region",
          [](TcpEndpoint& ep, py::handle name_or_handle) {
            if (py::isinstance<py::int_>(name_or_handle)) {
              ep.unregister_memory_region(handle_of(name_or_handle, "handle"));
            } else {
              ep.unregister_memory_region(name_or_handle.cast<std::string>());
            }
          },
          py::arg("name_or_handle"))
      .def("mr_info", [](const TcpEndpoint& ep) { return from_json(ep.mr_info()); })
      .def(
          "send",
          [](TcpEndpoint& ep, py::handle chunk) {
            const Chunk c = to_chunk(chunk);
            py::gil_scoped_release release;
            return ep.send(c);
          },
          py::arg("chunk"), "Two-sided send of (addr, offset, length); FIFO-matched to the peer's recvs.")
      .def(
          "recv",
          [](TcpEndpoint& ep, py::handle chunk) {
            const Chunk c = to_chunk(chunk);
            py::gil_scoped_release release;
            return ep.recv(c);
          },
          py::arg("chunk"), "Post a receive buffer (addr, offset, length); future.nbytes tells the message size.")
      .def(
          "read",
          [](TcpEndpoint& ep, py::handle assignments) {
            auto batch = to_assignments(assignments);
            py::gil_scoped_release release;
            return ep.read(std::move(batch));
          },
          py::arg("assignments"))
      .def(
          "write",
          [](TcpEndpoint& ep, py::handle assignments) {
            auto batch = to_assignments(assignments);
            py::gil_scoped_release release;
            return ep.write(std::move(batch));
          },
          py::arg("assignments"))
      .def(
          "write_with_imm",
          [](TcpEndpoint& ep, py::handle assignments, uint32_t imm_data) {
            return ep.write_with_imm(to_assignments(assignments), imm_data);
          },
          py::arg("assignments"), py::arg("imm_data") = 0)
      .def("imm_recv", [](TcpEndpoint& ep) { return ep.imm_recv(); })
      .def("shutdown", &TcpEndpoint::shutdown, py::call_guard<py::gil_scoped_release>())
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
      .def_property_readonly("options", [](const TcpEndpoint& ep) { return from_json(ep.options().to_json()); })
      .def("__enter__", [](std::shared_ptr<TcpEndpoint> ep) { return ep; })
      .def(
          "__exit__",
          [](TcpEndpoint& ep, py::handle, py::handle, py::handle) {
            py::gil_scoped_release release;
            ep.shutdown();
          })
      .def("__repr__", [](const TcpEndpoint& ep) {
        return fmt::format("<dlslime.TcpEndpoint {}:{}{}>", ep.host(), ep.port(),
                           ep.is_connected() ? " connected" : "");
      });
}

}  // namespace dlslime::py_bind
