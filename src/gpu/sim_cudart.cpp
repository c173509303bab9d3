// The simulated GPU (sim_cudart.h): the CUDA runtime and driver entry points cuda_runtime.cpp
// resolves, over an engine with device memory behind PROT_NONE views of memfds, IPC through
// pidfd_getfd, one worker thread per stream and events as completion counters. Compiled
// against the toolkit's headers, so the signatures, struct layouts and error codes are
// CUDA's. The engine throws (the errors device_runtime.h names); each exported CUDA call
// turns that into its error code, the thread's last error and the detail
// dlslime_sim_gpu_last_error() returns.
#include "gpu/sim_cudart.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "gpu/device_runtime.h"  // the error classes (header-only)

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace dlslime::gpu {
namespace {

// What the engine throws where CUDA has a more precise code than cudaErrorInvalidValue
// (every other InvalidArgumentError): an unknown stream or event, a device it lacks.
struct InvalidHandle : InvalidArgumentError {
  using InvalidArgumentError::InvalidArgumentError;
};
struct InvalidDevice : InvalidArgumentError {
  using InvalidArgumentError::InvalidArgumentError;
};
// A call in a device context that has a sticky error (SimGpu::check_context).
struct ContextFault : GpuError {
  using GpuError::GpuError;
};

[[noreturn]] void throw_errno(const std::string& what, int err) {
  throw GpuError(fmt::format("simulated GPU: {}: {}", what, std::strerror(err)));
}

size_t page_size() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

size_t page_round(size_t n) {
  const size_t page = page_size();
  return (n + page - 1) / page * page;
}

// The memfd's name ties a handle to one allocation: an opener checks it, so a handle whose
// allocation was freed (and whose fd number may since name another file) fails to open.
std::string memfd_name(int pid, uint64_t id) { return fmt::format("dlslime-sim-gpu:{}:{}", pid, id); }
constexpr const char* kMemfdPrefix = "/memfd:dlslime-sim-gpu:";

std::string fd_link(int fd) {
  char link[256] = {};
  const ssize_t n = fd < 0 ? -1 : readlink(fmt::format("/proc/self/fd/{}", fd).c_str(), link, sizeof link - 1);
  return n > 0 ? std::string(link, static_cast<size_t>(n)) : std::string();
}

const char* allocation_kind_name(sim::AllocationKind kind) noexcept {
  switch (kind) {
    case sim::AllocationKind::kCudaMalloc: return "cudaMalloc memory";
    case sim::AllocationKind::kManaged: return "managed memory (cudaMallocManaged)";
    case sim::AllocationKind::kVmm: return "VMM memory (cuMemCreate, as PyTorch's expandable_segments allocates)";
  }
  return "?";
}

// One device allocation, owned here or opened from another process's IPC handle.
struct Allocation {
  uintptr_t base = 0;    // the device pointer: a PROT_NONE view
  uint8_t* rw = nullptr;  // the private view the copies use
  size_t size = 0;       // what was asked for (bounds are checked against it)
  size_t mapped = 0;     // page-rounded
  int device = 0;
  int fd = -1;
  ino_t ino = 0;  // the memfd's inode: what its dma-bufs (reopened memfds) are known by
  uint64_t id = 0;
  int owner_pid = 0;
  bool imported = false;
  sim::AllocationKind kind = sim::AllocationKind::kCudaMalloc;
  ~Allocation() {
    if (base) munmap(reinterpret_cast<void*>(base), mapped);
    if (rw) munmap(rw, mapped);
    if (fd >= 0) close(fd);
  }
};

// The handle's layout inside cudaIpcMemHandle_t's reserved bytes.
struct HandleBytes {
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t id;
  uint64_t size;
  int32_t device;
};
static_assert(sizeof(HandleBytes) <= sizeof(cudaIpcMemHandle_t));
constexpr char kMagic[8] = {'D', 'L', 'S', 'G', 'S', 'I', 'M', '1'};

// A dma-buf is the allocation's memfd. A real one covers just the exported pages, so an
// export opens the memfd anew (a file description of its own) and records which pages in
// the description's file position, which nothing reads through: (first page << 32) | page
// count. Position 0, which any other open or dup of the memfd has, is the whole memfd. A dup
// of an export, or the same fd passed to another process, still says what it exports.
struct DmabufPages {
  uint64_t start = 0;  // byte offset of the buffer in the allocation
  uint64_t size = 0;
};
constexpr int kPageCountBits = 32;

// What a dma-buf fd of this GPU exports; InvalidArgumentError when the fd is none.
DmabufPages dmabuf_pages_of(int fd, struct stat& st) {
  const std::string target = fd_link(fd);
  const off_t pos = target.rfind(kMemfdPrefix, 0) == 0 ? lseek(fd, 0, SEEK_CUR) : -1;
  if (pos < 0 || fstat(fd, &st) != 0) {
    throw InvalidArgumentError(fmt::format("fd {} is not a dma-buf of the simulated GPU ({})", fd,
                                           target.empty() ? "not an open descriptor" : "it is '" + target + "'"));
  }
  const uint64_t page = page_size();
  const auto bits = static_cast<uint64_t>(pos);
  const DmabufPages out = bits == 0 ? DmabufPages{0, static_cast<uint64_t>(st.st_size)}
                                    : DmabufPages{(bits >> kPageCountBits) * page,
                                                  (bits & ((uint64_t{1} << kPageCountBits) - 1)) * page};
  if (out.size == 0 || out.start + out.size > static_cast<uint64_t>(st.st_size)) {
    throw InvalidArgumentError(fmt::format("fd {} is not a dma-buf of the simulated GPU (its file position {} names "
                                           "no pages of it)", fd, pos));
  }
  return out;
}

std::atomic<bool> g_held{false};

// The calling thread's current device (cudaSetDevice): cudaMalloc, cudaIpcOpenMemHandle,
// stream and event creation use it, and the null stream is its default stream.
thread_local int t_current_device = 0;

// Which device pairs have peer access (DLSLIME_GPU_SIM_PEER_ACCESS, read at each call):
// unset, empty or "all": every pair (one NVLink switch); "none": no pair; else pairs
// "A-B,C-D" (each both ways). A device always reaches itself. On a GPU, topology decides.
bool peer_access_configured(int device, int peer) {
  if (device == peer) return true;
  const char* raw = std::getenv("DLSLIME_GPU_SIM_PEER_ACCESS");
  const std::string value = raw ? raw : "";
  if (value.empty() || value == "all") return true;
  if (value == "none") return false;
  bool found = false;
  size_t pos = 0;
  while (pos <= value.size()) {
    const size_t end = std::min(value.find(',', pos), value.size());
    const std::string pair = value.substr(pos, end - pos);
    int a = -1, b = -1;
    char dash = 0, extra = 0;
    if (std::sscanf(pair.c_str(), "%d%c%d%c", &a, &dash, &b, &extra) != 3 || dash != '-' || a < 0 || b < 0 ||
        a >= sim::kDeviceCount || b >= sim::kDeviceCount) {
      throw InvalidArgumentError(fmt::format(
          "DLSLIME_GPU_SIM_PEER_ACCESS='{}': expected all, none, or device pairs like 0-1,1-2 (devices 0..{})", value,
          sim::kDeviceCount - 1));
    }
    found = found || (a == device && b == peer) || (a == peer && b == device);
    pos = end + 1;
  }
  return found;
}

class SimStream {
 public:
  explicit SimStream(int device) : device_(device), worker_([this] { run(); }) {}
  ~SimStream() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  int device() const { return device_; }
  void push(std::function<void()> op) {
    {
      std::lock_guard lock(mu_);
      ops_.push_back(std::move(op));
    }
    cv_.notify_all();
  }
  void wake() {
    { std::lock_guard lock(mu_); }
    cv_.notify_all();
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      // A stopping stream drains its queue even while held, so destroy never hangs.
      cv_.wait(lock, [&] { return stop_ || (!ops_.empty() && !g_held.load()); });
      if (ops_.empty()) return;  // stop_ and drained
      std::function<void()> op = std::move(ops_.front());
      ops_.pop_front();
      lock.unlock();
      op();
      lock.lock();
    }
  }

  int device_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> ops_;
  bool stop_ = false;
  std::thread worker_;  // last: it starts in the constructor and uses the members above
};

// An event counts records and completions; it is complete when they match.
struct SimEvent {
  explicit SimEvent(int d) : device(d) {}
  int device;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;
  uint64_t completed = 0;
};

// The engine: one per process (the library's state). Its calls throw; the CUDA entry points
// below turn that into error codes.
class SimGpu {
 public:
  static void check_device(int device) {
    if (device < 0 || device >= sim::kDeviceCount) {
      throw InvalidDevice(fmt::format("no GPU device {} (the simulated GPU has devices 0..{})", device,
                                      sim::kDeviceCount - 1));
    }
  }

  // Made up, but the same in every process on this host (as a GPU's UUID is), and different
  // for each device and each host: a hash of the boot id and the device number.
  static void device_uuid(int device, char out[16]) {
    check_device(device);
    static const std::string boot = [] {
      std::ifstream in("/proc/sys/kernel/random/boot_id");
      std::string id;
      std::getline(in, id);
      return id;
    }();
    auto fnv1a = [](const std::string& text) {
      uint64_t h = 0xcbf29ce484222325ull;
      for (unsigned char ch : text) h = (h ^ ch) * 0x100000001b3ull;
      return h;
    };
    const std::string key = fmt::format("dlslime-sim-gpu:{}:{}", boot, device);
    const uint64_t halves[2] = {fnv1a(key + ":hi"), fnv1a(key + ":lo")};
    for (int i = 0; i < 16; ++i) out[i] = static_cast<char>(halves[i / 8] >> (8 * (7 - i % 8)));
  }

  void pointer_attributes(const void* ptr, cudaPointerAttributes* attr) {
    *attr = cudaPointerAttributes{};
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -1;
    std::lock_guard lock(mu_);
    if (auto a = find_locked(reinterpret_cast<uintptr_t>(ptr))) {
      attr->type = a->kind == sim::AllocationKind::kManaged ? cudaMemoryTypeManaged : cudaMemoryTypeDevice;
      attr->device = a->device;
      attr->devicePointer = const_cast<void*>(ptr);
      return;
    }
    auto it = pinned_.upper_bound(reinterpret_cast<uintptr_t>(ptr));
    if (it != pinned_.begin()) {
      --it;
      if (reinterpret_cast<uintptr_t>(ptr) < it->first + it->second) {
        attr->type = cudaMemoryTypeHost;
        attr->hostPointer = const_cast<void*>(ptr);
      }
    }
  }

  std::pair<uintptr_t, size_t> allocation_range(uintptr_t addr) {
    std::lock_guard lock(mu_);
    auto a = find_locked(addr);
    if (!a) throw InvalidArgumentError(fmt::format("{:#x} is not device memory", addr));
    return {a->base, a->size};
  }

  void* alloc(int device, size_t nbytes, sim::AllocationKind kind) {
    check_device(device);
    if (nbytes == 0) throw InvalidArgumentError("simulated GPU: a device allocation of 0 bytes");
    auto a = std::make_shared<Allocation>();
    a->size = nbytes;
    a->mapped = page_round(nbytes);
    a->device = device;
    a->owner_pid = getpid();
    a->id = next_id_.fetch_add(1);
    a->fd = memfd_create(memfd_name(a->owner_pid, a->id).c_str(), MFD_CLOEXEC);
    if (a->fd < 0) throw_errno("memfd_create", errno);
    if (ftruncate(a->fd, static_cast<off_t>(a->mapped)) != 0) throw_errno(fmt::format("allocating {} bytes", nbytes), errno);
    struct stat st {};
    if (fstat(a->fd, &st) != 0) throw_errno("fstat of device memory", errno);
    a->ino = st.st_ino;
    a->kind = kind;
    map_views(*a);
    std::lock_guard lock(mu_);
    allocations_[a->base] = a;
    return reinterpret_cast<void*>(a->base);
  }

  void device_free(void* device_ptr) {
    if (device_ptr == nullptr) return;  // cudaFree(0) does nothing (and succeeds)
    std::lock_guard lock(mu_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(device_ptr));
    if (it == allocations_.end() || it->second->imported) {
      ++errors_;
      throw InvalidArgumentError(fmt::format("cudaFree({}): not the base of a device allocation of this process", device_ptr));
    }
    allocations_.erase(it);  // queued copies keep their views until they have run
  }

  void* pinned_alloc(size_t nbytes) {
    if (nbytes == 0) throw InvalidArgumentError("simulated GPU: a pinned allocation of 0 bytes");
    const size_t mapped = page_round(nbytes);
    void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw_errno(fmt::format("cudaMallocHost({})", nbytes), errno);
    std::lock_guard lock(mu_);
    pinned_[reinterpret_cast<uintptr_t>(p)] = mapped;
    return p;
  }

  void pinned_free(void* host_ptr) {
    std::lock_guard lock(mu_);
    auto it = pinned_.find(reinterpret_cast<uintptr_t>(host_ptr));
    if (it == pinned_.end()) {
      ++errors_;
      throw InvalidArgumentError(fmt::format("cudaFreeHost({}): not a pinned allocation", host_ptr));
    }
    munmap(host_ptr, it->second);
    pinned_.erase(it);
  }

  cudaIpcMemHandle_t ipc_get_handle(void* device_ptr) {
    std::shared_ptr<Allocation> a;
    {
      std::lock_guard lock(mu_);
      a = find_locked(reinterpret_cast<uintptr_t>(device_ptr));
    }
    if (!a) throw InvalidArgumentError(fmt::format("cudaIpcGetMemHandle({}): not device memory", device_ptr));
    if (a->imported) {
      throw InvalidArgumentError(
          fmt::format("cudaIpcGetMemHandle({}): memory opened from another process's handle", device_ptr));
    }
    // cudaIpcGetMemHandle fails (cudaErrorInvalidValue) on anything but cudaMalloc memory.
    if (a->kind != sim::AllocationKind::kCudaMalloc) {
      throw InvalidArgumentError(fmt::format("cudaIpcGetMemHandle({}) does not export {}", device_ptr,
                                             allocation_kind_name(a->kind)));
    }
    // Under Yama ptrace_scope 1 only ancestors may pidfd_getfd us; let any same-user process
    // open our handles (EINVAL without Yama: nothing to allow).
    static std::once_flag allow_openers;
    std::call_once(allow_openers, [] { prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0); });
    HandleBytes h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.pid = a->owner_pid;
    h.fd = a->fd;
    h.id = a->id;
    h.size = a->size;
    h.device = a->device;
    cudaIpcMemHandle_t out{};
    std::memcpy(out.reserved, &h, sizeof h);
    return out;
  }

  void* ipc_open(const cudaIpcMemHandle_t& handle, int device) {
    check_device(device);
    HandleBytes h;
    std::memcpy(&h, handle.reserved, sizeof h);
    if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
      throw InvalidArgumentError("cudaIpcOpenMemHandle: not an IPC handle of the simulated GPU");
    }
    if (h.pid == getpid()) {
      throw InvalidArgumentError(
          "cudaIpcOpenMemHandle: a process cannot open its own IPC handle (as in CUDA); use the pointer");
    }
    // Another GPU's memory is mapped for this one through peer access (CUDA:
    // cudaErrorPeerAccessUnsupported without it).
    if (h.device >= 0 && h.device < sim::kDeviceCount && !peer_access_configured(device, h.device)) {
      throw GpuError(fmt::format("ipc_open: device {} has no peer access to device {}, whose memory the handle names "
                                 "(DLSLIME_GPU_SIM_PEER_ACCESS)",
                                 device, h.device));
    }
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, h.pid, 0));
    if (pidfd < 0) {
      if (errno == ESRCH) throw GpuError(fmt::format("ipc_open: the process that owns this handle (pid {}) is gone", h.pid));
      throw_errno(fmt::format("pidfd_open({})", h.pid), errno);
    }
    const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, h.fd, 0));
    const int getfd_errno = errno;
    close(pidfd);
    if (fd < 0) {
      if (getfd_errno == EPERM) {
        throw GpuError(fmt::format(
            "ipc_open: no permission to take pid {}'s memory (pidfd_getfd needs ptrace access: the same user, "
            "and kernel.yama.ptrace_scope <= 1)", h.pid));
      }
      if (getfd_errno == EBADF) throw GpuError("ipc_open: the allocation behind this handle was freed");
      throw_errno(fmt::format("pidfd_getfd(pid {}, fd {})", h.pid, h.fd), getfd_errno);
    }
    auto a = std::make_shared<Allocation>();
    a->fd = fd;  // closed by ~Allocation from here on
    // The fd number may have been reused since the handle was taken: the name says which
    // allocation it is (readlink gives "/memfd:<name> (deleted)").
    const std::string expected = "/memfd:" + memfd_name(h.pid, h.id) + " ";
    struct stat st {};
    if (fd_link(fd).rfind(expected, 0) != 0 || fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < h.size) {
      throw GpuError("ipc_open: the allocation behind this handle was freed");
    }
    a->size = h.size;
    a->mapped = page_round(h.size);
    a->device = device;
    a->owner_pid = h.pid;
    a->id = h.id;
    a->imported = true;
    map_views(*a);
    std::lock_guard lock(mu_);
    allocations_[a->base] = a;
    return reinterpret_cast<void*>(a->base);
  }

  void ipc_close(void* opened_base) {
    std::lock_guard lock(mu_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(opened_base));
    if (it == allocations_.end() || !it->second->imported) {
      ++errors_;
      throw InvalidArgumentError(fmt::format("cudaIpcCloseMemHandle({}): not memory opened with cudaIpcOpenMemHandle", opened_base));
    }
    allocations_.erase(it);
  }

  int export_dmabuf(uintptr_t start, size_t size) {
    std::shared_ptr<Allocation> a;
    {
      std::lock_guard lock(mu_);
      a = find_locked(start);
    }
    if (!a || a->imported) {
      throw InvalidArgumentError(fmt::format("dma-buf export of [{:#x}, +{}): not device memory this process allocated",
                                             start, size));
    }
    const size_t page = page_size();
    if (start % page != 0 || size == 0 || size % page != 0) {
      throw InvalidArgumentError(fmt::format("dma-buf export of [{:#x}, +{}): the range must be aligned to the {}-byte host "
                                             "page, at both ends (cuMemGetHandleForAddressRange)",
                                             start, size, page));
    }
    if (size > a->size - (start - a->base)) {
      throw InvalidArgumentError(fmt::format("dma-buf export of [{:#x}, +{}) runs past its device allocation [{:#x}, +{})",
                                             start, size, a->base, a->size));
    }
    if (a->kind == sim::AllocationKind::kManaged) {
      throw GpuError(fmt::format("no dma-buf export of [{:#x}, +{}): cuMemGetHandleForAddressRange does not export {}",
                                 start, size, allocation_kind_name(a->kind)));
    }
    // The memfd reopened: a file description of its own, whose position says which pages
    // it exports (DmabufPages).
    const int fd = open(fmt::format("/proc/self/fd/{}", a->fd).c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) throw_errno("dma-buf export: reopening the allocation", errno);
    const auto pos = static_cast<off_t>((static_cast<uint64_t>(start - a->base) / page) << kPageCountBits | size / page);
    if (lseek(fd, pos, SEEK_SET) != pos) {
      const int err = errno;
      close(fd);
      throw_errno("dma-buf export: recording its pages", err);
    }
    return fd;
  }

  void check_dmabuf(int fd, uint64_t offset, size_t length, uintptr_t iova) {
    // Only this GPU's buffers are dma-bufs here: any other file is refused, as dma_buf_get
    // refuses a file that is no dma-buf.
    struct stat st {};
    const DmabufPages buf = dmabuf_pages_of(fd, st);
    std::shared_ptr<Allocation> a;
    {
      std::lock_guard lock(mu_);
      for (const auto& [base, candidate] : allocations_) {
        if (!candidate->imported && candidate->ino == st.st_ino) a = candidate;
      }
    }
    if (!a) {
      throw InvalidArgumentError(fmt::format(
          "fd {} is a dma-buf of a simulated GPU allocation this process does not own (freed, or another process's)", fd));
    }
    // The whole memfd is page-rounded: the buffer ends where the allocation does.
    const uint64_t size = std::min<uint64_t>(buf.size, a->size - buf.start);
    if (length == 0 || offset > size || length > size - offset) {
      throw InvalidArgumentError(
          fmt::format("[{}, +{}) is empty or runs past the {}-byte dma-buf (fd {})", offset, length, size, fd));
    }
    const uintptr_t at = a->base + buf.start + offset;
    if (iova != at) {
      throw InvalidArgumentError(fmt::format(
          "fd {} exports device memory at {:#x}: its byte {} is at {:#x} in this process, not at iova {:#x}", fd,
          a->base + buf.start, offset, at, iova));
    }
  }

  std::optional<sim::NicView> nic_view(uintptr_t addr, size_t length) {
    std::lock_guard lock(mu_);
    if (auto a = find_locked(addr)) {
      if (length > a->size - (addr - a->base)) {
        throw InvalidArgumentError(fmt::format("[{:#x}, +{}) runs past the end of its device allocation [{:#x}, +{})", addr,
                                               length, a->base, a->size));
      }
      return sim::NicView{a->rw + (addr - a->base), a};
    }
    auto next = allocations_.upper_bound(addr);
    if (next != allocations_.end() && next->first - addr < length) {
      throw InvalidArgumentError(fmt::format("[{:#x}, +{}) runs from host into device memory", addr, length));
    }
    return std::nullopt;
  }

  cudaStream_t stream_create(int device) {
    check_device(device);
    auto s = std::make_unique<SimStream>(device);
    auto handle = reinterpret_cast<cudaStream_t>(s.get());
    std::lock_guard lock(mu_);
    streams_[handle] = std::move(s);
    return handle;
  }

  void stream_destroy(cudaStream_t stream) {
    std::unique_ptr<SimStream> s;
    {
      std::lock_guard lock(mu_);
      auto it = streams_.find(stream);
      if (stream == nullptr || it == streams_.end()) {
        ++errors_;
        throw InvalidHandle("cudaStreamDestroy: unknown stream");
      }
      s = std::move(it->second);
      streams_.erase(it);
    }
    s.reset();  // drains and joins, outside the lock (its work may take the lock)
  }

  // Queued, not checked: a copy that runs past its allocation faults the stream's context
  // when its turn comes (cudaErrorIllegalAddress), and copies after it in that context do
  // not run.
  void memcpy_async(void* dst, const void* src, size_t n, cudaStream_t stream) {
    SimStream& s = stream_for(stream);
    if (n == 0) return;
    Resolved d = resolve(reinterpret_cast<uintptr_t>(dst), n, "destination");
    Resolved r = resolve(reinterpret_cast<uintptr_t>(src), n, "source");
    const int device = s.device();
    s.push([this, device, d = std::move(d), r = std::move(r), n] {
      if (faulted(device)) return;
      if (!d.fault.empty() || !r.fault.empty()) return fault(device, d.fault.empty() ? r.fault : d.fault);
      std::memmove(d.ptr, r.ptr, n);
    });
  }

  // CUDA's sticky errors: once a copy faulted in a device's context, every later call in that
  // context fails with cudaErrorIllegalAddress, its queued copies and host functions no
  // longer run, and only the process's exit clears it (cudaDeviceReset does not).
  void check_context(int device) const {
    if (device < 0 || device >= sim::kDeviceCount || !faulted(device)) return;
    throw ContextFault(fmt::format("device {}'s context has a sticky error: {}", device,
                                   fault_what_[static_cast<size_t>(device)]));
  }
  bool faulted(int device) const { return faulted_[static_cast<size_t>(device)].load(std::memory_order_acquire); }

  cudaEvent_t event_create(int device) {
    check_device(device);
    auto e = std::make_shared<SimEvent>(device);
    auto handle = reinterpret_cast<cudaEvent_t>(e.get());
    std::lock_guard lock(mu_);
    events_[handle] = std::move(e);
    return handle;
  }

  void event_destroy(cudaEvent_t event) {
    std::lock_guard lock(mu_);
    if (auto it = events_.find(event); it != events_.end()) check_context(it->second->device);
    if (events_.erase(event) == 0) {
      ++errors_;
      throw InvalidHandle("cudaEventDestroy: unknown event");
    }
  }

  void event_record(cudaEvent_t event, cudaStream_t stream) {
    std::shared_ptr<SimEvent> e = event_for(event);
    SimStream& s = stream_for(stream);
    // Events and streams belong to a device (CUDA: cudaErrorInvalidResourceHandle).
    if (e->device != s.device()) {
      ++errors_;
      throw InvalidHandle(fmt::format("cudaEventRecord: the event belongs to device {} and the stream to device {}{}",
                                      e->device, s.device(),
                                      stream == nullptr ? " (the null stream is the current device's default "
                                                          "stream: the device of the thread's last cudaSetDevice)"
                                                        : ""));
    }
    uint64_t generation;
    {
      std::lock_guard lock(e->mu);
      generation = ++e->recorded;
    }
    s.push([e, generation] {
      {
        std::lock_guard lock(e->mu);
        if (generation > e->completed) e->completed = generation;
      }
      e->cv.notify_all();
    });
  }

  // An event after a faulting copy completes (the stream moves on), and says so by failing.
  bool event_query(cudaEvent_t event) {
    std::shared_ptr<SimEvent> e = event_for(event);
    bool done;
    {
      std::lock_guard lock(e->mu);
      done = e->completed >= e->recorded;
    }
    check_context(e->device);
    return done;
  }

  void event_synchronize(cudaEvent_t event) {
    std::shared_ptr<SimEvent> e = event_for(event);
    {
      std::unique_lock lock(e->mu);
      const uint64_t target = e->recorded;
      e->cv.wait(lock, [&] { return e->completed >= target; });
    }
    check_context(e->device);
  }

  // As cudaLaunchHostFunc documents: unlike a stream callback, the function is not called
  // once the context has an error.
  void launch_host_func(cudaStream_t stream, cudaHostFn_t fn, void* arg) {
    if (fn == nullptr) throw InvalidArgumentError("cudaLaunchHostFunc: null function");
    SimStream& s = stream_for(stream);
    s.push([this, device = s.device(), fn, arg] {
      if (!faulted(device)) fn(arg);
    });
  }

  void wake_streams() {
    std::lock_guard lock(mu_);
    for (auto& [handle, s] : streams_) s->wake();
    for (auto& s : default_streams_) {
      if (s) s->wake();
    }
  }

  sim::ObjectCounts object_counts() {
    std::lock_guard lock(mu_);
    sim::ObjectCounts c{};
    for (const auto& [base, a] : allocations_) ++(a->imported ? c.ipc_mappings : c.device_allocations);
    c.host_allocations = static_cast<int64_t>(pinned_.size());
    c.streams = static_cast<int64_t>(streams_.size());
    c.events = static_cast<int64_t>(events_.size());
    c.errors = errors_.load();
    return c;
  }

 private:
  struct Resolved {
    uint8_t* ptr = nullptr;
    std::shared_ptr<Allocation> keep;  // a device side stays mapped until the copy ran
    std::string fault;                 // what a GPU would fault on when the copy runs (ptr unset)
  };

  static void map_views(Allocation& a) {
    void* base = mmap(nullptr, a.mapped, PROT_NONE, MAP_SHARED, a.fd, 0);
    if (base == MAP_FAILED) throw_errno("mapping device memory", errno);
    a.base = reinterpret_cast<uintptr_t>(base);
    void* rw = mmap(nullptr, a.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
    if (rw == MAP_FAILED) throw_errno("mapping device memory", errno);
    a.rw = static_cast<uint8_t*>(rw);
  }

  // The allocation holding addr (lock held).
  std::shared_ptr<Allocation> find_locked(uintptr_t addr) const {
    auto it = allocations_.upper_bound(addr);
    if (it == allocations_.begin()) return nullptr;
    --it;
    return addr < it->first + it->second->size ? it->second : nullptr;
  }

  // What a copy reads or writes: the private view for device memory (which must hold all n
  // bytes), the address itself for host memory (which must not run into device memory).
  // A range that breaks either rule is no error here: it is what the copy faults on when it
  // runs, as on a GPU, whose copy engine finds out only when it gets there.
  Resolved resolve(uintptr_t addr, size_t n, const char* side) {
    std::lock_guard lock(mu_);
    if (auto a = find_locked(addr)) {
      if (n > a->size - (addr - a->base)) {
        return {nullptr, nullptr,
                fmt::format("a copy's {} [{:#x}, +{}) ran past the end of its device allocation [{:#x}, +{})", side,
                            addr, n, a->base, a->size)};
      }
      return {a->rw + (addr - a->base), a, {}};
    }
    auto next = allocations_.upper_bound(addr);
    if (next != allocations_.end() && next->first - addr < n) {
      return {nullptr, nullptr, fmt::format("a copy's {} [{:#x}, +{}) ran from host into device memory", side, addr, n)};
    }
    return {reinterpret_cast<uint8_t*>(addr), nullptr, {}};
  }

  // A stream or event, in a context that has no sticky error.
  SimStream& stream_for(cudaStream_t stream) {
    std::lock_guard lock(mu_);
    if (stream == nullptr) {
      // The default stream: one per device (CUDA's legacy stream), of the thread's current one.
      check_context(t_current_device);
      auto& s = default_streams_[static_cast<size_t>(t_current_device)];
      if (!s) s = std::make_unique<SimStream>(t_current_device);
      return *s;
    }
    auto it = streams_.find(stream);
    if (it == streams_.end()) {
      ++errors_;
      throw InvalidHandle("unknown stream");
    }
    check_context(it->second->device());
    return *it->second;
  }

  std::shared_ptr<SimEvent> event_for(cudaEvent_t event) {
    std::lock_guard lock(mu_);
    auto it = events_.find(event);
    if (it == events_.end()) {
      ++errors_;
      throw InvalidHandle("unknown event");
    }
    check_context(it->second->device);
    return it->second;
  }

  // Sets a device's sticky error (once: the first fault is the one CUDA reports).
  void fault(int device, std::string what) {
    std::lock_guard lock(mu_);
    if (faulted(device)) return;
    fault_what_[static_cast<size_t>(device)] = std::move(what);
    ++errors_;
    faulted_[static_cast<size_t>(device)].store(true, std::memory_order_release);
  }

  std::mutex mu_;
  std::atomic<uint64_t> next_id_{1};
  std::map<uintptr_t, std::shared_ptr<Allocation>> allocations_;  // by base
  std::map<uintptr_t, size_t> pinned_;                             // base -> mapped length
  std::unordered_map<cudaStream_t, std::unique_ptr<SimStream>> streams_;
  std::unordered_map<cudaEvent_t, std::shared_ptr<SimEvent>> events_;
  std::array<std::unique_ptr<SimStream>, sim::kDeviceCount> default_streams_;
  std::atomic<int64_t> errors_{0};  // calls refused as misuse (sim::ObjectCounts::errors)
  // Each device context's sticky error: written once, before its flag is set, then only read.
  std::array<std::atomic<bool>, sim::kDeviceCount> faulted_{};
  std::array<std::string, sim::kDeviceCount> fault_what_;
};

// CUDA does not survive fork(): in a child of a process that initialized it, every call
// fails with an initialization error, and nothing of the parent's (streams and their
// threads, memory, IPC mappings) can be used or freed there. The simulated GPU does the
// same once it was initialized (its engine made) before the fork: the child's calls fail,
// and the parent's streams, whose threads are not in the child, are never joined there.
std::atomic<bool> g_fork_child{false};
constexpr const char* kForkChild =
    "CUDA cannot be used in a fork() child of a process that had initialized it (the simulated GPU, as CUDA, fails "
    "every call there): start the child with spawn or forkserver, or fork before the first GPU call";

SimGpu& gpu() {
  // Never destroyed: streams are threads, and exit-time destruction order against other
  // static objects that still hold streams or events would be a hazard for no gain.
  static SimGpu* engine = [] {
    pthread_atfork(nullptr, nullptr, [] { g_fork_child.store(true); });
    return new SimGpu();
  }();
  return *engine;
}

// A call in the calling thread's context: it fails while that context has a sticky error.
void in_context() { gpu().check_context(t_current_device); }

sim::NicView map_dmabuf_view(int fd, uint64_t offset, size_t length) {
  struct stat st {};
  const DmabufPages buf = dmabuf_pages_of(fd, st);
  if (length == 0 || offset > buf.size || length > buf.size - offset) {
    throw InvalidArgumentError(
        fmt::format("[{}, +{}) is empty or runs past the {}-byte dma-buf (fd {})", offset, length, buf.size, fd));
  }
  const uint64_t page = page_size();
  const uint64_t at = buf.start + offset;  // in the memfd
  const uint64_t start = at / page * page;
  const size_t mapped = page_round(static_cast<size_t>(at - start + length));
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(start));
  if (p == MAP_FAILED) throw_errno("mapping a dma-buf", errno);
  std::shared_ptr<const void> keep(p, [mapped](const void* q) { munmap(const_cast<void*>(q), mapped); });
  return {static_cast<uint8_t*>(p) + (at - start), std::move(keep)};
}

// --- The ABI boundary ------------------------------------------------------------------
// Each entry point runs the engine and turns what it threw into CUDA's code for it, the
// thread's last error (cudaGetLastError) and the detail (dlslime_sim_gpu_last_error).

thread_local std::string t_detail;
thread_local cudaError_t t_last_error = cudaSuccess;

// The runtime code for an exception; `other` for a failure that is no bad argument.
cudaError_t code_of(const std::exception& e, cudaError_t other) {
  if (dynamic_cast<const ContextFault*>(&e)) return cudaErrorIllegalAddress;
  if (dynamic_cast<const InvalidHandle*>(&e)) return cudaErrorInvalidResourceHandle;
  if (dynamic_cast<const InvalidDevice*>(&e)) return cudaErrorInvalidDevice;
  if (dynamic_cast<const InvalidArgumentError*>(&e)) return cudaErrorInvalidValue;
  if (dynamic_cast<const std::bad_alloc*>(&e)) return cudaErrorMemoryAllocation;
  return other;
}

// A runtime (cuda*) call: as in CUDA, a failure also becomes the thread's last error.
template <class F>
cudaError_t runtime_call(cudaError_t other, F&& body) noexcept {
  if (g_fork_child.load()) {
    t_detail = kForkChild;
    return t_last_error = cudaErrorInitializationError;
  }
  try {
    body();
    return cudaSuccess;
  } catch (const std::exception& e) {
    t_detail = e.what();
    t_last_error = code_of(e, other);
    return t_last_error;
  }
}

// A driver (cu*) call: its own codes, and no runtime last error.
template <class F>
CUresult driver_call(CUresult other, F&& body) noexcept {
  if (g_fork_child.load()) {
    t_detail = kForkChild;
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  try {
    body();
    return CUDA_SUCCESS;
  } catch (const std::exception& e) {
    t_detail = e.what();
    switch (code_of(e, cudaErrorUnknown)) {
      case cudaErrorUnknown: return other;
      case cudaErrorIllegalAddress: return CUDA_ERROR_ILLEGAL_ADDRESS;
      default: return CUDA_ERROR_INVALID_VALUE;
    }
  }
}

// The codes this library returns, with CUDA's names and texts.
#define DLSLIME_SIM_CUDA_ERRORS(X)                                      \
  X(cudaSuccess, "no error")                                            \
  X(cudaErrorInvalidValue, "invalid argument")                          \
  X(cudaErrorInitializationError, "initialization error")               \
  X(cudaErrorMemoryAllocation, "out of memory")                         \
  X(cudaErrorInvalidDevice, "invalid device ordinal")                   \
  X(cudaErrorMapBufferObjectFailed, "mapping of buffer object failed") \
  X(cudaErrorInvalidResourceHandle, "invalid resource handle")          \
  X(cudaErrorNotReady, "device not ready")                              \
  X(cudaErrorIllegalAddress, "an illegal memory access was encountered") \
  X(cudaErrorUnknown, "unknown error")
#define DLSLIME_SIM_CU_ERRORS(X) \
  X(CUDA_SUCCESS)                \
  X(CUDA_ERROR_NOT_INITIALIZED)  \
  X(CUDA_ERROR_INVALID_VALUE)    \
  X(CUDA_ERROR_NOT_SUPPORTED)    \
  X(CUDA_ERROR_ILLEGAL_ADDRESS)  \
  X(CUDA_ERROR_UNKNOWN)

// A C export for libdlslime (no CUDA entry point: it leaves the CUDA last error alone):
// what the body returns, or -1 with the detail set.
template <class F>
int c_call(F&& body) noexcept {
  if (g_fork_child.load()) {
    t_detail = kForkChild;
    return -1;
  }
  try {
    return body();
  } catch (const std::exception& e) {
    t_detail = e.what();
    return -1;
  }
}

DlslimeSimGpuView to_c(sim::NicView view) {
  return {view.data, new std::shared_ptr<const void>(std::move(view.keep))};
}

}  // namespace

namespace sim {
void* device_alloc(int device, size_t nbytes, AllocationKind kind) { return gpu().alloc(device, nbytes, kind); }
int export_dmabuf(uintptr_t start, size_t size) { return gpu().export_dmabuf(start, size); }
void hold_streams(bool held) {
  g_held.store(held);
  if (!held) gpu().wake_streams();
}
std::optional<NicView> nic_view(uintptr_t addr, size_t length) { return gpu().nic_view(addr, length); }
NicView map_dmabuf(int fd, uint64_t offset, size_t length) { return map_dmabuf_view(fd, offset, length); }
ObjectCounts object_counts() { return gpu().object_counts(); }
}  // namespace sim

}  // namespace dlslime::gpu

using dlslime::gpu::driver_call;
using dlslime::gpu::gpu;
using dlslime::gpu::in_context;
using dlslime::gpu::runtime_call;
using dlslime::gpu::SimGpu;

// --- The CUDA runtime API (cuda_runtime_api.h) --------------------------------------------
// Everything from here to the end is the library's ABI: exported, whatever the build's
// default visibility.
#pragma GCC visibility push(default)
extern "C" {

const char* cudaGetErrorName(cudaError_t error) {
#define X(code, text) \
  case code: return #code;
  switch (error) { DLSLIME_SIM_CUDA_ERRORS(X) default: return "cudaErrorUnknown"; }
#undef X
}

const char* cudaGetErrorString(cudaError_t error) {
#define X(code, text) \
  case code: return text;
  switch (error) { DLSLIME_SIM_CUDA_ERRORS(X) default: return "unrecognized error code"; }
#undef X
}

// Returns the thread's last error and resets it, as CUDA does for errors that are not
// sticky; a sticky error (SimGpu::check_context) is returned every time.
cudaError_t cudaGetLastError() {
  if (!dlslime::gpu::g_fork_child.load() && gpu().faulted(dlslime::gpu::t_current_device)) {
    return dlslime::gpu::t_last_error = cudaErrorIllegalAddress;
  }
  const cudaError_t err = dlslime::gpu::t_last_error;
  dlslime::gpu::t_last_error = cudaSuccess;
  return err;
}

cudaError_t cudaGetDeviceCount(int* count) {
  return runtime_call(cudaErrorUnknown, [&] {
    if (!count) throw dlslime::InvalidArgumentError("cudaGetDeviceCount: null count");
    *count = dlslime::gpu::sim::kDeviceCount;
  });
}

cudaError_t cudaSetDevice(int device) {
  return runtime_call(cudaErrorUnknown, [&] {
    SimGpu::check_device(device);
    dlslime::gpu::t_current_device = device;
  });
}

cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer_device) {
  return runtime_call(cudaErrorUnknown, [&] {
    SimGpu::check_device(device);
    SimGpu::check_device(peer_device);
    *can = dlslime::gpu::peer_access_configured(device, peer_device) ? 1 : 0;
  });
}

// The properties the simulated GPU has: its UUID, its name and the features the library asks
// about; the rest is zero.
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  return runtime_call(cudaErrorUnknown, [&] {
    SimGpu::check_device(device);
    *prop = cudaDeviceProp{};
    std::snprintf(prop->name, sizeof prop->name, "DLSlime simulated GPU %d", device);
    SimGpu::device_uuid(device, prop->uuid.bytes);
    prop->unifiedAddressing = 1;
  });
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* ptr) {
  return runtime_call(cudaErrorUnknown, [&] {
    in_context();
    gpu().pointer_attributes(ptr, attr); });
}

cudaError_t cudaMalloc(void** dev_ptr, size_t size) {
  return runtime_call(cudaErrorMemoryAllocation, [&] {
    in_context();
    *dev_ptr = gpu().alloc(dlslime::gpu::t_current_device, size, dlslime::gpu::sim::AllocationKind::kCudaMalloc);
  });
}

cudaError_t cudaFree(void* dev_ptr) {
  return runtime_call(cudaErrorUnknown, [&] {
    in_context();
    gpu().device_free(dev_ptr); });
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  return runtime_call(cudaErrorMemoryAllocation, [&] {
    in_context();
    *ptr = gpu().pinned_alloc(size); });
}

cudaError_t cudaFreeHost(void* ptr) {
  return runtime_call(cudaErrorUnknown, [&] {
    in_context();
    gpu().pinned_free(ptr); });
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* dev_ptr) {
  return runtime_call(cudaErrorUnknown, [&] {
    in_context();
    *handle = gpu().ipc_get_handle(dev_ptr); });
}

// A handle that cannot be mapped (its allocation freed, its owner gone, no peer access) is
// cudaErrorMapBufferObjectFailed, as the driver reports a failed IPC mapping.
cudaError_t cudaIpcOpenMemHandle(void** dev_ptr, cudaIpcMemHandle_t handle, unsigned int) {
  return runtime_call(cudaErrorMapBufferObjectFailed,
                      [&] {
                        in_context();
                        *dev_ptr = gpu().ipc_open(handle, dlslime::gpu::t_current_device);
                      });
}

cudaError_t cudaIpcCloseMemHandle(void* dev_ptr) {
  return runtime_call(cudaErrorUnknown, [&] {
    in_context();
    gpu().ipc_close(dev_ptr); });
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  return runtime_call(cudaErrorUnknown, [&] {
    in_context();
    *stream = gpu().stream_create(dlslime::gpu::t_current_device); });
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  return runtime_call(cudaErrorUnknown, [&] {
    in_context();
    gpu().stream_destroy(stream); });
}

// Every kind is cudaMemcpyDefault to the simulated GPU: unified addressing tells the sides.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind, cudaStream_t stream) {
  return runtime_call(cudaErrorUnknown, [&] { gpu().memcpy_async(dst, src, count, stream); });
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  return runtime_call(cudaErrorUnknown, [&] {
    in_context();
    *event = gpu().event_create(dlslime::gpu::t_current_device); });
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  return runtime_call(cudaErrorUnknown, [&] { gpu().event_destroy(event); });
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  return runtime_call(cudaErrorUnknown, [&] { gpu().event_record(event, stream); });
}

// cudaErrorNotReady is no error: it does not become the last error.
cudaError_t cudaEventQuery(cudaEvent_t event) {
  bool done = false;
  const cudaError_t err = runtime_call(cudaErrorUnknown, [&] { done = gpu().event_query(event); });
  return err != cudaSuccess ? err : done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return runtime_call(cudaErrorUnknown, [&] { gpu().event_synchronize(event); });
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  return runtime_call(cudaErrorUnknown, [&] { gpu().launch_host_func(stream, fn, user_data); });
}

// --- The driver API (cuda.h) -----------------------------------------------------------

CUresult cuGetErrorName(CUresult error, const char** name) {
#define X(code) \
  case code: *name = #code; return CUDA_SUCCESS;
  switch (error) { DLSLIME_SIM_CU_ERRORS(X) default: *name = nullptr; return CUDA_ERROR_INVALID_VALUE; }
#undef X
}

// cuda.h maps this name to cuMemGetAddressRange_v2, the symbol the adapter resolves.
CUresult cuMemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr ptr) {
  return driver_call(CUDA_ERROR_UNKNOWN, [&] {
    in_context();
    const auto [b, n] = gpu().allocation_range(static_cast<uintptr_t>(ptr));
    if (base) *base = b;
    if (size) *size = n;
  });
}

CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr dptr, size_t size, CUmemRangeHandleType type,
                                       unsigned long long flags) {
  return driver_call(CUDA_ERROR_NOT_SUPPORTED, [&] {
    in_context();
    if (type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || flags != 0) {
      throw dlslime::InvalidArgumentError("cuMemGetHandleForAddressRange: the simulated GPU exports dma-buf fds only");
    }
    *static_cast<int*>(handle) = gpu().export_dmabuf(static_cast<uintptr_t>(dptr), size);
  });
}

// --- The library's own exports (sim_cudart.h) -----------------------------------------

const char* dlslime_sim_gpu_last_error() { return dlslime::gpu::t_detail.c_str(); }

void dlslime_sim_gpu_object_counts(DlslimeSimGpuCounts* out) { *out = gpu().object_counts(); }

int dlslime_sim_gpu_check_dmabuf(int fd, uint64_t offset, size_t length, uintptr_t iova) {
  const int rc = dlslime::gpu::c_call([&] {
    gpu().check_dmabuf(fd, offset, length, iova);
    return 0;
  });
  return rc == 0 ? cudaSuccess : cudaErrorInvalidValue;
}

int dlslime_sim_gpu_nic_view(uintptr_t addr, size_t length, DlslimeSimGpuView* out) {
  // The NIC asks about every range it pins, host memory included. In a fork() child the GPU
  // is gone (no device memory of the child's exists), so nothing is device memory to it:
  // the range is pinned as host memory, and the parent's device mappings there, PROT_NONE,
  // fail that pinning as they should.
  if (dlslime::gpu::g_fork_child.load()) return 0;
  return dlslime::gpu::c_call([&] {
    std::optional<dlslime::gpu::sim::NicView> view = gpu().nic_view(addr, length);
    if (!view) return 0;
    *out = dlslime::gpu::to_c(std::move(*view));
    return 1;
  });
}

int dlslime_sim_gpu_map_dmabuf(int fd, uint64_t offset, size_t length, DlslimeSimGpuView* out) {
  return dlslime::gpu::c_call([&] {
    *out = dlslime::gpu::to_c(dlslime::gpu::map_dmabuf_view(fd, offset, length));
    return 0;
  });
}

void dlslime_sim_gpu_release_view(void* keep) { delete static_cast<std::shared_ptr<const void>*>(keep); }

}  // extern "C"
#pragma GCC visibility pop
