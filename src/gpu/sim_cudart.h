// The simulated GPU (DLSLIME_GPU_SIM=1; docs/nvlink.md, "The simulated GPU"): a shared
// library, libdlslime_sim_cudart.so (sim_cudart.cpp), that exports the CUDA runtime and
// driver entry points cuda_runtime.cpp resolves, with the toolkit's own signatures, so the
// adapter a GPU runs is the one every simulated-GPU test runs. Besides that ABI it exports
// the C functions below (libdlslime finds them with dlsym) and the C++ test hooks in
// dlslime::gpu::sim (the C++ tests link the library and call them directly).
//
// What it enforces, as a GPU would:
//  - Device memory is not host memory: a device pointer is a PROT_NONE view of a memfd, so
//    any host load or store through it faults (SIGSEGV). The copies use a second,
//    private read-write view of the same memfd that only the library knows about.
//  - IPC handles work across processes and only there: the opener takes the owner's memfd
//    with pidfd_open + pidfd_getfd (which needs ptrace permission over the owner: the same
//    user, and under Yama ptrace_scope 1 the owner's PR_SET_PTRACER_ANY, which exporting a
//    handle sets). A handle of a freed allocation, or one of this process's own, fails.
//  - dma-bufs (cuMemGetHandleForAddressRange) are the allocation's memfd reopened: a
//    simulated NIC "imports" one by mapping it (map_dmabuf below), as a NIC's driver maps a
//    dma-buf's pages for DMA. The export takes host-page-aligned ranges of one allocation
//    only, as the driver does.
//  - Managed (cudaMallocManaged) and VMM (cuMemCreate) allocations exist (device_alloc
//    below) and have no IPC handle, as in CUDA.
//  - Copies are asynchronous: each stream is a worker thread that runs its queue in order;
//    the host learns of completion only through events. Copies that run past a device
//    allocation fail when they are queued (cudaErrorInvalidValue).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#define DLSLIME_SIM_GPU_API __attribute__((visibility("default")))

// The library's own C exports (null in libcudart: the adapter tells the two apart by them).
extern "C" {
// The simulated GPU's live objects in this process, and the calls it refused as misuse
// that a GPU punishes too (a free of memory that is not an allocation, a destroy of an
// unknown stream or event, an event recorded on another device's stream): a leak, a
// double free or a cudaErrorInvalidResourceHandle there. dlslime.testing.sim_gpu_objects().
struct DlslimeSimGpuCounts {
  int64_t device_allocations, host_allocations, streams, events, ipc_mappings, errors;
};
// A simulated NIC's view of device memory: `keep` holds the mapping until
// dlslime_sim_gpu_release_view(keep).
struct DlslimeSimGpuView {
  uint8_t* data;
  void* keep;
};
// Why this thread's last failed call failed, in words (the CUDA error code alone does not
// say); the adapter adds it to its error messages. "" when there is none.
DLSLIME_SIM_GPU_API const char* dlslime_sim_gpu_last_error();
DLSLIME_SIM_GPU_API void dlslime_sim_gpu_object_counts(DlslimeSimGpuCounts* out);
// The checks the kernel makes of a dma-buf handed over to be registered, and the one CUDA
// cannot make (that its byte `offset` is the device memory at `iova` in this process).
// 0, or cudaErrorInvalidValue with the detail set.
DLSLIME_SIM_GPU_API int dlslime_sim_gpu_check_dmabuf(int fd, uint64_t offset, size_t length, uintptr_t iova);
// For the simulated NIC only (src/rdma/sim_peer_memory.cpp): GPUDirect RDMA, where the NIC,
// never host code, moves device memory's bytes. nic_view: 1 and the view of [addr, +length)
// when it lies in one device allocation; 0 when it is no device memory at all; -1 (detail
// set) when it is partly device memory or runs past its allocation. map_dmabuf: 0 and the
// view of [offset, +length) of a dma-buf of this GPU (the caller keeps the fd), else -1.
DLSLIME_SIM_GPU_API int dlslime_sim_gpu_nic_view(uintptr_t addr, size_t length, DlslimeSimGpuView* out);
DLSLIME_SIM_GPU_API int dlslime_sim_gpu_map_dmabuf(int fd, uint64_t offset, size_t length, DlslimeSimGpuView* out);
DLSLIME_SIM_GPU_API void dlslime_sim_gpu_release_view(void* keep);
}

// The C++ test hooks, for programs that link the library (they throw the errors
// device_runtime.h names, as the seam would).
namespace dlslime::gpu::sim {

inline constexpr int kDeviceCount = 2;

using ObjectCounts = DlslimeSimGpuCounts;
DLSLIME_SIM_GPU_API ObjectCounts object_counts();

// The kinds of device allocation, which CUDA exports differently: cudaIpcGetMemHandle takes
// cudaMalloc memory only, and a dma-buf is exported of cudaMalloc and VMM memory, never of
// managed memory. cudaMalloc makes kCudaMalloc memory.
enum class AllocationKind { kCudaMalloc, kManaged, kVmm };
// Device memory of `kind` on `device` (otherwise as cudaMalloc; cudaFree frees it).
DLSLIME_SIM_GPU_API void* device_alloc(int device, size_t nbytes, AllocationKind kind);

// The driver's export (cuMemGetHandleForAddressRange) of [start, +size), which must be
// host-page-aligned and inside one allocation of this process: InvalidArgumentError naming
// the alignment otherwise.
DLSLIME_SIM_GPU_API int export_dmabuf(uintptr_t start, size_t size);

// While held, no stream starts queued work (it stays queued, in order), so a test can
// observe work that has not happened yet. Destroying a stream drains it anyway.
DLSLIME_SIM_GPU_API void hold_streams(bool held);

struct NicView {
  uint8_t* data = nullptr;           // the NIC's view of the first byte asked for
  std::shared_ptr<const void> keep;  // holds the view (and the pages) while the MR exists
};
// As dlslime_sim_gpu_nic_view / _map_dmabuf, throwing InvalidArgumentError.
DLSLIME_SIM_GPU_API std::optional<NicView> nic_view(uintptr_t addr, size_t length);
DLSLIME_SIM_GPU_API NicView map_dmabuf(int fd, uint64_t offset, size_t length);

}  // namespace dlslime::gpu::sim
