// The simulated GPU runtime (sim_runtime.h): device memory behind PROT_NONE views of memfds,
// IPC through pidfd_getfd, one worker thread per stream, events as completion counters.
#include "gpu/sim_runtime.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

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

#include "gpu/device_runtime.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace dlslime::gpu {
namespace {

[[noreturn]] void throw_errno(const std::string& what, int err) {
  throw GpuError(fmt::format("simulated GPU: {}: {}", what, std::strerror(err)));
}

size_t page_round(size_t n) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

// The memfd's name ties a handle to one allocation: an opener checks it, so a handle whose
// allocation was freed (and whose fd number may since name another file) fails to open.
std::string memfd_name(int pid, uint64_t id) { return fmt::format("dlslime-sim-gpu:{}:{}", pid, id); }

// One device allocation, owned here or opened from another process's IPC handle.
struct Allocation {
  uintptr_t base = 0;    // the device pointer: a PROT_NONE view
  uint8_t* rw = nullptr;  // the private view the copies use
  size_t size = 0;       // what was asked for (bounds are checked against it)
  size_t mapped = 0;     // page-rounded
  int device = 0;
  int fd = -1;
  ino_t ino = 0;  // the memfd's inode: what its dma-bufs (duplicates) are known by
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

// The handle's layout inside IpcHandle::bytes.
struct HandleBytes {
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t id;
  uint64_t size;
  int32_t device;
};
static_assert(sizeof(HandleBytes) <= IpcHandle::kSize);
constexpr char kMagic[8] = {'D', 'L', 'S', 'G', 'S', 'I', 'M', '1'};

std::atomic<bool> g_held{false};

// The calling thread's current device, as the CUDA adapter leaves it: device_alloc,
// ipc_open, stream_create and event_create make their device current (cudaSetDevice), and
// the null stream is the current device's default stream.
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

class SimRuntime final : public Runtime {
 public:
  const char* name() const override { return "sim"; }
  int device_count() override { return sim::kDeviceCount; }

  bool can_access_peer(int device, int peer_device) override {
    check_device(device);
    check_device(peer_device);
    return peer_access_configured(device, peer_device);
  }

  // Made up, but the same in every process on this host (as a GPU's UUID is), and different
  // for each device and each host: a hash of the boot id and the device number.
  std::string device_uuid(int device) override {
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
    return fmt::format("{:016x}{:016x}", fnv1a(key + ":hi"), fnv1a(key + ":lo"));
  }

  PointerInfo pointer_info(const void* ptr) override {
    std::lock_guard lock(mu_);
    if (auto a = find_locked(reinterpret_cast<uintptr_t>(ptr))) return {MemoryType::kDevice, a->device};
    auto it = pinned_.upper_bound(reinterpret_cast<uintptr_t>(ptr));
    if (it != pinned_.begin()) {
      --it;
      if (reinterpret_cast<uintptr_t>(ptr) < it->first + it->second) return {MemoryType::kPinnedHost, -1};
    }
    return {MemoryType::kHost, -1};
  }

  AddressRange allocation_range(const void* device_ptr) override {
    std::lock_guard lock(mu_);
    auto a = find_locked(reinterpret_cast<uintptr_t>(device_ptr));
    if (!a) throw InvalidArgumentError(fmt::format("{} is not device memory", device_ptr));
    return {a->base, a->size};
  }

  void* device_alloc(int device, size_t nbytes) override { return alloc(device, nbytes, sim::AllocationKind::kCudaMalloc); }

  void* alloc(int device, size_t nbytes, sim::AllocationKind kind) {
    check_device(device);
    t_current_device = device;
    if (nbytes == 0) throw InvalidArgumentError("simulated GPU: device_alloc of 0 bytes");
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

  void device_free(void* device_ptr) override {
    std::lock_guard lock(mu_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(device_ptr));
    if (it == allocations_.end() || it->second->imported) {
      ++errors_;
      throw InvalidArgumentError(fmt::format("device_free({}): not the base of a device allocation of this process", device_ptr));
    }
    allocations_.erase(it);  // queued copies keep their views until they have run
  }

  void* pinned_alloc(size_t nbytes) override {
    if (nbytes == 0) throw InvalidArgumentError("simulated GPU: pinned_alloc of 0 bytes");
    const size_t mapped = page_round(nbytes);
    void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw_errno(fmt::format("pinned_alloc({})", nbytes), errno);
    std::lock_guard lock(mu_);
    pinned_[reinterpret_cast<uintptr_t>(p)] = mapped;
    return p;
  }

  void pinned_free(void* host_ptr) override {
    std::lock_guard lock(mu_);
    auto it = pinned_.find(reinterpret_cast<uintptr_t>(host_ptr));
    if (it == pinned_.end()) {
      ++errors_;
      throw InvalidArgumentError(fmt::format("pinned_free({}): not a pinned allocation", host_ptr));
    }
    munmap(host_ptr, it->second);
    pinned_.erase(it);
  }

  IpcHandle ipc_get_handle(void* device_ptr) override {
    std::shared_ptr<Allocation> a;
    {
      std::lock_guard lock(mu_);
      a = find_locked(reinterpret_cast<uintptr_t>(device_ptr));
    }
    if (!a) throw InvalidArgumentError(fmt::format("ipc_get_handle({}): not device memory", device_ptr));
    if (a->imported) throw InvalidArgumentError(fmt::format("ipc_get_handle({}): memory opened from another process's handle", device_ptr));
    // cudaIpcGetMemHandle fails (cudaErrorInvalidValue) on anything but cudaMalloc memory.
    if (a->kind != sim::AllocationKind::kCudaMalloc) {
      throw InvalidArgumentError(fmt::format("ipc_get_handle({}): cudaIpcGetMemHandle does not export {}", device_ptr,
                                             sim::allocation_kind_name(a->kind)));
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
    IpcHandle out;
    std::memcpy(out.bytes.data(), &h, sizeof h);
    return out;
  }

  void* ipc_open(const IpcHandle& handle, int device) override {
    check_device(device);
    t_current_device = device;
    HandleBytes h;
    std::memcpy(&h, handle.bytes.data(), sizeof h);
    if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
      throw InvalidArgumentError("ipc_open: not an IPC handle of the simulated GPU");
    }
    if (h.pid == getpid()) {
      throw InvalidArgumentError("ipc_open: a process cannot open its own IPC handle (as in CUDA); use the pointer");
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
    char link[256] = {};
    const ssize_t n = readlink(fmt::format("/proc/self/fd/{}", fd).c_str(), link, sizeof link - 1);
    const std::string expected = "/memfd:" + memfd_name(h.pid, h.id) + " ";
    struct stat st {};
    if (n <= 0 || std::string(link, static_cast<size_t>(n)).rfind(expected, 0) != 0 || fstat(fd, &st) != 0 ||
        static_cast<uint64_t>(st.st_size) < h.size) {
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

  void ipc_close(void* opened_base) override {
    std::lock_guard lock(mu_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(opened_base));
    if (it == allocations_.end() || !it->second->imported) {
      ++errors_;
      throw InvalidArgumentError(fmt::format("ipc_close({}): not memory opened with ipc_open", opened_base));
    }
    allocations_.erase(it);
  }

  DmabufRange dmabuf_fd(const void* device_ptr, size_t length) override {
    const auto addr = reinterpret_cast<uintptr_t>(device_ptr);
    std::shared_ptr<Allocation> a;
    {
      std::lock_guard lock(mu_);
      a = find_locked(addr);
    }
    if (!a) throw InvalidArgumentError(fmt::format("dmabuf_fd({}): not device memory", device_ptr));
    if (a->imported) {
      throw InvalidArgumentError(fmt::format("dmabuf_fd({}): memory opened from another process's IPC handle cannot be exported", device_ptr));
    }
    const PageRange pages = dmabuf_pages({a->base, a->size}, addr, length);  // as the CUDA adapter widens
    // The buffer is the whole allocation's memfd (a GPU's starts at pages.start), so the
    // offset counts from the allocation's base; callers use only the offset.
    return {export_dmabuf(pages.start, pages.size), addr - a->base};
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
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
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
                                 start, size, sim::allocation_kind_name(a->kind)));
    }
    // The allocation's memfd is the buffer: a duplicate of it.
    const int fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) throw_errno("dma-buf export: dup", errno);
    return fd;
  }

  void check_dmabuf(int fd, uint64_t offset, size_t length, uintptr_t iova) override {
    // Only this runtime's buffers are dma-bufs here (its memfds): any other file is refused,
    // as dma_buf_get refuses a file that is no dma-buf.
    const std::string target = fd_target(fd);
    struct stat st {};
    if (target.rfind("/memfd:dlslime-sim-gpu:", 0) != 0 || fstat(fd, &st) != 0) {
      throw InvalidArgumentError(fmt::format("fd {} is not a dma-buf of the simulated GPU ({})", fd,
                                             target.empty() ? "not an open descriptor" : "it is '" + target + "'"));
    }
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
    if (length == 0 || offset > a->size || length > a->size - offset) {
      throw InvalidArgumentError(
          fmt::format("[{}, +{}) is empty or runs past the {}-byte dma-buf (fd {})", offset, length, a->size, fd));
    }
    if (iova != a->base + offset) {
      throw InvalidArgumentError(fmt::format(
          "fd {} exports the device allocation at {:#x}: its byte {} is at {:#x} in this process, not at iova {:#x}", fd,
          a->base, offset, a->base + offset, iova));
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

  Stream stream_create(int device) override {
    check_device(device);
    t_current_device = device;
    auto s = std::make_unique<SimStream>(device);
    Stream handle = reinterpret_cast<Stream>(s.get());
    std::lock_guard lock(mu_);
    streams_[handle] = std::move(s);
    return handle;
  }

  void stream_destroy(Stream stream) override {
    std::unique_ptr<SimStream> s;
    {
      std::lock_guard lock(mu_);
      auto it = streams_.find(stream);
      if (stream == nullptr || it == streams_.end()) {
        ++errors_;
        throw InvalidArgumentError("stream_destroy: unknown stream");
      }
      s = std::move(it->second);
      streams_.erase(it);
    }
    s.reset();  // drains and joins, outside the lock (its work may take the lock)
  }

  void memcpy_async(void* dst, const void* src, size_t n, Stream stream) override {
    SimStream& s = stream_for(stream);
    if (n == 0) return;
    Resolved d = resolve(reinterpret_cast<uintptr_t>(dst), n, "destination");
    Resolved r = resolve(reinterpret_cast<uintptr_t>(src), n, "source");
    s.push([d, r, n] { std::memmove(d.ptr, r.ptr, n); });
  }

  Event event_create(int device) override {
    check_device(device);
    t_current_device = device;
    auto e = std::make_shared<SimEvent>(device);
    Event handle = reinterpret_cast<Event>(e.get());
    std::lock_guard lock(mu_);
    events_[handle] = std::move(e);
    return handle;
  }

  void event_destroy(Event event) override {
    std::lock_guard lock(mu_);
    if (events_.erase(event) == 0) {
      ++errors_;
      throw InvalidArgumentError("event_destroy: unknown event");
    }
  }

  void event_record(Event event, Stream stream) override {
    std::shared_ptr<SimEvent> e = event_for(event);
    SimStream& s = stream_for(stream);
    // Events and streams belong to a device (CUDA: cudaErrorInvalidResourceHandle).
    if (e->device != s.device()) {
      ++errors_;
      throw InvalidArgumentError(fmt::format("event_record: the event belongs to device {} and the stream to device {}{}",
                                             e->device, s.device(),
                                             stream == nullptr ? " (the null stream is the current device's default "
                                                                 "stream; the thread's current device is the one its "
                                                                 "last stream, event or allocation was made on)"
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

  bool event_query(Event event) override {
    std::shared_ptr<SimEvent> e = event_for(event);
    std::lock_guard lock(e->mu);
    return e->completed >= e->recorded;
  }

  void event_synchronize(Event event) override {
    std::shared_ptr<SimEvent> e = event_for(event);
    std::unique_lock lock(e->mu);
    const uint64_t target = e->recorded;
    e->cv.wait(lock, [&] { return e->completed >= target; });
  }

  void launch_host_func(Stream stream, HostFn fn, void* arg) override {
    if (fn == nullptr) throw InvalidArgumentError("launch_host_func: null function");
    stream_for(stream).push([fn, arg] { fn(arg); });
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
    sim::ObjectCounts c;
    for (const auto& [base, a] : allocations_) ++(a->imported ? c.ipc_mappings : c.device_allocations);
    c.host_allocations = static_cast<int64_t>(pinned_.size());
    c.streams = static_cast<int64_t>(streams_.size());
    c.events = static_cast<int64_t>(events_.size());
    c.errors = errors_.load();
    return c;
  }

 private:
  struct Resolved {
    uint8_t* ptr;
    std::shared_ptr<Allocation> keep;  // a device side stays mapped until the copy ran
  };

  static void check_device(int device) {
    if (device < 0 || device >= sim::kDeviceCount) {
      throw InvalidArgumentError(fmt::format("no GPU device {} (the simulated GPU has devices 0..{})", device,
                                             sim::kDeviceCount - 1));
    }
  }

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
  Resolved resolve(uintptr_t addr, size_t n, const char* side) {
    std::lock_guard lock(mu_);
    if (auto a = find_locked(addr)) {
      if (n > a->size - (addr - a->base)) {
        throw InvalidArgumentError(fmt::format(
            "copy {} [{:#x}, +{}) runs past the end of its device allocation [{:#x}, +{})", side, addr, n, a->base, a->size));
      }
      return {a->rw + (addr - a->base), a};
    }
    auto next = allocations_.upper_bound(addr);
    if (next != allocations_.end() && next->first - addr < n) {
      throw InvalidArgumentError(fmt::format("copy {} [{:#x}, +{}) runs from host into device memory", side, addr, n));
    }
    return {reinterpret_cast<uint8_t*>(addr), nullptr};
  }

  SimStream& stream_for(Stream stream) {
    std::lock_guard lock(mu_);
    if (stream == nullptr) {
      // The default stream: one per device (CUDA's legacy stream), of the thread's current one.
      auto& s = default_streams_[static_cast<size_t>(t_current_device)];
      if (!s) s = std::make_unique<SimStream>(t_current_device);
      return *s;
    }
    auto it = streams_.find(stream);
    if (it == streams_.end()) {
      ++errors_;
      throw InvalidArgumentError("unknown stream");
    }
    return *it->second;
  }

  std::shared_ptr<SimEvent> event_for(Event event) {
    std::lock_guard lock(mu_);
    auto it = events_.find(event);
    if (it == events_.end()) {
      ++errors_;
      throw InvalidArgumentError("unknown event");
    }
    return it->second;
  }

  std::mutex mu_;
  std::atomic<uint64_t> next_id_{1};
  std::map<uintptr_t, std::shared_ptr<Allocation>> allocations_;  // by base
  std::map<uintptr_t, size_t> pinned_;                             // base -> mapped length
  std::unordered_map<Stream, std::unique_ptr<SimStream>> streams_;
  std::unordered_map<Event, std::shared_ptr<SimEvent>> events_;
  std::array<std::unique_ptr<SimStream>, sim::kDeviceCount> default_streams_;
  std::atomic<int64_t> errors_{0};  // calls refused as misuse (sim::ObjectCounts::errors)
};

SimRuntime& instance() {
  // Never destroyed: streams are threads, and exit-time destruction order against other
  // static objects that still hold streams or events would be a hazard for no gain.
  static SimRuntime* runtime = new SimRuntime();
  return *runtime;
}

}  // namespace

Runtime& sim_runtime() { return instance(); }

namespace sim {
const char* allocation_kind_name(AllocationKind kind) noexcept {
  switch (kind) {
    case AllocationKind::kCudaMalloc: return "cudaMalloc memory";
    case AllocationKind::kManaged: return "managed memory (cudaMallocManaged)";
    case AllocationKind::kVmm: return "VMM memory (cuMemCreate, as PyTorch's expandable_segments allocates)";
  }
  return "?";
}
void* device_alloc(int device, size_t nbytes, AllocationKind kind) { return instance().alloc(device, nbytes, kind); }
int export_dmabuf(uintptr_t start, size_t size) { return instance().export_dmabuf(start, size); }

void hold_streams(bool held) {
  g_held.store(held);
  if (!held) instance().wake_streams();
}

std::optional<NicView> nic_view(uintptr_t addr, size_t length) { return instance().nic_view(addr, length); }
ObjectCounts object_counts() { return instance().object_counts(); }

NicView map_dmabuf(int fd, uint64_t offset, size_t length) {
  // Only the simulated GPU's buffers are dma-bufs here: its memfds, known by their name.
  char link[256] = {};
  const ssize_t n = readlink(fmt::format("/proc/self/fd/{}", fd).c_str(), link, sizeof link - 1);
  static const std::string prefix = "/memfd:dlslime-sim-gpu:";
  struct stat st {};
  if (n <= 0 || std::string(link, static_cast<size_t>(n)).rfind(prefix, 0) != 0 || fstat(fd, &st) != 0) {
    throw InvalidArgumentError(fmt::format("fd {} is not a dma-buf of the simulated GPU", fd));
  }
  if (length == 0 || offset > static_cast<uint64_t>(st.st_size) || length > static_cast<uint64_t>(st.st_size) - offset) {
    throw InvalidArgumentError(
        fmt::format("[{}, +{}) is empty or runs past the {}-byte dma-buf (fd {})", offset, length, st.st_size, fd));
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page;
  const size_t mapped = page_round(static_cast<size_t>(offset - start + length));
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(start));
  if (p == MAP_FAILED) throw_errno("mapping a dma-buf", errno);
  std::shared_ptr<const void> keep(p, [mapped](const void* q) { munmap(const_cast<void*>(q), mapped); });
  return {static_cast<uint8_t*>(p) + (offset - start), std::move(keep)};
}
}  // namespace sim

}  // namespace dlslime::gpu
