#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <arpa/inet.h>

#include <atomic>
#include <filesystem>
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

#include "core/log.h"
#include "dlslime/errors.h"
#include "dlslime/nanoctrl.h"
#include "dlslime/version.h"
#include "nanoctrl/auth.h"
#include "nanoctrl/control_service.h"
#include "nanoctrl/memory_store.h"
#include "nanoctrl/metrics.h"
#include "nanoctrl/redis_store.h"
#include "nanoctrl/request.h"
#include "nanoctrl/thread_pool.h"

namespace dlslime {

using nlohmann::json;
using nanoctrl::ApiError;
using nanoctrl::parse_body;
using nanoctrl::StoreUnavailable;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_body(const std::string& message) { return {{"status", "error"}, {"message", message}}; }

// httplib keeps an idle keep-alive connection open until its timeout even after stop(), so
// stopping would take keep_alive_timeout. Shut down this server's accepted sockets (local
// port == ours, with a peer) to end those connections at once.
void shutdown_accepted_sockets(uint16_t port) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    sockaddr_storage local{}, peer{};
    socklen_t llen = sizeof local, plen = sizeof peer;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0) continue;
    uint16_t local_port = 0;
    if (local.ss_family == AF_INET) {
      local_port = ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
    } else if (local.ss_family == AF_INET6) {
      local_port = ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port);
    } else {
      continue;
    }
    if (local_port != port || ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0) continue;
    ::shutdown(fd, SHUT_RDWR);
  }
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
  std::string url() const {
    std::string h = config_.host;
    if (h == "0.0.0.0" || h == "::" || h.empty()) h = "127.0.0.1";
    if (h.find(':') != std::string::npos) h = "[" + h + "]";
    return fmt::format("http://{}:{}", h, port_);
  }
  const NanoCtrlConfig& config() const { return config_; }

 private:
  using Handler = std::function<json(const json&, const httplib::Request&)>;

  void install_routes();
  void add(const char* method, const std::string& pattern, const std::string& route, Handler fn);
  void respond(const std::string& route, const httplib::Request& req, httplib::Response& res, const Handler& fn);
  void fallback(const httplib::Request& req, httplib::Response& res);
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
  std::unique_ptr<httplib::Server> http_;
  nanoctrl::Metrics metrics_;
  std::atomic<nanoctrl::GrowingThreadPool*> pool_{nullptr};
  // Known paths with their methods, for 405 replies.
  std::vector<std::pair<std::regex, std::string>> known_;
  std::thread listener_;
  std::atomic<bool> running_{false};
  std::atomic<bool> started_{false};
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  std::chrono::steady_clock::time_point started_at_;
  std::mutex stop_mu_;
  std::condition_variable stopped_cv_;
  bool stopped_ = false;
};

void NanoCtrlServerImpl::start() {
  if (started_.exchange(true)) throw Error(StatusCode::kFailed, "NanoCtrl server already started");
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

  http_ = std::make_unique<httplib::Server>();
  const std::size_t max_threads = config_.max_threads;
  http_->new_task_queue = [this, max_threads] {
    auto* pool = new nanoctrl::GrowingThreadPool(max_threads);
    pool_ = pool;
    return pool;
  };
  http_->set_payload_max_length(config_.max_body_bytes);
  http_->set_keep_alive_timeout(std::max<time_t>(1, config_.keep_alive_timeout.count() / 1000));
  http_->set_keep_alive_max_count(1000);
  http_->set_read_timeout(5, 0);
  http_->set_write_timeout(5, 0);
  http_->set_tcp_nodelay(true);
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
  DLSLIME_INFO("nanoctrl: serving {} with store {} ({})", url(), store_->describe(), config_.to_string());
}

void NanoCtrlServerImpl::stop() {
  if (!http_) return;
  running_ = false;
  store_->interrupt();  // blocked mailbox receives return now
  http_->stop();
  if (port_ != 0) shutdown_accepted_sockets(port_);
  if (listener_.joinable()) {
    if (listener_.get_id() == std::this_thread::get_id()) {
      listener_.detach();
    } else {
      listener_.join();
    }
  }
  pool_ = nullptr;
  std::lock_guard lock(stop_mu_);
  stopped_ = true;
  stopped_cv_.notify_all();
}

void NanoCtrlServerImpl::wait() {
  std::unique_lock lock(stop_mu_);
  stopped_cv_.wait(lock, [this] { return stopped_ || !started_; });
}

void NanoCtrlServerImpl::add(const char* method, const std::string& pattern, const std::string& route, Handler fn) {
  auto handler = [this, route, fn = std::move(fn)](const httplib::Request& req, httplib::Response& res) {
    respond(route, req, res, fn);
  };
  std::string m = method;
  if (m == "GET") {
    http_->Get(pattern, handler);
  } else {
    http_->Post(pattern, handler);
  }
  known_.emplace_back(std::regex(pattern), m);
}

// With a token configured, a request without the right `Authorization: Bearer` header gets
// 401 here, before its route runs. Checked after httplib has read the body (bounded by
// max_body), so the keep-alive connection stays in step.
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

void NanoCtrlServerImpl::respond(const std::string& route, const httplib::Request& req, httplib::Response& res,
                                 const Handler& fn) {
  if (!authorized(route, req, res)) return;
  int status = 200;
  json body;
  try {
    body = fn(req.method == "GET" ? json::object() : parse_body(req.body), req);
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
  if (auto* pool = pool_.load()) {
    gauge("nanoctrl_http_threads", "HTTP worker threads started.", static_cast<double>(pool->threads()));
    gauge("nanoctrl_http_threads_busy", "HTTP worker threads serving a connection.",
          static_cast<double>(pool->busy()));
  }
  gauge("nanoctrl_uptime_seconds", "Seconds since this process started serving.",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_at_).count());
  metrics_.count_request("/metrics", 200);
  out += metrics_.render_counters();
  res.status = 200;
  res.set_content(out, "text/plain; version=0.0.4; charset=utf-8");
}

void NanoCtrlServerImpl::fallback(const httplib::Request& req, httplib::Response& res) {
  // Unauthenticated clients learn nothing about which paths exist.
  if (!authorized("(unrouted)", req, res)) return;
  std::string allowed;
  for (const auto& [re, method] : known_) {
    if (std::regex_match(req.path, re)) allowed += (allowed.empty() ? "" : ", ") + method;
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
  http_->Get("/", [this](R req, httplib::Response& res) {
    if (!authorized("/", req, res)) return;
    res.set_content("NanoCtrl Server Running", "text/plain");
    metrics_.count_request("/", 200);
  });
  known_.emplace_back(std::regex("/"), "GET");
  http_->Get("/healthz", [this](R, httplib::Response& res) { healthz(res); });
  known_.emplace_back(std::regex("/healthz"), "GET");
  http_->Get("/metrics", [this](R req, httplib::Response& res) {
    if (authorized("/metrics", req, res)) metrics(res);
  });
  known_.emplace_back(std::regex("/metrics"), "GET");

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
  auto rest = [this](R req, httplib::Response& res) { fallback(req, res); };
  http_->Get(".*", rest);
  http_->Post(".*", rest);
  http_->Put(".*", rest);
  http_->Patch(".*", rest);
  http_->Delete(".*", rest);
  http_->Options(".*", rest);
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
const NanoCtrlConfig& NanoCtrlServer::config() const { return impl_->config(); }

}  // namespace dlslime
