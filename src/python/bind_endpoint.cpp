// dlslime.Endpoint: the surface every transport shares (include/dlslime/endpoint.h), bound
// once. A transport's binding derives from it and adds only its constructor and options
// (bind_tcp.cpp); an Endpoint the library returns (make_endpoint, PeerConnection.endpoint)
// reaches Python as its transport's own class, because Endpoint is polymorphic and
// pybind11 looks the dynamic type up.
#include <pybind11/stl.h>

#include <chrono>
#include <optional>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "bindings.h"
#include "core/memory_registry.h"
#include "dlslime/endpoint.h"
#include "dlslime/errors.h"
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
  d["notify"] = c.notify;
  d["host_memory"] = c.host_memory;
  d["device_memory"] = c.device_memory;
  return d;
}

// `stream` (upstream's CUDA stream handle) is checked by every op (check_stream_arg) and unused: no
// transport here orders its ops against a device stream yet.
Future send_op(Endpoint& ep, py::handle chunk, py::handle stream, py::handle timeout_ms) {
  check_stream_arg(stream);
  const Chunk c = to_chunk(chunk);
  const auto timeout = op_timeout_arg(timeout_ms);
  ReleaseGil release;
  return ep.send(c, timeout);
}

// exact_size=True (OpRequest::exact_size): the transport fails a recv whose message is
// shorter than the buffer.
Future recv_op(Endpoint& ep, py::handle chunk, py::handle stream, py::handle exact_size, py::handle timeout_ms) {
  check_stream_arg(stream);
  const Chunk c = to_chunk(chunk);
  const bool exact = bool_arg(exact_size, "exact_size");
  const auto timeout = op_timeout_arg(timeout_ms);
  ReleaseGil release;
  return ep.recv(c, exact, timeout);
}

template <OpKind Kind>
Future one_sided_op(Endpoint& ep, py::handle assignments, py::handle stream, py::handle timeout_ms,
                    py::handle assign, py::handle notify) {
  check_stream_arg(stream);
  const char* call = Kind == OpKind::kRead ? "read" : "write";
  auto batch = to_assignments(renamed_arg(assignments, assign, call, "assignments", "assign"));
  const auto timeout = op_timeout_arg(timeout_ms);
  std::optional<std::string> note;
  if (Kind == OpKind::kWrite) {
    note = notification_arg(notify, "notify", /*optional=*/true);
  } else if (!notify.is_none()) {
    throw py::type_error("read() takes no notify: notifications ride on writes (or send_notify)");
  }
  ReleaseGil release;
  return Kind == OpKind::kRead ? ep.read(std::move(batch), timeout) : ep.write(std::move(batch), timeout, std::move(note));
}

void def_send(py::class_<Endpoint, std::shared_ptr<Endpoint>>& cls, const char* name) {
  cls.def(name, &send_op, py::arg("chunk"), py::arg("stream") = py::none(), py::arg("timeout_ms") = py::none(),
          "Two-sided send of (addr, offset, length); FIFO-matched to the peer's recvs. stream is unused; "
          "timeout_ms: this op's deadline (None or 0: the endpoint's op_timeout).");
}

void def_recv(py::class_<Endpoint, std::shared_ptr<Endpoint>>& cls, const char* name) {
  cls.def(name, &recv_op, py::arg("chunk"), py::arg("stream") = py::none(), py::arg("exact_size") = false,
          py::arg("timeout_ms") = py::none(),
          "Post a receive buffer (addr, offset, length); future.nbytes tells the message size. exact_size=True: "
          "a message shorter than the buffer fails the op. timeout_ms: how long it waits for its message (None or "
          "0: the endpoint's recv_timeout); then it fails with TIMEOUT and the connection lives.");
}

template <OpKind Kind>
void def_one_sided(py::class_<Endpoint, std::shared_ptr<Endpoint>>& cls, const char* name) {
  cls.def(name, &one_sided_op<Kind>, py::arg_v("assignments", missing_arg(), "<required>"),
          py::arg("stream") = py::none(), py::arg("timeout_ms") = py::none(), py::kw_only(),
          py::arg_v("assign", missing_arg(), "<unset>"), py::arg("notify") = py::none(),
          "A batch of (local_handle, remote_handle, target_offset, source_offset, length) items (or one); "
          "`assign` is upstream's name for `assignments`. timeout_ms: this op's deadline (None or 0: the "
          "endpoint's op_timeout). write only: notify=b\"...\" (at most 4 KiB) reaches the peer's recv_notify() "
          "once every byte of this write is in place there.");
}

// The pool's name for a region registered without one (upstream's RDMAMemoryPool takes
// name=None): its address, so registering the same buffer again finds the same name.
std::string pool_region_name(py::handle name, uintptr_t addr) {
  return name.is_none() ? fmt::format("0x{:x}", addr) : region_name_arg(name);
}

// The local handle of `name`, -1 if the pool has none (upstream's get_mr_handle/get_handle).
int32_t pool_handle(const MemoryPoolView& pool, py::handle name) {
  return pool.registry()->find(region_name_arg(name)).value_or(-1);
}

// One mr_info entry of a peer (a dict with at least addr and length), checked as the
// endpoints' register_remote_memory_region checks its types.
nlohmann::json remote_entry_arg(py::handle entry) {
  if (!PyDict_Check(entry.ptr())) {
    throw py::type_error(fmt::format("mr_info must be a dict, not {}", type_name(entry)));
  }
  const auto d = py::reinterpret_borrow<py::dict>(entry);
  for (const char* key : {"addr", "length"}) {
    if (!d.contains(key)) throw py::value_error(fmt::format("mr_info has no '{}'", key));
    int_arg<uint64_t>(d[key], fmt::format("mr_info['{}']", key).c_str());
  }
  return to_json(entry, "mr_info");
}

void bind_memory_pool(py::module_& m) {
  py::class_<MemoryPoolView, std::shared_ptr<MemoryPoolView>>(
      m, "MemoryPool",
      "Named local memory regions with int handles, shared by every endpoint built on the pool "
      "(TcpEndpoint(pool=...), RDMAEndpoint(pool=...)): a region registered here or on any of them has "
      "one handle on all of them. Upstream DLSlime's TcpMemoryPool. See docs/upstream-compat.md.")
      .def(py::init<>())
      .def(
          "register_memory_region",
          [](MemoryPoolView& pool, py::handle addr, py::handle length, py::handle name, py::handle data_ptr) {
            const auto ad = int_arg<uintptr_t>(
                renamed_arg(addr, data_ptr, "register_memory_region", "addr", "data_ptr"), "addr");
            const auto len = int_arg<uint64_t>(length, "length");
            const std::string n = pool_region_name(name, ad);
            ReleaseGil release;  // replacing a name waits for the old region's transfers
            return pool.registry()->add(n, ad, 0, len);
          },
          py::arg_v("addr", missing_arg(), "<required>"), py::arg("length"), py::arg("name") = py::none(),
          py::kw_only(), py::arg_v("data_ptr", missing_arg(), "<unset>"),
          "Registers [addr, addr+length) as `name` (None: named by its address, \"0x...\"); returns its "
          "handle. `data_ptr` is upstream RDMAMemoryPool's name for `addr`. Registering a name again for "
          "other bytes replaces the region under a new handle.")
      .def("get_mr_handle", &pool_handle, py::arg("name"), "The handle of `name`; -1 if there is none.")
      .def("get_handle", &pool_handle, py::arg("name"), "The handle of `name`; -1 if there is none.")
      .def(
          "unregister_memory_region",
          [](MemoryPoolView& pool, py::handle key) {
            // Waits for the region's transfers in flight on every endpoint of the pool.
            if (PyLong_Check(key.ptr())) {
              const auto handle = int_arg<int32_t>(key, "key");
              ReleaseGil release;
              pool.registry()->remove(handle);
            } else if (PyUnicode_Check(key.ptr())) {
              const auto name = key.cast<std::string>();
              ReleaseGil release;
              pool.registry()->remove(name);
            } else {
              throw py::type_error(fmt::format("key must be a str name or an int handle, not {}", type_name(key)));
            }
            return 0;
          },
          py::arg("key"),
          "Unregisters a region (by name or handle) from the pool and every endpoint built on it; returns 0 "
          "once nothing in flight uses its memory. KeyError if there is none.")
      .def(
          "mr_info",
          [](const MemoryPoolView& pool) {
            nlohmann::json info = pool.registry()->mr_info();
            for (auto& [name, entry] : info.items()) entry["name"] = name;
            return from_json(info, "mr_info");
          },
          "{name: {addr, length, handle, name}} of the pool's regions. A peer addresses them through an "
          "endpoint's endpoint_info()[\"mr_info\"] (RDMA: each endpoint has its own rkeys).")
      .def(
          "register_remote_memory_region",
          [](MemoryPoolView& pool, py::handle entry, py::handle name) {
            nlohmann::json e = remote_entry_arg(entry);
            const std::string n =
                name.is_none() ? str_arg(py::reinterpret_borrow<py::dict>(entry).attr("get")("name", py::none()),
                                         "mr_info['name']")
                               : str_arg(name, "name");
            if (n.empty()) throw py::value_error("name must not be empty");
            return pool.record_remote(n, e);
          },
          py::arg("mr_info"), py::arg("name") = py::none(),
          "Records a peer's mr_info entry under `name` (default: the entry's 'name'); returns its remote "
          "handle in the pool (the same entry keeps its handle). An endpoint makes its own remote handles "
          "(Endpoint.register_remote_memory_region).")
      .def("remote_mr_info",
           [](const MemoryPoolView& pool) { return from_json(pool.remote_mr_info(), "remote_mr_info"); })
      .def(
          "register_into",
          [](const MemoryPoolView& pool, Endpoint& ep) {
            const nlohmann::json info = pool.registry()->mr_info();
            py::dict handles;
            for (const auto& [name, entry] : info.items()) {
              const auto addr = entry.at("addr").get<uintptr_t>();
              const auto length = entry.at("length").get<uint64_t>();
              int32_t h = 0;
              {
                ReleaseGil release;
                h = ep.register_memory_region(name, addr, 0, length);
              }
              handles[py::str(name)] = h;
            }
            return handles;
          },
          py::arg("endpoint"),
          "Registers every region of the pool on `endpoint` (one not built on this pool); returns "
          "{name: that endpoint's handle}.")
      .def("__len__", [](const MemoryPoolView& pool) { return pool.registry()->size(); })
      .def("__repr__", [](const MemoryPoolView& pool) {
        return fmt::format("<dlslime.MemoryPool {} regions>", pool.registry()->size());
      });
}

}  // namespace

void bind_endpoint(py::module_& m) {
  bind_memory_pool(m);
  // No constructor: an Endpoint is made by its transport's class or by make_endpoint().
  // Every call that can block on I/O or on transfers in flight runs without the GIL; the
  // arguments are converted before it is released. Upstream DLSlime's argument names and
  // positions are accepted too (docs/upstream-compat.md).
  py::class_<Endpoint, std::shared_ptr<Endpoint>> cls(
      m, "Endpoint", "What every transport's endpoint can do (docs/api.md, \"Endpoint base class\").");
  cls.def("endpoint_info", [](const Endpoint& ep) {
    nlohmann::json info;
    {
      ReleaseGil release;  // RDMA's may wait for a failed connection's work to drain
      info = ep.endpoint_info();
    }
    return from_json(info, "endpoint_info");
  })
      .def(
          "connect",
          [](Endpoint& ep, py::handle peer_info, py::handle remote_info) {
            auto info = to_json(renamed_arg(peer_info, remote_info, "connect", "peer_info", "remote_info"), "peer_info");
            ReleaseGil release;
            ep.connect(info);
          },
          py::arg_v("peer_info", missing_arg(), "<required>"), py::kw_only(),
          py::arg_v("remote_info", missing_arg(), "<unset>"))
      .def("is_connected", &Endpoint::is_connected)
      .def(
          "register_memory_region",
          [](Endpoint& ep, py::handle name, py::handle addr, py::handle offset, py::handle length,
             py::handle data_ptr) {
            const auto n = region_name_arg(name);
            const auto ad =
                int_arg<uintptr_t>(renamed_arg(addr, data_ptr, "register_memory_region", "addr", "data_ptr"), "addr");
            const auto off = int_arg<uint64_t>(offset, "offset");
            const auto len = int_arg<uint64_t>(length, "length");
            ReleaseGil release;  // replacing a name waits for the old region's transfers
            return ep.register_memory_region(n, ad, off, len);
          },
          py::arg("name"), py::arg_v("addr", missing_arg(), "<required>"), py::arg("offset"), py::arg("length"),
          py::kw_only(), py::arg_v("data_ptr", missing_arg(), "<unset>"))
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
          "write_with_imm",
          [](Endpoint& ep, py::handle assignments, py::handle imm_data, py::handle stream, py::handle timeout_ms,
             py::handle assign) {
            check_stream_arg(stream);
            auto batch = to_assignments(renamed_arg(assignments, assign, "write_with_imm", "assignments", "assign"));
            const auto imm = int_arg<uint32_t>(imm_data, "imm_data");
            const auto timeout = op_timeout_arg(timeout_ms);
            ReleaseGil release;
            return ep.write_with_imm(std::move(batch), imm, timeout);
          },
          py::arg_v("assignments", missing_arg(), "<required>"), py::arg("imm_data") = 0,
          py::arg("stream") = py::none(), py::arg("timeout_ms") = py::none(), py::kw_only(),
          py::arg_v("assign", missing_arg(), "<unset>"))
      .def(
          "imm_recv",
          [](Endpoint& ep, py::handle stream, py::handle timeout_ms) {
            check_stream_arg(stream);
            const auto timeout = op_timeout_arg(timeout_ms);
            ReleaseGil release;
            return ep.imm_recv(timeout);
          },
          py::arg("stream") = py::none(), py::arg("timeout_ms") = py::none(),
          "Wait for the peer's next write_with_imm; future.imm_data() is its immediate. timeout_ms: how long it "
          "waits (None or 0: the endpoint's recv_timeout); then it fails with TIMEOUT.")
      .def(
          "send_notify",
          [](Endpoint& ep, py::handle data, py::handle timeout_ms) {
            auto note = *notification_arg(data, "data", /*optional=*/false);
            const auto timeout = op_timeout_arg(timeout_ms);
            ReleaseGil release;
            return ep.send_notify(std::move(note), timeout);
          },
          py::arg("data"), py::arg("timeout_ms") = py::none(),
          "Send a notification (bytes, at most 4 KiB: ValueError past that) to the peer's recv_notify(), after "
          "every write submitted before it has completed. The future completes once the peer holds it, or fails "
          "(BATCH_OVERFLOW) if the peer's unclaimed notifications fill its budget.")
      .def(
          "recv_notify",
          [](Endpoint& ep, py::handle timeout_ms) {
            const auto timeout = op_timeout_arg(timeout_ms);
            ReleaseGil release;
            return ep.recv_notify(timeout);
          },
          py::arg("timeout_ms") = py::none(),
          "The peer's next notification: future.notification() gives its bytes once done. Each is received once, "
          "in the order the peer sent them. timeout_ms: how long it waits (None or 0: the endpoint's "
          "recv_timeout); a timed-out one takes nothing.")
      .def("capabilities", [](const Endpoint& ep) { return capabilities_dict(ep.capabilities()); })
      .def(
          "get_pool", [](const std::shared_ptr<Endpoint>& ep) { return pool_of(ep); },
          "The MemoryPool this endpoint was built on (its regions are the pool's); None if it has its own.")
      .def("shutdown", &Endpoint::shutdown, py::call_guard<ReleaseGil>())
      .def("__enter__", [](std::shared_ptr<Endpoint> ep) { return ep; })
      .def("__exit__", [](Endpoint& ep, py::handle, py::handle, py::handle) {
        ReleaseGil release;
        ep.shutdown();
      });
  // Upstream DLSlime's newer names for the same ops (async_* = the op returning a future,
  // which every op here does).
  def_send(cls, "send");
  def_send(cls, "async_send");
  def_recv(cls, "recv");
  def_recv(cls, "async_recv");
  def_one_sided<OpKind::kRead>(cls, "read");
  def_one_sided<OpKind::kRead>(cls, "async_read");
  def_one_sided<OpKind::kWrite>(cls, "write");
  def_one_sided<OpKind::kWrite>(cls, "async_write");
}

}  // namespace dlslime::py_bind
