// The simulated RDMA device behind the libibverbs ABI: libdlslime_sim_ibverbs.so exports the
// verbs entry points the library's adapter (ibverbs_provider.cpp) resolves, and the context
// ops table through which verbs.h's inline data-path calls (ibv_post_send, ibv_post_recv,
// ibv_poll_cq, ibv_req_notify_cq) dispatch. DLSLIME_RDMA_SIM=1 makes the adapter open this
// library instead of libibverbs.so.1, so every test on the simulated device runs the same
// adapter code a NIC runs. Compiled against rdma-core's own verbs.h: the structs, constants
// and calling conventions are the real ones.
//
// Conventions are libibverbs': a call that makes an object returns it, or NULL with errno
// set; other calls return 0 or a positive errno. Failures of the work itself are work
// completions (sim_device.cpp). The detail behind the last failure of a thread is kept for
// dlslime_sim_rdma_last_error(), as a NIC's driver would write it to the kernel log.
//
// The objects are C structs owned by this file: each verbs struct is the first member of a
// standard-layout wrapper whose second member points at the C++ state, so the pointer the
// caller holds converts back to the wrapper.
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

#include "core/host_mappings.h"
#include "core/log.h"
#include "rdma/sim_device.h"

namespace dlslime::rdma::sim {
namespace {

// --- Failure detail -------------------------------------------------------------------------

thread_local std::string last_error_text;

// Sets errno and the detail, returns `err` (for calls that return an errno).
int fail(int err, std::string detail) {
  last_error_text = std::move(detail);
  errno = err;
  return err;
}

template <class T>
T* fail_null(int err, std::string detail) {
  fail(err, std::move(detail));
  return nullptr;
}

// --- Object accounting ------------------------------------------------------------------------
//
// As verbs keeps it: a PD, CQ, completion channel or context that still has live children
// cannot be destroyed. ibv_dealloc_pd, ibv_destroy_cq, ibv_destroy_comp_channel and
// ibv_close_device then return EBUSY and the object stays (it leaks, on a NIC as here). The
// refusal is counted (destroy_failures) and logged, so a test sees the teardown order a NIC
// would punish.

struct Counts {
  std::atomic<int64_t> contexts{0}, pds{0}, mrs{0}, cqs{0}, qps{0}, comp_channels{0}, destroy_failures{0};
  std::atomic<int64_t> cqes{0}, recv_wrs{0};  // entries the live CQs and QP receive queues hold
};
Counts& counts() {
  static Counts* c = new Counts;  // never destroyed: objects may outlive static destruction
  return *c;
}

// A parent's count of its live children.
struct Children {
  std::atomic<int64_t> live{0};
};

// An object whose destroy was refused stays allocated, as on a NIC, though its caller has
// let go of it: it is kept here, so it is leaked on purpose, not lost (LeakSanitizer). A
// caller that tries again once its children are gone destroys it, and it leaves the list.
struct Refused {
  std::mutex mu;
  std::unordered_set<const void*> kept;
};
Refused& refused() {
  static auto* r = new Refused();
  return *r;
}
void keep_refused(const void* object) {
  std::lock_guard<std::mutex> lock(refused().mu);
  refused().kept.insert(object);
}
void forget_refused(const void* object) {
  std::lock_guard<std::mutex> lock(refused().mu);
  refused().kept.erase(object);
}

// Refuses the destroy of `object` while it still has children: EBUSY, counted, kept.
int refuse_if_parent(const void* object_ptr, const Children& children, const char* object, const char* kind) {
  const int64_t live = children.live.load();
  if (live == 0) return 0;
  keep_refused(object_ptr);
  ++counts().destroy_failures;
  DLSLIME_WARN("sim_rdma0: {} destroyed with {} live {}: refused with EBUSY, and the {} leaks (as on a NIC)", object,
               live, kind, object);
  return fail(EBUSY, fmt::format("{} still has {} live {}", object, live, kind));
}

// Counts one live object of a kind (and what it holds).
class Counted {
 public:
  Counted(std::atomic<int64_t>& count, int64_t amount = 1) : count_(&count), amount_(amount) { *count_ += amount_; }
  Counted(const Counted&) = delete;
  Counted& operator=(const Counted&) = delete;
  ~Counted() { *count_ -= amount_; }

 private:
  std::atomic<int64_t>* count_;
  int64_t amount_;
};

// Held by a child for its life: counts it in its parent.
class ChildOf {
 public:
  explicit ChildOf(Children& parent) : parent_(&parent) { ++parent_->live; }
  ChildOf(const ChildOf&) = delete;
  ChildOf& operator=(const ChildOf&) = delete;
  ~ChildOf() { --parent_->live; }

 private:
  Children* parent_;
};

// Whether ibv_fork_init was called, and how many devices were ever opened (it must come
// before the first).
std::atomic<bool> fork_initialized{false};
std::atomic<int64_t> devices_opened{0};

// --- The peer-memory client ------------------------------------------------------------------

std::mutex peer_memory_mu;
PeerMemory& peer_memory() {
  static PeerMemory* client = new PeerMemory;
  return *client;
}

// --- Objects ---------------------------------------------------------------------------------

template <class Verbs, class State>
struct Wrapped {
  Verbs ibv;
  State* state;
};

template <class W, class Verbs>
W* wrapper_of(Verbs* p) {
  static_assert(std::is_standard_layout_v<W>, "the verbs struct must be pointer-interconvertible with its wrapper");
  return reinterpret_cast<W*>(p);
}

struct ContextState {
  std::shared_ptr<Fabric> fabric = Fabric::acquire();
  Children children;  // its PDs, CQs and completion channels
  Counted counted{counts().contexts};
};
// An extended context (verbs_context), as every rdma-core provider has: verbs.h's inline
// wrappers find its extra ops (query_port here) through it.
struct ContextObj {
  verbs_context vctx;
  ContextState* state;
};

ContextObj* context_of(ibv_context* ctx) {
  static_assert(std::is_standard_layout_v<ContextObj>);
  return reinterpret_cast<ContextObj*>(reinterpret_cast<uint8_t*>(ctx) - offsetof(verbs_context, context));
}
ContextState& state_of(ibv_context* ctx) { return *context_of(ctx)->state; }

struct ChannelState {
  explicit ChannelState(Children& context) : parent(context) {}
  int read_fd = -1, write_fd = -1;
  std::mutex mu;
  std::deque<ibv_cq*> pending;  // CQs with an event not yet taken by ibv_get_cq_event
  Children cqs;                 // the CQs that report here
  ChildOf parent;
  Counted counted{counts().comp_channels};

  // A completion event of `cq`. The pipe holds one byte while events are pending, so the
  // fd is readable exactly then (the kernel's event file behaves the same for poll).
  void push(ibv_cq* cq) {
    std::lock_guard<std::mutex> lock(mu);
    pending.push_back(cq);
    if (pending.size() == 1) {
      const char byte = 1;
      [[maybe_unused]] ssize_t n = ::write(write_fd, &byte, 1);
    }
  }
  bool take(ibv_cq** cq) {
    std::lock_guard<std::mutex> lock(mu);
    if (pending.empty()) return false;
    *cq = pending.front();
    pending.pop_front();
    if (pending.empty()) {
      char byte = 0;
      [[maybe_unused]] ssize_t n = ::read(read_fd, &byte, 1);
    }
    return true;
  }
  void forget(ibv_cq* cq) {  // a destroyed CQ's events are dropped, as the kernel drops them
    std::lock_guard<std::mutex> lock(mu);
    const size_t before = pending.size();
    std::erase(pending, cq);
    if (before != 0 && pending.empty()) {
      char byte = 0;
      [[maybe_unused]] ssize_t n = ::read(read_fd, &byte, 1);
    }
  }
};
using ChannelObj = Wrapped<ibv_comp_channel, ChannelState>;

struct PdState {
  PdState(ContextState& context, uint32_t id) : context(context), id(id), parent(context.children) {}
  ContextState& context;
  uint32_t id;
  Children children;  // its MRs and QPs
  ChildOf parent;
  Counted counted{counts().pds};
};
using PdObj = Wrapped<ibv_pd, PdState>;

struct MrState {
  MrState(PdState& pd, uint32_t lkey) : pd(pd), lkey(lkey), parent(pd.children) {}
  PdState& pd;
  uint32_t lkey;
  ChildOf parent;
  Counted counted{counts().mrs};
};
using MrObj = Wrapped<ibv_mr, MrState>;

struct CqState {
  CqState(ContextState& context, int depth, ChannelState* channel)
      : context(context), cq(std::make_shared<Cq>(depth)), channel(channel), parent(context.children),
        entries(counts().cqes, depth) {
    if (channel) channel_child.emplace(channel->cqs);
  }
  ContextState& context;
  std::shared_ptr<Cq> cq;
  ChannelState* channel;
  Children qps;  // the QPs that complete here
  uint32_t events_taken = 0, events_acked = 0;
  ChildOf parent;
  std::optional<ChildOf> channel_child;
  Counted counted{counts().cqs};
  Counted entries;
};
using CqObj = Wrapped<ibv_cq, CqState>;

struct QueuePairState {
  QueuePairState(PdState& pd, CqState& scq, CqState& rcq, std::shared_ptr<Qp> qp, bool sig_all)
      : pd(pd), qp(std::move(qp)), sq_sig_all(sig_all), parent(pd.children), send_cq(scq.qps), recv_cq(rcq.qps),
        recv_wrs(counts().recv_wrs, this->qp->caps.max_recv_wr) {}
  PdState& pd;
  std::shared_ptr<Qp> qp;
  bool sq_sig_all;
  ChildOf parent, send_cq, recv_cq;
  Counted counted{counts().qps};
  Counted recv_wrs;
};
using QpObj = Wrapped<ibv_qp, QueuePairState>;

// --- Checks a NIC's driver makes at registration ---------------------------------------------

// As ibv_reg_mr: remote write needs local write, and only the flags this device knows.
bool access_ok(int access) {
  const int known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  return (access & ~known) == 0 && (!(access & IBV_ACCESS_REMOTE_WRITE) || (access & IBV_ACCESS_LOCAL_WRITE));
}

ibv_mr* make_mr(PdObj* pd, const Mr& mr, void* addr) {
  auto* obj = new MrObj{};
  obj->ibv.context = pd->ibv.context;
  obj->ibv.pd = &pd->ibv;
  obj->ibv.addr = addr;
  obj->ibv.length = mr.length;
  obj->ibv.handle = mr.lkey;
  obj->ibv.lkey = mr.lkey;
  obj->ibv.rkey = mr.rkey;
  obj->state = new MrState(*pd->state, mr.lkey);
  return &obj->ibv;
}

// --- ibv_modify_qp's attribute masks ----------------------------------------------------------
//
// The IB spec's table (the kernel's ib_modify_qp_is_ok, for RC): which transitions exist,
// which attributes each one requires and which it allows. A missing required attribute or
// one the transition does not take is EINVAL, as the kernel answers.

struct Transition {
  bool valid = false;
  int required = 0;
  int optional = 0;
};

Transition rc_transition(ibv_qp_state from, ibv_qp_state to) {
  if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) return {true, 0, 0};
  switch (from) {
    case IBV_QPS_RESET:
      if (to == IBV_QPS_INIT) return {true, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0};
      break;
    case IBV_QPS_INIT:
      if (to == IBV_QPS_INIT) return {true, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS};
      if (to == IBV_QPS_RTR) {
        return {true,
                IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                    IBV_QP_MIN_RNR_TIMER,
                IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX};
      }
      break;
    case IBV_QPS_RTR:
      if (to == IBV_QPS_RTS) {
        return {true, IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_TIMEOUT,
                IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
                    IBV_QP_PATH_MIG_STATE};
      }
      break;
    case IBV_QPS_RTS:
    case IBV_QPS_SQD:
      if (to == IBV_QPS_RTS) {
        return {true, 0,
                IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
                    IBV_QP_MIN_RNR_TIMER};
      }
      break;
    default: break;
  }
  return {};
}

ibv_qp_state verbs_state(QpState s) {
  switch (s) {
    case QpState::kReset: return IBV_QPS_RESET;
    case QpState::kInit: return IBV_QPS_INIT;
    case QpState::kRtr: return IBV_QPS_RTR;
    case QpState::kRts: return IBV_QPS_RTS;
    case QpState::kErr: return IBV_QPS_ERR;
  }
  return IBV_QPS_ERR;
}

const char* verbs_state_name(ibv_qp_state s) {
  switch (s) {
    case IBV_QPS_RESET: return "RESET";
    case IBV_QPS_INIT: return "INIT";
    case IBV_QPS_RTR: return "RTR";
    case IBV_QPS_RTS: return "RTS";
    case IBV_QPS_SQD: return "SQD";
    case IBV_QPS_SQE: return "SQE";
    case IBV_QPS_ERR: return "ERR";
    default: return "?";
  }
}

// --- The data path (the context's ops table) -------------------------------------------------

bool wr_opcode(ibv_wr_opcode op, WrOpcode* out) {
  switch (op) {
    case IBV_WR_RDMA_WRITE: *out = WrOpcode::kRdmaWrite; return true;
    case IBV_WR_RDMA_WRITE_WITH_IMM: *out = WrOpcode::kRdmaWriteWithImm; return true;
    case IBV_WR_RDMA_READ: *out = WrOpcode::kRdmaRead; return true;
    case IBV_WR_SEND: *out = WrOpcode::kSend; return true;
    case IBV_WR_SEND_WITH_IMM: *out = WrOpcode::kSendWithImm; return true;
    default: return false;  // atomics, invalidate, bind, TSO: not on this device
  }
}

static_assert(sizeof(Sge) == sizeof(ibv_sge) && offsetof(Sge, lkey) == offsetof(ibv_sge, lkey));

int sim_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  QueuePairState& q = *wrapper_of<QpObj>(qp)->state;
  std::vector<SendWr> wrs;
  std::vector<ibv_send_wr*> originals;
  ibv_send_wr* unsupported = nullptr;  // the first WR with an opcode this device lacks
  for (ibv_send_wr* w = wr; w != nullptr; w = w->next) {
    SendWr o;
    if (!wr_opcode(w->opcode, &o.opcode)) {
      unsupported = w;  // those before it are posted, as on hardware
      break;
    }
    o.wr_id = w->wr_id;
    o.sg_list = reinterpret_cast<const Sge*>(w->sg_list);
    o.num_sge = w->num_sge;
    o.signaled = q.sq_sig_all || (w->send_flags & IBV_SEND_SIGNALED) != 0;
    o.inline_data = (w->send_flags & IBV_SEND_INLINE) != 0;
    o.imm_data = ntohl(w->imm_data);
    o.remote_addr = w->wr.rdma.remote_addr;
    o.rkey = w->wr.rdma.rkey;
    wrs.push_back(o);
    originals.push_back(w);
  }
  for (size_t i = 0; i + 1 < wrs.size(); ++i) wrs[i].next = &wrs[i + 1];
  int rc = 0;
  const SendWr* bad = nullptr;
  if (!wrs.empty()) {
    std::lock_guard<std::mutex> lock(q.pd.context.fabric->mu);
    rc = q.pd.context.fabric->post_send(*q.qp, wrs.data(), &bad);
  }
  if (rc != 0) {
    if (bad_wr) *bad_wr = originals[static_cast<size_t>(bad - wrs.data())];
    return fail(rc, fmt::format("post_send on QP {}: refused ({})", qp->qp_num, std::strerror(rc)));
  }
  if (unsupported) {
    if (bad_wr) *bad_wr = unsupported;
    return fail(EINVAL, fmt::format("post_send on QP {}: opcode {} is not supported by the simulated device",
                                    qp->qp_num, static_cast<int>(unsupported->opcode)));
  }
  return 0;
}

int sim_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  QueuePairState& q = *wrapper_of<QpObj>(qp)->state;
  std::vector<RecvWr> wrs;
  std::vector<ibv_recv_wr*> originals;
  for (ibv_recv_wr* w = wr; w != nullptr; w = w->next) {
    RecvWr o;
    o.wr_id = w->wr_id;
    o.sg_list = reinterpret_cast<const Sge*>(w->sg_list);
    o.num_sge = w->num_sge;
    wrs.push_back(o);
    originals.push_back(w);
  }
  for (size_t i = 0; i + 1 < wrs.size(); ++i) wrs[i].next = &wrs[i + 1];
  if (wrs.empty()) return 0;
  const RecvWr* bad = nullptr;
  int rc = 0;
  {
    std::lock_guard<std::mutex> lock(q.pd.context.fabric->mu);
    rc = q.pd.context.fabric->post_recv(*q.qp, wrs.data(), &bad);
  }
  if (rc != 0) {
    if (bad_wr) *bad_wr = originals[static_cast<size_t>(bad - wrs.data())];
    return fail(rc, fmt::format("post_recv on QP {}: refused ({})", qp->qp_num, std::strerror(rc)));
  }
  return 0;
}

ibv_wc_opcode verbs_wc_opcode(WcOpcode op) {
  switch (op) {
    case WcOpcode::kSend: return IBV_WC_SEND;
    case WcOpcode::kRdmaWrite: return IBV_WC_RDMA_WRITE;
    case WcOpcode::kRdmaRead: return IBV_WC_RDMA_READ;
    case WcOpcode::kRecv: return IBV_WC_RECV;
    case WcOpcode::kRecvRdmaWithImm: return IBV_WC_RECV_RDMA_WITH_IMM;
  }
  return IBV_WC_RECV;
}

int sim_poll_cq(ibv_cq* cq, int num_entries, ibv_wc* wc) {
  CqState& c = *wrapper_of<CqObj>(cq)->state;
  if (num_entries <= 0) return 0;
  constexpr int kChunk = 64;
  WorkCompletion got[kChunk];
  int total = 0;
  std::lock_guard<std::mutex> lock(c.context.fabric->mu);
  while (total < num_entries) {
    const int want = std::min(kChunk, num_entries - total);
    const int n = c.context.fabric->poll(*c.cq, want, got);
    if (n < 0) return total > 0 ? total : n;  // an overrun CQ: -EOVERFLOW, as a provider reports it
    for (int i = 0; i < n; ++i) {
      ibv_wc& o = wc[total + i];
      o = ibv_wc{};
      o.wr_id = got[i].wr_id;
      o.status = static_cast<ibv_wc_status>(got[i].status);
      o.opcode = verbs_wc_opcode(got[i].opcode);
      o.byte_len = got[i].byte_len;
      o.qp_num = got[i].qp_num;
      if (got[i].has_imm) {
        o.wc_flags |= IBV_WC_WITH_IMM;
        o.imm_data = htonl(got[i].imm_data);
      }
    }
    total += n;
    if (n < want) break;
  }
  return total;
}

int sim_req_notify_cq(ibv_cq* cq, int /*solicited_only*/) {
  CqState& c = *wrapper_of<CqObj>(cq)->state;
  std::lock_guard<std::mutex> lock(c.context.fabric->mu);
  if (c.cq->overrun) return fail(EIO, "req_notify_cq: the CQ overran and is in error");
  c.cq->armed = true;
  return 0;
}

// verbs_context's query_port: every rdma-core provider has it, and verbs.h's ibv_query_port
// calls it with the caller's struct size.
int sim_query_port(ibv_context* /*ctx*/, uint8_t port, ibv_port_attr* attr, size_t attr_len) {
  if (port != kPort) return fail(EINVAL, fmt::format("sim_rdma0 has port 1 only, not port {}", port));
  ibv_port_attr a{};
  a.state = IBV_PORT_ACTIVE;
  a.max_mtu = static_cast<ibv_mtu>(kActiveMtu);
  a.active_mtu = static_cast<ibv_mtu>(kActiveMtu);
  a.gid_tbl_len = 1;
  a.pkey_tbl_len = 1;
  a.lid = 0;  // RoCE ports have no LID
  a.link_layer = IBV_LINK_LAYER_ETHERNET;
  a.port_cap_flags = IBV_PORT_IP_BASED_GIDS;
  std::memcpy(attr, &a, std::min(attr_len, sizeof a));
  return 0;
}

}  // namespace
}  // namespace dlslime::rdma::sim

// --- The exported verbs ABI --------------------------------------------------------------------

using namespace dlslime::rdma::sim;  // NOLINT: this file is that namespace's C face
using dlslime::rdma::QpCaps;
using dlslime::rdma::RcInitAttr;
using dlslime::rdma::RcRtrAttr;
using dlslime::rdma::RcRtsAttr;
using dlslime::rdma::QpState;
using dlslime::rdma::Mtu;

extern "C" {

DLSLIME_SIM_API ibv_device** ibv_get_device_list(int* num_devices) {
  static ibv_device device = [] {
    ibv_device d{};
    d.node_type = IBV_NODE_CA;
    d.transport_type = IBV_TRANSPORT_IB;
    std::snprintf(d.name, sizeof d.name, "%s", kDeviceName);
    std::snprintf(d.dev_name, sizeof d.dev_name, "uverbs_sim0");
    return d;
  }();
  auto** list = static_cast<ibv_device**>(std::calloc(2, sizeof(ibv_device*)));
  if (list == nullptr) return fail_null<ibv_device*>(ENOMEM, "get_device_list: out of memory");
  list[0] = &device;
  if (num_devices) *num_devices = 1;
  return list;
}

DLSLIME_SIM_API void ibv_free_device_list(ibv_device** list) { std::free(list); }

DLSLIME_SIM_API const char* ibv_get_device_name(ibv_device* device) { return device->name; }

DLSLIME_SIM_API ibv_context* ibv_open_device(ibv_device* device) {
  if (device == nullptr || std::strcmp(device->name, kDeviceName) != 0) {
    return fail_null<ibv_context>(ENODEV, "open_device: not the simulated device");
  }
  std::unique_ptr<ContextState> state;
  try {
    state = std::make_unique<ContextState>();
  } catch (const std::exception& e) {
    return fail_null<ibv_context>(EIO, fmt::format("open_device: {}", e.what()));
  }
  auto* obj = new ContextObj{};
  verbs_context& v = obj->vctx;
  v.sz = sizeof(verbs_context);
  v.query_port = sim_query_port;
  ibv_context& c = v.context;
  c.device = device;
  c.ops.poll_cq = sim_poll_cq;
  c.ops.req_notify_cq = sim_req_notify_cq;
  c.ops.post_send = sim_post_send;
  c.ops.post_recv = sim_post_recv;
  c.cmd_fd = -1;
  c.async_fd = -1;
  c.num_comp_vectors = 1;
  pthread_mutex_init(&c.mutex, nullptr);
  c.abi_compat = __VERBS_ABI_IS_EXTENDED;
  obj->state = state.release();
  ++devices_opened;
  return &c;
}

DLSLIME_SIM_API int ibv_close_device(ibv_context* ctx) {
  ContextObj* obj = context_of(ctx);
  if (int rc = refuse_if_parent(obj, obj->state->children, "context", "PDs, CQs or completion channels")) return rc;
  forget_refused(obj);
  pthread_mutex_destroy(&ctx->mutex);
  delete obj->state;
  delete obj;
  return 0;
}

DLSLIME_SIM_API int ibv_query_device(ibv_context* ctx, ibv_device_attr* attr) {
  (void)ctx;
  *attr = ibv_device_attr{};
  std::snprintf(attr->fw_ver, sizeof attr->fw_ver, "dlslime-sim");
  attr->max_mr_size = ~uint64_t{0};
  attr->page_size_cap = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  attr->max_qp = 1 << 16;
  attr->max_qp_wr = static_cast<int>(kMaxQpWr);
  attr->max_sge = static_cast<int>(kMaxSge);
  attr->max_sge_rd = static_cast<int>(kMaxSge);
  attr->max_cq = 1 << 16;
  attr->max_cqe = kMaxCqe;
  attr->max_mr = 1 << 20;
  attr->max_pd = 1 << 16;
  attr->max_qp_rd_atom = 16;
  attr->max_qp_init_rd_atom = 16;
  attr->max_res_rd_atom = 1 << 20;
  attr->atomic_cap = IBV_ATOMIC_NONE;
  attr->max_pkeys = 1;
  attr->local_ca_ack_delay = 16;
  attr->phys_port_cnt = 1;
  return 0;
}

// The exported (compat) ibv_query_port: the same answer as the context's own op.
DLSLIME_SIM_API int (ibv_query_port)(ibv_context* ctx, uint8_t port, struct _compat_ibv_port_attr* attr) {
  return sim_query_port(ctx, port, reinterpret_cast<ibv_port_attr*>(attr), sizeof(ibv_port_attr));
}

DLSLIME_SIM_API int _ibv_query_gid_ex(ibv_context* /*ctx*/, uint32_t port, uint32_t gid_index, ibv_gid_entry* entry,
                                      uint32_t /*flags*/, size_t entry_size) {
  if (port != kPort) return fail(EINVAL, fmt::format("sim_rdma0 has port 1 only, not port {}", port));
  if (gid_index != 0) {  // a table of one GID (gid_tbl_len 1): past it is EINVAL, as the kernel answers
    return fail(EINVAL, fmt::format("sim_rdma0 port 1 has one GID (index 0), not index {}", gid_index));
  }
  ibv_gid_entry e{};
  const auto gid = device_gid();
  std::memcpy(e.gid.raw, gid.data(), 16);
  e.gid_index = 0;
  e.port_num = kPort;
  e.gid_type = IBV_GID_TYPE_ROCE_V2;
  e.ndev_ifindex = 1;
  std::memcpy(entry, &e, std::min(entry_size, sizeof e));
  return 0;
}

// The plain GID and P_Key queries most programs call (rdma-core implements them over its
// own context internals, which a preloaded simulation does not have: a program that calls
// one this library lacks reaches libibverbs with a context it cannot read).
DLSLIME_SIM_API int ibv_query_gid(ibv_context* ctx, uint8_t port, int index, ibv_gid* gid) {
  if (index < 0) return fail(EINVAL, fmt::format("GID index {}", index));
  ibv_gid_entry e{};
  const int rc = _ibv_query_gid_ex(ctx, port, static_cast<uint32_t>(index), &e, 0, sizeof e);
  if (rc == 0) *gid = e.gid;
  return rc;
}

DLSLIME_SIM_API int ibv_query_pkey(ibv_context* /*ctx*/, uint8_t port, int index, __be16* pkey) {
  if (port != kPort) return fail(EINVAL, fmt::format("sim_rdma0 has port 1 only, not port {}", port));
  if (index != 0) return fail(EINVAL, fmt::format("sim_rdma0 port 1 has one P_Key (index 0), not index {}", index));
  *pkey = htobe16(0xffff);  // the default full-membership key
  return 0;
}

DLSLIME_SIM_API __be64 ibv_get_device_guid(ibv_device* /*device*/) {
  const auto gid = device_gid();
  uint64_t guid = 0;
  std::memcpy(&guid, gid.data() + 8, sizeof guid);  // the interface id half, already big-endian
  return guid;
}

DLSLIME_SIM_API ibv_pd* ibv_alloc_pd(ibv_context* ctx) {
  ContextState& c = state_of(ctx);
  uint32_t id = 0;
  {
    std::lock_guard<std::mutex> lock(c.fabric->mu);
    id = c.fabric->new_pd();
  }
  auto* obj = new PdObj{};
  obj->ibv.context = ctx;
  obj->ibv.handle = id;
  obj->state = new PdState(c, id);
  return &obj->ibv;
}

DLSLIME_SIM_API int ibv_dealloc_pd(ibv_pd* pd) {
  PdObj* obj = wrapper_of<PdObj>(pd);
  if (int rc = refuse_if_parent(obj, obj->state->children, "PD", "MRs or QPs")) return rc;
  forget_refused(obj);
  delete obj->state;
  delete obj;
  return 0;
}

DLSLIME_SIM_API ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) {
  PdObj* obj = wrapper_of<PdObj>(pd);
  if (addr == nullptr || length == 0) return fail_null<ibv_mr>(EINVAL, "reg_mr: null address or zero length");
  if (!access_ok(static_cast<int>(access))) {
    return fail_null<ibv_mr>(EINVAL, fmt::format("reg_mr: invalid access flags {:#x} (remote write needs local write)",
                                                 access));
  }
  if (iova != reinterpret_cast<uintptr_t>(addr)) {
    return fail_null<ibv_mr>(EOPNOTSUPP, "reg_mr: the simulated device registers memory at its own address only "
                                         "(iova == addr)");
  }
  const auto at = reinterpret_cast<uintptr_t>(addr);
  // Device memory of a GPU: registered by address only with peer-memory support
  // (nvidia-peermem's role), and then the NIC moves its bytes through its own view.
  std::optional<DeviceView> view;
  std::string error;
  {
    std::lock_guard<std::mutex> lock(peer_memory_mu);
    if (peer_memory().view) view = peer_memory().view(at, length, error);
  }
  if (!error.empty()) return fail_null<ibv_mr>(EFAULT, fmt::format("reg_mr({}, {} bytes): {}", addr, length, error));
  DeviceMemorySupport support;
  try {
    support = device_memory_support();
  } catch (const std::exception& e) {
    return fail_null<ibv_mr>(EINVAL, e.what());
  }
  if (view && !support.peermem) {
    return fail_null<ibv_mr>(EFAULT, fmt::format("reg_mr({}, {} bytes): the range is GPU memory and the simulated "
                                                 "device has no peer-memory support (DLSLIME_RDMA_SIM_DEVICE_MEMORY)",
                                                 addr, length));
  }
  if (!view) {
    const bool write = (access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)) != 0;
    // What pinning host pages checks (get_user_pages): every page mapped and readable, and
    // writable if the MR asks for local or remote write.
    if (auto problem = dlslime::host_pages_problem(at, length, write)) {
      return fail_null<ibv_mr>(EFAULT, fmt::format("reg_mr({}, {} bytes): {} (a NIC fails the pinning with EFAULT)",
                                                   addr, length, *problem));
    }
  }
  Fabric& fabric = *obj->state->context.fabric;
  std::lock_guard<std::mutex> lock(fabric.mu);
  const Mr& mr = view ? fabric.add_mr(at, length, access, obj->state->id, view->data, std::move(view->keep))
                      : fabric.add_mr(at, length, access, obj->state->id);
  return make_mr(obj, mr, addr);
}

// The exported ibv_reg_mr (verbs.h's inline wrapper calls it for constant access flags).
DLSLIME_SIM_API ibv_mr*(ibv_reg_mr)(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr), static_cast<unsigned int>(access));
}

DLSLIME_SIM_API ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                          int access) {
  PdObj* obj = wrapper_of<PdObj>(pd);
  DeviceMemorySupport support;
  try {
    support = device_memory_support();
  } catch (const std::exception& e) {
    return fail_null<ibv_mr>(EINVAL, e.what());
  }
  if (!support.dmabuf) {
    return fail_null<ibv_mr>(EOPNOTSUPP, "reg_dmabuf_mr: the simulated device has no dma-buf support "
                                         "(DLSLIME_RDMA_SIM_DEVICE_MEMORY)");
  }
  if (iova == 0 || length == 0) return fail_null<ibv_mr>(EINVAL, "reg_dmabuf_mr: null iova or zero length");
  if (!access_ok(access)) {
    return fail_null<ibv_mr>(EINVAL, fmt::format("reg_dmabuf_mr: invalid access flags {:#x}", access));
  }
  // The import: the NIC maps the buffer's pages for itself (the fd may be closed after).
  std::optional<DeviceView> view;
  std::string error = "no GPU driver has registered dma-buf import with the simulated device";
  {
    std::lock_guard<std::mutex> lock(peer_memory_mu);
    if (peer_memory().map_dmabuf) view = peer_memory().map_dmabuf(fd, offset, length, error);
  }
  if (!view) return fail_null<ibv_mr>(EINVAL, fmt::format("reg_dmabuf_mr: {}", error));
  Fabric& fabric = *obj->state->context.fabric;
  std::lock_guard<std::mutex> lock(fabric.mu);
  const Mr& mr = fabric.add_mr(iova, length, static_cast<uint32_t>(access), obj->state->id, view->data,
                               std::move(view->keep));
  return make_mr(obj, mr, reinterpret_cast<void*>(iova));
}

DLSLIME_SIM_API int ibv_dereg_mr(ibv_mr* mr) {
  MrObj* obj = wrapper_of<MrObj>(mr);
  {
    Fabric& fabric = *obj->state->pd.context.fabric;
    std::lock_guard<std::mutex> lock(fabric.mu);
    fabric.remove_mr(obj->state->lkey);
  }
  delete obj->state;
  delete obj;
  return 0;
}

DLSLIME_SIM_API ibv_comp_channel* ibv_create_comp_channel(ibv_context* ctx) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    const int err = errno;
    return fail_null<ibv_comp_channel>(err, fmt::format("create_comp_channel: pipe: {}", std::strerror(err)));
  }
  // The engine must never block on it; the reader's end is blocking until the caller says
  // otherwise, as a real channel's fd.
  ::fcntl(fds[1], F_SETFL, ::fcntl(fds[1], F_GETFL) | O_NONBLOCK);
  auto* obj = new ChannelObj{};
  obj->state = new ChannelState(state_of(ctx).children);
  obj->state->read_fd = fds[0];
  obj->state->write_fd = fds[1];
  obj->ibv.context = ctx;
  obj->ibv.fd = fds[0];
  obj->ibv.refcnt = 0;
  return &obj->ibv;
}

DLSLIME_SIM_API int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  ChannelObj* obj = wrapper_of<ChannelObj>(channel);
  if (int rc = refuse_if_parent(obj, obj->state->cqs, "completion channel", "CQs")) return rc;
  forget_refused(obj);
  ::close(obj->state->read_fd);
  ::close(obj->state->write_fd);
  delete obj->state;
  delete obj;
  return 0;
}

DLSLIME_SIM_API ibv_cq* ibv_create_cq(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel,
                                      int comp_vector) {
  if (cqe < 1 || cqe > kMaxCqe) {
    return fail_null<ibv_cq>(EINVAL, fmt::format("create_cq: {} entries outside 1..{} (max_cqe)", cqe, kMaxCqe));
  }
  if (comp_vector < 0 || comp_vector >= ctx->num_comp_vectors) {
    return fail_null<ibv_cq>(EINVAL, fmt::format("create_cq: completion vector {} (the device has {})", comp_vector,
                                                 ctx->num_comp_vectors));
  }
  if (channel && channel->context != ctx) {
    return fail_null<ibv_cq>(EINVAL, "create_cq: the completion channel belongs to another device context");
  }
  ContextState& c = state_of(ctx);
  ChannelState* ch = channel ? wrapper_of<ChannelObj>(channel)->state : nullptr;
  auto* obj = new CqObj{};
  obj->ibv.context = ctx;
  obj->ibv.channel = channel;
  obj->ibv.cq_context = cq_context;
  obj->ibv.cqe = cqe;
  pthread_mutex_init(&obj->ibv.mutex, nullptr);
  pthread_cond_init(&obj->ibv.cond, nullptr);
  obj->state = new CqState(c, cqe, ch);
  if (ch) {
    ibv_cq* self = &obj->ibv;
    obj->state->cq->on_event = [ch, self] { ch->push(self); };
  }
  return &obj->ibv;
}

DLSLIME_SIM_API int ibv_destroy_cq(ibv_cq* cq) {
  CqObj* obj = wrapper_of<CqObj>(cq);
  CqState& c = *obj->state;
  if (int rc = refuse_if_parent(obj, c.qps, "CQ", "QPs")) return rc;
  if (c.events_taken != c.events_acked) {
    // libibverbs waits in ibv_destroy_cq until every event it handed out is acked: with one
    // missing it blocks for ever. Counted and refused here instead of hanging the test.
    keep_refused(obj);
    ++counts().destroy_failures;
    DLSLIME_WARN("sim_rdma0: CQ destroyed with {} of {} completion events not acked (ibv_destroy_cq blocks for ever "
                 "on a NIC)",
                 c.events_taken - c.events_acked, c.events_taken);
    return fail(EBUSY, "destroy_cq: completion events taken and not acked");
  }
  {
    std::lock_guard<std::mutex> lock(c.context.fabric->mu);
    c.cq->on_event = nullptr;  // the engine may hold the Cq a little longer
  }
  forget_refused(obj);
  if (c.channel) c.channel->forget(cq);
  pthread_cond_destroy(&cq->cond);
  pthread_mutex_destroy(&cq->mutex);
  delete obj->state;
  delete obj;
  return 0;
}

DLSLIME_SIM_API int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  ChannelState& ch = *wrapper_of<ChannelObj>(channel)->state;
  for (;;) {
    ibv_cq* got = nullptr;
    if (ch.take(&got)) {
      ++wrapper_of<CqObj>(got)->state->events_taken;
      *cq = got;
      *cq_context = got->cq_context;
      return 0;
    }
    // None pending: a non-blocking fd says so (EAGAIN), a blocking one waits, as read() on
    // the kernel's event file does.
    if (::fcntl(ch.read_fd, F_GETFL) & O_NONBLOCK) {
      fail(EAGAIN, "get_cq_event: no event");
      return -1;
    }
    pollfd p{ch.read_fd, POLLIN, 0};
    ::poll(&p, 1, -1);
  }
}

DLSLIME_SIM_API void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  wrapper_of<CqObj>(cq)->state->events_acked += nevents;
}

DLSLIME_SIM_API ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  PdObj* pobj = wrapper_of<PdObj>(pd);
  if (attr->qp_type != IBV_QPT_RC) {
    return fail_null<ibv_qp>(EOPNOTSUPP, fmt::format("create_qp: QP type {} (the simulated device has RC only)",
                                                     static_cast<int>(attr->qp_type)));
  }
  if (attr->srq != nullptr) return fail_null<ibv_qp>(EOPNOTSUPP, "create_qp: the simulated device has no SRQs");
  if (attr->send_cq == nullptr || attr->recv_cq == nullptr) return fail_null<ibv_qp>(EINVAL, "create_qp: a CQ is null");
  // The kernel resolves a QP's CQs in the PD's context: a CQ of another context is EINVAL.
  if (attr->send_cq->context != pd->context || attr->recv_cq->context != pd->context) {
    return fail_null<ibv_qp>(EINVAL, "create_qp: a CQ belongs to another device context than the PD");
  }
  const ibv_qp_cap& cap = attr->cap;
  if (cap.max_send_wr > kMaxQpWr || cap.max_recv_wr > kMaxQpWr || cap.max_send_sge > kMaxSge ||
      cap.max_recv_sge > kMaxSge || cap.max_inline_data > kMaxInline) {
    return fail_null<ibv_qp>(EINVAL, fmt::format("create_qp: caps beyond the device's (max_wr {}, max_sge {}, "
                                                 "max_inline {})",
                                                 kMaxQpWr, kMaxSge, kMaxInline));
  }
  QpCaps caps{cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge, cap.max_inline_data};
  CqState& scq = *wrapper_of<CqObj>(attr->send_cq)->state;
  CqState& rcq = *wrapper_of<CqObj>(attr->recv_cq)->state;
  std::shared_ptr<Qp> qp;
  {
    Fabric& fabric = *pobj->state->context.fabric;
    std::lock_guard<std::mutex> lock(fabric.mu);
    qp = fabric.add_qp(pobj->state->id, scq.cq, rcq.cq, caps);
  }
  auto* obj = new QpObj{};
  obj->ibv.context = pd->context;
  obj->ibv.qp_context = attr->qp_context;
  obj->ibv.pd = pd;
  obj->ibv.send_cq = attr->send_cq;
  obj->ibv.recv_cq = attr->recv_cq;
  obj->ibv.handle = qp->qpn;
  obj->ibv.qp_num = qp->qpn;
  obj->ibv.state = IBV_QPS_RESET;
  obj->ibv.qp_type = IBV_QPT_RC;
  pthread_mutex_init(&obj->ibv.mutex, nullptr);
  pthread_cond_init(&obj->ibv.cond, nullptr);
  obj->state = new QueuePairState(*pobj->state, scq, rcq, std::move(qp), attr->sq_sig_all != 0);
  // The caps granted are written back: exactly those asked here.
  return &obj->ibv;
}

DLSLIME_SIM_API int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  QueuePairState& q = *wrapper_of<QpObj>(qp)->state;
  Fabric& fabric = *q.pd.context.fabric;
  std::lock_guard<std::mutex> lock(fabric.mu);
  const ibv_qp_state cur = verbs_state(q.qp->state);
  if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur) {
    return fail(EINVAL, fmt::format("modify_qp {}: cur_qp_state {} but the QP is in {}", qp->qp_num,
                                    verbs_state_name(attr->cur_qp_state), verbs_state_name(cur)));
  }
  const ibv_qp_state next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
  const Transition t = rc_transition(cur, next);
  if (!t.valid) {
    return fail(EINVAL, fmt::format("modify_qp {}: {} -> {} is no RC transition", qp->qp_num, verbs_state_name(cur),
                                    verbs_state_name(next)));
  }
  const int given = mask & ~(IBV_QP_STATE | IBV_QP_CUR_STATE);
  if ((given & t.required) != t.required) {
    return fail(EINVAL, fmt::format("modify_qp {}: {} -> {} requires attribute mask {:#x}, missing {:#x}", qp->qp_num,
                                    verbs_state_name(cur), verbs_state_name(next), t.required,
                                    t.required & ~given));
  }
  if ((given & ~(t.required | t.optional)) != 0) {
    return fail(EINVAL, fmt::format("modify_qp {}: {} -> {} does not take attribute mask {:#x}", qp->qp_num,
                                    verbs_state_name(cur), verbs_state_name(next),
                                    given & ~(t.required | t.optional)));
  }
  int rc = 0;
  if (next == IBV_QPS_INIT && cur == IBV_QPS_RESET) {
    RcInitAttr init;
    init.port = attr->port_num;
    init.pkey_index = attr->pkey_index;
    init.access = static_cast<uint32_t>(attr->qp_access_flags);
    rc = fabric.modify(*q.qp, QpState::kInit, &init, nullptr, nullptr);
  } else if (next == IBV_QPS_RTR) {
    const ibv_ah_attr& ah = attr->ah_attr;
    if (ah.port_num != kPort) return fail(EINVAL, fmt::format("modify_qp {}: RTR on port {}", qp->qp_num, ah.port_num));
    RcRtrAttr rtr;
    rtr.remote_qpn = attr->dest_qp_num;
    rtr.rq_psn = attr->rq_psn;
    rtr.path_mtu = static_cast<Mtu>(attr->path_mtu);
    rtr.remote_lid = ah.dlid;
    rtr.use_gid = ah.is_global != 0;
    std::memcpy(rtr.remote_gid.data(), ah.grh.dgid.raw, 16);
    rtr.sgid_index = ah.grh.sgid_index;
    rtr.hop_limit = ah.grh.hop_limit;
    rtr.traffic_class = ah.grh.traffic_class;
    rtr.service_level = ah.sl;
    rtr.max_dest_rd_atomic = attr->max_dest_rd_atomic;
    rtr.min_rnr_timer = attr->min_rnr_timer;
    rc = fabric.modify(*q.qp, QpState::kRtr, nullptr, &rtr, nullptr);
  } else if (next == IBV_QPS_RTS && cur == IBV_QPS_RTR) {
    RcRtsAttr rts;
    rts.sq_psn = attr->sq_psn;
    rts.timeout = attr->timeout;
    rts.retry_cnt = attr->retry_cnt;
    rts.rnr_retry = attr->rnr_retry;
    rts.max_rd_atomic = attr->max_rd_atomic;
    rc = fabric.modify(*q.qp, QpState::kRts, nullptr, nullptr, &rts);
  } else if (next == IBV_QPS_ERR) {
    rc = fabric.modify(*q.qp, QpState::kErr, nullptr, nullptr, nullptr);
  } else {
    return fail(EOPNOTSUPP, fmt::format("modify_qp {}: {} -> {} is valid verbs the simulated device does not model",
                                        qp->qp_num, verbs_state_name(cur), verbs_state_name(next)));
  }
  if (rc != 0) {
    return fail(rc, fmt::format("modify_qp {}: {} -> {} with these attributes is refused (port 1, pkey 0, a GRH on "
                                "GID 0, an MTU up to 4096, 24-bit PSNs and QPNs, timers in range)",
                                qp->qp_num, verbs_state_name(cur), verbs_state_name(next)));
  }
  qp->state = next;
  return 0;
}

DLSLIME_SIM_API int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int /*mask*/, ibv_qp_init_attr* init_attr) {
  QueuePairState& q = *wrapper_of<QpObj>(qp)->state;
  std::lock_guard<std::mutex> lock(q.pd.context.fabric->mu);
  *attr = ibv_qp_attr{};
  attr->qp_state = verbs_state(q.qp->state);
  attr->cur_qp_state = attr->qp_state;
  const QpCaps& c = q.qp->caps;
  attr->cap = ibv_qp_cap{c.max_send_wr, c.max_recv_wr, c.max_send_sge, c.max_recv_sge, c.max_inline_data};
  if (init_attr) {
    *init_attr = ibv_qp_init_attr{};
    init_attr->qp_context = qp->qp_context;
    init_attr->send_cq = qp->send_cq;
    init_attr->recv_cq = qp->recv_cq;
    init_attr->cap = attr->cap;
    init_attr->qp_type = IBV_QPT_RC;
    init_attr->sq_sig_all = q.sq_sig_all ? 1 : 0;
  }
  return 0;
}

DLSLIME_SIM_API int ibv_destroy_qp(ibv_qp* qp) {
  QpObj* obj = wrapper_of<QpObj>(qp);
  {
    Fabric& fabric = *obj->state->pd.context.fabric;
    std::lock_guard<std::mutex> lock(fabric.mu);
    fabric.remove_qp(qp->qp_num);
  }
  pthread_cond_destroy(&qp->cond);
  pthread_mutex_destroy(&qp->mutex);
  delete obj->state;
  delete obj;
  return 0;
}

// As rdma-core: fork protection (MADV_DONTFORK on registered pages) must be asked for
// before any device is opened; after that it is too late (EINVAL). Nothing is pinned here,
// so there is nothing to protect, but the order is checked and recorded.
DLSLIME_SIM_API int ibv_fork_init(void) {
  if (devices_opened.load() != 0) return fail(EINVAL, "ibv_fork_init after a device was opened: too late");
  fork_initialized = true;
  return 0;
}

// --- The library's own exports (sim_device.h) ----------------------------------------------------

DLSLIME_SIM_API void dlslime_sim_rdma_object_counts(dlslime::rdma::SimObjectCounts* out) {
  const Counts& c = counts();
  *out = dlslime::rdma::SimObjectCounts{c.contexts.load(), c.pds.load(),   c.mrs.load(),
                                        c.cqs.load(),      c.qps.load(),   c.comp_channels.load(),
                                        c.destroy_failures.load(), c.cqes.load(), c.recv_wrs.load(),
                                        fork_initialized.load() ? 1 : 0};
}

DLSLIME_SIM_API void dlslime_sim_rdma_set_peer_memory(const PeerMemory* client) {
  std::lock_guard<std::mutex> lock(peer_memory_mu);
  peer_memory() = client ? *client : PeerMemory{};
}

DLSLIME_SIM_API const char* dlslime_sim_rdma_last_error() { return last_error_text.c_str(); }

}  // extern "C"
