// The verbs.h interface over the simulated device (sim_device.h). Each object holds the
// fabric alive and takes its lock for every call; the engine thread does the work.
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <optional>

#include <fmt/format.h>

#include "core/log.h"
#include "gpu/sim_runtime.h"
#include "rdma/sim_device.h"

namespace dlslime::rdma {
namespace {

using sim::Fabric;

// Object accounting as verbs keeps it. A PD, CQ or context that still has live children
// cannot be destroyed: ibv_dealloc_pd, ibv_destroy_cq and ibv_close_device return EBUSY and
// the object leaks, and a child destroyed after its context is a call through freed
// memory. The simulated device counts such a destroy (destroy_failures) and logs it, so a
// test sees the teardown order a NIC would punish.
struct Counts {
  std::atomic<int64_t> contexts{0}, pds{0}, mrs{0}, cqs{0}, qps{0}, comp_channels{0}, destroy_failures{0};
  // What the live objects hold of the device: CQ entries and QP receive-queue entries.
  std::atomic<int64_t> cqes{0}, recv_wrs{0};
};
Counts& counts() {
  static Counts c;
  return c;
}

// A parent's count of its live children.
struct Children {
  std::atomic<int64_t> live{0};
};

// Held by a child for its life: counts it in its parent.
class ChildOf {
 public:
  explicit ChildOf(std::shared_ptr<Children> parent) : parent_(std::move(parent)) { ++parent_->live; }
  ChildOf(const ChildOf&) = delete;
  ChildOf& operator=(const ChildOf&) = delete;
  ~ChildOf() { --parent_->live; }
  const Children* parent() const { return parent_.get(); }

 private:
  std::shared_ptr<Children> parent_;
};

// The destroy of an object with `children`: refused on hardware (EBUSY) if any still live.
void destroyed(const Children& children, const char* object, const char* kind) {
  const int64_t live = children.live.load();
  if (live == 0) return;
  ++counts().destroy_failures;
  DLSLIME_WARN("sim_rdma0: {} destroyed with {} live {} (a NIC refuses this with EBUSY and the {} leaks)", object,
               live, kind, object);
}

// Counts one live object of a kind.
class Counted {
 public:
  explicit Counted(std::atomic<int64_t>& count, int64_t amount = 1) : count_(count), amount_(amount) {
    count_ += amount_;
  }
  Counted(const Counted&) = delete;
  Counted& operator=(const Counted&) = delete;
  ~Counted() { count_ -= amount_; }

 private:
  std::atomic<int64_t>& count_;
  const int64_t amount_;
};

// What pinning host pages does on a NIC (get_user_pages): every page of [addr, +length) must
// be mapped and readable, and writable if the MR asks for local or remote write. Otherwise
// ibv_reg_mr fails with EFAULT. Read from /proc/self/maps: registration is not a hot path.
void check_host_pages(uintptr_t addr, size_t length, bool write) {
  const uintptr_t end = addr + length;
  uintptr_t covered = addr;  // [addr, covered) is known to be mapped as needed
  std::FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) throw VerbsError(errno, "sim reg_mr: cannot read /proc/self/maps");
  char line[512];
  const char* why = "is not mapped";
  while (covered < end && std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) != 3) continue;
    if (hi <= covered) continue;
    if (lo > covered) break;  // a hole: the mappings are sorted
    if (perms[0] != 'r' || (write && perms[1] != 'w')) {
      why = perms[0] != 'r' ? "is not readable (PROT_NONE)" : "is read-only, and the MR asks for write access";
      break;
    }
    covered = hi;
  }
  std::fclose(maps);
  if (covered < end) {
    throw VerbsError(EFAULT, fmt::format("sim reg_mr({:#x}, {} bytes): memory at {:#x} {} (a NIC fails the pinning "
                                         "with EFAULT)",
                                         addr, length, covered, why));
  }
}

class SimMemoryRegion final : public MemoryRegion {
 public:
  SimMemoryRegion(std::shared_ptr<Fabric> fabric, const sim::Mr& mr, std::shared_ptr<Children> pd)
      : fabric_(std::move(fabric)), mr_(mr), pd_(std::move(pd)) {}
  ~SimMemoryRegion() override {
    std::lock_guard<std::mutex> lock(fabric_->mu);
    fabric_->remove_mr(mr_.lkey);
  }
  uint64_t addr() const override { return mr_.addr; }
  size_t length() const override { return mr_.length; }
  uint32_t lkey() const override { return mr_.lkey; }
  uint32_t rkey() const override { return mr_.rkey; }

 private:
  std::shared_ptr<Fabric> fabric_;
  sim::Mr mr_;
  ChildOf pd_;
  Counted counted_{counts().mrs};
};

class SimCompletionQueue final : public CompletionQueue {
 public:
  SimCompletionQueue(std::shared_ptr<Fabric> fabric, int depth, std::shared_ptr<Children> context)
      : fabric_(std::move(fabric)), cq_(std::make_shared<sim::Cq>(depth)), context_(std::move(context)) {}
  ~SimCompletionQueue() override { destroyed(*qps_, "CQ", "QPs"); }
  int depth() const override { return cq_->depth; }
  int poll(int max, WorkCompletion* out) override {
    std::lock_guard<std::mutex> lock(fabric_->mu);
    return fabric_->poll(*cq_, max, out);
  }
  int req_notify() override {
    std::lock_guard<std::mutex> lock(fabric_->mu);
    if (cq_->overrun) return EIO;
    cq_->armed = true;
    return 0;
  }
  int channel_fd() const override { return cq_->event_fd; }
  int ack_events() override {
    uint64_t count = 0;
    if (::read(cq_->event_fd, &count, sizeof(count)) != sizeof(count)) return 0;  // EAGAIN: none pending
    return static_cast<int>(count);
  }
  const std::shared_ptr<sim::Cq>& cq() const { return cq_; }
  const std::shared_ptr<Children>& qps() const { return qps_; }
  const Children* context() const { return context_.parent(); }

 private:
  std::shared_ptr<Fabric> fabric_;
  std::shared_ptr<sim::Cq> cq_;
  ChildOf context_;
  std::shared_ptr<Children> qps_ = std::make_shared<Children>();
  // The CQ and its completion channel (one event fd here) are made and destroyed together.
  Counted counted_{counts().cqs}, channel_counted_{counts().comp_channels};
  Counted entries_{counts().cqes, cq_->depth};
};

class SimQueuePair final : public QueuePair {
 public:
  SimQueuePair(std::shared_ptr<Fabric> fabric, std::shared_ptr<sim::Qp> qp, std::shared_ptr<Children> pd,
               std::shared_ptr<Children> send_cq, std::shared_ptr<Children> recv_cq)
      : fabric_(std::move(fabric)),
        qp_(std::move(qp)),
        pd_(std::move(pd)),
        send_cq_(std::move(send_cq)),
        recv_cq_(std::move(recv_cq)) {}
  ~SimQueuePair() override {
    std::lock_guard<std::mutex> lock(fabric_->mu);
    fabric_->remove_qp(qp_->qpn);
  }
  uint32_t qp_num() const override { return qp_->qpn; }
  QpState state() const override {
    std::lock_guard<std::mutex> lock(fabric_->mu);
    return qp_->state;
  }
  const QpCaps& caps() const override { return qp_->caps; }
  int modify_to_init(const RcInitAttr& attr) override { return modify(QpState::kInit, &attr, nullptr, nullptr); }
  int modify_to_rtr(const RcRtrAttr& attr) override { return modify(QpState::kRtr, nullptr, &attr, nullptr); }
  int modify_to_rts(const RcRtsAttr& attr) override { return modify(QpState::kRts, nullptr, nullptr, &attr); }
  int modify_to_err() override { return modify(QpState::kErr, nullptr, nullptr, nullptr); }
  int post_send(const SendWr* wr, const SendWr** bad_wr) override {
    std::lock_guard<std::mutex> lock(fabric_->mu);
    return fabric_->post_send(*qp_, wr, bad_wr);
  }
  int post_recv(const RecvWr* wr, const RecvWr** bad_wr) override {
    std::lock_guard<std::mutex> lock(fabric_->mu);
    return fabric_->post_recv(*qp_, wr, bad_wr);
  }

 private:
  int modify(QpState to, const RcInitAttr* init, const RcRtrAttr* rtr, const RcRtsAttr* rts) {
    std::lock_guard<std::mutex> lock(fabric_->mu);
    return fabric_->modify(*qp_, to, init, rtr, rts);
  }
  std::shared_ptr<Fabric> fabric_;
  std::shared_ptr<sim::Qp> qp_;
  ChildOf pd_, send_cq_, recv_cq_;
  Counted counted_{counts().qps};
  Counted recv_wrs_{counts().recv_wrs, qp_->caps.max_recv_wr};
};

class SimProtectionDomain final : public ProtectionDomain {
 public:
  SimProtectionDomain(std::shared_ptr<Fabric> fabric, std::shared_ptr<Children> context)
      : fabric_(std::move(fabric)), context_(std::move(context)) {
    std::lock_guard<std::mutex> lock(fabric_->mu);
    pd_ = fabric_->new_pd();
  }
  ~SimProtectionDomain() override { destroyed(*children_, "PD", "MRs or QPs"); }
  std::unique_ptr<MemoryRegion> reg_mr(void* addr, size_t length, uint32_t access) override {
    // As ibv_reg_mr: remote write needs local write, and only the known flags are valid.
    if (addr == nullptr || length == 0) throw VerbsError(EINVAL, "sim reg_mr: null address or zero length", StatusCode::kInvalidArgument);
    check_access(access);
    // Device memory of the simulated GPU: registered by address only with peer-memory
    // support (nvidia-peermem's role), and then the NIC moves its bytes through its own
    // view. Without it, pinning a device address fails as get_user_pages does: EFAULT.
    std::optional<gpu::sim::NicView> view;
    try {
      view = gpu::sim::nic_view(reinterpret_cast<uintptr_t>(addr), length);
    } catch (const InvalidArgumentError& e) {
      throw VerbsError(EFAULT, fmt::format("sim reg_mr({}, {} bytes): {}", addr, length, e.what()));
    }
    if (view && !sim::device_memory_support().peermem) {
      throw VerbsError(EFAULT, fmt::format("sim reg_mr({}, {} bytes): the range is GPU memory and the simulated device "
                                           "has no peer-memory support (DLSLIME_RDMA_SIM_DEVICE_MEMORY)",
                                           addr, length));
    }
    if (!view) check_host_pages(reinterpret_cast<uintptr_t>(addr), length, (access & (kLocalWrite | kRemoteWrite)) != 0);
    std::lock_guard<std::mutex> lock(fabric_->mu);
    const sim::Mr& mr = view ? fabric_->add_mr(reinterpret_cast<uint64_t>(addr), length, access, pd_, view->data,
                                               std::move(view->keep))
                             : fabric_->add_mr(reinterpret_cast<uint64_t>(addr), length, access, pd_);
    return std::make_unique<SimMemoryRegion>(fabric_, mr, children_);
  }
  std::unique_ptr<MemoryRegion> reg_dmabuf_mr(uint64_t offset, size_t length, uint64_t iova, int fd,
                                              uint32_t access) override {
    if (!sim::device_memory_support().dmabuf) {
      throw VerbsError(EOPNOTSUPP, "sim reg_dmabuf_mr: the simulated device has no dma-buf support "
                                   "(DLSLIME_RDMA_SIM_DEVICE_MEMORY)");
    }
    if (iova == 0 || length == 0) {
      throw VerbsError(EINVAL, "sim reg_dmabuf_mr: null iova or zero length", StatusCode::kInvalidArgument);
    }
    check_access(access);
    // The import: the NIC maps the buffer's pages for itself (the fd may be closed after).
    gpu::sim::NicView view;
    try {
      view = gpu::sim::map_dmabuf(fd, offset, length);
    } catch (const InvalidArgumentError& e) {
      throw VerbsError(EINVAL, fmt::format("sim reg_dmabuf_mr: {}", e.what()), StatusCode::kInvalidArgument);
    }
    std::lock_guard<std::mutex> lock(fabric_->mu);
    const sim::Mr& mr = fabric_->add_mr(iova, length, access, pd_, view.data, std::move(view.keep));
    return std::make_unique<SimMemoryRegion>(fabric_, mr, children_);
  }
  static void check_access(uint32_t access) {
    if ((access & ~(kLocalWrite | kRemoteWrite | kRemoteRead)) != 0 ||
        ((access & kRemoteWrite) && !(access & kLocalWrite))) {
      throw VerbsError(EINVAL, fmt::format("sim reg_mr: invalid access flags {:#x} (remote write needs local write)", access),
                       StatusCode::kInvalidArgument);
    }
  }
  std::unique_ptr<QueuePair> create_rc_qp(CompletionQueue& send_cq, CompletionQueue& recv_cq, const QpCaps& caps) override {
    auto* scq = dynamic_cast<SimCompletionQueue*>(&send_cq);
    auto* rcq = dynamic_cast<SimCompletionQueue*>(&recv_cq);
    if (!scq || !rcq) throw VerbsError(EINVAL, "sim create_qp: the CQs are not the simulated device's", StatusCode::kInvalidArgument);
    // The kernel resolves a QP's CQs in the PD's context: a CQ of another context is EINVAL.
    if (scq->context() != context_.parent() || rcq->context() != context_.parent()) {
      throw VerbsError(EINVAL, "sim create_qp: a CQ belongs to another device context than the PD",
                       StatusCode::kInvalidArgument);
    }
    if (caps.max_send_wr > sim::kMaxQpWr || caps.max_recv_wr > sim::kMaxQpWr || caps.max_send_sge > sim::kMaxSge ||
        caps.max_recv_sge > sim::kMaxSge || caps.max_inline_data > sim::kMaxInline) {
      throw VerbsError(EINVAL,
                       fmt::format("sim create_qp: caps beyond the device's (max_wr {}, max_sge {}, max_inline {})",
                                   sim::kMaxQpWr, sim::kMaxSge, sim::kMaxInline),
                       StatusCode::kInvalidArgument);
    }
    std::lock_guard<std::mutex> lock(fabric_->mu);
    return std::make_unique<SimQueuePair>(fabric_, fabric_->add_qp(pd_, scq->cq(), rcq->cq(), caps), children_,
                                          scq->qps(), rcq->qps());
  }

 private:
  std::shared_ptr<Fabric> fabric_;
  uint32_t pd_ = 0;
  ChildOf context_;
  std::shared_ptr<Children> children_ = std::make_shared<Children>();  // its MRs and QPs
  Counted counted_{counts().pds};
};

class SimContext final : public Context {
 public:
  SimContext() : fabric_(Fabric::acquire()) {}
  ~SimContext() override { destroyed(*children_, "context", "PDs or CQs"); }
  const std::string& device_name() const override { return name_; }
  PortAttr query_port(uint8_t port) override {
    check_port(port);
    PortAttr attr;
    attr.state = PortState::kActive;
    attr.link_layer = LinkLayer::kEthernet;
    attr.active_mtu = sim::kActiveMtu;
    attr.lid = 0;  // RoCE ports have no LID
    attr.gid_table_len = 1;
    return attr;
  }
  GidEntry query_gid(uint8_t port, int index) override {
    check_port(port);
    if (index != 0) throw VerbsError(EINVAL, fmt::format("sim_rdma0 port 1 has one GID (index 0), not index {}", index), StatusCode::kInvalidArgument);
    return GidEntry{sim::device_gid(), GidType::kRoceV2};
  }
  std::unique_ptr<ProtectionDomain> alloc_pd() override {
    return std::make_unique<SimProtectionDomain>(fabric_, children_);
  }
  std::unique_ptr<CompletionQueue> create_cq(int depth) override {
    if (depth < 1 || depth > sim::kMaxCqe) {
      throw VerbsError(EINVAL, fmt::format("sim create_cq: depth {} outside 1..{}", depth, sim::kMaxCqe), StatusCode::kInvalidArgument);
    }
    return std::make_unique<SimCompletionQueue>(fabric_, depth, children_);
  }

 private:
  static void check_port(uint8_t port) {
    if (port != sim::kPort) throw VerbsError(EINVAL, fmt::format("sim_rdma0 has port 1 only, not port {}", port), StatusCode::kInvalidArgument);
  }
  std::shared_ptr<Fabric> fabric_;
  std::string name_ = sim::kDeviceName;
  std::shared_ptr<Children> children_ = std::make_shared<Children>();  // its PDs and CQs
  Counted counted_{counts().contexts};
};

class SimProvider final : public Provider {
 public:
  const char* name() const override { return "sim"; }
  std::vector<std::string> list_devices() override { return {sim::kDeviceName}; }
  std::unique_ptr<Context> open(const std::string& device_name) override {
    if (device_name != sim::kDeviceName) {
      throw NotFoundError(fmt::format("no RDMA device '{}' (the simulated device is {})", device_name, sim::kDeviceName));
    }
    return std::make_unique<SimContext>();
  }
};

}  // namespace

SimObjectCounts sim_object_counts() {
  const Counts& c = counts();
  return SimObjectCounts{c.contexts.load(), c.pds.load(),           c.mrs.load(),
                         c.cqs.load(),      c.qps.load(),           c.comp_channels.load(),
                         c.destroy_failures.load(), c.cqes.load(), c.recv_wrs.load()};
}

Provider& sim_provider() {
  static SimProvider instance;
  return instance;
}

}  // namespace dlslime::rdma
