// dlslime.Endpoint: the surface every transport shares (include/dlslime/endpoint.h), bound
// once. A transport's binding derives from it and adds only its constructor and options
// (bind_tcp.cpp); an Endpoint the library returns (make_endpoint, PeerConnection.endpoint)
// reaches Python as its transport's own class, because Endpoint is polymorphic and
// pybind11 looks the dynamic type up.
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <optional>
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

// recv(..., exact_size=True), upstream DLSlime's "the message fills the buffer": a shorter
// message fails the op (a longer one already fails with MESSAGE_TOO_LARGE). The check is
// made on the transport's result once its future is done, when the transport no longer
// owns the buffer, so reporting the failure never races with bytes still landing.
class RecvFuture : public Future {
 public:
  RecvFuture(Future f, std::optional<uint64_t> exact_size) : Future(std::move(f)), exact_size_(exact_size) {}

  Status result() const {
    Status s = Future::result();
    if (s.code() == StatusCode::kSuccess && exact_size_ && nbytes() != *exact_size_) {
      return Status::failed(fmt::format("recv(exact_size=True): the message has {} bytes, the buffer {}", nbytes(),
                                        *exact_size_));
    }
    return s;
  }

 private:
  std::optional<uint64_t> exact_size_;
};

// Until done the status is PENDING either way; afterwards the checked result's.
bool wait_done(const Future& f, std::optional<std::chrono::nanoseconds> timeout) {
  if (f.done()) return true;
  return wait_interruptibly(timeout, [&](std::chrono::nanoseconds d) { return f.wait_for(d).has_value(); });
}

int status_of(const RecvFuture& f) { return f.done() ? static_cast<int>(f.result().code()) : f.status(); }

// The per-op deadline argument of send/read/write: upstream's timeout_ms (an int of
// milliseconds, 0 = none). Validated here; the op's deadline is still the endpoint's
// op_timeout (default 30 s, upstream's default timeout_ms) until OpRequest can carry one
// (docs/upstream-compat.md, "Not yet").
void check_timeout_ms(py::handle timeout_ms) {
  if (!timeout_ms.is_none()) int_arg<uint32_t>(timeout_ms, "timeout_ms");
}

// `stream` (upstream's CUDA stream handle) is accepted by every op and unused: no
// transport here orders its ops against a device stream yet.
Future send_op(Endpoint& ep, py::handle chunk, py::handle /*stream*/, py::handle timeout_ms) {
  const Chunk c = to_chunk(chunk);
  check_timeout_ms(timeout_ms);
  ReleaseGil release;
  return ep.send(c);
}

RecvFuture recv_op(Endpoint& ep, py::handle chunk, py::handle /*stream*/, py::handle exact_size) {
  const Chunk c = to_chunk(chunk);
  const bool exact = bool_arg(exact_size, "exact_size");
  Future f;
  {
    ReleaseGil release;
    f = ep.recv(c);
  }
  return RecvFuture(std::move(f), exact ? std::optional<uint64_t>(c.length) : std::nullopt);
}

template <OpKind Kind>
Future one_sided_op(Endpoint& ep, py::handle assignments, py::handle /*stream*/, py::handle timeout_ms,
                    py::handle assign) {
  const char* call = Kind == OpKind::kRead ? "read" : "write";
  auto batch = to_assignments(renamed_arg(assignments, assign, call, "assignments", "assign"));
  check_timeout_ms(timeout_ms);
  ReleaseGil release;
  return Kind == OpKind::kRead ? ep.read(std::move(batch)) : ep.write(std::move(batch));
}

void def_send(py::class_<Endpoint, std::shared_ptr<Endpoint>>& cls, const char* name) {
  cls.def(name, &send_op, py::arg("chunk"), py::arg("stream") = py::none(), py::arg("timeout_ms") = py::none(),
          "Two-sided send of (addr, offset, length); FIFO-matched to the peer's recvs. stream is unused; "
          "timeout_ms: see docs/upstream-compat.md.");
}

void def_recv(py::class_<Endpoint, std::shared_ptr<Endpoint>>& cls, const char* name) {
  cls.def(name, &recv_op, py::arg("chunk"), py::arg("stream") = py::none(), py::arg("exact_size") = false,
          "Post a receive buffer (addr, offset, length); future.nbytes tells the message size. exact_size=True: "
          "a message shorter than the buffer fails the op.");
}

template <OpKind Kind>
void def_one_sided(py::class_<Endpoint, std::shared_ptr<Endpoint>>& cls, const char* name) {
  cls.def(name, &one_sided_op<Kind>, py::arg_v("assignments", missing_arg(), "<required>"),
          py::arg("stream") = py::none(), py::arg("timeout_ms") = py::none(), py::kw_only(),
          py::arg_v("assign", missing_arg(), "<unset>"),
          "A batch of (local_handle, remote_handle, target_offset, source_offset, length) items (or one); "
          "`assign` is upstream's name for `assignments`.");
}

}  // namespace

void bind_endpoint(py::module_& m) {
  // recv()'s future: a dlslime.Future that also applies recv(exact_size=True)'s check.
  // Upstream DLSlime's name for it is SlimeTcpRecvFuture (python/dlslime/__init__.py).
  py::class_<RecvFuture, Future>(m, "RecvFuture", "The future of a recv (a Future; see recv's exact_size).")
      .def(
          "wait",
          [](const RecvFuture& f) {
            wait_done(f, std::nullopt);
            return status_of(f);
          },
          "Block until done; return the status code (0 = success). Ctrl-C raises KeyboardInterrupt.")
      .def(
          "wait_for",
          [](const RecvFuture& f, py::handle seconds, py::handle timeout_seconds) -> std::optional<int> {
            py::handle s = renamed_arg(seconds, timeout_seconds, "wait_for", "seconds", "timeout_seconds");
            std::optional<std::chrono::nanoseconds> timeout;
            if (!s.is_none()) timeout = seconds_arg(s, "seconds");
            if (!wait_done(f, timeout)) return std::nullopt;
            return status_of(f);
          },
          py::arg_v("seconds", missing_arg(), "<required>"), py::kw_only(),
          py::arg_v("timeout_seconds", missing_arg(), "<unset>"),
          "Wait up to `seconds` (None or inf: no limit); None if still running, else the status code.")
      .def_property_readonly("status", &status_of)
      .def_property_readonly("message",
                             [](const RecvFuture& f) { return f.done() ? f.result().message() : f.message(); })
      .def("__repr__", [](const RecvFuture& f) {
        if (!f.done()) return std::string("<dlslime.RecvFuture running>");
        return "<dlslime.RecvFuture " + f.result().to_string() + ">";
      });

  // No constructor: an Endpoint is made by its transport's class or by make_endpoint().
  // Every call that can block on I/O or on transfers in flight runs without the GIL; the
  // arguments are converted before it is released. Upstream DLSlime's argument names and
  // positions are accepted too (docs/upstream-compat.md).
  py::class_<Endpoint, std::shared_ptr<Endpoint>> cls(
      m, "Endpoint", "What every transport's endpoint can do (docs/api.md, \"Endpoint base class\").");
  cls.def("endpoint_info", [](const Endpoint& ep) { return from_json(ep.endpoint_info(), "endpoint_info"); })
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
          [](Endpoint& ep, py::handle assignments, py::handle imm_data, py::handle /*stream*/, py::handle assign) {
            auto batch = to_assignments(renamed_arg(assignments, assign, "write_with_imm", "assignments", "assign"));
            const auto imm = int_arg<uint32_t>(imm_data, "imm_data");
            ReleaseGil release;
            return ep.write_with_imm(std::move(batch), imm);
          },
          py::arg_v("assignments", missing_arg(), "<required>"), py::arg("imm_data") = 0,
          py::arg("stream") = py::none(), py::kw_only(), py::arg_v("assign", missing_arg(), "<unset>"))
      .def(
          "imm_recv", [](Endpoint& ep, py::handle /*stream*/) { return ep.imm_recv(); },
          py::arg("stream") = py::none())
      .def("capabilities", [](const Endpoint& ep) { return capabilities_dict(ep.capabilities()); })
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
