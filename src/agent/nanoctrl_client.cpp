#include "dlslime/nanoctrl_client.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <vector>

#include <httplib.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dlslime/errors.h"
#include "nanoctrl/auth.h"

namespace dlslime {

using nlohmann::json;

namespace {

// Idle connections kept per client for reuse.
constexpr std::size_t kMaxIdleConnections = 8;

std::string normalize_url(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  if (url.find("://") == std::string::npos) url = "http://" + url;
  return url;
}

// The explicit token, else $DLSLIME_NANOCTRL_TOKEN; "" = none.
std::string resolve_token(const std::string& token) {
  if (!token.empty()) {
    nanoctrl::validate_token(token, "the NanoCtrl token");
    return token;
  }
  const char* env = std::getenv("DLSLIME_NANOCTRL_TOKEN");
  if (env == nullptr || *env == '\0') return "";
  nanoctrl::validate_token(env, "DLSLIME_NANOCTRL_TOKEN");
  return env;
}

// httplib waits with poll(), whose timeout is an int of milliseconds: a longer wait wrapped
// around (49.7 days became 1 ms, and the request failed at once). Waits are capped at the
// longest poll() takes, 24.8 days, which is "no limit" in practice.
constexpr std::chrono::milliseconds kMaxSocketWait{std::numeric_limits<int>::max()};

template <typename Rep, typename Period>
std::pair<time_t, time_t> split(std::chrono::duration<Rep, Period> d) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  if (us < 0) us = 0;
  return {static_cast<time_t>(us / 1000000), static_cast<time_t>(us % 1000000)};
}

}  // namespace

class NanoCtrlClientImpl {
 public:
  NanoCtrlClientImpl(std::string url, std::string scope, std::chrono::milliseconds timeout, const std::string& token)
      : url_(normalize_url(std::move(url))), scope_(std::move(scope)), timeout_(timeout), token_(resolve_token(token)) {
    if (url_.rfind("http://", 0) != 0 && url_.rfind("https://", 0) != 0) {
      throw InvalidArgumentError("NanoCtrl URL '" + url_ + "' must be http://host:port");
    }
    httplib::Client probe(url_);
    if (!probe.is_valid()) throw InvalidArgumentError("NanoCtrl URL '" + url_ + "' is not a valid http URL");
  }

  json request(const std::string& method, const std::string& path, json body,
               std::chrono::milliseconds extra_wait = std::chrono::milliseconds(0)) {
    if (!scope_.empty() && body.is_object() && !body.contains("scope")) body["scope"] = scope_;
    auto client = acquire();
    const auto wait = std::min(timeout_, kMaxSocketWait);
    const auto read_wait = std::min(timeout_ + extra_wait, kMaxSocketWait);
    auto [cs, cus] = split(wait);
    client->set_connection_timeout(cs, cus);
    auto [rs, rus] = split(read_wait);
    client->set_read_timeout(rs, rus);
    client->set_write_timeout(cs, cus);

    auto started = std::chrono::steady_clock::now();
    httplib::Result res = method == "GET" ? client->Get(path) : client->Post(path, body.dump(), "application/json");
    if (!res) {
      auto err = res.error();
      auto elapsed = std::chrono::steady_clock::now() - started;
      std::string what = "NanoCtrl " + method + " " + url_ + path + " failed: " + httplib::to_string(err);
      if (err == httplib::Error::Read && elapsed >= read_wait) {
        throw TimeoutError(what + " (no reply within the client timeout)");
      }
      if (err == httplib::Error::ConnectionTimeout) throw TimeoutError(what);
      throw ConnectionError(what + "; is NanoCtrl running at " + url_ + "?");
    }
    release(std::move(client));
    // Nesting is bounded as the server bounds request bodies: a hostile or broken server
    // must not drive the recursive code that later walks the reply (dump, conversion).
    constexpr int kMaxReplyDepth = 64;
    bool too_deep = false;
    json reply = json::parse(
        res->body,
        [&](int depth, json::parse_event_t, json&) {
          if (depth > kMaxReplyDepth) too_deep = true;
          return !too_deep;
        },
        /*allow_exceptions=*/false);
    if (too_deep) {
      // ValueError in Python, like every too-deep value (issue 10, item 5).
      throw InvalidArgumentError(
          fmt::format("NanoCtrl's reply is nested deeper than {} levels ({} {})", kMaxReplyDepth, method, path));
    }
    const int status = res->status;
    if (status >= 200 && status < 300) {
      if (reply.is_discarded()) {
        throw Error(StatusCode::kProtocolError, "NanoCtrl " + path + " replied with a body that is not JSON");
      }
      return reply;
    }
    std::string message = reply.is_object() && reply.contains("message") && reply["message"].is_string()
                              ? reply["message"].get<std::string>()
                              : res->body.substr(0, 300);
    std::string what = "NanoCtrl " + path + " (HTTP " + std::to_string(status) + "): " + message;
    switch (status) {
      case 400:
      case 413: throw InvalidArgumentError(what);
      case 401: throw AuthenticationError(what);
      case 404: throw NotFoundError(what);
      case 503: throw ConnectionError(what);
      default: throw Error(StatusCode::kFailed, what);
    }
  }

  const std::string url_;
  const std::string scope_;
  const std::chrono::milliseconds timeout_;
  const std::string token_;

 private:
  std::unique_ptr<httplib::Client> acquire() {
    {
      std::lock_guard lock(mu_);
      if (!idle_.empty()) {
        auto c = std::move(idle_.back());
        idle_.pop_back();
        return c;
      }
    }
    auto c = std::make_unique<httplib::Client>(url_);
    c->set_keep_alive(true);
    c->set_tcp_nodelay(true);
    if (!token_.empty()) c->set_bearer_token_auth(token_);
    return c;
  }

  void release(std::unique_ptr<httplib::Client> c) {
    std::lock_guard lock(mu_);
    if (idle_.size() < kMaxIdleConnections) idle_.push_back(std::move(c));
  }

  std::mutex mu_;
  std::vector<std::unique_ptr<httplib::Client>> idle_;
};

NanoCtrlClient::NanoCtrlClient(const std::string& url, std::string scope, std::chrono::milliseconds timeout,
                               const std::string& token)
    : impl_(std::make_unique<NanoCtrlClientImpl>(url, std::move(scope), timeout, token)) {}

NanoCtrlClient::~NanoCtrlClient() = default;

const std::string& NanoCtrlClient::url() const { return impl_->url_; }
const std::string& NanoCtrlClient::scope() const { return impl_->scope_; }
bool NanoCtrlClient::has_token() const { return !impl_->token_.empty(); }

json NanoCtrlClient::healthz() { return impl_->request("GET", "/healthz", json::object()); }

json NanoCtrlClient::call(const std::string& path, const json& body) { return impl_->request("POST", path, body); }

json NanoCtrlClient::start_peer_agent(const json& fields) {
  if (!fields.is_object()) throw InvalidArgumentError("start_peer_agent fields must be a JSON object");
  return impl_->request("POST", "/start_peer_agent", fields);
}

std::string NanoCtrlClient::heartbeat(const std::string& entity_id, const std::string& entity_type) {
  json r = impl_->request("POST", "/heartbeat", {{"entity_type", entity_type}, {"entity_id", entity_id}});
  return r.value("status", "error");
}

json NanoCtrlClient::query() { return impl_->request("POST", "/query", json::object()); }

std::optional<json> NanoCtrlClient::get_peer_agent(const std::string& name) {
  try {
    return impl_->request("POST", "/get_peer_agent", {{"name", name}}).at("agent");
  } catch (const NotFoundError&) {
    return std::nullopt;
  }
}

json NanoCtrlClient::cleanup(const std::string& agent_name) {
  return impl_->request("POST", "/cleanup", {{"agent_name", agent_name}});
}

json NanoCtrlClient::set_desired_topology(const std::string& agent, const std::vector<std::string>& target_peers,
                                          bool symmetric, std::optional<double> min_bw) {
  json body = {{"target_peers", target_peers}, {"symmetric", symmetric}};
  if (min_bw) body["min_bw"] = *min_bw;
  return impl_->request("POST", "/v1/desired_topology/" + agent, body);
}

std::optional<json> NanoCtrlClient::get_desired_topology(const std::string& agent) {
  std::string path = "/v1/desired_topology/" + agent;
  if (!impl_->scope_.empty()) path += "?scope=" + impl_->scope_;
  try {
    return impl_->request("GET", path, json::object()).at("spec");
  } catch (const NotFoundError&) {
    return std::nullopt;
  }
}

void NanoCtrlClient::register_mr(const std::string& agent_name, const std::string& mr_name, const json& mr_info) {
  impl_->request("POST", "/register_mr", {{"agent_name", agent_name}, {"mr_name", mr_name}, {"mr_info", mr_info}});
}

std::optional<json> NanoCtrlClient::get_mr_info(const std::string& owner, const std::string& mr_name) {
  json r = impl_->request("POST", "/get_mr_info", {{"dst", owner}, {"mr_name", mr_name}});
  if (!r.contains("mr_info") || r["mr_info"].is_null()) return std::nullopt;
  return r["mr_info"];
}

bool NanoCtrlClient::unregister_mr(const std::string& agent_name, const std::string& mr_name) {
  return impl_->request("POST", "/unregister_mr", {{"agent_name", agent_name}, {"mr_name", mr_name}})
      .value("existed", false);
}

json NanoCtrlClient::register_entity(const std::string& entity_id, const std::string& kind,
                                     const std::string& entity_type, const json& extra) {
  json body = extra.is_object() ? extra : json::object();
  body["entity_id"] = entity_id;
  body["kind"] = kind;
  body["entity_type"] = entity_type;
  return impl_->request("POST", "/register", body);
}

bool NanoCtrlClient::unregister_entity(const std::string& entity_id, const std::string& entity_type) {
  return impl_->request("POST", "/unregister", {{"entity_id", entity_id}, {"entity_type", entity_type}})
      .value("existed", false);
}

std::optional<json> NanoCtrlClient::get_entity_info(const std::string& entity_id, const std::string& entity_type) {
  json r = impl_->request("POST", "/get_entity_info", {{"entity_id", entity_id}, {"entity_type", entity_type}});
  if (r.value("status", "") != "ok") return std::nullopt;
  return r["entity_info"];
}

json NanoCtrlClient::list_entities(const std::string& entity_type, const std::string& kind) {
  json body = json::object();
  if (!entity_type.empty()) body["entity_type"] = entity_type;
  if (!kind.empty()) body["kind"] = kind;
  return impl_->request("POST", "/list_entities", body).at("entities");
}

uint64_t NanoCtrlClient::post(const std::string& to, const json& message, const std::string& from) {
  json body = {{"to", to}, {"message", message}};
  if (!from.empty()) body["from"] = from;
  return impl_->request("POST", "/mailbox/post", body).value("depth", uint64_t{0});
}

std::vector<json> NanoCtrlClient::recv(const std::string& alias, std::chrono::milliseconds timeout,
                                       uint32_t max_messages) {
  if (timeout.count() < 0) timeout = std::chrono::milliseconds(0);
  json body = {{"alias", alias}, {"timeout", static_cast<double>(timeout.count()) / 1000.0}, {"max", max_messages}};
  json r = impl_->request("POST", "/mailbox/recv", body, timeout);
  std::vector<json> out;
  for (auto& m : r.at("messages")) out.push_back(std::move(m));
  return out;
}

}  // namespace dlslime
