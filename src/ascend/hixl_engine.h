// The Ascend vendor seam (docs/ascend.md, "The seam"): every call the Ascend transport makes
// into Huawei's transfer library goes through this one small interface. It mirrors
// hixl::Hixl (CANN >= 8.5; hixl/hixl.h, hixl_types.h), which is also the shape of the older
// adxl::AdxlEngine (CANN >= 8.2): one engine per process-side endpoint, named "ip:port",
// that registers memory, connects to other engines by name and moves bytes between its
// registered memory and theirs.
//
// Two implementations: the library itself (hixl_library.cpp, compiled in when the CANN
// toolkit is found at build time), and the strict simulation (sim_hixl.cpp,
// DLSLIME_ASCEND_SIM=1), which follows the library's documented behaviour, status codes
// included, so that code that passes on it has a real chance on an NPU. The seam stays at
// this C++ interface rather than at an ABI (as the simulated GPU and NIC do): HIXL is a C++
// class, not a C ABI a library could stand in for.
//
// Calls return the library's status codes (HixlStatus) and never throw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dlslime/export.h"

namespace dlslime::ascend {

// hixl_types.h's status codes, with their values: they appear in our error messages, and
// users search the vendor's docs for them.
enum HixlStatus : uint32_t {
  kHixlSuccess = 0,
  kHixlParamInvalid = 103900,
  kHixlTimeout = 103901,
  kHixlNotConnected = 103902,
  kHixlAlreadyConnected = 103903,
  kHixlNotifyFailed = 103904,
  kHixlUnsupported = 103905,
  kHixlResourceExhausted = 203900,
  kHixlFailed = 503900,
};
// "PARAM_INVALID (103900)"; "status 42" for a code the library does not document.
std::string hixl_status_name(uint32_t status);

enum class MemType { kDevice, kHost };   // MEM_DEVICE, MEM_HOST
enum class TransferOp { kRead, kWrite };  // READ: remote -> local; WRITE: local -> remote
// An async request's state. TIMEOUT is declared by the library but never reported (it sets
// no deadline of its own); a request is consumed once a final state has been read.
enum class TransferStatus { kWaiting, kCompleted, kTimeout, kFailed };

struct MemDesc {
  uintptr_t addr = 0;
  size_t len = 0;
};
using MemHandle = void*;

// One contiguous copy. remote_addr is the peer's own virtual address, inside memory the peer
// had registered when the link was made.
struct TransferOpDesc {
  uintptr_t local_addr = 0;
  uintptr_t remote_addr = 0;
  size_t len = 0;
};
using TransferReq = void*;

// A notify: `name` is the sending engine's name as the receiver's GetNotifies reports it
// (the library fills it in; what a sender puts there is ignored); `notify_msg` is the
// payload. Each field is at most kMaxNotifyField characters.
struct NotifyDesc {
  std::string name;
  std::string notify_msg;
};
inline constexpr size_t kMaxNotifyField = 1024;
// Unread notifies one link holds at the receiver; a SendNotify past it is RESOURCE_EXHAUSTED.
inline constexpr size_t kMaxUnreadNotifies = 4096;

// Option keys the library takes at Initialize (values are strings, as in the library).
// The transport validates them (ascend_options.cpp) before they reach an engine.
using EngineOptions = std::map<std::string, std::string>;

class HixlEngine {
 public:
  virtual ~HixlEngine() = default;

  // `local_engine` is "ip" (a client only: it connects but nobody can connect to it) or
  // "ip:port" with port > 0 (it also listens there). PARAM_INVALID for a malformed name or
  // option; FAILED when the name cannot be served (the port is taken).
  virtual uint32_t Initialize(const std::string& local_engine, const EngineOptions& options) = 0;
  // Disconnects every link and deregisters everything. Idempotent.
  virtual void Finalize() = 0;

  // Memory a transfer may use, on either side. A remote engine sees what was registered
  // when its link was made (Connect snapshots it): memory registered later is not
  // reachable through an existing link.
  virtual uint32_t RegisterMem(const MemDesc& mem, MemType type, MemHandle& handle) = 0;
  virtual uint32_t DeregisterMem(MemHandle handle) = 0;

  // Makes the link from this engine to `remote_engine` ("ip:port"). TIMEOUT when nobody
  // serves the name within timeout_ms; ALREADY_CONNECTED for a second Connect.
  virtual uint32_t Connect(const std::string& remote_engine, int32_t timeout_ms) = 0;
  // NOT_CONNECTED without a link. Requests in flight on the link fail.
  virtual uint32_t Disconnect(const std::string& remote_engine, int32_t timeout_ms) = 0;

  // A batch succeeds or fails as a whole; NOT_CONNECTED without a link, PARAM_INVALID for a
  // range outside registered memory on either side, TIMEOUT past timeout_ms (after which
  // the library requires the link to be disconnected before it is used again).
  virtual uint32_t TransferSync(const std::string& remote_engine, TransferOp op,
                                const std::vector<TransferOpDesc>& descs, int32_t timeout_ms) = 0;
  // Starts the batch and returns at once with `req`; GetTransferStatus tells its state.
  // Errors the library sees before starting (NOT_CONNECTED, PARAM_INVALID) are returned here.
  virtual uint32_t TransferAsync(const std::string& remote_engine, TransferOp op,
                                 const std::vector<TransferOpDesc>& descs, TransferReq& req) = 0;
  // PARAM_INVALID for an unknown or already consumed request.
  virtual uint32_t GetTransferStatus(TransferReq req, TransferStatus& status) = 0;

  // Over the link to `remote_engine`: NOT_CONNECTED without one, PARAM_INVALID for a field
  // past kMaxNotifyField, RESOURCE_EXHAUSTED when the receiver holds kMaxUnreadNotifies of
  // this link's notifies unread, NOTIFY_FAILED when it cannot be delivered.
  virtual uint32_t SendNotify(const std::string& remote_engine, const NotifyDesc& notify, int32_t timeout_ms) = 0;
  // Takes every notify received since the last call, from all links, in arrival order.
  virtual uint32_t GetNotifies(std::vector<NotifyDesc>& notifies) = 0;

  // What this library supports, for the transport to choose its path: whether TransferAsync
  // and SendNotify exist (ADXL before 8.3 has neither async transfers nor notifies).
  struct Capability {
    bool transfer_async = true;
    bool notify = true;
  };
  virtual Capability GetCapability() const = 0;
};

// Which library makes engines in this process: the simulation when DLSLIME_ASCEND_SIM=1
// (read on each call), else the CANN library compiled in. Never falls back from one to the
// other.
//  - make_engine: a new, uninitialized engine, or throws ConnectionError naming what is
//    missing (no CANN toolkit in this build, the CANN runtime or the NPU at run time) and
//    DLSLIME_ASCEND_SIM.
//  - unavailable_reason: "" when make_engine would succeed, else why not, for
//    available_transports().
std::unique_ptr<HixlEngine> make_engine();
DLSLIME_API std::string unavailable_reason();
DLSLIME_API bool sim_selected();

// The library adapters behind make_engine (each in its own file).
std::unique_ptr<HixlEngine> make_sim_engine();
std::unique_ptr<HixlEngine> make_library_engine();  // throws ConnectionError where absent
std::string library_unavailable_reason();            // "" when make_library_engine succeeds

inline constexpr const char* kSimHint = "set DLSLIME_ASCEND_SIM=1 to use the simulated HIXL";

}  // namespace dlslime::ascend
