// The device-runtime seam over the CUDA runtime (device_runtime.h): a thin translation, no
// policy, and the seam's only implementation. libcudart is loaded with dlopen at first use,
// not linked, so libdlslime and `import dlslime` work on hosts without the toolkit or a
// driver; the toolkit's headers give the function types, so every call is type-checked at
// build time. tests/hardware/run_gpu_checks.sh runs it on a GPU.
//
// The same adapter drives the simulated GPU: under DLSLIME_GPU_SIM=1 it opens
// libdlslime_sim_cudart.so, which exports the CUDA runtime and driver entry points below
// (sim_cudart.cpp), in place of both libcudart and libcuda. Every test on the simulated GPU
// therefore runs this file.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include "core/shared_library.h"
#include "gpu/device_runtime.h"
#include "gpu/sim_cudart.h"

namespace dlslime::gpu {
namespace {

// libcudart's functions, looked up by name. The names are the plain (legacy default
// stream) entry points: this file never defines CUDA_API_PER_THREAD_DEFAULT_STREAM.
struct CudaApi {
  decltype(&::cudaGetErrorName) GetErrorName = nullptr;
  decltype(&::cudaGetErrorString) GetErrorString = nullptr;
  decltype(&::cudaGetLastError) GetLastError = nullptr;
  decltype(&::cudaGetDeviceCount) GetDeviceCount = nullptr;
  decltype(&::cudaSetDevice) SetDevice = nullptr;
  decltype(&::cudaDeviceCanAccessPeer) DeviceCanAccessPeer = nullptr;
  // cudaDeviceProp's layout is versioned: CUDA 12 headers map this name to
  // cudaGetDeviceProperties_v2 with a macro, CUDA 13 exports it plainly. The symbol looked up
  // is the one the macro expands to (kGetDevicePropertiesName), so it fills the struct these
  // headers declare.
  decltype(&::cudaGetDeviceProperties) GetDeviceProperties = nullptr;
  decltype(&::cudaPointerGetAttributes) PointerGetAttributes = nullptr;
  decltype(&::cudaMalloc) Malloc = nullptr;
  decltype(&::cudaFree) Free = nullptr;
  decltype(&::cudaMallocHost) MallocHost = nullptr;
  decltype(&::cudaFreeHost) FreeHost = nullptr;
  decltype(&::cudaIpcGetMemHandle) IpcGetMemHandle = nullptr;
  decltype(&::cudaIpcOpenMemHandle) IpcOpenMemHandle = nullptr;
  decltype(&::cudaIpcCloseMemHandle) IpcCloseMemHandle = nullptr;
  decltype(&::cudaStreamCreateWithFlags) StreamCreateWithFlags = nullptr;
  decltype(&::cudaStreamDestroy) StreamDestroy = nullptr;
  decltype(&::cudaMemcpyAsync) MemcpyAsync = nullptr;
  decltype(&::cudaEventCreateWithFlags) EventCreateWithFlags = nullptr;
  decltype(&::cudaEventDestroy) EventDestroy = nullptr;
  decltype(&::cudaEventRecord) EventRecord = nullptr;
  decltype(&::cudaEventQuery) EventQuery = nullptr;
  decltype(&::cudaEventSynchronize) EventSynchronize = nullptr;
  decltype(&::cudaLaunchHostFunc) LaunchHostFunc = nullptr;
  // The runtime API has no "allocation that holds this address": the driver's
  // cuMemGetAddressRange does (libcuda, present wherever a GPU is usable; cuda.h maps the
  // name to cuMemGetAddressRange_v2, the symbol looked up).
  decltype(&::cuMemGetAddressRange) MemGetAddressRange = nullptr;
  // cuMemGetHandleForAddressRange (CUDA 11.7+ drivers): the dma-buf export of a range.
  decltype(&::cuMemGetHandleForAddressRange) MemGetHandleForAddressRange = nullptr;
  decltype(&::cuGetErrorName) DriverGetErrorName = nullptr;
  // The simulated GPU's own exports (sim_cudart.h); null in libcudart.
  SimGpuExports sim;

  // What the library adds about this thread's last failed call (the simulated GPU's
  // detail), as " (detail)", or nothing.
  std::string detail() const {
    const char* text = sim.last_error ? sim.last_error() : nullptr;
    return text && *text ? fmt::format(" ({})", text) : std::string();
  }
};

#define DLSLIME_CUDA_SYMBOL_NAME(fn) DLSLIME_CUDA_SYMBOL_NAME_(fn)
#define DLSLIME_CUDA_SYMBOL_NAME_(fn) #fn
constexpr const char* kGetDevicePropertiesName = DLSLIME_CUDA_SYMBOL_NAME(cudaGetDeviceProperties);

class CudaRuntime final : public Runtime {
 public:
  CudaRuntime(const char* name, const CudaApi& api, int devices) : name_(name), api_(api), devices_(devices) {}

  const char* name() const override { return name_; }
  int device_count() override { return devices_; }

  bool can_access_peer(int device, int peer_device) override {
    check_device(device);
    check_device(peer_device);
    if (device == peer_device) return true;
    int can = 0;
    check(api_.DeviceCanAccessPeer(&can, device, peer_device),
          fmt::format("cudaDeviceCanAccessPeer({}, {})", device, peer_device));
    return can != 0;
  }

  std::string device_uuid(int device) override {
    check_device(device);
    cudaDeviceProp prop{};
    check(api_.GetDeviceProperties(&prop, device), fmt::format("cudaGetDeviceProperties({})", device));
    static_assert(sizeof prop.uuid.bytes == 16);
    std::string out;
    for (char b : prop.uuid.bytes) out += fmt::format("{:02x}", static_cast<unsigned char>(b));
    return out;
  }

  PointerInfo pointer_info(const void* ptr) override {
    cudaPointerAttributes attr{};
    const cudaError_t err = api_.PointerGetAttributes(&attr, ptr);
    if (err != cudaSuccess) {
      // A context with a sticky error cannot say where memory lives, and "host" would let
      // host code touch device memory (a crash): refuse, saying why.
      if (sticky(err)) check(err, "cudaPointerGetAttributes");
      api_.GetLastError();  // older runtimes fail (and set the last error) for plain host memory
      return {MemoryType::kHost, -1};
    }
    switch (attr.type) {
      case cudaMemoryTypeDevice:
      case cudaMemoryTypeManaged: return {MemoryType::kDevice, attr.device};
      case cudaMemoryTypeHost: return {MemoryType::kPinnedHost, -1};
      default: return {MemoryType::kHost, -1};
    }
  }

  AddressRange allocation_range(const void* device_ptr) override {
    const PointerInfo info = pointer_info(device_ptr);
    if (info.type != MemoryType::kDevice) throw InvalidArgumentError(fmt::format("{} is not device memory", device_ptr));
    if (!api_.MemGetAddressRange) throw GpuError("cuMemGetAddressRange is not available (libcuda.so.1 not loaded)");
    make_context_current(info.device);  // a driver call: it needs a current context
    unsigned long long base = 0;
    size_t size = 0;
    const CUresult rc = api_.MemGetAddressRange(&base, &size, reinterpret_cast<uintptr_t>(device_ptr));
    if (rc != CUDA_SUCCESS) {
      throw GpuError(fmt::format("cuMemGetAddressRange({}) failed: {}{}", device_ptr, driver_error_name(rc), api_.detail()));
    }
    return {static_cast<uintptr_t>(base), size};
  }

  void* device_alloc(int device, size_t nbytes) override {
    set_device(device);
    void* p = nullptr;
    check(api_.Malloc(&p, nbytes), fmt::format("cudaMalloc({})", nbytes));
    return p;
  }
  void device_free(void* device_ptr) override { check(api_.Free(device_ptr), "cudaFree"); }

  void* pinned_alloc(size_t nbytes) override {
    void* p = nullptr;
    check(api_.MallocHost(&p, nbytes), fmt::format("cudaMallocHost({})", nbytes));
    return p;
  }
  void pinned_free(void* host_ptr) override { check(api_.FreeHost(host_ptr), "cudaFreeHost"); }

  IpcHandle ipc_get_handle(void* device_ptr) override {
    cudaIpcMemHandle_t h{};
    // Its error (cudaErrorInvalidValue) does not say why an allocation cannot be exported;
    // the usual reason does.
    check(api_.IpcGetMemHandle(&h, device_ptr),
          "cudaIpcGetMemHandle (CUDA IPC exports cudaMalloc memory only: not VMM memory from cuMemCreate, such as "
          "PyTorch's expandable_segments, nor cudaMallocAsync pools or managed memory)");
    static_assert(sizeof h == IpcHandle::kSize);
    IpcHandle out;
    std::memcpy(out.bytes.data(), &h, sizeof h);
    return out;
  }

  void* ipc_open(const IpcHandle& handle, int device) override {
    set_device(device);
    cudaIpcMemHandle_t h{};
    std::memcpy(&h, handle.bytes.data(), sizeof h);
    void* p = nullptr;
    check(api_.IpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    return p;
  }
  void ipc_close(void* opened_base) override { check(api_.IpcCloseMemHandle(opened_base), "cudaIpcCloseMemHandle"); }

  DmabufRange dmabuf_fd(const void* device_ptr, size_t length) override {
    // InvalidArgumentError for host memory; leaves the allocation's context current for the
    // export below.
    const AddressRange range = allocation_range(device_ptr);
    const auto addr = reinterpret_cast<uintptr_t>(device_ptr);
    // The driver exports host-page-aligned ranges only, of one allocation: small
    // allocations are not page-aligned, so the widened range is checked against this one's.
    const PageRange pages = dmabuf_pages(range, addr, length);
    if (!api_.MemGetHandleForAddressRange) {
      throw GpuError("no dma-buf export: the CUDA driver lacks cuMemGetHandleForAddressRange (it needs a driver for "
                     "CUDA 11.7 or later)");
    }
    const uintptr_t start = pages.start;
    const uintptr_t end = pages.start + pages.size;
    int fd = -1;
    const CUresult rc = api_.MemGetHandleForAddressRange(&fd, start, end - start, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (rc != CUDA_SUCCESS) {
      throw GpuError(fmt::format("no dma-buf export of [{:#x}, +{}): cuMemGetHandleForAddressRange failed: {}{}{}", start,
                                 end - start, driver_error_name(rc), api_.detail(),
                                 rc == CUDA_ERROR_NOT_SUPPORTED && !api_.sim.last_error
                                     ? "; the device or driver does not support dma-buf "
                                       "(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0; it needs the open kernel modules)"
                                     : ""));
    }
    return {fd, addr - start};
  }

  // CUDA cannot say which allocation a dma-buf exports: the kernel's checks are all there
  // are. The simulated GPU knows its own buffers (which are no kernel dma-bufs) and checks.
  void check_dmabuf(int fd, uint64_t offset, size_t length, uintptr_t iova) override {
    if (!api_.sim.check_dmabuf) return check_kernel_dmabuf(fd, offset, length);
    if (api_.sim.check_dmabuf(fd, offset, length, iova) != 0) throw InvalidArgumentError(api_.sim.last_error());
  }

  Stream stream_create(int device) override {
    set_device(device);
    cudaStream_t s = nullptr;
    check(api_.StreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return reinterpret_cast<Stream>(s);
  }
  void stream_destroy(Stream stream) override {
    check(api_.StreamDestroy(reinterpret_cast<cudaStream_t>(stream)), "cudaStreamDestroy");
  }

  void memcpy_async(void* dst, const void* src, size_t n, Stream stream) override {
    check(api_.MemcpyAsync(dst, src, n, cudaMemcpyDefault, reinterpret_cast<cudaStream_t>(stream)),
          fmt::format("cudaMemcpyAsync({} bytes)", n));
  }

  Event event_create(int device) override {
    set_device(device);
    cudaEvent_t e = nullptr;
    check(api_.EventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return reinterpret_cast<Event>(e);
  }
  void event_destroy(Event event) override { check(api_.EventDestroy(reinterpret_cast<cudaEvent_t>(event)), "cudaEventDestroy"); }
  void event_record(Event event, Stream stream) override {
    check(api_.EventRecord(reinterpret_cast<cudaEvent_t>(event), reinterpret_cast<cudaStream_t>(stream)), "cudaEventRecord");
  }
  bool event_query(Event event) override {
    const cudaError_t err = api_.EventQuery(reinterpret_cast<cudaEvent_t>(event));
    if (err == cudaErrorNotReady) return false;
    check(err, "cudaEventQuery");
    return true;
  }
  void event_synchronize(Event event) override {
    check(api_.EventSynchronize(reinterpret_cast<cudaEvent_t>(event)), "cudaEventSynchronize");
  }
  void launch_host_func(Stream stream, HostFn fn, void* arg) override {
    if (fn == nullptr) throw InvalidArgumentError("launch_host_func: null function");
    check(api_.LaunchHostFunc(reinterpret_cast<cudaStream_t>(stream), fn, arg), "cudaLaunchHostFunc");
  }

  const SimGpuExports& sim() const { return api_.sim; }

 private:
  void check_device(int device) const {
    if (device < 0 || device >= devices_) {
      throw InvalidArgumentError(fmt::format("no GPU device {} (this host has {})", device, devices_));
    }
  }

  void set_device(int device) {
    check_device(device);
    check(api_.SetDevice(device), "cudaSetDevice");
  }

  // Makes the device's primary context current on this thread, for driver (cu*) calls.
  // Before CUDA 12 cudaSetDevice only selects the device: the runtime creates and binds the
  // context at the next call that needs one, and a driver call made first on a thread that
  // has made none (the agent's threads) fails CUDA_ERROR_INVALID_CONTEXT. cudaFree(0) is
  // such a call that does nothing else (what NCCL does).
  void make_context_current(int device) {
    set_device(device);
    check(api_.Free(nullptr), "cudaFree(0) (creating the device's primary context)");
  }

  std::string driver_error_name(CUresult rc) const {
    const char* name = nullptr;
    if (api_.DriverGetErrorName) api_.DriverGetErrorName(rc, &name);
    return name ? fmt::format("{} ({})", name, static_cast<int>(rc)) : fmt::format("CUresult {}", static_cast<int>(rc));
  }

  // The errors after which CUDA fails every later call in the context: a kernel or copy
  // faulted, and only the process's exit clears it.
  static bool sticky(cudaError_t err) {
    switch (err) {
      case cudaErrorIllegalAddress:
      case cudaErrorLaunchFailure:
      case cudaErrorHardwareStackError:
      case cudaErrorIllegalInstruction:
      case cudaErrorMisalignedAddress:
      case cudaErrorInvalidAddressSpace:
      case cudaErrorInvalidPc:
      case cudaErrorECCUncorrectable: return true;
      default: return false;
    }
  }

  void check(cudaError_t err, const std::string& what) {
    if (err == cudaSuccess) return;
    const std::string text =
        fmt::format("{} failed: {} ({}){}{}", what, api_.GetErrorName(err), api_.GetErrorString(err), api_.detail(),
                    sticky(err) ? "; the GPU context is unusable from here on (a sticky CUDA error): restart the process"
                                : "");
    if (err == cudaErrorInvalidValue || err == cudaErrorInvalidDevicePointer || err == cudaErrorInvalidResourceHandle) {
      throw InvalidArgumentError(text);
    }
    throw GpuError(text);
  }

  const char* name_;
  CudaApi api_;
  int devices_;
};

// A loaded library, or why there is none.
struct Loaded {
  std::unique_ptr<CudaRuntime> runtime;
  std::string reason;
};

// Resolves the runtime entry points from `lib` and checks there is a device; `driver`
// (libcuda, or the same simulated library) gives the optional driver entry points.
// `hint` ends every reason.
Loaded load(const char* name, SharedLibrary& lib, const std::function<SharedLibrary&()>& driver, const std::string& hint) {
  Loaded out;
  if (!lib.handle()) {
    out.reason = fmt::format("no GPU runtime: {}; {}", lib.error(), hint);
    return out;
  }
  CudaApi api;
  auto sym = [&](auto& fn, const char* symbol) { lib.resolve(fn, symbol); };
  sym(api.GetErrorName, "cudaGetErrorName");
  sym(api.GetErrorString, "cudaGetErrorString");
  sym(api.GetLastError, "cudaGetLastError");
  sym(api.GetDeviceCount, "cudaGetDeviceCount");
  sym(api.SetDevice, "cudaSetDevice");
  sym(api.DeviceCanAccessPeer, "cudaDeviceCanAccessPeer");
  sym(api.GetDeviceProperties, kGetDevicePropertiesName);
  sym(api.PointerGetAttributes, "cudaPointerGetAttributes");
  sym(api.Malloc, "cudaMalloc");
  sym(api.Free, "cudaFree");
  sym(api.MallocHost, "cudaMallocHost");
  sym(api.FreeHost, "cudaFreeHost");
  sym(api.IpcGetMemHandle, "cudaIpcGetMemHandle");
  sym(api.IpcOpenMemHandle, "cudaIpcOpenMemHandle");
  sym(api.IpcCloseMemHandle, "cudaIpcCloseMemHandle");
  sym(api.StreamCreateWithFlags, "cudaStreamCreateWithFlags");
  sym(api.StreamDestroy, "cudaStreamDestroy");
  sym(api.MemcpyAsync, "cudaMemcpyAsync");
  sym(api.EventCreateWithFlags, "cudaEventCreateWithFlags");
  sym(api.EventDestroy, "cudaEventDestroy");
  sym(api.EventRecord, "cudaEventRecord");
  sym(api.EventQuery, "cudaEventQuery");
  sym(api.EventSynchronize, "cudaEventSynchronize");
  sym(api.LaunchHostFunc, "cudaLaunchHostFunc");
  SimGpuExports& sim = api.sim;
  lib.resolve_optional(sim.last_error, "dlslime_sim_gpu_last_error");
  lib.resolve_optional(sim.object_counts, "dlslime_sim_gpu_object_counts");
  lib.resolve_optional(sim.check_dmabuf, "dlslime_sim_gpu_check_dmabuf");
  lib.resolve_optional(sim.nic_view, "dlslime_sim_gpu_nic_view");
  lib.resolve_optional(sim.map_dmabuf, "dlslime_sim_gpu_map_dmabuf");
  lib.resolve_optional(sim.release_view, "dlslime_sim_gpu_release_view");
  if (std::string missing = lib.missing_error(); !missing.empty()) {
    out.reason = fmt::format("no GPU runtime: {}; {}", missing, hint);
    return out;
  }
  int count = 0;
  const cudaError_t err = api.GetDeviceCount(&count);
  if (err != cudaSuccess) {
    out.reason = fmt::format("no GPU: cudaGetDeviceCount failed: {} ({}){}; {}", api.GetErrorName(err),
                             api.GetErrorString(err), api.detail(), hint);
    return out;
  }
  if (count == 0) {
    out.reason = fmt::format("no GPU: the CUDA runtime sees no device; {}", hint);
    return out;
  }
  // Optional: the features that need them say so when they are missing.
  SharedLibrary& drv = driver();
  drv.resolve_optional(api.MemGetAddressRange, "cuMemGetAddressRange_v2");
  drv.resolve_optional(api.MemGetHandleForAddressRange, "cuMemGetHandleForAddressRange");
  drv.resolve_optional(api.DriverGetErrorName, "cuGetErrorName");
  out.runtime = std::make_unique<CudaRuntime>(name, api, count);
  return out;
}

// The libraries, each loaded once at its first use and kept for the process (a CUDA
// runtime is never unloaded: its own state outlives any one user).
const Loaded& real_library() {
  static const Loaded* loaded = [] {
    static SharedLibrary lib("libcudart", {DLSLIME_CUDART_SONAME, "libcudart.so"}, "DLSLIME_CUDART_LIBRARY");
    // A driver that reported devices is loaded already; this only finds it.
    return new Loaded(load("cuda", lib, [] () -> SharedLibrary& {
      static SharedLibrary driver("libcuda", {"libcuda.so.1"}, "DLSLIME_CUDA_DRIVER_LIBRARY");
      return driver;
    }, kSimHint));
  }();
  return *loaded;
}

const Loaded& sim_library() {
  static const Loaded* loaded = [] {
    // Beside libdlslime.so (installed, or the build tree), else by soname: a program (the
    // C++ tests) that links it has it loaded already. It is the driver library too.
    static SharedLibrary lib("libdlslime_sim_cudart (the simulated GPU)",
                             {own_library_directory() + "libdlslime_sim_cudart.so", "libdlslime_sim_cudart.so"},
                             "DLSLIME_GPU_SIM_LIBRARY");
    auto* out = new Loaded(load("sim", lib, [] () -> SharedLibrary& { return lib; },
                                "it is built with BUILD_CUDA, beside libdlslime"));
    if (out->runtime && !out->runtime->sim().object_counts) {
      out->runtime.reset();
      out->reason = fmt::format("no GPU runtime: {} is not the simulated GPU's library", lib.path());
    }
    return out;
  }();
  return *loaded;
}

}  // namespace

Runtime& cuda_runtime() {
  const Loaded& loaded = real_library();
  if (!loaded.runtime) throw GpuUnavailableError(loaded.reason);
  return *loaded.runtime;
}

Runtime& sim_runtime() {
  const Loaded& loaded = sim_library();
  if (!loaded.runtime) throw GpuUnavailableError(loaded.reason);
  return *loaded.runtime;
}

const SimGpuExports* sim_gpu_exports() {
  const Loaded& loaded = sim_library();
  return loaded.runtime ? &loaded.runtime->sim() : nullptr;
}

SimObjectCounts sim_object_counts() {
  static_cast<void>(sim_runtime());  // GpuUnavailableError, saying why, without the library
  DlslimeSimGpuCounts c{};
  sim_gpu_exports()->object_counts(&c);
  return {c.device_allocations, c.host_allocations, c.streams, c.events, c.ipc_mappings, c.errors};
}

}  // namespace dlslime::gpu
