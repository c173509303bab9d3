// The simulated NPU (sim_npu_memory.h).
#include "ascend/sim_npu_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "dlslime/errors.h"

namespace dlslime::ascend {
namespace {

constexpr int kDefaultDevices = 2;
constexpr int kMaxDevices = 16;

size_t page_round(size_t n) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

struct Allocation {
  uintptr_t base = 0;   // the device pointer: the PROT_NONE view
  uint8_t* rw = nullptr;  // the simulation's own read-write view of the same pages
  size_t size = 0;      // as asked: a range past it is an overrun even inside the last page
  size_t mapped = 0;    // page-rounded
  int device = 0;
};

// Where a range lies: in one allocation (alloc set), in none (alloc null, why empty), or
// partly / past the end (why says which).
struct Located {
  const Allocation* alloc = nullptr;
  std::string why;
};

class SimNpuMemory final : public NpuMemory {
 public:
  SimNpuMemory() {
    // Read once: the device count must not change under allocations made with it.
    const char* raw = std::getenv("DLSLIME_ASCEND_SIM_DEVICES");
    if (raw == nullptr || *raw == '\0') {
      devices_ = kDefaultDevices;
      return;
    }
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(raw, &end, 10);
    if (errno != 0 || *end != '\0' || n < 1 || n > kMaxDevices) {
      devices_error_ = fmt::format("DLSLIME_ASCEND_SIM_DEVICES='{}' is not a device count from 1 to {}", raw,
                                   kMaxDevices);
      return;
    }
    devices_ = static_cast<int>(n);
  }

  const char* name() const override { return "sim"; }

  int device_count() override {
    if (!devices_error_.empty()) throw InvalidArgumentError(devices_error_);
    return devices_;
  }

  void* alloc(int device, size_t nbytes) override {
    const int count = device_count();
    if (device < 0 || device >= count) {
      throw InvalidArgumentError(fmt::format("simulated NPU {} does not exist (this process has {}, 0..{})",
                                             device, count, count - 1));
    }
    // aclrtMalloc refuses an empty allocation; so does the simulation, so code that relies
    // on one fails here rather than on an NPU.
    if (nbytes == 0) throw InvalidArgumentError("cannot allocate 0 bytes of NPU memory");
    Allocation a;
    a.size = nbytes;
    a.mapped = page_round(nbytes);
    a.device = device;
    const int fd = ::memfd_create(fmt::format("dlslime-sim-npu:{}", device).c_str(), MFD_CLOEXEC);
    if (fd < 0) throw_errno("memfd_create", errno, nbytes);
    if (::ftruncate(fd, static_cast<off_t>(a.mapped)) != 0) {
      const int err = errno;
      ::close(fd);
      throw_errno("ftruncate", err, nbytes);
    }
    void* base = ::mmap(nullptr, a.mapped, PROT_NONE, MAP_SHARED, fd, 0);
    void* rw = base == MAP_FAILED ? MAP_FAILED : ::mmap(nullptr, a.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);  // the mappings keep the pages
    if (rw == MAP_FAILED) {
      if (base != MAP_FAILED) ::munmap(base, a.mapped);
      throw_errno("mmap", err, nbytes);
    }
    a.base = reinterpret_cast<uintptr_t>(base);
    a.rw = static_cast<uint8_t*>(rw);
    std::lock_guard<std::mutex> lock(mu_);
    allocations_[a.base] = a;
    return base;
  }

  void free(void* device_ptr) override {
    Allocation a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = allocations_.find(reinterpret_cast<uintptr_t>(device_ptr));
      if (it == allocations_.end()) {
        throw InvalidArgumentError(
            fmt::format("{} is not an NPU allocation of this process (free takes the pointer alloc returned)",
                        device_ptr));
      }
      a = it->second;
      allocations_.erase(it);
    }
    ::munmap(reinterpret_cast<void*>(a.base), a.mapped);
    ::munmap(a.rw, a.mapped);
  }

  void copy_to_device(void* device_dst, const void* host_src, size_t n) override {
    // Under the lock: a concurrent free cannot unmap the view mid-copy.
    std::lock_guard<std::mutex> lock(mu_);
    uint8_t* dst = device_view(reinterpret_cast<uintptr_t>(device_dst), n, "copy_to_device's destination");
    require_host(reinterpret_cast<uintptr_t>(host_src), n, "copy_to_device's source");
    if (n > 0) std::memcpy(dst, host_src, n);
  }

  void copy_to_host(void* host_dst, const void* device_src, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    const uint8_t* src = device_view(reinterpret_cast<uintptr_t>(device_src), n, "copy_to_host's source");
    require_host(reinterpret_cast<uintptr_t>(host_dst), n, "copy_to_host's destination");
    if (n > 0) std::memcpy(host_dst, src, n);
  }

  std::mutex& dma_mutex() { return mu_; }  // sim_npu_dma_lock()

  MemType classify(uintptr_t addr, size_t len) override {
    std::lock_guard<std::mutex> lock(mu_);
    Located at = locate(addr, len);
    if (!at.why.empty()) throw InvalidArgumentError(at.why);
    return at.alloc != nullptr ? MemType::kDevice : MemType::kHost;
  }

  uint8_t* host_view(uintptr_t addr, size_t len, std::string* why) {
    std::lock_guard<std::mutex> lock(mu_);
    Located at = locate(addr, len);
    *why = std::move(at.why);
    if (at.alloc == nullptr) return nullptr;
    return at.alloc->rw + (addr - at.alloc->base);
  }

  int64_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(allocations_.size());
  }

 private:
  [[noreturn]] static void throw_errno(const char* call, int err, size_t nbytes) {
    // Out of memory or of file descriptors is what the user can act on; name the size.
    throw InvalidArgumentError(
        fmt::format("cannot allocate {} bytes of simulated NPU memory: {} failed: {}", nbytes, call, std::strerror(err)));
  }

  // mu_ held.
  Located locate(uintptr_t addr, size_t len) const {
    Located out;
    if (addr + len < addr) {
      out.why = fmt::format("the range at {:#x} of {} bytes wraps around the address space", addr, len);
      return out;
    }
    const uintptr_t end = addr + len;
    auto it = allocations_.upper_bound(addr);
    if (it != allocations_.begin()) {
      const Allocation& a = std::prev(it)->second;
      if (addr < a.base + a.size) {
        if (end <= a.base + a.size) {
          out.alloc = &a;
        } else {
          out.why = fmt::format(
              "[{:#x}, +{}) runs {} bytes past the end of its NPU allocation of {} bytes at {:#x}", addr, len,
              end - (a.base + a.size), a.size, a.base);
        }
        return out;
      }
    }
    // Not inside one: some allocation may still start within the range.
    if (it != allocations_.end() && it->first < end) {
      out.why = fmt::format("[{:#x}, +{}) is partly NPU memory: the NPU allocation of {} bytes at {:#x} starts in it",
                            addr, len, it->second.size, it->first);
    }
    return out;
  }

  // mu_ held.
  uint8_t* device_view(uintptr_t addr, size_t n, const char* what) const {
    Located at = locate(addr, n);
    if (!at.why.empty()) throw InvalidArgumentError(fmt::format("{}: {}", what, at.why));
    if (at.alloc == nullptr) {
      throw InvalidArgumentError(fmt::format("{} {:#x} is not NPU memory of this process", what, addr));
    }
    return at.alloc->rw + (addr - at.alloc->base);
  }

  // mu_ held. Host code cannot touch device memory: a host pointer that is one would fault.
  void require_host(uintptr_t addr, size_t n, const char* what) const {
    Located at = locate(addr, n);
    if (at.alloc != nullptr || !at.why.empty()) {
      throw InvalidArgumentError(fmt::format("{} [{:#x}, +{}) must be host memory, and it is NPU memory", what,
                                             addr, n));
    }
  }

  int devices_ = 0;
  std::string devices_error_;  // non-empty: DLSLIME_ASCEND_SIM_DEVICES was malformed
  std::mutex mu_;
  std::map<uintptr_t, Allocation> allocations_;  // by base
};

SimNpuMemory& instance() {
  static SimNpuMemory* npu = new SimNpuMemory();  // never destroyed: engines may outlive statics
  return *npu;
}

}  // namespace

NpuMemory& sim_npu_memory() { return instance(); }

uint8_t* sim_host_view(uintptr_t addr, size_t len, std::string* why) { return instance().host_view(addr, len, why); }

int64_t sim_npu_allocations() { return instance().count(); }

std::unique_lock<std::mutex> sim_npu_dma_lock() { return std::unique_lock<std::mutex>(instance().dma_mutex()); }

}  // namespace dlslime::ascend
