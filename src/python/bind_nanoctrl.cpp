// NanoCtrl in Python: the embedded server, the client, and the `nanoctrl` command line.
#include <pybind11/stl.h>

#include <nlohmann/json.hpp>

#include "bindings.h"
#include "dlslime/errors.h"
#include "dlslime/nanoctrl.h"
#include "dlslime/nanoctrl_client.h"
#include "convert.h"
#include "gil.h"

namespace py = pybind11;

namespace dlslime::py_bind {

namespace {

using nlohmann::json;
using ms = std::chrono::milliseconds;

constexpr const char* kReply = "NanoCtrl's reply";
// One long-poll request of recv() on the main thread: how soon Ctrl-C is seen, against one
// request per slice while nothing arrives.
constexpr std::chrono::milliseconds kRecvSlice{250};

py::object optional_json(const std::optional<json>& j) { return j ? from_json(*j, kReply) : py::none(); }

// Runs `fn` without the GIL and converts its JSON result with it.
template <typename F>
py::object nogil_json(F&& fn) {
  json out;
  {
    ReleaseGil release;
    out = fn();
  }
  return from_json(out, kReply);
}

template <typename F>
py::object nogil_optional(F&& fn) {
  std::optional<json> out;
  {
    ReleaseGil release;
    out = fn();
  }
  return optional_json(out);
}

}  // namespace

void bind_nanoctrl(py::module_& m) {
  py::class_<NanoCtrlServer>(m, "NanoCtrlServer",
                             "The NanoCtrl control plane, embedded in this process (docs/control-plane.md).")
      .def(py::init([](py::handle host, py::handle port, py::handle redis_url, py::handle ttl,
                       py::handle key_prefix, py::handle max_body, py::handle max_threads, py::handle max_waiters,
                       py::handle max_wait, py::handle mailbox_max, py::handle mailbox_ttl, py::handle keep_alive,
                       py::handle redis_timeout, py::handle token, py::handle advertise_host,
                       py::handle advertise_interface) {
             NanoCtrlConfig c;
             c.host = str_arg(host, "host");
             c.port = int_arg<uint16_t>(port, "port");
             c.redis_url = optional_str_arg(redis_url, "redis_url");
             c.ttl = millis_arg(ttl, "ttl");
             c.key_prefix = str_arg(key_prefix, "key_prefix");
             c.max_body_bytes = int_arg<std::size_t>(max_body, "max_body");
             c.max_threads = int_arg<uint32_t>(max_threads, "max_threads");
             c.max_waiters = int_arg<uint32_t>(max_waiters, "max_waiters");
             c.max_wait = millis_arg(max_wait, "max_wait");
             c.mailbox_max_messages = int_arg<uint32_t>(mailbox_max, "mailbox_max");
             c.mailbox_ttl = millis_arg(mailbox_ttl, "mailbox_ttl");
             c.keep_alive_timeout = millis_arg(keep_alive, "keep_alive");
             c.redis_timeout = millis_arg(redis_timeout, "redis_timeout");
             c.token = optional_str_arg(token, "token");
             c.advertise_host = optional_str_arg(advertise_host, "advertise_host");
             c.advertise_interface = optional_str_arg(advertise_interface, "advertise_interface");
             return std::make_unique<NanoCtrlServer>(c);
           }),
           py::arg("host") = "127.0.0.1", py::arg("port") = 4479, py::arg("redis_url") = py::none(),
           py::arg("ttl") = 60.0, py::arg("key_prefix") = "nanoctrl:", py::arg("max_body") = 1 << 20,
           py::arg("max_threads") = 1024, py::arg("max_waiters") = 0, py::arg("max_wait") = 60.0,
           py::arg("mailbox_max") = 4096, py::arg("mailbox_ttl") = 600.0, py::arg("keep_alive") = 5.0,
           py::arg("redis_timeout") = 2.0, py::arg("token") = py::none(), py::arg("advertise_host") = py::none(),
           py::arg("advertise_interface") = py::none(),
           "token: when set, every request but GET /healthz must carry 'Authorization: Bearer <token>' "
           "(others get 401); None or '' = no authentication.")
      .def("start", &NanoCtrlServer::start, py::call_guard<ReleaseGil>(),
           "Connect the store and start serving; returns once requests are accepted.")
      .def("stop", &NanoCtrlServer::stop, py::call_guard<ReleaseGil>(), "Stop serving (idempotent).")
      .def_property_readonly("url", &NanoCtrlServer::url, "The URL for clients on this host.")
      .def_property_readonly("advertised_url", &NanoCtrlServer::advertised_url,
                             "The URL for clients on other hosts (docs/deploy.md).")
      .def_property_readonly("port", &NanoCtrlServer::port)
      .def_property_readonly("running", &NanoCtrlServer::running)
      .def_property_readonly("config",
                             [](const NanoCtrlServer& s) { return from_json(s.config().to_json(), "config"); })
      .def("__enter__",
           [](NanoCtrlServer& s) -> NanoCtrlServer& {
             ReleaseGil release;
             if (!s.running()) s.start();
             return s;
           })
      .def("__exit__", [](NanoCtrlServer& s, py::args) {
        ReleaseGil release;
        s.stop();
      });

  py::class_<NanoCtrlClient>(m, "NanoCtrlClient",
                             "HTTP client of NanoCtrl. Errors: ValueError (400), PermissionError (401: missing or "
                             "wrong token), KeyError (404), ConnectionError (unreachable or 503), TimeoutError, "
                             "RuntimeError (409, 429, other).")
      .def(py::init([](py::handle url, py::handle scope, py::handle timeout, py::handle token) {
             return std::make_unique<NanoCtrlClient>(str_arg(url, "url"), optional_str_arg(scope, "scope"),
                                                     millis_arg(timeout, "timeout"), optional_str_arg(token, "token"));
           }),
           py::arg("url") = "http://127.0.0.1:4479", py::arg("scope") = py::none(), py::arg("timeout") = 10.0,
           py::arg("token") = py::none(),
           "token: the server's bearer token, sent with every request; None or '' = the environment "
           "variable DLSLIME_NANOCTRL_TOKEN, no token when that is unset.")
      .def_property_readonly("url", &NanoCtrlClient::url)
      .def_property_readonly("scope", &NanoCtrlClient::scope)
      .def_property_readonly("has_token", &NanoCtrlClient::has_token)
      .def("healthz", [](NanoCtrlClient& c) { return nogil_json([&] { return c.healthz(); }); })
      .def(
          "start_peer_agent",
          [](NanoCtrlClient& c, std::optional<std::string> alias, py::kwargs fields) {
            json body = to_json(fields, "start_peer_agent fields");
            if (alias) body["alias"] = *alias;
            return nogil_json([&] { return c.start_peer_agent(body); });
          },
          py::arg("alias") = py::none(),
          "Register an agent; other keyword fields (address, device, ib_port, link_type, resource, metadata, "
          "endpoint_info, name_prefix) go into its record. Returns the reply with `name`.")
      .def("heartbeat", &NanoCtrlClient::heartbeat, py::arg("entity_id"), py::arg("entity_type") = "agent",
           py::call_guard<ReleaseGil>())
      .def("query", [](NanoCtrlClient& c) { return nogil_json([&] { return c.query(); }); })
      .def(
          "get_peer_agent",
          [](NanoCtrlClient& c, const std::string& name) { return nogil_optional([&] { return c.get_peer_agent(name); }); },
          py::arg("name"))
      .def(
          "cleanup",
          [](NanoCtrlClient& c, const std::string& name) { return nogil_json([&] { return c.cleanup(name); }); },
          py::arg("agent_name"))
      .def(
          "set_desired_topology",
          [](NanoCtrlClient& c, const std::string& agent, py::handle target_peers, py::handle symmetric,
             py::handle min_bw) {
            const auto targets = str_list_arg(target_peers, "target_peers");
            const bool sym = bool_arg(symmetric, "symmetric");
            std::optional<double> bw;
            if (!min_bw.is_none()) {
              if (!PyFloat_Check(min_bw.ptr()) && !PyLong_Check(min_bw.ptr())) {
                throw py::type_error("min_bw must be a number or None");
              }
              bw = min_bw.cast<double>();
            }
            return nogil_json([&] { return c.set_desired_topology(agent, targets, sym, bw); });
          },
          py::arg("agent"), py::arg("target_peers"), py::arg("symmetric") = false, py::arg("min_bw") = py::none())
      .def(
          "get_desired_topology",
          [](NanoCtrlClient& c, const std::string& agent) {
            return nogil_optional([&] { return c.get_desired_topology(agent); });
          },
          py::arg("agent"))
      .def(
          "register_mr",
          [](NanoCtrlClient& c, const std::string& agent, const std::string& mr, py::handle info) {
            json j = to_json(info, "mr_info");
            ReleaseGil release;
            c.register_mr(agent, mr, j);
          },
          py::arg("agent_name"), py::arg("mr_name"), py::arg("mr_info"))
      .def(
          "get_mr_info",
          [](NanoCtrlClient& c, const std::string& owner, const std::string& mr) {
            return nogil_optional([&] { return c.get_mr_info(owner, mr); });
          },
          py::arg("owner"), py::arg("mr_name"))
      .def("unregister_mr", &NanoCtrlClient::unregister_mr, py::arg("agent_name"), py::arg("mr_name"),
           py::call_guard<ReleaseGil>())
      .def(
          "register",
          [](NanoCtrlClient& c, const std::string& entity_id, const std::string& kind, const std::string& type,
             py::object endpoint, py::object metadata, py::object resource) {
            json extra = json::object();
            // A str ("host:port") or a dict (upstream DLSlime's form); the server checks it.
            if (!endpoint.is_none()) {
              if (!py::isinstance<py::str>(endpoint) && !py::isinstance<py::dict>(endpoint)) {
                throw py::type_error("endpoint must be a str, a dict or None");
              }
              extra["endpoint"] = to_json(endpoint, "endpoint");
            }
            if (!metadata.is_none()) extra["metadata"] = to_json(metadata, "metadata");
            if (!resource.is_none()) extra["resource"] = to_json(resource, "resource");
            return nogil_json([&] { return c.register_entity(entity_id, kind, type, extra); });
          },
          py::arg("entity_id"), py::arg("kind") = "", py::arg("entity_type") = "service",
          py::arg("endpoint") = py::none(), py::arg("metadata") = py::none(), py::arg("resource") = py::none())
      .def("unregister", &NanoCtrlClient::unregister_entity, py::arg("entity_id"), py::arg("entity_type") = "service",
           py::call_guard<ReleaseGil>())
      .def(
          "get_entity_info",
          [](NanoCtrlClient& c, const std::string& id, const std::string& type) {
            return nogil_optional([&] { return c.get_entity_info(id, type); });
          },
          py::arg("entity_id"), py::arg("entity_type") = "service")
      .def(
          "list_entities",
          [](NanoCtrlClient& c, std::optional<std::string> type, std::optional<std::string> kind) {
            return nogil_json([&] { return c.list_entities(type.value_or(""), kind.value_or("")); });
          },
          py::arg("entity_type") = py::none(), py::arg("kind") = py::none())
      .def(
          "post",
          [](NanoCtrlClient& c, const std::string& to, py::handle message, std::optional<std::string> sender) {
            json j = to_json(message, "message");
            ReleaseGil release;
            return c.post(to, j, sender.value_or(""));
          },
          py::arg("to"), py::arg("message"), py::arg("sender") = py::none(),
          "Queue `message` (any JSON value) in the mailbox of agent `to`; returns the queue depth.")
      .def(
          "recv",
          [](NanoCtrlClient& c, const std::string& alias, py::handle timeout, py::handle max_messages) {
            const auto total = seconds_arg(timeout, "timeout");
            const auto most = int_arg<uint32_t>(max_messages, "max_messages");
            // A long poll in slices of kRecvSlice, so that Ctrl-C interrupts it (gil.h).
            std::vector<json> got;
            wait_interruptibly(
                total,
                [&](std::chrono::nanoseconds d) {
                  got = c.recv(alias, std::chrono::ceil<ms>(d), most);
                  return !got.empty();
                },
                kRecvSlice);
            py::list out;
            for (const auto& m : got) out.append(from_json(m, kReply));
            return out;
          },
          py::arg("alias"), py::arg("timeout") = 0.0, py::arg("max_messages") = 1,
          "Wait up to `timeout` seconds for messages to `alias`; each is {'from', 'message', 'ts_ms'}.")
      .def(
          "call",
          [](NanoCtrlClient& c, const std::string& path, py::object body) {
            json j = body.is_none() ? json::object() : to_json(body, "body");
            return nogil_json([&] { return c.call(path, j); });
          },
          py::arg("path"), py::arg("body") = py::none(), "POST `body` to any route; returns the reply.");

  m.def(
      "_nanoctrl_main",
      [](const std::vector<std::string>& args, const std::vector<std::string>& self_command) {
        ReleaseGil release;
        return nanoctrl_main(args, self_command);
      },
      py::arg("args"), py::arg("self_command"));
}

}  // namespace dlslime::py_bind
