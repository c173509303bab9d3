// The simulated RDMA device behind DLSLIME_RDMA_SIM=1 (docs/rdma.md, "The simulated
// device"): its state (MRs, CQs, QPs), the engine thread that executes posted work like a
// NIC would, and the fault-injection hooks tests use. sim_ibverbs.cpp puts it behind the
// libibverbs ABI, in its own shared library (libdlslime_sim_ibverbs.so), so the library's
// real verbs adapter (ibverbs_provider.cpp) is the code that drives it. This header is
// internal to that library, src/rdma and the tests; the functions marked DLSLIME_SIM_API
// are the ones the shared library exports besides the verbs ABI.
//
// One Fabric per process, shared by every open "sim_rdma0" context: two QPs of two
// contexts connected to each other talk through it, as two ports on one switch would.
// Every process is its own host: its port's GID encodes its pid (device_gid()), and a QP
// addressed by another process's GID is reached over the host-local link (sim_link.h),
// where that process's fabric answers as the responder and moves the bytes itself.
// Everything is guarded by one mutex; the engine thread is the only one that starts work
// or produces send completions, so nothing completes inside post_send.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <queue>
#include <thread>
#include <unordered_map>
#include <vector>

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>

#include "rdma/verbs.h"

// Exported by libdlslime_sim_ibverbs.so (compiled with hidden visibility like the rest).
#define DLSLIME_SIM_API __attribute__((visibility("default")))

namespace dlslime::rdma::sim {

inline constexpr const char* kDeviceName = "sim_rdma0";
inline constexpr uint8_t kPort = 1;
inline constexpr Mtu kActiveMtu = Mtu::k4096;
// Device limits (create_* beyond them fails with EINVAL, as ibv_create_qp does).
inline constexpr uint32_t kMaxQpWr = 16384;
inline constexpr uint32_t kMaxSge = 30;
inline constexpr uint32_t kMaxInline = 256;
inline constexpr int kMaxCqe = 65536;

// The one GID of port 1 in this process: ::ffff:127.a.b.c (IPv4-mapped, RoCE v2) where
// a.b.c is the pid (pids fit in 22 bits), so each process is a separate, addressable host.
DLSLIME_SIM_API GidBytes device_gid();
// The pid a simulated GID names, or 0 for a GID no simulated device has.
DLSLIME_SIM_API pid_t gid_pid(const GidBytes& gid);

using Clock = std::chrono::steady_clock;

struct Mr {
  uint64_t addr = 0;
  size_t length = 0;
  uint32_t access = 0;
  uint32_t pd = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  // Device memory (GPUDirect RDMA): where the NIC reads and writes the MR's bytes, its own
  // view of them (from the peer-memory client below), never the device address host code
  // cannot touch. Null for host memory, which the NIC reaches at its address.
  uint8_t* nic = nullptr;
  std::shared_ptr<const void> keep;  // holds that view while the MR exists
  // The address the engine copies from or to for [a, ...) inside this MR.
  uint64_t dma_addr(uint64_t a) const { return nic ? reinterpret_cast<uint64_t>(nic) + (a - addr) : a; }
};

// Which device memory the simulated NIC can register (DLSLIME_RDMA_SIM_DEVICE_MEMORY, read
// at each registration): "dmabuf", "peermem", both comma-separated (the default, unset or
// empty) or "none". Anything else is an InvalidArgumentError naming the variable.
struct DeviceMemorySupport {
  bool dmabuf = true;
  bool peermem = true;
};
DeviceMemorySupport device_memory_support();

// The NIC's own view of device memory it registered (GPUDirect RDMA).
struct DeviceView {
  uint8_t* data = nullptr;           // the view of the first byte asked for
  std::shared_ptr<const void> keep;  // holds the view (and the pages) while the MR exists
};

// How the simulated NIC reaches a GPU's memory, as nvidia-peermem (peer memory) and the
// dma-buf importer do for a real one: the GPU side registers itself as this client, and
// the NIC asks it at registration. Each call returns the view, or nullopt with `error` set
// (view: empty `error` means "no device memory at all", so the range is host memory).
struct PeerMemory {
  std::function<std::optional<DeviceView>(uintptr_t addr, size_t length, std::string& error)> view;
  std::function<std::optional<DeviceView>(int fd, uint64_t offset, size_t length, std::string& error)> map_dmabuf;
};

struct Cq {
  explicit Cq(int depth) : depth(depth) {}
  struct Entry {
    WorkCompletion wc;
    uint32_t qpn = 0;
    bool send_queue = false;
    uint64_t seq = 0;  // the WR's position in its queue: polling it frees the slots up to it
  };
  int depth;
  std::deque<Entry> entries;
  bool overrun = false;  // more completions than depth arrived: the CQ is in error
  bool armed = false;
  // Raises a completion event on the CQ's channel (called with the fabric's lock held).
  std::function<void()> on_event;
  void signal() {
    if (on_event) on_event();
  }
};

struct PostedSend {
  SendWr wr;  // next and sg_list are not used: sges/inline_bytes hold copies
  std::vector<Sge> sges;
  std::vector<uint8_t> inline_bytes;
  uint64_t seq = 0;
  uint32_t rnr_tries = 0;
  uint32_t retry_tries = 0;
};

// What the requester's engine sends the responder for one WR (its packets, as one unit).
// Addresses in `sges` are the requester's: the responder copies from or to them itself.
struct RequestHeader {
  uint64_t token = 0;  // names this attempt in the answer
  GidBytes src_gid{};
  uint32_t src_qpn = 0;
  uint32_t dst_qpn = 0;
  uint32_t psn = 0;
  uint32_t packets = 1;  // PSNs the WR takes: ceil(bytes / path MTU), at least one
  WrOpcode opcode = WrOpcode::kRdmaWrite;
  uint32_t rkey = 0;
  uint64_t remote_addr = 0;
  uint32_t imm_data = 0;
  uint64_t total = 0;  // payload bytes
  bool inline_data = false;
};

struct Request {
  RequestHeader h;
  std::vector<Sge> sges;             // the requester's buffers (not for inline)
  std::vector<uint8_t> inline_bytes;  // the payload itself, for inline WRs
};

// The responder's answer, as the requester's NIC would see it on the wire.
enum class Reply : uint8_t {
  kAck,
  kNoAck,      // nothing answered (no such QP, not connected back, wrong state or PSN): retry
  kRnr,        // no receive posted: retry after min_rnr_timer
  kRemAccess,  // NAK remote access error
  kRemInvReq,  // NAK invalid request (message longer than the receive)
  kRemOpErr,   // NAK remote operational error (bad receive buffer, or the copy failed)
};

struct Answer {
  Reply reply = Reply::kNoAck;
  uint8_t min_rnr_timer = 0;  // for kRnr
};

class Link;

struct PostedRecv {
  uint64_t wr_id = 0;
  std::vector<Sge> sges;
  uint64_t seq = 0;
};

struct Qp {
  uint32_t qpn = 0;
  uint32_t pd = 0;
  std::shared_ptr<Cq> send_cq;
  std::shared_ptr<Cq> recv_cq;
  QpCaps caps;
  QpState state = QpState::kReset;
  RcInitAttr init;
  RcRtrAttr rtr;
  RcRtsAttr rts;
  uint32_t next_send_psn = 0;  // requester side, advanced per packet
  uint32_t expected_psn = 0;   // responder side
  std::deque<PostedSend> sq;
  std::deque<PostedRecv> rq;
  // Queue slots are freed when a completion at or after the WR is polled (as mlx5 does),
  // so a queue of unsignaled WRs fills up just as it does on hardware.
  uint64_t sq_posted = 0, sq_freed = 0;
  uint64_t rq_posted = 0, rq_freed = 0;
  // A WR waiting for an RNR or ACK retry runs again no earlier than this.
  Clock::time_point last_retry_at{};
  // The head WR was sent to another process and awaits its answer (token != 0). The
  // wait counts as ACK timeouts: each `inflight_deadline` passed is one retry.
  uint64_t inflight_token = 0;
  uint64_t inflight_link = 0;  // the connection it went on (its loss is a lost answer)
  Clock::time_point inflight_deadline{};
  // Completions not yet delivered because of an injected delay (they keep their order).
  int delayed_in_flight = 0;
  Clock::time_point last_delivery_at{};
  // Fault injection and observation.
  std::chrono::microseconds completion_delay{0};
  int drop_completions = 0;
  uint64_t rnr_naks = 0;
};

class Fabric {
 public:
  // The process's fabric, created with the first context and gone with the last object.
  static std::shared_ptr<Fabric> acquire();
  static std::shared_ptr<Fabric> current();  // nullptr when nothing is open
  Fabric();
  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  std::mutex mu;
  uint32_t new_pd();
  Mr& add_mr(uint64_t addr, size_t length, uint32_t access, uint32_t pd, uint8_t* nic = nullptr,
             std::shared_ptr<const void> keep = nullptr);
  void remove_mr(uint32_t lkey);
  std::shared_ptr<Qp> add_qp(uint32_t pd, std::shared_ptr<Cq> send_cq, std::shared_ptr<Cq> recv_cq, const QpCaps& caps);
  void remove_qp(uint32_t qpn);

  // The calls behind QueuePair and CompletionQueue (lock held by the caller: `mu`).
  int modify(Qp& qp, QpState to, const RcInitAttr* init, const RcRtrAttr* rtr, const RcRtsAttr* rts);
  int post_send(Qp& qp, const SendWr* wr, const SendWr** bad_wr);
  int post_recv(Qp& qp, const RecvWr* wr, const RecvWr** bad_wr);
  int poll(Cq& cq, int max, WorkCompletion* out);

  // Fault injection (tests). Each throws NotFoundError for an unknown QP number.
  void fail_qp(uint32_t qpn);                                      // to ERR, flushing its WRs
  void delay_completions(uint32_t qpn, std::chrono::microseconds delay);  // later completions
  void drop_completions(uint32_t qpn, int count);                  // lose the next `count`
  uint64_t rnr_naks(uint32_t qpn);                                 // RNR NAKs its sends got

  // The responder side of one WR (lock held): checks it against this fabric's QPs and MRs
  // exactly as an RC responder does, moves the bytes (from or to the requester's process,
  // `requester` = 0 for this one), completes the receive it consumes. Also the entry
  // point for requests from other processes (sim_link.cpp).
  Answer respond(const Request& rq, pid_t requester);
  // The answer to a request this fabric sent to another process (lock held).
  void on_answer(uint32_t qpn, uint64_t token, const Answer& answer);
  // A connection to another process closed: its unanswered requests are lost (lock held).
  void on_link_lost(uint64_t link);

 private:
  struct Event {
    Clock::time_point at;
    uint64_t order;
    uint32_t qpn;  // progress this QP's send queue (or flush it)
    bool deliver = false;
    std::shared_ptr<Cq> cq;  // deliver: this completion
    Cq::Entry entry;
    bool operator>(const Event& o) const { return at != o.at ? at > o.at : order > o.order; }
  };

  void run();
  void schedule_progress(Qp& qp, Clock::time_point at);
  void progress(Qp& qp);
  // Starts qp's first send WR: local checks, then the responder's answer (at once for a
  // QP of this process, later over the link for another process's).
  void execute(Qp& qp);
  // Applies the responder's answer to qp's first send WR: completes it, or leaves it at
  // the head with a retry time (RNR NAK, no ACK), or fails it.
  void finish(Qp& qp, const Answer& answer);
  void fail_head(Qp& qp, WcStatus status);  // the first send WR fails; the QP goes to ERR
  void complete(Qp& qp, bool send_queue, uint64_t seq, const WorkCompletion& wc);
  void deliver(Cq& cq, const Cq::Entry& entry);
  void to_error(Qp& qp);
  void flush(Qp& qp);
  Qp* find_qp(uint32_t qpn);
  const Mr* find_key(uint32_t key, bool remote) const;
  Qp& require_qp(uint32_t qpn);

  uint32_t next_pd_ = 1;
  uint32_t next_qpn_ = 0x100;
  uint32_t next_key_;
  uint64_t next_order_ = 0;
  uint64_t next_token_ = 0;
  GidBytes gid_;
  std::unordered_map<uint32_t, Mr> mrs_;              // by lkey
  std::unordered_map<uint32_t, uint32_t> rkey_to_lkey_;
  std::unordered_map<uint32_t, std::shared_ptr<Qp>> qps_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread engine_;
  std::unique_ptr<Link> link_;  // to the other processes' devices; after engine_ (uses mu)
};

// The fault hooks on the current fabric (NotFoundError when no simulated device is open).
DLSLIME_SIM_API void fail_qp(uint32_t qpn);
DLSLIME_SIM_API void delay_completions(uint32_t qpn, std::chrono::microseconds delay);
DLSLIME_SIM_API void drop_completions(uint32_t qpn, int count);
DLSLIME_SIM_API uint64_t rnr_naks(uint32_t qpn);

}  // namespace dlslime::rdma::sim

namespace dlslime::rdma::sim {
// Registers the simulated GPU (src/gpu/sim_cudart.h) as the simulated NIC's peer-memory
// client through `set` (the library's dlslime_sim_rdma_set_peer_memory). Part of
// libdlslime (sim_peer_memory.cpp), called when it loads the simulated device's library.
void attach_simulated_gpu(void (*set)(const PeerMemory* client));
}  // namespace dlslime::rdma::sim

// What the shared library exports besides the verbs ABI, as C symbols so that libdlslime
// finds them with dlsym: its object accounting, the peer-memory client's registration, and
// the detail behind the last failed verbs call of this thread (a NIC's driver writes that
// to the kernel log; libibverbs itself only gives errno).
extern "C" {
DLSLIME_SIM_API void dlslime_sim_rdma_object_counts(dlslime::rdma::SimObjectCounts* out);
DLSLIME_SIM_API void dlslime_sim_rdma_set_peer_memory(const dlslime::rdma::sim::PeerMemory* client);
DLSLIME_SIM_API const char* dlslime_sim_rdma_last_error();
}
