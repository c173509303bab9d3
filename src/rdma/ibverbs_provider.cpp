// The verbs.h interface over libibverbs: a thin translation, no policy. libibverbs is
// opened at run time (core/shared_library.h), never linked: libdlslime loads on a host
// without rdma-core, and there the RDMA transport says why it is unavailable.
//
// The same adapter drives the simulated device: under DLSLIME_RDMA_SIM=1 it opens
// libdlslime_sim_ibverbs.so, which exports the libibverbs ABI (sim_ibverbs.cpp), instead of
// libibverbs.so.1. Every test on the simulated device therefore runs this file, and
// tests/hardware/run_rdma_checks.sh runs it against a NIC where one exists.
#include <fcntl.h>
#include <infiniband/verbs.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/log.h"
#include "core/shared_library.h"
#include "dlslime/errors.h"
#include "rdma/sim_device.h"
#include "rdma/verbs.h"

namespace dlslime::rdma {
namespace {

// The libibverbs entry points this adapter calls, resolved once. The data-path verbs
// (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) are inline in verbs.h and
// dispatch through the context's ops table, so they need no symbol; the inline wrappers
// that call an exported function (ibv_reg_mr, ibv_query_port, ibv_query_gid_ex) are
// replaced by that function, called as the wrapper calls it.
struct Ibverbs {
  decltype(&::ibv_get_device_list) get_device_list;
  decltype(&::ibv_free_device_list) free_device_list;
  decltype(&::ibv_get_device_name) get_device_name;
  decltype(&::ibv_open_device) open_device;
  decltype(&::ibv_close_device) close_device;
  decltype(&::ibv_query_device) query_device;
  decltype(&::ibv_query_port) query_port;  // the exported (compat) one; see query_port_attr()
  decltype(&::_ibv_query_gid_ex) query_gid_ex;
  decltype(&::ibv_alloc_pd) alloc_pd;
  decltype(&::ibv_dealloc_pd) dealloc_pd;
  decltype(&::ibv_reg_mr_iova2) reg_mr_iova2;
  decltype(&::ibv_reg_dmabuf_mr) reg_dmabuf_mr;  // optional: rdma-core 34 or later
  decltype(&::ibv_dereg_mr) dereg_mr;
  decltype(&::ibv_create_comp_channel) create_comp_channel;
  decltype(&::ibv_destroy_comp_channel) destroy_comp_channel;
  decltype(&::ibv_create_cq) create_cq;
  decltype(&::ibv_destroy_cq) destroy_cq;
  decltype(&::ibv_get_cq_event) get_cq_event;
  decltype(&::ibv_ack_cq_events) ack_cq_events;
  decltype(&::ibv_create_qp) create_qp;
  decltype(&::ibv_modify_qp) modify_qp;
  decltype(&::ibv_query_qp) query_qp;
  decltype(&::ibv_destroy_qp) destroy_qp;
  decltype(&::ibv_fork_init) fork_init;  // optional
  // The simulated device's own exports (sim_device.h); null in libibverbs.
  decltype(&::dlslime_sim_rdma_last_error) sim_last_error;
  decltype(&::dlslime_sim_rdma_object_counts) sim_object_counts;
  decltype(&::dlslime_sim_rdma_set_peer_memory) sim_set_peer_memory;

  // What the library adds to errno about the last failed call of this thread (the
  // simulated device's detail), as "; detail", or nothing.
  std::string detail() const {
    const char* text = sim_last_error ? sim_last_error() : nullptr;
    return text && *text ? fmt::format(" ({})", text) : std::string();
  }
};

struct LoadedIbverbs {
  Ibverbs api{};
  std::string error;  // why RDMA cannot run here (empty: loaded)
};

// Resolves the table from an opened library; `hint` says what to do when it cannot be.
LoadedIbverbs resolve_ibverbs(SharedLibrary& lib, const char* hint) {
  LoadedIbverbs out;
  if (!lib.handle()) {
    out.error = fmt::format("RDMA is unavailable: {} ({})", lib.error(), hint);
    return out;
  }
  Ibverbs& a = out.api;
  lib.resolve(a.get_device_list, "ibv_get_device_list");
  lib.resolve(a.free_device_list, "ibv_free_device_list");
  lib.resolve(a.get_device_name, "ibv_get_device_name");
  lib.resolve(a.open_device, "ibv_open_device");
  lib.resolve(a.close_device, "ibv_close_device");
  lib.resolve(a.query_device, "ibv_query_device");
  lib.resolve(a.query_port, "ibv_query_port");
  lib.resolve(a.query_gid_ex, "_ibv_query_gid_ex");
  lib.resolve(a.alloc_pd, "ibv_alloc_pd");
  lib.resolve(a.dealloc_pd, "ibv_dealloc_pd");
  lib.resolve(a.reg_mr_iova2, "ibv_reg_mr_iova2");
  lib.resolve_optional(a.reg_dmabuf_mr, "ibv_reg_dmabuf_mr");
  lib.resolve(a.dereg_mr, "ibv_dereg_mr");
  lib.resolve(a.create_comp_channel, "ibv_create_comp_channel");
  lib.resolve(a.destroy_comp_channel, "ibv_destroy_comp_channel");
  lib.resolve(a.create_cq, "ibv_create_cq");
  lib.resolve(a.destroy_cq, "ibv_destroy_cq");
  lib.resolve(a.get_cq_event, "ibv_get_cq_event");
  lib.resolve(a.ack_cq_events, "ibv_ack_cq_events");
  lib.resolve(a.create_qp, "ibv_create_qp");
  lib.resolve(a.modify_qp, "ibv_modify_qp");
  lib.resolve(a.query_qp, "ibv_query_qp");
  lib.resolve(a.destroy_qp, "ibv_destroy_qp");
  lib.resolve_optional(a.fork_init, "ibv_fork_init");
  lib.resolve_optional(a.sim_last_error, "dlslime_sim_rdma_last_error");
  lib.resolve_optional(a.sim_object_counts, "dlslime_sim_rdma_object_counts");
  lib.resolve_optional(a.sim_set_peer_memory, "dlslime_sim_rdma_set_peer_memory");
  if (std::string missing = lib.missing_error(); !missing.empty()) {
    out.error = fmt::format("RDMA is unavailable: {}", missing);
    return out;
  }
  // Fork safety (review F12), before any device is opened, as libibverbs requires: with it,
  // registered pages are not copied into a fork() child, so the parent's MRs keep pointing
  // at the parent's pages. On kernels with copy-on-fork for pinned pages (5.13+) it is a
  // no-op. A failure (too late: another user of libibverbs in this process opened a device
  // first) is logged, not fatal: RDMA still works, the child then must not touch registered
  // memory before exec.
  if (a.fork_init) {
    if (int rc = a.fork_init(); rc != 0) {
      DLSLIME_WARN("ibv_fork_init failed ({}){}: a fork() child must not touch RDMA-registered memory before exec",
                   std::strerror(rc), a.detail());
    }
  }
  return out;
}

// The tables, each loaded at its first use (never at import); ConnectionError, naming the
// library, the symbol and the variable, where one cannot be used. Every object below was
// made through a loaded table and keeps it, so their own calls always find one.
const Ibverbs& real_library() {
  static const LoadedIbverbs* loaded = [] {
    SharedLibrary lib("libibverbs", {"libibverbs.so.1"}, "DLSLIME_IBVERBS_LIBRARY");
    return new LoadedIbverbs(resolve_ibverbs(
        lib, "install rdma-core's libibverbs1, or set DLSLIME_RDMA_SIM=1 for the simulated device"));
  }();
  if (!loaded->error.empty()) throw ConnectionError(loaded->error);
  return loaded->api;
}

const Ibverbs& sim_library() {
  static const LoadedIbverbs* loaded = [] {
    // Beside libdlslime.so (installed, or the build tree), else by soname: a program (the
    // C++ tests) that links it has it loaded already.
    SharedLibrary lib("the simulated device's libibverbs",
                      {own_library_directory() + "libdlslime_sim_ibverbs.so", "libdlslime_sim_ibverbs.so"},
                      "DLSLIME_RDMA_SIM_LIBRARY");
    auto* out = new LoadedIbverbs(resolve_ibverbs(lib, "it is built with the RDMA transport"));
    if (out->error.empty() && !out->api.sim_object_counts) {
      out->error = fmt::format("RDMA is unavailable: {} is not the simulated device's library", lib.path());
    }
    if (out->error.empty()) attach_simulated_gpu(out->api.sim_set_peer_memory);
    return out;
  }();
  if (!loaded->error.empty()) throw ConnectionError(loaded->error);
  return loaded->api;
}

// ibv_query_port as verbs.h's inline wrapper does it: the provider's extended query where
// it has one, else the exported compat call into a zeroed attribute.
int query_port_attr(const Ibverbs& lib, ibv_context* ctx, uint8_t port, ibv_port_attr* attr) {
  if (verbs_context* vctx = verbs_get_ctx_op(ctx, query_port)) return vctx->query_port(ctx, port, attr, sizeof *attr);
  std::memset(attr, 0, sizeof *attr);
  return lib.query_port(ctx, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

[[noreturn]] void throw_errno(const Ibverbs& lib, const std::string& what, int err) {
  throw VerbsError(err, fmt::format("{}: {}{}", what, std::strerror(err), lib.detail()));
}

class IbvMemoryRegion final : public MemoryRegion {
 public:
  IbvMemoryRegion(const Ibverbs& lib, ibv_mr* mr) : lib_(lib), mr_(mr) {}
  ~IbvMemoryRegion() override { lib_.dereg_mr(mr_); }
  uint64_t addr() const override { return reinterpret_cast<uint64_t>(mr_->addr); }
  size_t length() const override { return mr_->length; }
  uint32_t lkey() const override { return mr_->lkey; }
  uint32_t rkey() const override { return mr_->rkey; }

 private:
  const Ibverbs& lib_;
  ibv_mr* mr_;
};

class IbvCompletionQueue final : public CompletionQueue {
 public:
  IbvCompletionQueue(const Ibverbs& lib, ibv_context* ctx, int depth) : lib_(lib) {
    channel_ = lib_.create_comp_channel(ctx);
    if (!channel_) throw_errno(lib_, "ibv_create_comp_channel", errno);
    // Non-blocking, so ack_events() never blocks and the fd can sit in an event loop.
    int flags = fcntl(channel_->fd, F_GETFL);
    if (flags < 0 || fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
      int err = errno;
      lib_.destroy_comp_channel(channel_);
      throw_errno(lib_, "fcntl(O_NONBLOCK) on the completion channel", err);
    }
    cq_ = lib_.create_cq(ctx, depth, nullptr, channel_, 0);
    if (!cq_) {
      int err = errno;
      lib_.destroy_comp_channel(channel_);
      throw_errno(lib_, fmt::format("ibv_create_cq(depth {})", depth), err);
    }
  }
  ~IbvCompletionQueue() override {
    lib_.destroy_cq(cq_);
    lib_.destroy_comp_channel(channel_);
  }
  int depth() const override { return cq_->cqe; }
  int poll(int max, WorkCompletion* out) override {
    constexpr int kChunk = 32;
    ibv_wc wc[kChunk];
    int total = 0;
    while (total < max) {
      int n = ibv_poll_cq(cq_, std::min(kChunk, max - total), wc);
      if (n < 0) return n;
      for (int i = 0; i < n; ++i) out[total + i] = convert(wc[i]);
      total += n;
      if (n < kChunk) break;
    }
    return total;
  }
  int req_notify() override { return ibv_req_notify_cq(cq_, 0); }
  int channel_fd() const override { return channel_->fd; }
  int ack_events() override {
    int count = 0;
    ibv_cq* cq = nullptr;
    void* cq_ctx = nullptr;
    while (lib_.get_cq_event(channel_, &cq, &cq_ctx) == 0) ++count;
    if (count) lib_.ack_cq_events(cq_, count);
    return count;
  }
  ibv_cq* raw() const { return cq_; }

 private:
  static WorkCompletion convert(const ibv_wc& wc) {
    WorkCompletion out;
    out.wr_id = wc.wr_id;
    switch (wc.status) {
      case IBV_WC_SUCCESS:
      case IBV_WC_LOC_LEN_ERR:
      case IBV_WC_LOC_QP_OP_ERR:
      case IBV_WC_LOC_PROT_ERR:
      case IBV_WC_WR_FLUSH_ERR:
      case IBV_WC_REM_INV_REQ_ERR:
      case IBV_WC_REM_ACCESS_ERR:
      case IBV_WC_REM_OP_ERR:
      case IBV_WC_RETRY_EXC_ERR:
      case IBV_WC_RNR_RETRY_EXC_ERR: out.status = static_cast<WcStatus>(wc.status); break;
      default: out.status = WcStatus::kGeneralErr; break;
    }
    switch (wc.opcode) {
      case IBV_WC_SEND: out.opcode = WcOpcode::kSend; break;
      case IBV_WC_RDMA_WRITE: out.opcode = WcOpcode::kRdmaWrite; break;
      case IBV_WC_RDMA_READ: out.opcode = WcOpcode::kRdmaRead; break;
      case IBV_WC_RECV_RDMA_WITH_IMM: out.opcode = WcOpcode::kRecvRdmaWithImm; break;
      default: out.opcode = WcOpcode::kRecv; break;
    }
    out.byte_len = wc.byte_len;
    out.has_imm = (wc.wc_flags & IBV_WC_WITH_IMM) != 0;
    out.imm_data = out.has_imm ? ntohl(wc.imm_data) : 0;
    out.qp_num = wc.qp_num;
    return out;
  }

  const Ibverbs& lib_;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
};

class IbvQueuePair final : public QueuePair {
 public:
  IbvQueuePair(const Ibverbs& lib, ibv_pd* pd, IbvCompletionQueue& scq, IbvCompletionQueue& rcq, const QpCaps& caps)
      : lib_(lib) {
    ibv_qp_init_attr attr{};
    attr.send_cq = scq.raw();
    attr.recv_cq = rcq.raw();
    attr.qp_type = IBV_QPT_RC;
    attr.sq_sig_all = 0;
    attr.cap.max_send_wr = caps.max_send_wr;
    attr.cap.max_recv_wr = caps.max_recv_wr;
    attr.cap.max_send_sge = caps.max_send_sge;
    attr.cap.max_recv_sge = caps.max_recv_sge;
    attr.cap.max_inline_data = caps.max_inline_data;
    qp_ = lib_.create_qp(pd, &attr);
    if (!qp_) throw_errno(lib_, "ibv_create_qp(RC)", errno);
    // ibv_create_qp writes back the caps it granted (at least those asked).
    caps_ = QpCaps{attr.cap.max_send_wr, attr.cap.max_recv_wr, attr.cap.max_send_sge, attr.cap.max_recv_sge,
                   attr.cap.max_inline_data};
  }
  ~IbvQueuePair() override { lib_.destroy_qp(qp_); }
  uint32_t qp_num() const override { return qp_->qp_num; }
  QpState state() const override {
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    if (lib_.query_qp(qp_, &attr, IBV_QP_STATE, &init) != 0) return QpState::kErr;
    switch (attr.qp_state) {
      case IBV_QPS_RESET: return QpState::kReset;
      case IBV_QPS_INIT: return QpState::kInit;
      case IBV_QPS_RTR: return QpState::kRtr;
      case IBV_QPS_RTS: return QpState::kRts;
      default: return QpState::kErr;
    }
  }
  const QpCaps& caps() const override { return caps_; }
  int modify_to_init(const RcInitAttr& a) override {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.port_num = a.port;
    attr.pkey_index = a.pkey_index;
    attr.qp_access_flags = a.access;
    port_ = a.port;  // the address vector of RTR names the same port
    return lib_.modify_qp(qp_, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  }
  int modify_to_rtr(const RcRtrAttr& a) override {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = static_cast<ibv_mtu>(a.path_mtu);
    attr.dest_qp_num = a.remote_qpn;
    attr.rq_psn = a.rq_psn;
    attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
    attr.min_rnr_timer = a.min_rnr_timer;
    attr.ah_attr.dlid = a.remote_lid;
    attr.ah_attr.sl = a.service_level;
    attr.ah_attr.port_num = port_;
    attr.ah_attr.is_global = a.use_gid ? 1 : 0;
    if (a.use_gid) {
      std::memcpy(attr.ah_attr.grh.dgid.raw, a.remote_gid.data(), 16);
      attr.ah_attr.grh.sgid_index = a.sgid_index;
      attr.ah_attr.grh.hop_limit = a.hop_limit;
      attr.ah_attr.grh.traffic_class = a.traffic_class;
    }
    return lib_.modify_qp(qp_, &attr,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  }
  int modify_to_rts(const RcRtsAttr& a) override {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn = a.sq_psn;
    attr.timeout = a.timeout;
    attr.retry_cnt = a.retry_cnt;
    attr.rnr_retry = a.rnr_retry;
    attr.max_rd_atomic = a.max_rd_atomic;
    return lib_.modify_qp(qp_, &attr,
                         IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                             IBV_QP_MAX_QP_RD_ATOMIC);
  }
  int modify_to_err() override {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    return lib_.modify_qp(qp_, &attr, IBV_QP_STATE);
  }
  int post_send(const SendWr* wr, const SendWr** bad_wr) override {
    if (bad_wr) *bad_wr = nullptr;
    // Translated in chunks so a long list needs no allocation per WR.
    constexpr int kChunk = 64;
    ibv_send_wr wrs[kChunk];
    const SendWr* chunk_start = wr;
    while (chunk_start) {
      int n = 0;
      const SendWr* w = chunk_start;
      for (; w && n < kChunk; w = w->next, ++n) {
        ibv_send_wr& o = wrs[n];
        o = ibv_send_wr{};
        o.wr_id = w->wr_id;
        // ibv_sge and Sge have the same layout (addr, length, lkey).
        o.sg_list = reinterpret_cast<ibv_sge*>(const_cast<Sge*>(w->sg_list));
        o.num_sge = w->num_sge;
        o.opcode = opcode(w->opcode);
        o.send_flags = (w->signaled ? IBV_SEND_SIGNALED : 0) | (w->inline_data ? IBV_SEND_INLINE : 0);
        o.imm_data = htonl(w->imm_data);
        o.wr.rdma.remote_addr = w->remote_addr;
        o.wr.rdma.rkey = w->rkey;
        o.next = n + 1 < kChunk && w->next ? &wrs[n + 1] : nullptr;
      }
      ibv_send_wr* bad = nullptr;
      int rc = ibv_post_send(qp_, wrs, &bad);
      if (rc) {
        if (bad_wr) {
          const SendWr* p = chunk_start;
          for (ibv_send_wr* q = wrs; q != bad; q = q->next) p = p->next;
          *bad_wr = p;
        }
        return rc;
      }
      chunk_start = w;
    }
    return 0;
  }
  int post_recv(const RecvWr* wr, const RecvWr** bad_wr) override {
    if (bad_wr) *bad_wr = nullptr;
    for (const RecvWr* w = wr; w; w = w->next) {
      ibv_recv_wr o{};
      o.wr_id = w->wr_id;
      o.sg_list = reinterpret_cast<ibv_sge*>(const_cast<Sge*>(w->sg_list));
      o.num_sge = w->num_sge;
      ibv_recv_wr* bad = nullptr;
      int rc = ibv_post_recv(qp_, &o, &bad);
      if (rc) {
        if (bad_wr) *bad_wr = w;
        return rc;
      }
    }
    return 0;
  }
 private:
  static ibv_wr_opcode opcode(WrOpcode op) {
    switch (op) {
      case WrOpcode::kRdmaWrite: return IBV_WR_RDMA_WRITE;
      case WrOpcode::kRdmaWriteWithImm: return IBV_WR_RDMA_WRITE_WITH_IMM;
      case WrOpcode::kRdmaRead: return IBV_WR_RDMA_READ;
      case WrOpcode::kSend: return IBV_WR_SEND;
      case WrOpcode::kSendWithImm: return IBV_WR_SEND_WITH_IMM;
    }
    return IBV_WR_SEND;
  }
  const Ibverbs& lib_;
  ibv_qp* qp_ = nullptr;
  QpCaps caps_;
  uint8_t port_ = 1;
};

static_assert(sizeof(Sge) == sizeof(ibv_sge) && offsetof(Sge, lkey) == offsetof(ibv_sge, lkey),
              "Sge must match ibv_sge so sg lists pass through unchanged");

class IbvProtectionDomain final : public ProtectionDomain {
 public:
  IbvProtectionDomain(const Ibverbs& lib, ibv_context* ctx) : lib_(lib), pd_(lib_.alloc_pd(ctx)) {
    if (!pd_) throw_errno(lib_, "ibv_alloc_pd", errno);
  }
  ~IbvProtectionDomain() override { lib_.dealloc_pd(pd_); }
  std::unique_ptr<MemoryRegion> reg_mr(void* addr, size_t length, uint32_t access) override {
    ibv_mr* mr = lib_.reg_mr_iova2(pd_, addr, length, reinterpret_cast<uintptr_t>(addr), access);
    if (!mr) throw_errno(lib_, fmt::format("ibv_reg_mr({}, {} bytes, access {:#x})", addr, length, access), errno);
    return std::make_unique<IbvMemoryRegion>(lib_, mr);
  }
  std::unique_ptr<MemoryRegion> reg_dmabuf_mr(uint64_t offset, size_t length, uint64_t iova, int fd,
                                              uint32_t access) override {
    if (!lib_.reg_dmabuf_mr) {
      throw VerbsError(ENOSYS, "ibv_reg_dmabuf_mr: the libibverbs loaded lacks it (rdma-core 34 or later has it)");
    }
    ibv_mr* mr = lib_.reg_dmabuf_mr(pd_, offset, length, iova, fd, static_cast<int>(access));
    if (!mr) {
      throw_errno(lib_, fmt::format("ibv_reg_dmabuf_mr(fd {}, offset {}, {} bytes, iova {:#x}, access {:#x})", fd, offset,
                              length, iova, access),
                  errno);
    }
    return std::make_unique<IbvMemoryRegion>(lib_, mr);
  }
  std::unique_ptr<QueuePair> create_rc_qp(CompletionQueue& send_cq, CompletionQueue& recv_cq, const QpCaps& caps) override {
    auto* scq = dynamic_cast<IbvCompletionQueue*>(&send_cq);
    auto* rcq = dynamic_cast<IbvCompletionQueue*>(&recv_cq);
    if (!scq || !rcq) throw VerbsError(EINVAL, "ibv create_qp: the CQs are not libibverbs CQs", StatusCode::kInvalidArgument);
    return std::make_unique<IbvQueuePair>(lib_, pd_, *scq, *rcq, caps);
  }

 private:
  const Ibverbs& lib_;
  ibv_pd* pd_;
};

static_assert(static_cast<uint32_t>(IBV_ACCESS_LOCAL_WRITE) == kLocalWrite &&
                  static_cast<uint32_t>(IBV_ACCESS_REMOTE_WRITE) == kRemoteWrite &&
                  static_cast<uint32_t>(IBV_ACCESS_REMOTE_READ) == kRemoteRead,
              "Access values are IBV_ACCESS_* values");

class IbvContext final : public Context {
 public:
  IbvContext(const Ibverbs& lib, ibv_context* ctx, std::string name) : lib_(lib), ctx_(ctx), name_(std::move(name)) {}
  ~IbvContext() override { lib_.close_device(ctx_); }
  const std::string& device_name() const override { return name_; }
  PortAttr query_port(uint8_t port) override {
    ibv_port_attr attr{};
    int rc = query_port_attr(lib_, ctx_, port, &attr);
    if (rc) throw_errno(lib_, fmt::format("ibv_query_port({} port {})", name_, port), rc);
    PortAttr out;
    switch (attr.state) {
      case IBV_PORT_DOWN: out.state = PortState::kDown; break;
      case IBV_PORT_INIT: out.state = PortState::kInit; break;
      case IBV_PORT_ARMED: out.state = PortState::kArmed; break;
      case IBV_PORT_ACTIVE: out.state = PortState::kActive; break;
      default: out.state = PortState::kOther; break;
    }
    out.link_layer = attr.link_layer == IBV_LINK_LAYER_ETHERNET     ? LinkLayer::kEthernet
                     : attr.link_layer == IBV_LINK_LAYER_INFINIBAND ? LinkLayer::kInfiniBand
                                                                    : LinkLayer::kUnspecified;
    out.active_mtu = static_cast<Mtu>(attr.active_mtu);
    out.lid = attr.lid;
    out.gid_table_len = attr.gid_tbl_len;
    return out;
  }
  GidEntry query_gid(uint8_t port, int index) override {
    ibv_gid_entry entry{};
    int rc = lib_.query_gid_ex(ctx_, port, static_cast<uint32_t>(index), &entry, 0, sizeof entry);
    GidEntry out;
    if (rc == ENODATA) return out;  // an unused slot
    if (rc) throw_errno(lib_, fmt::format("ibv_query_gid_ex({} port {} index {})", name_, port, index), rc);
    std::memcpy(out.gid.data(), entry.gid.raw, 16);
    out.type = entry.gid_type == IBV_GID_TYPE_ROCE_V2   ? GidType::kRoceV2
               : entry.gid_type == IBV_GID_TYPE_ROCE_V1 ? GidType::kRoceV1
               : entry.gid_type == IBV_GID_TYPE_IB      ? GidType::kIb
                                                        : GidType::kUnknown;
    return out;
  }
  DeviceCaps query_device() override {
    ibv_device_attr attr{};
    if (int rc = lib_.query_device(ctx_, &attr)) throw_errno(lib_, fmt::format("ibv_query_device({})", name_), rc);
    DeviceCaps out;
    out.max_qp_wr = static_cast<uint32_t>(std::max(attr.max_qp_wr, 0));
    out.max_sge = static_cast<uint32_t>(std::max(attr.max_sge, 0));
    out.max_cqe = attr.max_cqe;
    return out;
  }
  std::unique_ptr<ProtectionDomain> alloc_pd() override { return std::make_unique<IbvProtectionDomain>(lib_, ctx_); }
  std::unique_ptr<CompletionQueue> create_cq(int depth) override {
    return std::make_unique<IbvCompletionQueue>(lib_, ctx_, depth);
  }

 private:
  const Ibverbs& lib_;
  ibv_context* ctx_;
  std::string name_;
};

// A device list and its devices, from one library: libibverbs, or the simulated device's.
class IbvProvider final : public Provider {
 public:
  IbvProvider(const char* name, const Ibverbs& (*library)()) : name_(name), library_(library) {}
  const char* name() const override { return name_; }
  std::vector<std::string> list_devices() override {
    const Ibverbs& lib = library_();
    std::vector<std::string> names;
    int n = 0;
    // NULL (e.g. ENOSYS: no RDMA subsystem in the kernel) and an empty list both mean "none".
    ibv_device** list = lib.get_device_list(&n);
    if (!list) return names;
    for (int i = 0; i < n; ++i) names.emplace_back(lib.get_device_name(list[i]));
    lib.free_device_list(list);
    return names;
  }
  std::unique_ptr<Context> open(const std::string& device_name) override {
    const Ibverbs& lib = library_();
    int n = 0;
    ibv_device** list = lib.get_device_list(&n);
    if (!list) throw NotFoundError(fmt::format("no RDMA device '{}' ({})", device_name, kNoDeviceReason));
    ibv_context* ctx = nullptr;
    bool found = false;
    int err = 0;
    std::vector<std::string> names;
    for (int i = 0; i < n && !found; ++i) {
      names.emplace_back(lib.get_device_name(list[i]));
      if (device_name == names.back()) {
        found = true;
        ctx = lib.open_device(list[i]);
        if (!ctx) err = errno;
      }
    }
    lib.free_device_list(list);
    if (!found) {
      throw NotFoundError(fmt::format("no RDMA device '{}' (the {} devices: {})", device_name, name_,
                                      names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", "))));
    }
    if (!ctx) throw_errno(lib, fmt::format("ibv_open_device({})", device_name), err);
    return std::make_unique<IbvContext>(lib, ctx, device_name);
  }

 private:
  const char* name_;
  const Ibverbs& (*library_)();
};

}  // namespace

Provider& ibverbs_provider() {
  static IbvProvider instance("ibverbs", real_library);
  return instance;
}

Provider& sim_provider() {
  static IbvProvider instance("sim", sim_library);
  return instance;
}

SimObjectCounts sim_object_counts() {
  SimObjectCounts out;
  sim_library().sim_object_counts(&out);
  return out;
}

}  // namespace dlslime::rdma
