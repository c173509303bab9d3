// The verbs seam: every libibverbs call the RDMA transport makes goes through this one
// small interface, so the same transport code runs on a real NIC (ibverbs_provider.cpp)
// and on the strict simulated device that CI uses (docs/rdma.md): the same adapter
// (ibverbs_provider.cpp) over libibverbs.so.1 or over the simulated device's library,
// which exports the libibverbs ABI (sim_ibverbs.cpp).
//
// The interface mirrors verbs closely (same objects, same state machine, same work
// request and completion fields, same error codes) so that the real provider stays a thin
// translation and code that passes on the simulated device has a real chance on hardware.
//
// Error convention (one rule, the one verbs itself follows):
//  - Calls that create an object (open, alloc_pd, reg_mr, create_cq, create_qp) or that
//    query one throw VerbsError, which carries the errno-like code and says what failed.
//  - Calls on the data path and state changes return an int: 0 on success, else a
//    positive errno (post_send/post_recv: ENOMEM when the queue is full, EINVAL for a bad
//    sge count or inline length or a QP in the wrong state; modify: EINVAL for an illegal
//    transition). CompletionQueue::poll returns the number of completions (>= 0) or a
//    negative errno (-EOVERFLOW once the CQ has overrun), as ibv_poll_cq does.
// Failures of the work itself are never call errors: they are work completions with a
// status (WcStatus), delivered asynchronously, as on hardware.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlslime/errors.h"

namespace dlslime::rdma {

// A verbs call failed synchronously. code() is kFailed (or kInvalidArgument for a bad
// argument); error_number() is the errno verbs gave (or the simulated device's).
class VerbsError : public Error {
 public:
  VerbsError(int error_number, const std::string& what, StatusCode code = StatusCode::kFailed)
      : Error(code, what), error_number_(error_number) {}
  int error_number() const noexcept { return error_number_; }

 private:
  int error_number_;
};

enum class PortState { kDown, kInit, kArmed, kActive, kOther };
enum class LinkLayer { kUnspecified, kInfiniBand, kEthernet };
enum class GidType { kUnknown, kIb, kRoceV1, kRoceV2 };

// IB path MTU values (enum ibv_mtu numbering) and their size in bytes.
enum class Mtu : uint8_t { k256 = 1, k512 = 2, k1024 = 3, k2048 = 4, k4096 = 5 };
constexpr int mtu_bytes(Mtu mtu) noexcept { return 128 << static_cast<int>(mtu); }

const char* port_state_name(PortState state) noexcept;
const char* link_layer_name(LinkLayer layer) noexcept;
const char* gid_type_name(GidType type) noexcept;

struct PortAttr {
  PortState state = PortState::kDown;
  LinkLayer link_layer = LinkLayer::kUnspecified;
  Mtu active_mtu = Mtu::k1024;
  uint16_t lid = 0;
  int gid_table_len = 0;
};

using GidBytes = std::array<uint8_t, 16>;

struct GidEntry {
  GidBytes gid{};
  GidType type = GidType::kUnknown;
  bool empty() const noexcept;  // all zero: an unused table slot
};
std::string gid_to_string(const GidBytes& gid);  // "fe80:0000:...", 8 groups

// Memory region access flags (IBV_ACCESS_* values, so the real provider passes them as is).
enum Access : uint32_t {
  kLocalWrite = 1,
  kRemoteWrite = 2,
  kRemoteRead = 4,
};

enum class QpState { kReset, kInit, kRtr, kRts, kErr };
const char* qp_state_name(QpState state) noexcept;

struct QpCaps {
  uint32_t max_send_wr = 128;
  uint32_t max_recv_wr = 128;
  uint32_t max_send_sge = 4;
  uint32_t max_recv_sge = 4;
  uint32_t max_inline_data = 64;
};

// ibv_wc_status values for the statuses RC traffic produces; others map to kGeneralErr.
enum class WcStatus : int {
  kSuccess = 0,
  kLocLenErr = 1,
  kLocQpOpErr = 2,
  kLocProtErr = 4,
  kWrFlushErr = 5,
  kRemInvReqErr = 9,
  kRemAccessErr = 10,
  kRemOpErr = 11,
  kRetryExcErr = 12,
  kRnrRetryExcErr = 13,
  kGeneralErr = 21,
};
const char* wc_status_name(WcStatus status) noexcept;  // "REM_ACCESS_ERR", as ibv_wc_status_str

enum class WrOpcode { kRdmaWrite, kRdmaWriteWithImm, kRdmaRead, kSend, kSendWithImm };
enum class WcOpcode { kSend, kRdmaWrite, kRdmaRead, kRecv, kRecvRdmaWithImm };
const char* wc_opcode_name(WcOpcode opcode) noexcept;

struct Sge {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

// One send work request; `next` links a list posted in one call (ibv_send_wr).
struct SendWr {
  uint64_t wr_id = 0;
  SendWr* next = nullptr;
  const Sge* sg_list = nullptr;
  int num_sge = 0;
  WrOpcode opcode = WrOpcode::kRdmaWrite;
  bool signaled = true;
  bool inline_data = false;  // copy the payload at post time (total <= max_inline_data)
  uint32_t imm_data = 0;     // for *_WITH_IMM (host order here; providers convert)
  uint64_t remote_addr = 0;  // for RDMA ops
  uint32_t rkey = 0;
};

struct RecvWr {
  uint64_t wr_id = 0;
  RecvWr* next = nullptr;
  const Sge* sg_list = nullptr;
  int num_sge = 0;
};

struct WorkCompletion {
  uint64_t wr_id = 0;
  WcStatus status = WcStatus::kSuccess;
  WcOpcode opcode = WcOpcode::kSend;  // meaningful for successful completions, as in verbs
  uint32_t byte_len = 0;              // receives: the bytes that arrived
  bool has_imm = false;
  uint32_t imm_data = 0;
  uint32_t qp_num = 0;
};

// The attributes of the RC state transitions (ibv_modify_qp with the usual masks).
struct RcInitAttr {
  uint8_t port = 1;
  uint16_t pkey_index = 0;
  uint32_t access = kLocalWrite | kRemoteWrite | kRemoteRead;  // what remote peers may do to this QP
};

struct RcRtrAttr {
  uint32_t remote_qpn = 0;
  uint32_t rq_psn = 0;  // the remote's send PSN
  Mtu path_mtu = Mtu::k1024;
  GidBytes remote_gid{};
  uint16_t remote_lid = 0;
  bool use_gid = true;  // RoCE always; IB across subnets
  uint8_t sgid_index = 0;
  uint8_t hop_limit = 64;
  uint8_t traffic_class = 0;
  uint8_t service_level = 0;
  uint8_t max_dest_rd_atomic = 16;
  uint8_t min_rnr_timer = 12;  // IB encoding (12 = 0.64 ms); what this responder asks senders to wait
};

struct RcRtsAttr {
  uint32_t sq_psn = 0;
  uint8_t timeout = 14;    // ack timeout 4.096 us * 2^timeout (0 = infinite)
  uint8_t retry_cnt = 7;   // transport retries before RETRY_EXC_ERR
  uint8_t rnr_retry = 7;   // RNR retries before RNR_RETRY_EXC_ERR (7 = infinite)
  uint8_t max_rd_atomic = 16;
};

class ProtectionDomain;

class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  virtual uint64_t addr() const = 0;
  virtual size_t length() const = 0;
  virtual uint32_t lkey() const = 0;
  virtual uint32_t rkey() const = 0;
};

// A completion queue with its own completion channel. channel_fd() is a non-blocking fd
// that becomes readable once the CQ was armed (req_notify) and a completion arrived, so it
// can sit in epoll or an asio descriptor. After it fires: ack_events(), then req_notify()
// again, then poll until empty (the order verbs requires to not miss a completion).
class CompletionQueue {
 public:
  virtual ~CompletionQueue() = default;
  virtual int depth() const = 0;
  virtual int poll(int max, WorkCompletion* out) = 0;
  virtual int req_notify() = 0;
  virtual int channel_fd() const = 0;
  // Consumes the pending channel events (ibv_get_cq_event + ibv_ack_cq_events); returns
  // how many there were (0 when none: the fd is non-blocking).
  virtual int ack_events() = 0;
};

class QueuePair {
 public:
  virtual ~QueuePair() = default;
  virtual uint32_t qp_num() const = 0;
  virtual QpState state() const = 0;
  virtual const QpCaps& caps() const = 0;  // the caps granted (at least those asked)
  virtual int modify_to_init(const RcInitAttr& attr) = 0;
  virtual int modify_to_rtr(const RcRtrAttr& attr) = 0;
  virtual int modify_to_rts(const RcRtsAttr& attr) = 0;
  virtual int modify_to_err() = 0;
  // Posts a linked list; on failure *bad_wr is the first WR not posted (those before it are).
  virtual int post_send(const SendWr* wr, const SendWr** bad_wr) = 0;
  virtual int post_recv(const RecvWr* wr, const RecvWr** bad_wr) = 0;
};

class ProtectionDomain {
 public:
  virtual ~ProtectionDomain() = default;
  // Host memory, or device memory where the platform lets the NIC pin it by address (a
  // peer-memory module: nvidia-peermem); elsewhere device memory fails (EFAULT).
  virtual std::unique_ptr<MemoryRegion> reg_mr(void* addr, size_t length, uint32_t access) = 0;
  // ibv_reg_dmabuf_mr: [offset, +length) of the dma-buf `fd` (borrowed: the MR holds the
  // buffer itself), addressed in work requests as [iova, +length). EOPNOTSUPP (or ENOSYS)
  // where the kernel, the NIC's driver or rdma-core cannot; EINVAL for an fd that is no
  // dma-buf or a range past it.
  virtual std::unique_ptr<MemoryRegion> reg_dmabuf_mr(uint64_t offset, size_t length, uint64_t iova, int fd,
                                                      uint32_t access) = 0;
  // An RC QP whose sends complete on send_cq and receives on recv_cq (which may be the same).
  virtual std::unique_ptr<QueuePair> create_rc_qp(CompletionQueue& send_cq, CompletionQueue& recv_cq,
                                                  const QpCaps& caps) = 0;
};

// The device's limits (ibv_query_device): a QP or CQ asking for more fails at creation.
struct DeviceCaps {
  uint32_t max_qp_wr = 0;
  uint32_t max_sge = 0;
  int max_cqe = 0;
};

// An open device (ibv_context). Objects made from it must be destroyed before it.
class Context {
 public:
  virtual ~Context() = default;
  virtual const std::string& device_name() const = 0;
  virtual DeviceCaps query_device() = 0;
  virtual PortAttr query_port(uint8_t port) = 0;
  virtual GidEntry query_gid(uint8_t port, int index) = 0;
  virtual std::unique_ptr<ProtectionDomain> alloc_pd() = 0;
  virtual std::unique_ptr<CompletionQueue> create_cq(int depth) = 0;
};

class Provider {
 public:
  virtual ~Provider() = default;
  virtual const char* name() const = 0;  // "ibverbs" or "sim"
  virtual std::vector<std::string> list_devices() = 0;
  virtual std::unique_ptr<Context> open(const std::string& device_name) = 0;  // NotFoundError if unknown
};

// The provider this process uses: the simulated device when DLSLIME_RDMA_SIM=1 (read on
// each call, never at static initialisation), libibverbs otherwise. Never falls back
// from one to the other. Both are the same adapter (ibverbs_provider.cpp) over a library
// with the libibverbs ABI: libibverbs.so.1, or libdlslime_sim_ibverbs.so.
Provider& provider();
Provider& ibverbs_provider();
Provider& sim_provider();

// The simulated device's live objects, and the destroys it refused as verbs does (EBUSY: a
// PD, CQ, completion channel or context destroyed while children of it still lived, or a
// CQ with unacknowledged events; the object leaks, on a NIC as on the simulated device).
// Loads the simulated device's library if it is not loaded yet (ConnectionError if it
// cannot be).
struct SimObjectCounts {
  int64_t contexts = 0, pds = 0, mrs = 0, cqs = 0, qps = 0, comp_channels = 0, destroy_failures = 0;
  int64_t cqes = 0, recv_wrs = 0;  // entries the live CQs and QP receive queues hold
  int64_t fork_init = 0;           // 1 once ibv_fork_init was called, before any device was opened
};
DLSLIME_API SimObjectCounts sim_object_counts();  // exported for dlslime.testing
bool sim_selected();  // DLSLIME_RDMA_SIM=1; unset, empty or 0: no; anything else throws InvalidArgumentError

// Why there is no device to use, for probes and errors.
inline constexpr const char* kNoDeviceReason =
    "no RDMA device found (set DLSLIME_RDMA_SIM=1 to use the simulated device)";

}  // namespace dlslime::rdma
