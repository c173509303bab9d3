// An agent's registration with NanoCtrl: registering, heartbeating, registering again when
// NanoCtrl forgot the agent (a restart on the memory store, an emptied Redis, an expiry during
// a partition), and the cleanup when the agent leaves. Its own lock guards whether NanoCtrl
// holds a registration made by it, and the incarnation NanoCtrl returned for it; its own
// thread heartbeats.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "dlslime/nanoctrl_client.h"

namespace dlslime {

class ControlSession {
 public:
  // `body`: the registration request's body (address, metadata) without the alias.
  // `registered_again`: called on the heartbeat thread after a registration made again
  // (the agent publishes its regions again). `heartbeat`: 0 for what NanoCtrl suggests.
  ControlSession(NanoCtrlClient& ctrl, std::chrono::milliseconds heartbeat, std::function<nlohmann::json()> body,
                 std::function<void()> registered_again);
  ~ControlSession() { stop(); }
  ControlSession(const ControlSession&) = delete;
  ControlSession& operator=(const ControlSession&) = delete;

  // Registers under `alias` ("": NanoCtrl picks one); returns the alias NanoCtrl
  // registered. A refused registration (409: the alias is taken) throws and leaves nothing
  // of ours to clean up.
  std::string start(const std::string& alias);
  // Starts heartbeating (and registering again when NanoCtrl forgot us), once the agent has
  // stored its alias: `registered_again` may read it on the heartbeat thread.
  void start_heartbeat();
  // POSTs an agent route naming our registration (and, when NanoCtrl issued one, its
  // incarnation), so NanoCtrl applies it to that registration only.
  nlohmann::json call(const std::string& path, nlohmann::json body);
  // Stops heartbeating (no registration is made again after it). Idempotent.
  void stop();
  // After stop(): removes our registration from NanoCtrl (its peers are notified) if
  // NanoCtrl holds one made by us; a refused one must not delete the live agent's.
  void leave();

 private:
  nlohmann::json register_once(const std::string& alias);
  void register_again();
  void heartbeat_loop();

  NanoCtrlClient& ctrl_;
  const std::chrono::milliseconds heartbeat_option_;
  const std::function<nlohmann::json()> body_;
  const std::function<void()> registered_again_;
  std::string alias_;  // set by start(), before the heartbeat thread runs; never changed after
  std::chrono::milliseconds heartbeat_interval_{15000};  // heartbeat thread only, after start()

  mutable std::mutex mu_;
  bool registered_ = false;  // NanoCtrl holds a registration made by this agent now
  std::string incarnation_;  // the one NanoCtrl returned for it ("" from one that issues none)

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;  // stop_mu_
  std::thread heartbeat_thread_;
};

}  // namespace dlslime
