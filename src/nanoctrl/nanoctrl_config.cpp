#include <nlohmann/json.hpp>

#include "core/advertise_address.h"
#include "core/host_name.h"
#include "dlslime/errors.h"
#include "dlslime/nanoctrl.h"
#include "nanoctrl/auth.h"
#include "nanoctrl/redis_store.h"

namespace dlslime {

void NanoCtrlConfig::validate() const {
  auto fail = [](const std::string& msg) { throw InvalidArgumentError("NanoCtrl config: " + msg); };
  if (host.empty()) fail("host must not be empty");
  if (!advertise_host.empty()) check_host_text(advertise_host, "NanoCtrl config: advertise_host");
  if (!advertise_interface.empty()) check_interface_name(advertise_interface, "NanoCtrl config: advertise_interface");
  if (!advertise_host.empty() && !advertise_interface.empty()) {
    fail("advertise_host and advertise_interface are both set: set one");
  }
  if (!redis_url.empty()) nanoctrl::RedisUrl::parse(redis_url);  // throws with the reason
  if (key_prefix.find_first_of("*?[]\\") != std::string::npos) {
    fail("key_prefix '" + key_prefix + "' must not contain glob characters * ? [ ] \\");
  }
  if (ttl.count() < 100) fail("ttl must be at least 100 ms");
  if (max_body_bytes < 1024) fail("max_body_bytes must be at least 1024");
  if (max_threads < 4) fail("max_threads must be at least 4");
  if (max_waiters >= max_threads) {
    fail("max_waiters (" + std::to_string(max_waiters) + ") must be below max_threads (" +
         std::to_string(max_threads) + "), or threads are left for nothing but waiting");
  }
  if (max_wait.count() < 0) fail("max_wait must not be negative");
  if (mailbox_max_messages < 1) fail("mailbox_max_messages must be at least 1");
  if (mailbox_ttl.count() < 1000) fail("mailbox_ttl must be at least 1000 ms");
  if (keep_alive_timeout.count() < 1000) fail("keep_alive_timeout must be at least 1000 ms");
  if (request_read_timeout.count() < 100) fail("request_read_timeout must be at least 100 ms");
  if (redis_timeout.count() < 10) fail("redis_timeout must be at least 10 ms");
  if (!token.empty()) nanoctrl::validate_token(token, "NanoCtrl config: token");
}

nlohmann::json NanoCtrlConfig::to_json() const {
  return {{"host", host},
          {"port", port},
          {"advertise_host", advertise_host},
          {"advertise_interface", advertise_interface},
          {"store", redis_url.empty() ? "memory" : nanoctrl::RedisUrl::parse(redis_url).to_string()},
          {"key_prefix", key_prefix},
          {"ttl_ms", ttl.count()},
          {"max_body_bytes", max_body_bytes},
          {"max_threads", max_threads},
          {"max_waiters", max_waiters == 0 ? max_threads / 2 : max_waiters},
          {"max_wait_ms", max_wait.count()},
          {"mailbox_max_messages", mailbox_max_messages},
          {"mailbox_ttl_ms", mailbox_ttl.count()},
          {"keep_alive_timeout_ms", keep_alive_timeout.count()},
          {"request_read_timeout_ms", request_read_timeout.count()},
          {"redis_timeout_ms", redis_timeout.count()},
          {"token", token.empty() ? "none" : "set"}};
}

std::string NanoCtrlConfig::to_string() const { return to_json().dump(); }

}  // namespace dlslime
