// Device selection, GID selection and the RDMA memory domain (rdma_device.h).
#include "rdma/rdma_device.h"

#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "dlslime/errors.h"
#include "dlslime/rdma_endpoint.h"
#include "gpu/device_runtime.h"

namespace dlslime::rdma {

LinkLayer parse_link_type(const std::string& link_type) {
  if (strcasecmp(link_type.c_str(), "auto") == 0) return LinkLayer::kUnspecified;
  if (strcasecmp(link_type.c_str(), "roce") == 0 || strcasecmp(link_type.c_str(), "ethernet") == 0) {
    return LinkLayer::kEthernet;
  }
  if (strcasecmp(link_type.c_str(), "ib") == 0 || strcasecmp(link_type.c_str(), "infiniband") == 0) {
    return LinkLayer::kInfiniBand;
  }
  throw InvalidArgumentError(
      fmt::format("RDMAEndpoint option link_type='{}' is not one of auto, RoCE, IB", link_type));
}

namespace {

const char* visible_env() {
  const char* v = std::getenv("SLIME_VISIBLE_DEVICES");
  return v != nullptr && *v != '\0' ? v : nullptr;
}

}  // namespace

std::vector<std::string> visible_devices() {
  std::vector<std::string> all = provider().list_devices();
  const char* env = visible_env();
  if (env == nullptr) return all;
  std::set<std::string> wanted;
  std::stringstream list(env);
  for (std::string name; std::getline(list, name, ',');) {
    if (!name.empty()) wanted.insert(name);
  }
  std::erase_if(all, [&](const std::string& d) { return wanted.count(d) == 0; });
  return all;
}

std::string no_visible_device_reason() {
  const std::vector<std::string> all = provider().list_devices();
  if (all.empty() || visible_env() == nullptr) return kNoDeviceReason;
  return fmt::format("SLIME_VISIBLE_DEVICES='{}' hides every RDMA device (found: {})", visible_env(),
                     fmt::join(all, ", "));
}

namespace {

bool ipv4_mapped(const GidBytes& g) {
  for (int i = 0; i < 10; ++i) {
    if (g[i] != 0) return false;
  }
  return g[10] == 0xff && g[11] == 0xff;
}

// Automatic GID choice: on RoCE, a RoCE v2 GID with an IPv4-mapped address (routable,
// what RoCE fabrics are configured for), then any RoCE v2, then any non-empty one; on IB,
// the first non-empty one (index 0, the port GID). -1 when the table has none.
int pick_gid(Context& ctx, uint8_t port, const PortAttr& attr) {
  int best = -1, best_rank = 0;
  for (int i = 0; i < attr.gid_table_len; ++i) {
    GidEntry e;
    try {
      e = ctx.query_gid(port, i);
    } catch (const VerbsError&) {
      continue;  // a slot the kernel cannot report (e.g. a removed address)
    }
    if (e.empty()) continue;
    int rank = 1;
    if (attr.link_layer == LinkLayer::kEthernet && e.type == GidType::kRoceV2) rank = ipv4_mapped(e.gid) ? 3 : 2;
    if (rank > best_rank) {
      best = i;
      best_rank = rank;
    }
    if (attr.link_layer != LinkLayer::kEthernet || rank == 3) break;
  }
  return best;
}

}  // namespace

std::shared_ptr<Device> open_device(const RdmaOptions& options) {
  Provider& prov = provider();
  const LinkLayer wanted = parse_link_type(options.link_type);
  std::vector<std::string> names;
  if (options.device_name.empty()) {
    names = visible_devices();
    if (names.empty()) throw ConnectionError(no_visible_device_reason());
  } else {
    names = {options.device_name};
  }
  auto dev = std::make_shared<Device>();
  std::string why;  // the reasons devices were passed over, for the error
  for (const std::string& name : names) {
    std::unique_ptr<Context> ctx = prov.open(name);  // NotFoundError for an unknown name
    PortAttr attr;
    try {
      attr = ctx->query_port(options.ib_port);
    } catch (const VerbsError& e) {
      why += fmt::format("; {}: port {}: {}", name, options.ib_port, e.what());
      continue;
    }
    if (attr.state != PortState::kActive) {
      why += fmt::format("; {} port {} is {}", name, options.ib_port, port_state_name(attr.state));
      continue;
    }
    if (wanted != LinkLayer::kUnspecified && attr.link_layer != wanted) {
      why += fmt::format("; {} port {} is {}, not {} (link_type='{}')", name, options.ib_port,
                         link_layer_name(attr.link_layer), link_layer_name(wanted), options.link_type);
      continue;
    }
    int index = options.gid_index;
    if (index < 0) {
      index = pick_gid(*ctx, options.ib_port, attr);
      if (index < 0) {
        why += fmt::format("; {} port {} has no GID configured", name, options.ib_port);
        continue;
      }
    }
    GidEntry gid;
    try {
      gid = ctx->query_gid(options.ib_port, index);
    } catch (const VerbsError& e) {
      why += fmt::format("; {} port {}: GID index {}: {}", name, options.ib_port, index, e.what());
      continue;
    }
    if (gid.empty()) {
      why += fmt::format("; {} port {}: GID index {} is empty", name, options.ib_port, index);
      continue;
    }
    dev->port = options.ib_port;
    dev->port_attr = attr;
    dev->gid_index = index;
    dev->gid = gid;
    dev->caps = ctx->query_device();
    dev->pd = ctx->alloc_pd();
    dev->ctx = std::move(ctx);
    return dev;
  }
  throw ConnectionError(fmt::format("no usable RDMA device{}", why));
}

std::unique_ptr<MemoryRegion> register_memory(ProtectionDomain& pd, uintptr_t addr, uint64_t length, MemoryKind kind,
                                              uint32_t access) {
  if (kind == MemoryKind::kHost) return pd.reg_mr(reinterpret_cast<void*>(addr), length, access);
  // dma-buf first: it needs no peer-memory module, and the MR holds the buffer itself.
  std::string dmabuf_why;
  try {
    const gpu::DmabufRange buf = gpu::runtime().dmabuf_fd(reinterpret_cast<const void*>(addr), length);
    try {
      auto mr = pd.reg_dmabuf_mr(buf.offset, length, addr, buf.fd, access);
      ::close(buf.fd);  // the MR holds the dma-buf, not the descriptor
      return mr;
    } catch (const VerbsError& e) {
      ::close(buf.fd);
      dmabuf_why = fmt::format("the NIC did not take the GPU's dma-buf ({}{})", e.what(),
                               e.error_number() == EOPNOTSUPP || e.error_number() == ENOSYS
                                   ? ": no dma-buf support in the kernel, the NIC's driver or rdma-core (34+)"
                                   : "");
    }
  } catch (const gpu::GpuError& e) {
    dmabuf_why = fmt::format("the GPU could not export a dma-buf ({})", e.what());
  }
  try {
    return pd.reg_mr(reinterpret_cast<void*>(addr), length, access);
  } catch (const VerbsError& e) {
    throw VerbsError(e.error_number(),
                     fmt::format("cannot register GPU memory [{:#x}, +{}) for RDMA: {}; and registering it by address "
                                 "failed ({}): no peer-memory module (load nvidia-peermem) or the NIC cannot reach this "
                                 "GPU. GPU memory is never staged through host memory by RDMA",
                                 addr, length, dmabuf_why, e.what()));
  }
}

void check_dmabuf_region(int fd, uint64_t offset, uint64_t length, uint64_t iova) {
  if (length == 0) throw InvalidArgumentError("register_dmabuf_memory_region: length must be positive");
  if (memory_place_of(iova).kind != MemoryKind::kDevice) {
    throw InvalidArgumentError(fmt::format(
        "register_dmabuf_memory_region: iova {:#x} is not GPU memory of this process; pass the GPU address the "
        "dma-buf's byte `offset` has here (the pointer it was exported from)",
        iova));
  }
  // The fd itself, as the kernel checks it (hostile N11: a pipe, a socket, /dev/null or a
  // file was taken, and the region was whatever iova named).
  try {
    gpu::runtime().check_dmabuf(fd, offset, length, iova);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(fmt::format("register_dmabuf_memory_region: {}", e.what()));
  }
}

void RdmaMemoryDomain::region_added(int32_t handle, const LocalRegion& region) {
  if (region.length == 0) return;  // nothing to register
  // Local write (which remote write needs) pins the pages for writing, which a NIC refuses
  // with EFAULT for read-only memory such as a PROT_READ mmap of a weights file. Such memory
  // is registered for remote reads only, and published so (describe): peers may read it,
  // and their writes fail alone at the initiator (review F8). Unmapped memory fails both.
  bool writable = true;
  std::unique_ptr<MemoryRegion> mr;
  if (region.dmabuf) {
    // The caller's buffer, as it is: no export of our own, no other way in.
    const uint32_t access = kLocalWrite | kRemoteWrite | kRemoteRead;
    try {
      mr = device_->pd->reg_dmabuf_mr(region.dmabuf->offset(), region.length, region.addr, region.dmabuf->fd(), access);
    } catch (const VerbsError& e) {
      throw VerbsError(e.error_number(),
                       fmt::format("register_dmabuf_memory_region: the NIC did not take the dma-buf: {}", e.what()),
                       e.code());
    }
  } else {
    try {
      mr = register_memory(*device_->pd, region.addr, region.length, region.kind,
                           kLocalWrite | kRemoteWrite | kRemoteRead);
    } catch (const VerbsError& e) {
      if (e.error_number() != EFAULT || region.kind != MemoryKind::kHost) throw;
      mr = register_memory(*device_->pd, region.addr, region.length, region.kind, kRemoteRead);
      writable = false;
      DLSLIME_INFO("RDMA: region [{:#x}, +{}) is read-only memory: registered for remote reads only", region.addr,
                   region.length);
    }
  }
  std::lock_guard lock(mu_);
  mrs_[handle] = Registered{std::move(mr), region.kind == MemoryKind::kDevice, writable};
}

void RdmaMemoryDomain::region_removed(int32_t handle, const LocalRegion&) {
  std::unique_ptr<MemoryRegion> mr;
  {
    std::lock_guard lock(mu_);
    auto it = mrs_.find(handle);
    if (it == mrs_.end()) return;
    mr = std::move(it->second.mr);
    mrs_.erase(it);
  }
  if (before_deregister) before_deregister(mr->rkey());
  // Deregistered here, outside the lock: from now on the rkey is invalid at the NIC.
}

nlohmann::json RdmaMemoryDomain::describe(int32_t handle, const LocalRegion& region) const {
  nlohmann::json entry = {{"handle", handle}, {"addr", region.addr}, {"length", region.length}};
  std::lock_guard lock(mu_);
  if (auto it = mrs_.find(handle); it != mrs_.end()) {
    entry["rkey"] = it->second.mr->rkey();
    if (!it->second.writable) entry["access"] = "read";  // absent: read and write (every upstream record)
  }
  return entry;
}

std::optional<LocalKey> RdmaMemoryDomain::lkey(int32_t handle) const {
  std::lock_guard lock(mu_);
  auto it = mrs_.find(handle);
  if (it == mrs_.end()) return std::nullopt;
  return LocalKey{it->second.mr->lkey(), it->second.device, it->second.writable};
}

}  // namespace dlslime::rdma
