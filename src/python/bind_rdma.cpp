// dlslime.RDMAEndpoint, RDMAContext, RDMAMemoryPool and available_nic(): the RDMA
// transport's constructors, options and device list. Everything else RDMAEndpoint inherits
// from dlslime.Endpoint, and RDMAMemoryPool from dlslime.MemoryPool (bind_endpoint.cpp).
// Compiled only with BUILD_RDMA.
//
// Upstream DLSlime's three constructor forms are taken (docs/upstream-compat.md):
//   RDMAEndpoint(pool, num_qp=1, worker=None)       on a pool: the pool's regions and device
//   RDMAEndpoint(context, num_qp=1, worker=None)    a new pool of its own on the context
//   RDMAEndpoint(device_name="", ib_port=1, link_type="auto", num_qp=1, worker=None)
// The first two share the pool's regions (get_pool() returns it); the last has its own,
// as TcpEndpoint without pool= (get_pool() is None).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <pybind11/stl.h>

#include "bindings.h"
#include "convert.h"
#include "core/memory_registry.h"
#include "core/transport_registry.h"
#include "dlslime/errors.h"
#include "dlslime/rdma_endpoint.h"
#include "dlslime/transport.h"
#include "gil.h"
#include "rdma/verbs.h"

namespace py = pybind11;

namespace dlslime::py_bind {

namespace {

std::vector<std::string> rdma_devices() {
  // The registry's probe: the selected provider's devices, filtered by SLIME_VISIBLE_DEVICES.
  for (const TransportInfo& t : available_transports()) {
    if (t.name == "rdma") return t.devices;
  }
  return {};
}

// Upstream's RDMAContext: which device, port and link layer the endpoints of its pools
// use. Each RDMAEndpoint opens the device itself (its own protection domain and MRs for
// the pool's regions), so the context holds the choice, checked at init, not a device.
// Only touched with the GIL held.
struct RdmaContextView {
  std::string device_name;  // "" (init("")): the first device with an active port
  int64_t ib_port = 1;
  std::string link_type = "auto";
  bool initialized = false;
  bool closed = false;

  std::string describe() const {
    return fmt::format("{}:{}", device_name.empty() ? std::string("(first active device)") : device_name, ib_port);
  }

  // Checks the device exists (NotFoundError, as RDMAEndpoint raises), the options are
  // valid (InvalidArgumentError), and the port is an active port of the device (ValueError
  // naming the active ones). A port of another link layer is found when an endpoint opens
  // it (ConnectionError).
  void init(const std::string& name, int64_t port, const std::string& link) {
    if (closed) throw py::value_error(fmt::format("RDMAContext {} is closed", describe()));
    nlohmann::json o = {{"device_name", name}, {"ib_port", port}, {"link_type", link}};
    RdmaOptions::from_json(o);  // validates ib_port and link_type
    if (initialized && (name != device_name || port != ib_port || link != link_type)) {
      throw py::value_error(fmt::format("RDMAContext is already initialised for {} ({}); make another context for {}:{}",
                                        describe(), link_type, name.empty() ? "(first active device)" : name, port));
    }
    const auto devices = rdma_devices();
    if (devices.empty()) {  // the error RDMAEndpoint raises without a device
      throw ConnectionError("RDMAContext.init: no RDMA device is available here (DLSLIME_RDMA_SIM=1 selects the "
                            "simulated device)");
    }
    if (!name.empty() && std::find(devices.begin(), devices.end(), name) == devices.end()) {
      throw NotFoundError(fmt::format("RDMAContext.init: no RDMA device named '{}' (available: {})", name,
                                      fmt::join(devices, ", ")));
    }
    // No name: the first device with that port active, as an endpoint picks it.
    std::vector<std::string> active;
    bool found = false;
    for (const TransportPort& p : TransportRegistry::instance().ports("rdma")) {
      if (!name.empty() && p.device != name) continue;
      active.push_back(fmt::format("{}:{}", p.device, p.port));
      found = found || p.port == port;
    }
    if (!found) {
      throw py::value_error(fmt::format("RDMAContext.init: ib_port={} is not an active port of {} (active ports: {})",
                                        port, name.empty() ? "any RDMA device" : name,
                                        active.empty() ? "none" : fmt::format("{}", fmt::join(active, ", "))));
    }
    device_name = name;
    ib_port = port;
    link_type = link;
    initialized = true;
  }

  // What a pool or an endpoint needs of its context.
  void check_usable(const char* what) const {
    if (closed) throw py::value_error(fmt::format("{}: RDMAContext {} is closed", what, describe()));
    if (!initialized) {
      throw py::value_error(fmt::format("{}: the RDMAContext is not initialised (call init(device_name, ib_port, "
                                        "link_type) first)",
                                        what));
    }
  }

  nlohmann::json options() const {
    return {{"device_name", device_name}, {"ib_port", ib_port}, {"link_type", link_type}};
  }
};

// register_dmabuf_memory_region(fd, offset, length, iova, name=None): upstream DLSlime
// 0.1.23's RDMAMemoryPool signature, on the pool and on RDMAEndpoint.
constexpr const char* kDmabufDoc =
    "Registers [offset, +length) of the dma-buf fd (borrowed for the call) as a region addressed at iova, which "
    "must be the GPU address of that byte in this process (the pointer it was exported from); name=None names it "
    "by iova ('0x...'). Returns its handle. GPU memory registers for RDMA by dma-buf or peer memory "
    "(docs/rdma.md, 'GPU memory'); ValueError for a bad fd, range or an iova that is not GPU memory.";

struct DmabufArgs {
  int fd = -1;
  uint64_t offset = 0, length = 0, iova = 0;
  std::string name;
};

DmabufArgs dmabuf_args(py::handle fd, py::handle offset, py::handle length, py::handle iova, py::handle name) {
  DmabufArgs a;
  a.fd = int_arg<int>(fd, "fd", 0);
  a.offset = int_arg<uint64_t>(offset, "offset");
  a.length = int_arg<uint64_t>(length, "length", 1);
  a.iova = int_arg<uint64_t>(iova, "iova");
  a.name = name.is_none() ? fmt::format("{:#x}", a.iova) : str_arg(name, "name");
  if (a.name.empty()) throw InvalidArgumentError("register_dmabuf_memory_region: name must not be empty");
  return a;
}

// RDMAMemoryPool: a MemoryPool bound to one context.
struct RdmaPoolView final : MemoryPoolView {
  explicit RdmaPoolView(std::shared_ptr<RdmaContextView> ctx) : context(std::move(ctx)) {}
  const std::shared_ptr<RdmaContextView> context;
};

std::shared_ptr<RdmaContextView> context_arg(py::handle v, const char* what) {
  if (!py::isinstance<RdmaContextView>(v)) {
    throw py::type_error(fmt::format("{} must be a dlslime.RDMAContext, not {}", what, Py_TYPE(v.ptr())->tp_name));
  }
  return v.cast<std::shared_ptr<RdmaContextView>>();
}

std::shared_ptr<RdmaPoolView> rdma_pool_arg(py::handle v) {
  if (!py::isinstance<RdmaPoolView>(v)) {
    throw py::type_error(fmt::format("pool must be a dlslime.RDMAMemoryPool (made on an RDMAContext), not {}",
                                     Py_TYPE(v.ptr())->tp_name));
  }
  return v.cast<std::shared_ptr<RdmaPoolView>>();
}

// The constructor's arguments, upstream's way: each parameter by position or by keyword,
// not both. Keywords left in `kwargs` afterwards are RdmaOptions' keys.
class Params {
 public:
  Params(py::tuple args, const py::dict& kwargs, std::vector<const char*> names)
      : args_(std::move(args)), kwargs_(py::dict(kwargs)), names_(std::move(names)) {
    if (args_.size() > names_.size()) {
      throw py::type_error(fmt::format("RDMAEndpoint() takes at most {} positional arguments in this form ({}), "
                                       "{} given",
                                       names_.size(), fmt::join(names_, ", "), args_.size()));
    }
  }
  // The parameter's value, or `fallback` when it is not given.
  py::object take(size_t index, py::object fallback) {
    const char* name = names_[index];
    const bool by_keyword = kwargs_.contains(name);
    if (index < args_.size()) {
      if (by_keyword) throw py::type_error(fmt::format("RDMAEndpoint() got multiple values for argument '{}'", name));
      return args_[index];
    }
    if (by_keyword) {
      py::object v = kwargs_[name];
      PyDict_DelItemString(kwargs_.ptr(), name);
      return v;
    }
    return fallback;
  }
  // The keywords not taken, with `refused` ones (which this form does not take) rejected.
  const py::dict& rest(std::initializer_list<const char*> refused, const char* why) const {
    for (const char* name : refused) {
      if (kwargs_.contains(name)) throw py::type_error(fmt::format("RDMAEndpoint(): '{}' {}", name, why));
    }
    return kwargs_;
  }

 private:
  py::tuple args_;
  py::dict kwargs_;
  std::vector<const char*> names_;
};

void check_worker(py::handle worker) {
  if (!worker.is_none()) {
    throw py::type_error(
        "RDMAEndpoint(worker=...): this package has no RDMAWorker (each endpoint runs its own completion "
        "thread); pass None");
  }
}

std::shared_ptr<RDMAEndpoint> make_rdma_endpoint(const py::args& args, const py::kwargs& kwargs) {
  py::object first = args.empty() ? py::object(py::none()) : py::reinterpret_borrow<py::object>(args[0]);
  const bool on_pool_or_context = py::isinstance<MemoryPoolView>(first) || py::isinstance<RdmaContextView>(first) ||
                                  kwargs.contains("pool") || kwargs.contains("context");
  std::shared_ptr<RdmaPoolView> pool;
  py::object num_qp;
  py::dict rest;
  if (on_pool_or_context) {
    // RDMAEndpoint(pool | context, num_qp=1, worker=None, *, pool=, context=, **options)
    const bool first_is_context = py::isinstance<RdmaContextView>(first);
    Params p(args, kwargs, {first_is_context ? "context" : "pool", "num_qp", "worker"});
    py::object given = p.take(0, py::none());
    num_qp = p.take(1, py::int_(1));
    check_worker(p.take(2, py::none()));
    Params others(py::tuple(), p.rest({}, ""), {first_is_context ? "pool" : "context"});
    py::object other = others.take(0, py::none());
    py::object pool_obj = first_is_context ? other : given;
    py::object context_obj = first_is_context ? given : other;
    rest = py::dict(others.rest({"device_name", "ib_port", "link_type"},
                                "comes from the pool's or context's RDMAContext in this form"));
    if (pool_obj.is_none() && context_obj.is_none()) {
      throw py::type_error("RDMAEndpoint(): pool and context are None; give one of them, or a device_name");
    }
    std::shared_ptr<RdmaContextView> ctx;
    if (!context_obj.is_none()) ctx = context_arg(context_obj, "context");
    if (!pool_obj.is_none()) {
      pool = rdma_pool_arg(pool_obj);
      if (ctx && ctx != pool->context) {
        throw py::value_error(fmt::format("RDMAEndpoint(pool=..., context=...): the pool belongs to RDMAContext {}, "
                                          "not to the context given ({})",
                                          pool->context->describe(), ctx->describe()));
      }
      pool->context->check_usable("RDMAEndpoint(pool=...)");
    } else {
      ctx->check_usable("RDMAEndpoint(context=...)");
      pool = std::make_shared<RdmaPoolView>(ctx);  // upstream: a new private pool on the context
    }
  } else {
    // RDMAEndpoint(device_name="", ib_port=1, link_type="auto", num_qp=1, worker=None, **options)
    Params p(args, kwargs, {"device_name", "ib_port", "link_type", "num_qp", "worker"});
    const std::string device = str_arg(p.take(0, py::str("")), "device_name");
    const auto port = int_arg<int64_t>(p.take(1, py::int_(1)), "ib_port");
    const std::string link = str_arg(p.take(2, py::str("auto")), "link_type");
    num_qp = p.take(3, py::int_(1));
    check_worker(p.take(4, py::none()));
    rest = py::dict(p.rest({}, ""));
    // Its own regions, as before pools existed (get_pool() is None); opening the device
    // reports a missing or unknown one, a port that is down or of another link layer.
    nlohmann::json options = rest.empty() ? nlohmann::json::object() : to_json(rest, "options");
    options["device_name"] = device;
    options["ib_port"] = port;
    options["link_type"] = link;
    options["num_qp"] = int_arg<int64_t>(num_qp, "num_qp");
    return make_without_gil<RDMAEndpoint>(RdmaOptions::from_json(options));
  }
  // The rest are RdmaOptions' keys; RdmaOptions::from_json (in the factory) rejects unknown ones.
  nlohmann::json options = rest.empty() ? nlohmann::json::object() : to_json(rest, "options");
  const nlohmann::json device = pool->context->options();
  for (const auto& [key, value] : device.items()) options[key] = value;
  options["num_qp"] = int_arg<int64_t>(num_qp, "num_qp");
  return std::static_pointer_cast<RDMAEndpoint>(make_endpoint_on_pool("rdma", options, pool));
}

}  // namespace

void bind_rdma(py::module_& m) {
  py::class_<RdmaContextView, std::shared_ptr<RdmaContextView>>(
      m, "RDMAContext",
      "Upstream DLSlime's device handle: the device, port and link layer that the endpoints of its "
      "RDMAMemoryPools use. RDMAContext() then init(device_name, ib_port=1, link_type='auto'), or "
      "RDMAContext(device_name, ...) in one step. See docs/rdma.md.")
      .def(py::init([](py::handle device_name, py::handle ib_port, py::handle link_type) {
             auto ctx = std::make_shared<RdmaContextView>();
             if (!device_name.is_none()) {
               ctx->init(str_arg(device_name, "device_name"), int_arg<int64_t>(ib_port, "ib_port"),
                         str_arg(link_type, "link_type"));
             }
             return ctx;
           }),
           py::arg("device_name") = py::none(), py::arg("ib_port") = 1, py::arg("link_type") = "auto")
      .def(
          "init",
          [](RdmaContextView& ctx, py::handle device_name, py::handle ib_port, py::handle link_type) {
            ctx.init(str_arg(device_name, "device_name"), int_arg<int64_t>(ib_port, "ib_port"),
                     str_arg(link_type, "link_type"));
            return 0;
          },
          py::arg("device_name"), py::arg("ib_port") = 1, py::arg("link_type") = "auto",
          "Chooses the device (\"\": the first with an active port), port and link layer ('auto', 'RoCE', "
          "'IB'); returns 0. KeyError for an unknown device, ValueError for a bad port or link type, "
          "ConnectionError where there is no RDMA device.")
      .def(
          "launch_future", [](const RdmaContextView&) {},
          "Accepted for upstream scripts; nothing to start: each endpoint runs its own completion thread.")
      .def(
          "close", [](RdmaContextView& ctx) { ctx.closed = true; },
          "No new pool or endpoint may use this context (ValueError); endpoints already made keep working.")
      .def(
          "stop_future", [](RdmaContextView& ctx) { ctx.closed = true; }, "Upstream's name for close().")
      .def_property_readonly("device_name", [](const RdmaContextView& ctx) { return ctx.device_name; })
      .def_property_readonly("ib_port", [](const RdmaContextView& ctx) { return ctx.ib_port; })
      .def_property_readonly("link_type", [](const RdmaContextView& ctx) { return ctx.link_type; })
      .def_property_readonly("closed", [](const RdmaContextView& ctx) { return ctx.closed; })
      .def("__repr__", [](const RdmaContextView& ctx) {
        return fmt::format("<dlslime.RDMAContext {}{}>", ctx.initialized ? ctx.describe() : "(not initialised)",
                           ctx.closed ? " closed" : "");
      });

  py::class_<RdmaPoolView, MemoryPoolView, std::shared_ptr<RdmaPoolView>>(
      m, "RDMAMemoryPool",
      "A MemoryPool on one RDMAContext: RDMAEndpoint(pool=...) endpoints share its regions (each registers "
      "them as MRs of its own protection domain, so rkeys come from endpoint.endpoint_info()).")
      .def(py::init([](py::handle context) {
             auto ctx = context_arg(context, "context");
             ctx->check_usable("RDMAMemoryPool(context)");
             return std::make_shared<RdmaPoolView>(std::move(ctx));
           }),
           py::arg("context"))
      .def_property_readonly("context", [](const RdmaPoolView& pool) { return pool.context; })
      .def(
          "register_dmabuf_memory_region",
          [](RdmaPoolView& pool, py::handle fd, py::handle offset, py::handle length, py::handle iova,
             py::handle name) {
            const DmabufArgs a = dmabuf_args(fd, offset, length, iova, name);
            ReleaseGil release;  // replacing a name waits for the old region's transfers
            return RDMAEndpoint::add_dmabuf_region(*pool.registry(), a.name, a.fd, a.offset, a.length, a.iova);
          },
          py::arg("fd"), py::arg("offset"), py::arg("length"), py::arg("iova"), py::arg("name") = py::none(),
          kDmabufDoc)
      .def("__repr__", [](const RdmaPoolView& pool) {
        return fmt::format("<dlslime.RDMAMemoryPool {} {} regions>", pool.context->describe(), pool.registry()->size());
      });

  py::class_<RDMAEndpoint, Endpoint, std::shared_ptr<RDMAEndpoint>>(
      m, "RDMAEndpoint", "Peer-to-peer transfers over RDMA RC queue pairs. See docs/rdma.md.")
      .def(py::init(&make_rdma_endpoint),
           "RDMAEndpoint(device_name='', ib_port=1, link_type='auto', num_qp=1, worker=None, **options), "
           "RDMAEndpoint(pool: RDMAMemoryPool, num_qp=1, worker=None, **options) or "
           "RDMAEndpoint(context: RDMAContext, num_qp=1, worker=None, **options). The other keywords are "
           "RdmaOptions' keys (docs/rdma.md); worker must be None.")
      .def_property_readonly("options",
                             [](const RDMAEndpoint& ep) { return from_json(ep.options().to_json(), "options"); })
      .def(
          "register_dmabuf_memory_region",
          [](RDMAEndpoint& ep, py::handle fd, py::handle offset, py::handle length, py::handle iova, py::handle name) {
            const DmabufArgs a = dmabuf_args(fd, offset, length, iova, name);
            ReleaseGil release;
            return ep.register_dmabuf_memory_region(a.name, a.fd, a.offset, a.length, a.iova);
          },
          py::arg("fd"), py::arg("offset"), py::arg("length"), py::arg("iova"), py::arg("name") = py::none(),
          kDmabufDoc)
      .def("__repr__", [](const RDMAEndpoint& ep) {
        return fmt::format("<dlslime.RDMAEndpoint {} num_qp={}{}>", ep.options().device_name.empty()
                                                                         ? std::string("(first active device)")
                                                                         : ep.options().device_name,
                           ep.options().num_qp, ep.is_connected() ? " connected" : "");
      });

  m.def(
      "available_nic", [] { return rdma_devices(); },
      "Names of the RDMA devices this process may use (SLIME_VISIBLE_DEVICES respected).");

  m.def(
      "_sim_rdma_objects",
      [] {
        const rdma::SimObjectCounts c = rdma::sim_object_counts();
        py::dict d;
        d["contexts"] = c.contexts;
        d["pds"] = c.pds;
        d["mrs"] = c.mrs;
        d["cqs"] = c.cqs;
        d["qps"] = c.qps;
        d["comp_channels"] = c.comp_channels;
        d["destroy_failures"] = c.destroy_failures;
        d["cqes"] = c.cqes;
        d["recv_wrs"] = c.recv_wrs;
        d["fork_init"] = c.fork_init;
        return d;
      },
      "The simulated RDMA device's live objects and refused destroys (dlslime.testing.sim_rdma_objects).");
}

}  // namespace dlslime::py_bind
