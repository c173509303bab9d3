// libFuzzer target: NanoCtrl request handling without HTTP. Request bodies go through the
// same parse step as the server (size, depth, JSON, object check) and then to
// ControlService on a fresh MemoryStore, as nanoctrl_server.cpp routes them.
//
// Input: one or more requests separated by a 0xFF byte (never valid inside UTF-8 JSON), so
// one input can register an agent and then act on it. The first byte of a request picks
// the route (and, for the topology routes, the agent name in the path); the rest is the
// body. The service must answer every request with a reply body or an ApiError (4xx) - any
// other exception would be an HTTP 500, which the server reserves for bugs, so it is a
// crash here.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dlslime/logging.h"
#include "dlslime/nanoctrl.h"
#include "fuzz_common.h"
#include "nanoctrl/control_service.h"
#include "nanoctrl/memory_store.h"
#include "nanoctrl/request.h"

using nlohmann::json;
using namespace dlslime;
using namespace dlslime::nanoctrl;

namespace {

const NanoCtrlConfig& config() {
  static const NanoCtrlConfig cfg = [] {
    set_log_level("off");
    NanoCtrlConfig c;
    c.max_wait = std::chrono::milliseconds(0);  // a mailbox receive never blocks the fuzzer
    c.mailbox_max_messages = 8;                 // reach "mailbox full" (429)

    return c;
  }();
  return cfg;
}

// Agent names a topology path may carry: valid, registered by the seeds, invalid, empty-ish.
const std::string kPathAgents[] = {"a", "agent-1", "b", "bad:name", "x*", ".", std::string(200, 'n'), "é"};
constexpr int kPathAgentCount = sizeof kPathAgents / sizeof kPathAgents[0];

constexpr int kRoutes = 17;

json call(ControlService& s, uint8_t selector, const json& body) {
  const std::string& agent = kPathAgents[(selector / kRoutes) % kPathAgentCount];
  switch (selector % kRoutes) {
    case 0: return s.start_peer_agent(body);
    case 1: return s.heartbeat(body);
    case 2: return s.query(body);
    case 3: return s.get_peer_agent(body);
    case 4: return s.cleanup(body);
    case 5: return s.set_desired_topology(agent, body);
    case 6: {  // GET: the body is ignored, only ?scope= is passed on (a string)
      json q = json::object();
      if (body.contains("scope") && body["scope"].is_string()) q["scope"] = body["scope"];
      return s.get_desired_topology(agent, q);
    }
    case 7: return s.register_mr(body);
    case 8: return s.get_mr_info(body);
    case 9: return s.unregister_mr(body);
    case 10: return s.register_entity(body);
    case 11: return s.unregister_entity(body);
    case 12: return s.get_entity_info(body);
    case 13: return s.list_entities(body);
    case 14: return s.mailbox_post(body);
    case 15: return s.mailbox_recv(body);
    default: {  // /metrics
      auto st = s.stats();
      return json{{"agents", st.agents}, {"entities", st.entities}};
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const NanoCtrlConfig& cfg = config();
  MemoryStore store;
  ControlService service(store, cfg);

  std::string_view in(reinterpret_cast<const char*>(data), size);
  int requests = 0;
  while (!in.empty() && requests++ < 64) {
    const size_t end = in.find('\xff');
    std::string_view record = in.substr(0, end);
    in = end == std::string_view::npos ? std::string_view() : in.substr(end + 1);
    if (record.empty()) continue;
    const auto selector = static_cast<uint8_t>(record[0]);
    const std::string body_text(record.substr(1));
    try {
      json reply = call(service, selector, parse_body(body_text));
      // The server answers with dump(replace): it must not throw.
      const std::string text = reply.dump(-1, ' ', false, json::error_handler_t::replace);
      FUZZ_CHECK(!text.empty());
    } catch (const ApiError& e) {
      FUZZ_CHECK(e.status() >= 400 && e.status() < 500);
      FUZZ_CHECK(std::strlen(e.what()) > 0);
      // The error body is dumped the same way.
      const std::string text = json{{"status", "error"}, {"message", e.what()}}.dump(
          -1, ' ', false, json::error_handler_t::replace);
      FUZZ_CHECK(!text.empty());
    } catch (const StoreUnavailable&) {
      FUZZ_CHECK(false && "the memory store is never unavailable");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "route %d -> HTTP 500: %s\nbody: %s\n", selector % kRoutes, e.what(), body_text.c_str());
      FUZZ_CHECK(false && "an exception other than ApiError (HTTP 500) from a request body");
    }
  }
  return 0;
}
