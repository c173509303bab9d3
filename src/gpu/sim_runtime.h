// The simulated GPU runtime behind DLSLIME_GPU_SIM=1 (docs/nvlink.md, "The simulated GPU").
// Internal to src/gpu and the tests: the library reaches it only through device_runtime.h.
//
// What it enforces, as a GPU would:
//  - Device memory is not host memory: a device pointer is a PROT_NONE view of a memfd, so
//    any host load or store through it faults (SIGSEGV). The copies use a second,
//    private read-write view of the same memfd that only this file knows about.
//  - IPC handles work across processes and only there: the opener takes the owner's memfd
//    with pidfd_open + pidfd_getfd (which needs ptrace permission over the owner: the same
//    user, and under Yama ptrace_scope 1 the owner's PR_SET_PTRACER_ANY, which exporting a
//    handle sets). A handle of a freed allocation, or one of this process's own, fails.
//  - dma-bufs (Runtime::dmabuf_fd) are duplicates of the allocation's memfd: a simulated
//    NIC "imports" one by mapping it (map_dmabuf below), as a NIC's driver maps a dma-buf's
//    pages for DMA. The export takes host-page-aligned ranges of one allocation only, as
//    cuMemGetHandleForAddressRange does (export_dmabuf below).
//  - Managed (cudaMallocManaged) and VMM (cuMemCreate) allocations exist (device_alloc
//    below) and have no IPC handle, as in CUDA.
//  - Copies are asynchronous: each stream is a worker thread that runs its queue in order;
//    the host learns of completion only through events. Copies that run past a device
//    allocation fail when they are queued (InvalidArgumentError).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "dlslime/export.h"

namespace dlslime::gpu::sim {

inline constexpr int kDeviceCount = 2;

// The simulated GPU's live objects in this process, and the calls it refused as misuse
// that a GPU punishes too (a free of memory that is not an allocation, a destroy of an
// unknown stream or event, an event recorded on another device's stream): a leak, a
// double free or a cudaErrorInvalidResourceHandle there. dlslime.testing.sim_gpu_objects().
struct ObjectCounts {
  int64_t device_allocations = 0, host_allocations = 0, streams = 0, events = 0, ipc_mappings = 0, errors = 0;
};
DLSLIME_API ObjectCounts object_counts();

// The kinds of device allocation, which CUDA exports differently: cudaIpcGetMemHandle takes
// cudaMalloc memory only, and a dma-buf is exported of cudaMalloc and VMM memory, never of
// managed memory. Runtime::device_alloc makes kCudaMalloc memory.
enum class AllocationKind { kCudaMalloc, kManaged, kVmm };
const char* allocation_kind_name(AllocationKind kind) noexcept;
// Test hook: device memory of `kind` (otherwise as Runtime::device_alloc; device_free frees it).
void* device_alloc(int device, size_t nbytes, AllocationKind kind);

// The driver's export (cuMemGetHandleForAddressRange) of [start, +size), which must be
// host-page-aligned and inside one allocation of this process: InvalidArgumentError naming
// the alignment otherwise. Runtime::dmabuf_fd widens a caller's range to it.
int export_dmabuf(uintptr_t start, size_t size);

// Test hook: while held, no stream starts queued work (it stays queued, in order), so a
// test can observe work that has not happened yet. Destroying a stream drains it anyway.
void hold_streams(bool held);

// --- For the simulated RDMA NIC only (src/rdma/sim_provider.cpp) ---------------------------
// GPUDirect RDMA: the NIC, never host code, moves the bytes of device memory. These give the
// simulated NIC its own read-write view of device memory; nothing else may use them (the
// library's host code must fail on device memory exactly as on a GPU).
struct NicView {
  uint8_t* data = nullptr;           // the NIC's view of the first byte asked for
  std::shared_ptr<const void> keep;  // holds the view (and the pages) while the MR exists
};
// Peer memory (nvidia-peermem's role): the view of [addr, +length) when it lies in one
// simulated device allocation; nullopt when it is no device memory at all.
// InvalidArgumentError when it is partly device memory or runs past its allocation.
std::optional<NicView> nic_view(uintptr_t addr, size_t length);
// dma-buf import: maps [offset, +length) of a simulated GPU's dma-buf fd (the caller keeps
// the fd; the mapping does not need it). InvalidArgumentError when the fd is not one or the
// range runs past it.
NicView map_dmabuf(int fd, uint64_t offset, size_t length);

}  // namespace dlslime::gpu::sim
