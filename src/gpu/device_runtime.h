// The device-runtime seam: every CUDA runtime call the library makes goes through this one
// small interface, implemented once (cuda_runtime.cpp) over a library loaded with dlopen:
// libcudart + libcuda on a real GPU, or the strict simulated GPU's library
// (libdlslime_sim_cudart.so, sim_cudart.h), which exports the same CUDA entry points, on
// hosts without one (docs/nvlink.md, "The device runtime").
//
// The interface mirrors the CUDA runtime (unified addressing, IPC handles of whole
// allocations, ordered streams, events) so that code that passes on the simulated runtime
// has a real chance on a GPU.
//
// Error convention: every call throws on failure. GpuUnavailableError (a GpuError) when
// there is no GPU runtime to use at all; InvalidArgumentError for a bad argument the
// runtime can see (an unknown device, a copy that runs past a device allocation, a handle
// that is not an IPC handle); GpuError (code kFailed) for everything else, with the
// runtime's own error text. Failures of queued work surface at event_query and
// event_synchronize, as in CUDA.
//
// Internal (not an installed header), but its entry points are exported (DLSLIME_API) for
// the Python module (src/python/bind_gpu.cpp), which must use the library's one runtime: the
// simulated GPU's allocations live in the library's state.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "dlslime/errors.h"
#include "dlslime/export.h"

namespace dlslime::gpu {

class DLSLIME_API GpuError : public Error {
 public:
  explicit GpuError(const std::string& what, StatusCode code = StatusCode::kFailed) : Error(code, what) {}
};

// No GPU runtime can be used in this process: no GPU, no driver, no libcudart, or a build
// without CUDA. The message always names the GPU and how to get the simulated one.
class DLSLIME_API GpuUnavailableError : public GpuError {
 public:
  explicit GpuUnavailableError(const std::string& what) : GpuError(what) {}
};

enum class MemoryType { kHost, kPinnedHost, kDevice };
DLSLIME_API const char* memory_type_name(MemoryType type) noexcept;

struct PointerInfo {
  MemoryType type = MemoryType::kHost;
  int device = -1;  // kDevice: the device that owns the memory; -1 otherwise
};

// The allocation that holds a device address: IPC handles name whole allocations.
struct AddressRange {
  uintptr_t base = 0;
  size_t size = 0;
};

// A dma-buf file descriptor exporting device memory (Runtime::dmabuf_fd): the caller owns
// `fd` and closes it; `offset` is where the asked-for address lies in the buffer (a
// dma-buf covers whole host pages, so it may start before the address).
struct DmabufRange {
  int fd = -1;
  uint64_t offset = 0;
};

// An IPC handle: cudaIpcMemHandle_t's 64 opaque bytes. It names the whole allocation that
// held the address it was taken at; opening it gives that allocation's base.
struct DLSLIME_API IpcHandle {
  static constexpr size_t kSize = 64;
  std::array<uint8_t, kSize> bytes{};
  std::string to_hex() const;
  static IpcHandle from_hex(const std::string& hex);  // InvalidArgumentError if malformed
  bool operator==(const IpcHandle&) const = default;
};

// Opaque runtime objects (cudaStream_t / cudaEvent_t, or the simulated runtime's own).
// A null Stream is the device's default stream.
struct StreamObject;
struct EventObject;
using Stream = StreamObject*;
using Event = EventObject*;

class DLSLIME_API Runtime {
 public:
  virtual ~Runtime() = default;
  virtual const char* name() const = 0;  // "cuda" or "sim"
  virtual int device_count() = 0;

  // Whether `device` can access `peer_device`'s memory directly (CUDA peer access over
  // NVLink or PCIe: cudaDeviceCanAccessPeer); true when they are the same device.
  // InvalidArgumentError for a device this runtime does not have.
  virtual bool can_access_peer(int device, int peer_device) = 0;
  // The device's UUID as 32 lowercase hex digits (cudaDeviceProp::uuid): what names one GPU
  // to another process, whose device numbers may differ (CUDA_VISIBLE_DEVICES).
  // InvalidArgumentError for a device this runtime does not have.
  virtual std::string device_uuid(int device) = 0;

  // Where an address lives (unified addressing): host memory (pageable or pinned) or one
  // device's memory. Any address may be asked about.
  virtual PointerInfo pointer_info(const void* ptr) = 0;
  // The allocation that holds a device address (InvalidArgumentError for a host address).
  virtual AddressRange allocation_range(const void* device_ptr) = 0;

  virtual void* device_alloc(int device, size_t nbytes) = 0;
  virtual void device_free(void* device_ptr) = 0;
  virtual void* pinned_alloc(size_t nbytes) = 0;
  virtual void pinned_free(void* host_ptr) = 0;

  // The handle of the allocation that holds device_ptr (any address inside it).
  virtual IpcHandle ipc_get_handle(void* device_ptr) = 0;
  // Maps another process's allocation into this one, on `device`; returns its base. As in
  // CUDA, a process cannot open its own handles (InvalidArgumentError).
  virtual void* ipc_open(const IpcHandle& handle, int device) = 0;
  virtual void ipc_close(void* opened_base) = 0;

  // A dma-buf that exports [device_ptr, +length) of one device allocation, for a NIC to
  // register (ibv_reg_dmabuf_mr: GPUDirect RDMA without a peer-memory module). CUDA:
  // cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD), which takes only
  // host-page-aligned ranges, over dmabuf_pages(): the range widened to host pages, which
  // must stay inside the allocation. InvalidArgumentError for host memory or a range that
  // runs past its allocation; GpuError when the driver or device cannot export, or when the
  // range's pages are not all the allocation's (the message says why; a caller falls back to
  // registering by address).
  virtual DmabufRange dmabuf_fd(const void* device_ptr, size_t length) = 0;
  // Checks a dma-buf a caller hands over to be registered as it is (RDMA's
  // register_dmabuf_memory_region) the way the kernel checks one (dma_buf_get, then the
  // size): `fd` must be a dma-buf, and [offset, +length) must lie in it. Where the runtime
  // can tell (the simulated GPU knows its own buffers; CUDA cannot map a dma-buf back to an
  // address), its byte `offset` must also be the device memory at `iova` in this process.
  // InvalidArgumentError otherwise, naming what the fd is.
  virtual void check_dmabuf(int fd, uint64_t offset, size_t length, uintptr_t iova) = 0;

  virtual Stream stream_create(int device) = 0;
  virtual void stream_destroy(Stream stream) = 0;  // waits for its queued work
  // Copies n bytes, host or device on either side, after the stream's earlier work; returns
  // at once. The memory must stay valid until an event recorded after it has completed.
  virtual void memcpy_async(void* dst, const void* src, size_t n, Stream stream) = 0;

  virtual Event event_create(int device) = 0;
  virtual void event_destroy(Event event) = 0;
  // Completes when the stream's work queued before it has finished.
  virtual void event_record(Event event, Stream stream) = 0;
  // True once the last record has completed (and for an event never recorded).
  virtual bool event_query(Event event) = 0;
  virtual void event_synchronize(Event event) = 0;

  // Calls fn(arg) on a runtime thread once the stream's work queued before it has
  // finished (cudaLaunchHostFunc): how a completion thread learns, without spinning, that
  // an event it waits for may be complete. fn must not call the runtime, and it must not
  // block. As in CUDA, it is not called after an error in the context: a waiter needs a
  // bound as well.
  using HostFn = void (*)(void* arg);
  virtual void launch_host_func(Stream stream, HostFn fn, void* arg) = 0;
};

// The runtime this process uses: the simulated one when DLSLIME_GPU_SIM=1 (read on each
// call), else the CUDA runtime. Never falls back from one to the other: without the
// variable and without a usable GPU it throws GpuUnavailableError.
DLSLIME_API Runtime& runtime();
DLSLIME_API bool sim_selected();  // DLSLIME_GPU_SIM=1
// "" when runtime() would succeed, else why not (for probes: available_transports()).
DLSLIME_API std::string unavailable_reason();

// The seam over the simulated GPU's library, or GpuUnavailableError (a build without CUDA,
// or the library missing beside libdlslime) naming what is missing.
DLSLIME_API Runtime& sim_runtime();
// The CUDA runtime, or GpuUnavailableError (no libcudart, no driver, no GPU, or a build
// without CUDA) naming what is missing.
DLSLIME_API Runtime& cuda_runtime();

// The simulated GPU's live objects and refused calls (DlslimeSimGpuCounts in sim_cudart.h):
// dlslime.testing.sim_gpu_objects(). GpuUnavailableError without the library.
struct SimObjectCounts {
  int64_t device_allocations = 0, host_allocations = 0, streams = 0, events = 0, ipc_mappings = 0, errors = 0;
};
DLSLIME_API SimObjectCounts sim_object_counts();

}  // namespace dlslime::gpu

struct DlslimeSimGpuCounts;
struct DlslimeSimGpuView;

namespace dlslime::gpu {

// The simulated GPU library's own C exports (sim_cudart.h), as the adapter resolved them:
// all null in libcudart. For the simulated NIC's peer-memory client (sim_peer_memory.cpp).
struct SimGpuExports {
  const char* (*last_error)() = nullptr;
  void (*object_counts)(DlslimeSimGpuCounts* out) = nullptr;
  int (*check_dmabuf)(int fd, uint64_t offset, size_t length, uintptr_t iova) = nullptr;
  int (*nic_view)(uintptr_t addr, size_t length, DlslimeSimGpuView* out) = nullptr;
  int (*map_dmabuf)(int fd, uint64_t offset, size_t length, DlslimeSimGpuView* out) = nullptr;
  void (*release_view)(void* keep) = nullptr;
};
// The simulated GPU library's exports, loading it; null when it cannot be loaded.
const SimGpuExports* sim_gpu_exports();

// The host pages a dma-buf export of [addr, +length) covers, for the runtimes' dmabuf_fd:
// the range widened to whole host pages (a dma-buf is made of pages, and
// cuMemGetHandleForAddressRange refuses a range that is not page-aligned), which must lie
// inside `allocation`. Small cudaMalloc allocations need not be page-aligned (the driver may
// pack them at 512-byte granularity, several to a page), and a page holding another
// allocation's bytes is not this one's to export: then GpuError naming why. InvalidArgumentError when the
// range is empty or runs past the allocation.
struct PageRange {
  uintptr_t start = 0;
  size_t size = 0;
};
PageRange dmabuf_pages(const AddressRange& allocation, uintptr_t addr, size_t length);

// For the runtimes' check_dmabuf: what /proc/self/fd says `fd` is ("" if it is not open),
// and the kernel's own checks of a dma-buf (InvalidArgumentError).
std::string fd_target(int fd);
void check_kernel_dmabuf(int fd, uint64_t offset, size_t length);

inline constexpr const char* kSimHint = "set DLSLIME_GPU_SIM=1 to use the simulated GPU";

}  // namespace dlslime::gpu
