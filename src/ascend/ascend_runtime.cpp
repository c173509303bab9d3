// Which HIXL and which NPU memory this process uses (hixl_engine.h, npu_memory.h): the
// simulation under DLSLIME_ASCEND_SIM=1, read on each call, else the CANN library. Never a
// fallback from one to the other.
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "ascend/hixl_engine.h"
#include "ascend/npu_memory.h"
#include "dlslime/errors.h"

namespace dlslime::ascend {

std::string hixl_status_name(uint32_t status) {
  const char* name = nullptr;
  switch (status) {
    case kHixlSuccess: name = "SUCCESS"; break;
    case kHixlParamInvalid: name = "PARAM_INVALID"; break;
    case kHixlTimeout: name = "TIMEOUT"; break;
    case kHixlNotConnected: name = "NOT_CONNECTED"; break;
    case kHixlAlreadyConnected: name = "ALREADY_CONNECTED"; break;
    case kHixlNotifyFailed: name = "NOTIFY_FAILED"; break;
    case kHixlUnsupported: name = "UNSUPPORTED"; break;
    case kHixlResourceExhausted: name = "RESOURCE_EXHAUSTED"; break;
    case kHixlFailed: name = "FAILED"; break;
    default: return fmt::format("status {}", status);
  }
  return fmt::format("{} ({})", name, status);
}

bool sim_selected() {
  const char* v = std::getenv("DLSLIME_ASCEND_SIM");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

std::unique_ptr<HixlEngine> make_engine() { return sim_selected() ? make_sim_engine() : make_library_engine(); }

std::string unavailable_reason() { return sim_selected() ? std::string() : library_unavailable_reason(); }

NpuMemory& npu_memory() { return sim_selected() ? sim_npu_memory() : acl_npu_memory(); }

}  // namespace dlslime::ascend
