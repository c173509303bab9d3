#include "agent/control_session.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/log.h"
#include "dlslime/errors.h"

namespace dlslime {

using nlohmann::json;

ControlSession::ControlSession(NanoCtrlClient& ctrl, std::chrono::milliseconds heartbeat,
                               std::function<json()> body, std::function<void()> registered_again)
    : ctrl_(ctrl), heartbeat_option_(heartbeat), body_(std::move(body)), registered_again_(std::move(registered_again)) {}

json ControlSession::register_once(const std::string& alias) {
  json body = body_();
  if (!alias.empty()) body["alias"] = alias;
  json reply = ctrl_.start_peer_agent(body);
  if (!reply.contains("name") || !reply["name"].is_string()) {
    throw Error(StatusCode::kProtocolError, "NanoCtrl's /start_peer_agent reply has no 'name': " + reply.dump());
  }
  if (heartbeat_option_.count() > 0) {
    heartbeat_interval_ = heartbeat_option_;
  } else if (reply.contains("heartbeat_interval_ms") && reply["heartbeat_interval_ms"].is_number()) {
    heartbeat_interval_ = std::chrono::milliseconds(std::max<int64_t>(reply["heartbeat_interval_ms"].get<int64_t>(), 10));
  }
  return reply;
}

std::string ControlSession::start(const std::string& alias) {
  // Only now registered_ may become true: a refused registration throws here.
  json reply = register_once(alias);
  alias_ = reply["name"].get<std::string>();
  {
    std::lock_guard lock(mu_);
    registered_ = true;
    incarnation_ = reply.value("incarnation", "");
  }
  return alias_;
}

void ControlSession::start_heartbeat() { heartbeat_thread_ = std::thread([this] { heartbeat_loop(); }); }

json ControlSession::call(const std::string& path, json body) {
  {
    std::lock_guard lock(mu_);
    if (!incarnation_.empty()) body["incarnation"] = incarnation_;
  }
  return ctrl_.call(path, body);
}

void ControlSession::stop() {
  {
    std::lock_guard lock(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  // One still running could register us again after leave().
  if (heartbeat_thread_.joinable() && heartbeat_thread_.get_id() != std::this_thread::get_id()) {
    heartbeat_thread_.join();
  }
}

void ControlSession::leave() {
  bool ours = false;
  {
    std::lock_guard lock(mu_);
    ours = registered_;
    registered_ = false;
  }
  if (!ours) return;
  try {
    call("/cleanup", {{"agent_name", alias_}});
  } catch (const std::exception& e) {
    DLSLIME_WARN("PeerAgent '{}': NanoCtrl cleanup failed (its records expire with the TTL): {}", alias_, e.what());
  }
}

void ControlSession::register_again() {
  {
    // Whatever NanoCtrl holds under our alias now is not ours (gone, or another agent's).
    std::lock_guard lock(mu_);
    registered_ = false;
  }
  DLSLIME_WARN("PeerAgent '{}': NanoCtrl no longer knows this agent; registering again", alias_);
  json reply = register_once(alias_);  // a 409 (another agent took the alias) propagates
  const std::string name = reply["name"].get<std::string>();
  {
    std::lock_guard lock(mu_);
    registered_ = true;
    incarnation_ = reply.value("incarnation", "");
  }
  if (name != alias_) {
    // The alias is fixed for the agent's life (peers and every thread know it by it): a
    // NanoCtrl that names us otherwise is not one to stay registered with.
    call("/cleanup", {{"agent_name", name}});
    std::lock_guard lock(mu_);
    registered_ = false;
    throw Error(StatusCode::kProtocolError,
                fmt::format("NanoCtrl registered this agent again as '{}', not as '{}'", name, alias_));
  }
  registered_again_();
}

void ControlSession::heartbeat_loop() {
  for (;;) {
    {
      std::unique_lock lock(stop_mu_);
      if (stop_cv_.wait_for(lock, heartbeat_interval_, [&] { return stopping_; })) return;
    }
    try {
      json reply = call("/heartbeat", {{"entity_type", "agent"}, {"entity_id", alias_}});
      // NanoCtrl forgot us: register again under the same alias and publish our regions again.
      if (reply.value("status", "") == "not_found") register_again();
    } catch (const std::exception& e) {
      bool ours = false;
      {
        std::lock_guard lock(mu_);
        ours = registered_;
      }
      if (ours) {
        DLSLIME_WARN("PeerAgent '{}': heartbeat failed (will retry): {}", alias_, e.what());
      } else {
        DLSLIME_ERROR("PeerAgent '{}': not registered with NanoCtrl (peers cannot find this agent; will retry): {}",
                      alias_, e.what());
      }
    }
  }
}

}  // namespace dlslime
