#include <fcntl.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <regex>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "core/advertise_address.h"
#include "core/log.h"
#include "dlslime/errors.h"
#include "dlslime/nanoctrl.h"
#include "dlslime/version.h"
#include "nanoctrl/auth.h"
#include "nanoctrl/connection_gate.h"
#include "nanoctrl/control_service.h"
#include "nanoctrl/memory_store.h"
#include "nanoctrl/metrics.h"
#include "nanoctrl/redis_store.h"
#include "nanoctrl/request.h"

namespace dlslime {

using nlohmann::json;
using nanoctrl::ApiError;
using nanoctrl::ConnectionGate;
using nanoctrl::parse_body;
using nanoctrl::StoreUnavailable;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_body(const std::string& message) { return {{"status", "error"}, {"message", message}}; }

// httplib hands each accepted socket to its task queue; this server passes it on to the
// ConnectionGate (which reads requests off the workers) and serves one complete request at
// a time on a gate worker.
class GatedHttpServer final : public httplib::Server {
 public:
  void set_gate(ConnectionGate* gate) { gate_ = gate; }
  // Serves the request at the head of `strm`; true if the connection may carry another.
  bool serve_one(httplib::Stream& strm) {
    bool closed = false;
    bool ok = process_request(strm, /*close_connection=*/false, closed, nullptr);
    return ok && !closed;
  }

 private:
  bool process_and_close_socket(socket_t sock) override {
    gate_->add(sock);
    return true;
  }
  ConnectionGate* gate_ = nullptr;
};

// httplib's accept loop enqueues one task per socket; run it at once (it only hands the
// socket to the gate).
class InlineTaskQueue final : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

bool has_body(const httplib::Request& req) {
  return req.has_header("Transfer-Encoding") || req.get_header_value<uint64_t>("Content-Length") > 0;
}

}  // namespace

class NanoCtrlServerImpl {
 public:
  explicit NanoCtrlServerImpl(NanoCtrlConfig config) : config_(std::move(config)), auth_(validated(config_).token) {
    if (config_.max_waiters == 0) config_.max_waiters = config_.max_threads / 2;
  }

  ~NanoCtrlServerImpl() { stop(); }

  void start();
  void stop();
  void wait();
  bool running() const { return running_; }
  uint16_t port() const { return port_; }
  std::string url() const { return url_of(is_wildcard_address(config_.host) ? "127.0.0.1" : config_.host); }
  std::string advertised_url() const { return url_of(advertised_host_); }
  const NanoCtrlConfig& config() const { return config_; }

 private:
  std::string url_of(const std::string& host) const {
    const bool v6 = host.find(':') != std::string::npos;  // an IPv6 literal goes in brackets
    return fmt::format("http://{}{}{}:{}", v6 ? "[" : "", host, v6 ? "]" : "", port_);
  }
  using Handler = std::function<json(const json&, const httplib::Request&)>;

  void install_routes();
  void add(const char* method, const std::string& pattern, const std::string& route, Handler fn);
  void respond(const std::string& route, const httplib::Request& req, const std::string& body,
               httplib::Response& res, const Handler& fn);
  void fallback(const httplib::Request& req, httplib::Response& res);
  // Runs once a request's headers are read, before any of its body: authentication and the
  // body limits. Returns true when it has answered the request.
  bool before_body(const httplib::Request& req, httplib::Response& res);
  // Reads a POST body of at most body_limit() bytes (chunked included); false after
  // answering 413 or 400.
  bool read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                 std::string& body);
  std::size_t body_limit(const httplib::Request& req) const;
  // The route template a path belongs to (for metrics), or "(unrouted)".
  std::string route_of(const std::string& path) const;
  static const NanoCtrlConfig& validated(const NanoCtrlConfig& c) {
    c.validate();
    return c;
  }
  bool authorized(const std::string& route, const httplib::Request& req, httplib::Response& res);
  json mailbox_recv(const json& body);
  void healthz(httplib::Response& res);
  void metrics(httplib::Response& res);

  NanoCtrlConfig config_;
  const nanoctrl::BearerAuth auth_;
  std::unique_ptr<nanoctrl::Store> store_;
  std::unique_ptr<nanoctrl::ControlService> service_;
  std::unique_ptr<GatedHttpServer> http_;
  std::unique_ptr<ConnectionGate> gate_;
  nanoctrl::Metrics metrics_;
  // Known paths with their methods and route templates, for 405 replies and metrics.
  struct KnownRoute {
    std::regex pattern;
    std::string method;
    std::string route;
  };
  std::vector<KnownRoute> known_;
  std::thread listener_;
  std::atomic<bool> running_{false};
  std::atomic<bool> started_{false};
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  std::chrono::steady_clock::time_point started_at_;
  std::mutex stop_mu_;
  std::condition_variable stopped_cv_;
  bool stopped_ = false;
  std::string advertised_host_;  // set by start() (core/advertise_address.h)
};

void NanoCtrlServerImpl::start() {
  if (started_.exchange(true)) throw Error(StatusCode::kFailed, "NanoCtrl server already started");
  // First: a missing advertise interface is the caller's error, before anything is bound.
  advertised_host_ = choose_advertise_address(config_.host, config_.advertise_host, config_.advertise_interface,
                                              "NanoCtrl option advertise_interface")
                         .host;
  if (config_.redis_url.empty()) {
    store_ = std::make_unique<nanoctrl::MemoryStore>();
  } else {
    auto url = nanoctrl::RedisUrl::parse(config_.redis_url);
    store_ = std::make_unique<nanoctrl::RedisStore>(url, config_.redis_timeout);
    try {
      store_->ping();
    } catch (const StoreUnavailable& e) {
      throw ConnectionError(std::string("NanoCtrl cannot start: ") + e.what() +
                            ". Start Redis or fix --redis-url");
    }
  }
  service_ = std::make_unique<nanoctrl::ControlService>(*store_, config_);

  http_ = std::make_unique<GatedHttpServer>();
  nanoctrl::GateLimits limits;
  limits.request_read_timeout = config_.request_read_timeout;
  limits.keep_alive_timeout = config_.keep_alive_timeout;
  limits.max_threads = config_.max_threads;
  gate_ = std::make_unique<ConnectionGate>(limits, [this](httplib::Stream& strm) { return http_->serve_one(strm); });
  http_->set_gate(gate_.get());
  http_->new_task_queue = [] { return new InlineTaskQueue; };
  // Content-Length bodies over the limit are refused in before_body(); this is the backstop.
  http_->set_payload_max_length(config_.max_body_bytes);
  // Only advertised in the Keep-Alive header: the gate closes idle connections.
  http_->set_keep_alive_timeout(std::max<time_t>(1, config_.keep_alive_timeout.count() / 1000));
  http_->set_keep_alive_max_count(1000);
  http_->set_tcp_nodelay(true);
  http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return before_body(req, res) ? httplib::Server::HandlerResponse::Handled
                                 : httplib::Server::HandlerResponse::Unhandled;
  });
  // A request whose body was left unread ends its connection: say so to the client.
  http_->set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
    if (!ConnectionGate::closing_after_response()) return;
    res.headers.erase("Keep-Alive");
    res.set_header("Connection", "close");
  });
  // SO_REUSEADDR (quick restarts) but not httplib's default SO_REUSEPORT, which would let a
  // second server bind the same port silently; close-on-exec so children do not inherit it.
  http_->set_socket_options([this](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    ::fcntl(sock, F_SETFD, FD_CLOEXEC);
    listen_fd_ = sock;
  });
  http_->set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                       httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg;
    switch (res.status) {
      case 413:
        if (req.get_header_value("Content-Type").find("x-www-form-urlencoded") != std::string::npos) {
          // httplib caps form-encoded bodies at 8 KiB whatever the configured limit.
          msg = "request body sent as application/x-www-form-urlencoded is limited to 8192 bytes; "
                "send it with Content-Type: application/json";
        } else {
          msg = fmt::format("request body is larger than the limit of {} bytes", config_.max_body_bytes);
        }
        break;
      case 404: msg = "no route " + req.method + " " + req.path.substr(0, 200); break;
      case 400:
        msg = "malformed HTTP request (a POST needs a Content-Length header or a chunked body, even when empty)";
        break;
      default: msg = fmt::format("HTTP error {}", res.status); break;
    }
    metrics_.count_request("(unrouted)", res.status);
    res.set_content(dump(error_body(msg)), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(dump(error_body("internal error: " + what)), "application/json");
  });
  install_routes();

  int port = config_.port == 0 ? http_->bind_to_any_port(config_.host) : (http_->bind_to_port(config_.host, config_.port)
                                                                              ? config_.port
                                                                              : -1);
  if (port <= 0) {
    throw ConnectionError(fmt::format("NanoCtrl cannot listen on {}:{} (address in use, or not a local address)",
                                      config_.host, config_.port));
  }
  port_ = static_cast<uint16_t>(port);
  // httplib listens with a backlog of 5: hundreds of agents connecting at once would
  // overflow it (dropped handshakes, resets). Listening again only enlarges the queue.
  if (listen_fd_ >= 0) ::listen(listen_fd_, SOMAXCONN);
  started_at_ = std::chrono::steady_clock::now();
  gate_->start();
  listener_ = std::thread([this] {
    http_->listen_after_bind();
    std::lock_guard lock(stop_mu_);
    stopped_ = true;
    stopped_cv_.notify_all();
  });
  // stop() only works once the accept loop runs; the socket already queues connections.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!http_->is_running() && std::chrono::steady_clock::now() < deadline) {
    std::lock_guard lock(stop_mu_);
    if (stopped_) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  running_ = http_->is_running();
  if (!running_) {
    stop();
    throw ConnectionError("NanoCtrl's HTTP server did not start");
  }
  // to_string() says only whether a token is set, never the token.
  DLSLIME_INFO("nanoctrl: serving {} (other hosts: {}) with store {} ({})", url(), advertised_url(),
               store_->describe(), config_.to_string());
}

void NanoCtrlServerImpl::stop() {
  if (!http_) return;
  running_ = false;
  store_->interrupt();  // blocked mailbox receives return now
  http_->stop();
  if (listener_.joinable()) {
    if (listener_.get_id() == std::this_thread::get_id()) {
      listener_.detach();
    } else {
      listener_.join();
    }
  }
  // Closes idle keep-alive connections at once and ends the requests being served.
  if (gate_) gate_->stop();
  std::lock_guard lock(stop_mu_);
  stopped_ = true;
  stopped_cv_.notify_all();
}

void NanoCtrlServerImpl::wait() {
  std::unique_lock lock(stop_mu_);
  stopped_cv_.wait(lock, [this] { return stopped_ || !started_; });
}

void NanoCtrlServerImpl::add(const char* method, const std::string& pattern, const std::string& route, Handler fn) {
  std::string m = method;
  if (m == "GET") {
    http_->Get(pattern, [this, route, fn = std::move(fn)](const httplib::Request& req, httplib::Response& res) {
      respond(route, req, "", res, fn);
    });
  } else {
    // A content reader, so that the body is read here under body_limit() whatever its
    // encoding (httplib's own limit does not apply to chunked bodies).
    http_->Post(pattern, [this, route, fn = std::move(fn)](const httplib::Request& req, httplib::Response& res,
                                                          const httplib::ContentReader& reader) {
      std::string body;
      if (read_body(req, res, reader, body)) respond(route, req, body, res, fn);
    });
  }
  known_.push_back({std::regex(pattern), m, route});
}

std::string NanoCtrlServerImpl::route_of(const std::string& path) const {
  for (const auto& k : known_) {
    if (std::regex_match(path, k.pattern)) return k.route;
  }
  return "(unrouted)";
}

std::size_t NanoCtrlServerImpl::body_limit(const httplib::Request& req) const {
  // Form-encoded bodies keep httplib's 8 KiB cap (docs/control-plane.md, errors).
  if (req.get_header_value("Content-Type").find("x-www-form-urlencoded") != std::string::npos) {
    return std::min<std::size_t>(config_.max_body_bytes, 8192);
  }
  return config_.max_body_bytes;
}

bool NanoCtrlServerImpl::before_body(const httplib::Request& req, httplib::Response& res) {
  const bool body = has_body(req);
  const bool is_post = req.method == "POST";
  // Health needs no token: load balancers and `nanoctrl status` probe it.
  const bool public_route = req.method == "GET" && req.path == "/healthz";
  if (!public_route && !authorized(route_of(req.path), req, res)) {
    // Never read a body for a client that may not send one.
    if (body) ConnectionGate::close_after_response();
    return true;
  }
  if (!is_post) {
    // Only POST routes take a body; another method's body is never read (httplib would read
    // a chunked or length-less one without a limit), so it ends the connection.
    if (body) ConnectionGate::close_after_response();
    if (req.method == "GET" || req.method == "HEAD") return false;
    fallback(req, res);
    return true;
  }
  if (req.get_header_value("Content-Type").find("multipart/form-data") != std::string::npos) {
    ConnectionGate::close_after_response();
    res.status = 400;
    res.set_content(dump(error_body("multipart bodies are not accepted: send the request as JSON with "
                                    "Content-Type: application/json")),
                    "application/json");
    metrics_.count_request("(unrouted)", 400);
    return true;
  }
  if (req.has_header("Content-Length") && req.get_header_value<uint64_t>("Content-Length") > body_limit(req)) {
    // Refused from the header, before a byte of the body is read (the error handler words it).
    ConnectionGate::close_after_response();
    res.status = 413;
    return true;
  }
  return false;
}

bool NanoCtrlServerImpl::read_body(const httplib::Request& req, httplib::Response& res,
                                   const httplib::ContentReader& reader, std::string& body) {
  const std::size_t limit = body_limit(req);
  bool too_large = false;
  bool ok = reader([&](const char* data, std::size_t n) {
    if (body.size() + n > limit) {
      too_large = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (ok) return true;
  // The rest of the body is unread (or malformed): this connection carries no more requests.
  ConnectionGate::close_after_response();
  res.status = too_large ? 413 : 400;
  res.body.clear();  // the error handler words the reply
  return false;
}

// With a token configured, a request without the right `Authorization: Bearer` header gets
// 401 here, from before_body(): before its route runs and before its body is read.
bool NanoCtrlServerImpl::authorized(const std::string& route, const httplib::Request& req, httplib::Response& res) {
  if (!auth_.enabled()) return true;
  auto result = auth_.check(req.get_header_value("Authorization"));
  if (result == nanoctrl::BearerAuth::Result::kOk) return true;
  std::string msg;
  if (result == nanoctrl::BearerAuth::Result::kMissing) {
    msg = "this NanoCtrl requires a bearer token: send the header 'Authorization: Bearer <token>' "
          "(NanoCtrlClient: the token argument or DLSLIME_NANOCTRL_TOKEN)";
    metrics_.auth_failures_missing.fetch_add(1);
  } else {
    msg = "the bearer token is wrong: this NanoCtrl was started with a different token";
    metrics_.auth_failures_wrong.fetch_add(1);
  }
  res.status = 401;
  // RFC 6750: the challenge names the scheme; error="invalid_token" when one was presented.
  res.set_header("WWW-Authenticate", result == nanoctrl::BearerAuth::Result::kMissing
                                         ? std::string("Bearer realm=\"nanoctrl\"")
                                         : std::string("Bearer realm=\"nanoctrl\", error=\"invalid_token\""));
  res.set_content(dump(error_body(msg)), "application/json");
  metrics_.count_request(route, 401);
  return false;
}

void NanoCtrlServerImpl::respond(const std::string& route, const httplib::Request& req, const std::string& raw,
                                 httplib::Response& res, const Handler& fn) {
  int status = 200;
  json body;
  try {
    body = fn(req.method == "GET" ? json::object() : parse_body(raw), req);
  } catch (const ApiError& e) {
    status = e.status();
    body = error_body(e.what());
  } catch (const StoreUnavailable& e) {
    status = 503;
    body = error_body(e.what());
    DLSLIME_WARN("nanoctrl: {} -> 503: {}", route, e.what());
  } catch (const std::exception& e) {
    status = 500;
    body = error_body(std::string("internal error: ") + e.what());
    DLSLIME_ERROR("nanoctrl: {} -> 500: {}", route, e.what());
  }
  res.status = status;
  res.set_content(dump(body), "application/json");
  metrics_.count_request(route, status);
}

json NanoCtrlServerImpl::mailbox_recv(const json& body) {
  // Each blocked receive holds an HTTP thread; refusing past max_waiters keeps threads free
  // for heartbeats and posts.
  if (metrics_.waiters.fetch_add(1) >= static_cast<int64_t>(config_.max_waiters)) {
    metrics_.waiters.fetch_sub(1);
    metrics_.waiters_rejected.fetch_add(1);
    throw ApiError(429, fmt::format("too many mailbox receives are waiting on this NanoCtrl ({}, the "
                                    "max_waiters limit); retry shortly or raise --max-waiters/--max-threads",
                                    config_.max_waiters));
  }
  struct Release {
    std::atomic<int64_t>& n;
    ~Release() { n.fetch_sub(1); }
  } release{metrics_.waiters};
  return service_->mailbox_recv(body);
}

void NanoCtrlServerImpl::healthz(httplib::Response& res) {
  double uptime = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_at_).count();
  json body = {{"store", store_->kind()},
               {"store_url", store_->describe()},
               {"version", DLSLIME_VERSION_STRING},
               {"uptime_s", uptime},
               {"auth", auth_.enabled() ? "bearer" : "none"}};
  try {
    store_->ping();
    body["status"] = "ok";
    res.status = 200;
  } catch (const StoreUnavailable& e) {
    body["status"] = "error";
    body["message"] = e.what();
    res.status = 503;
  }
  res.set_content(dump(body), "application/json");
  metrics_.count_request("/healthz", res.status);
}

void NanoCtrlServerImpl::metrics(httplib::Response& res) {
  std::string out;
  auto gauge = [&out](const char* name, const char* help, double v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
  };
  bool up = true;
  nanoctrl::ControlService::Stats s;
  try {
    s = service_->stats();
  } catch (const std::exception&) {
    up = false;
  }
  gauge("nanoctrl_store_up", "1 if the store answered this scrape.", up ? 1 : 0);
  if (up) {
    gauge("nanoctrl_agents", "Registered agents, all scopes.", static_cast<double>(s.agents));
    gauge("nanoctrl_entities", "Registered entities, all scopes.", static_cast<double>(s.entities));
    gauge("nanoctrl_mailboxes", "Non-empty mailboxes, all scopes.", static_cast<double>(s.mailboxes));
    gauge("nanoctrl_mailbox_depth", "Messages waiting in all mailboxes.", static_cast<double>(s.mailbox_messages));
  }
  gauge("nanoctrl_http_threads", "HTTP worker threads started.", static_cast<double>(gate_->threads()));
  gauge("nanoctrl_http_threads_busy", "HTTP worker threads serving a request.", static_cast<double>(gate_->busy()));
  gauge("nanoctrl_http_connections_waiting", "Connections held off the workers until a whole request arrives.",
        static_cast<double>(gate_->waiting()));
  out += "# HELP nanoctrl_http_requests_dropped_total Connections closed before a whole request arrived.\n"
         "# TYPE nanoctrl_http_requests_dropped_total counter\n";
  out += fmt::format("nanoctrl_http_requests_dropped_total{{reason=\"read_timeout\"}} {}\n",
                     gate_->dropped_read_timeout());
  out += fmt::format("nanoctrl_http_requests_dropped_total{{reason=\"head_too_large\"}} {}\n",
                     gate_->dropped_head_too_large());
  gauge("nanoctrl_uptime_seconds", "Seconds since this process started serving.",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_at_).count());
  metrics_.count_request("/metrics", 200);
  out += metrics_.render_counters();
  res.status = 200;
  res.set_content(out, "text/plain; version=0.0.4; charset=utf-8");
}

void NanoCtrlServerImpl::fallback(const httplib::Request& req, httplib::Response& res) {
  // Unauthenticated clients learn nothing about which paths exist: before_body() has
  // answered them 401 already.
  std::string allowed;
  for (const auto& k : known_) {
    if (std::regex_match(req.path, k.pattern)) allowed += (allowed.empty() ? "" : ", ") + k.method;
  }
  if (!allowed.empty()) {
    res.status = 405;
    res.set_header("Allow", allowed);
    res.set_content(dump(error_body(req.method + " is not allowed on " + req.path + "; use " + allowed)),
                    "application/json");
  } else {
    res.status = 404;
    res.set_content(dump(error_body("no route " + req.method + " " + req.path.substr(0, 200) +
                                    " (see docs/control-plane.md)")),
                    "application/json");
  }
  metrics_.count_request("(unrouted)", res.status);
}

void NanoCtrlServerImpl::install_routes() {
  auto& s = *service_;
  using R = const httplib::Request&;
  http_->Get("/", [this](R, httplib::Response& res) {
    res.set_content("NanoCtrl Server Running", "text/plain");
    metrics_.count_request("/", 200);
  });
  known_.push_back({std::regex("/"), "GET", "/"});
  http_->Get("/healthz", [this](R, httplib::Response& res) { healthz(res); });
  known_.push_back({std::regex("/healthz"), "GET", "/healthz"});
  http_->Get("/metrics", [this](R, httplib::Response& res) { metrics(res); });
  known_.push_back({std::regex("/metrics"), "GET", "/metrics"});

  auto post = [&](const std::string& path, json (nanoctrl::ControlService::*fn)(const json&)) {
    add("POST", path, path, [&s, fn](const json& body, R) { return (s.*fn)(body); });
  };
  post("/start_peer_agent", &nanoctrl::ControlService::start_peer_agent);
  post("/heartbeat", &nanoctrl::ControlService::heartbeat);
  post("/query", &nanoctrl::ControlService::query);
  post("/get_peer_agent", &nanoctrl::ControlService::get_peer_agent);
  post("/cleanup", &nanoctrl::ControlService::cleanup);
  post("/register_mr", &nanoctrl::ControlService::register_mr);
  post("/get_mr_info", &nanoctrl::ControlService::get_mr_info);
  post("/unregister_mr", &nanoctrl::ControlService::unregister_mr);
  post("/register", &nanoctrl::ControlService::register_entity);
  post("/unregister", &nanoctrl::ControlService::unregister_entity);
  post("/get_entity_info", &nanoctrl::ControlService::get_entity_info);
  post("/list_entities", &nanoctrl::ControlService::list_entities);
  post("/get_redis_address", &nanoctrl::ControlService::get_redis_address);
  post("/mailbox/post", &nanoctrl::ControlService::mailbox_post);
  add("POST", "/mailbox/recv", "/mailbox/recv", [this](const json& body, R) { return mailbox_recv(body); });

  const std::string topo = R"(/v1/desired_topology/([^/]+))";
  const std::string topo_route = "/v1/desired_topology/{agent}";
  add("POST", topo, topo_route,
      [&s](const json& body, R req) { return s.set_desired_topology(req.matches[1].str(), body); });
  add("GET", topo, topo_route, [&s](const json&, R req) {
    json q = json::object();
    if (req.has_param("scope")) q["scope"] = req.get_param_value("scope");
    return s.get_desired_topology(req.matches[1].str(), q);
  });

  // Anything else: 405 on a known path, 404 otherwise.
  // (Other methods are answered by before_body() without reading their bodies.)
  auto rest = [this](R req, httplib::Response& res) { fallback(req, res); };
  http_->Get(".*", rest);
  http_->Post(".*", [this](R req, httplib::Response& res, const httplib::ContentReader& reader) {
    std::string body;
    if (read_body(req, res, reader, body)) fallback(req, res);
  });
}

// ------------------------------------------------------------------------------- facade

NanoCtrlServer::NanoCtrlServer(NanoCtrlConfig config) : impl_(std::make_unique<NanoCtrlServerImpl>(std::move(config))) {}
NanoCtrlServer::~NanoCtrlServer() = default;
void NanoCtrlServer::start() { impl_->start(); }
void NanoCtrlServer::stop() { impl_->stop(); }
void NanoCtrlServer::wait() { impl_->wait(); }
bool NanoCtrlServer::running() const { return impl_->running(); }
uint16_t NanoCtrlServer::port() const { return impl_->port(); }
std::string NanoCtrlServer::url() const { return impl_->url(); }
std::string NanoCtrlServer::advertised_url() const { return impl_->advertised_url(); }
const NanoCtrlConfig& NanoCtrlServer::config() const { return impl_->config(); }

}  // namespace dlslime
