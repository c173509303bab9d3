// Names, handle encoding and runtime selection for the device-runtime seam (device_runtime.h).
#include "gpu/device_runtime.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace dlslime::gpu {

const char* memory_type_name(MemoryType type) noexcept {
  switch (type) {
    case MemoryType::kHost: return "host";
    case MemoryType::kPinnedHost: return "pinned host";
    case MemoryType::kDevice: return "device";
  }
  return "?";
}

std::string IpcHandle::to_hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * kSize);
  for (uint8_t b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

IpcHandle IpcHandle::from_hex(const std::string& hex) {
  if (hex.size() != 2 * kSize) {
    throw InvalidArgumentError(fmt::format("an IPC handle is {} hex digits, not {}", 2 * kSize, hex.size()));
  }
  auto digit = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw InvalidArgumentError(fmt::format("an IPC handle is hex digits; '{}' is not one", c));
  };
  IpcHandle handle;
  for (size_t i = 0; i < kSize; ++i) {
    handle.bytes[i] = static_cast<uint8_t>(digit(hex[2 * i]) << 4 | digit(hex[2 * i + 1]));
  }
  return handle;
}

PageRange dmabuf_pages(const AddressRange& allocation, uintptr_t addr, size_t length) {
  const uintptr_t base = allocation.base;
  if (length == 0 || addr < base || addr - base > allocation.size || length > allocation.size - (addr - base)) {
    throw InvalidArgumentError(fmt::format("dmabuf_fd: [{:#x}, +{}) is empty or runs past its device allocation [{:#x}, +{})",
                                           addr, length, base, allocation.size));
  }
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t start = addr / page * page;
  const uintptr_t end = (addr + length + page - 1) / page * page;  // addr + length <= base + size: no overflow
  if (start < base || end - base > allocation.size) {
    throw GpuError(fmt::format(
        "no dma-buf export of [{:#x}, +{}): a dma-buf covers whole host pages ({} bytes), and the pages [{:#x}, {:#x}) "
        "holding it reach outside its device allocation [{:#x}, +{}), whose base or end is not page-aligned (small "
        "cudaMalloc allocations share pages); allocate whole pages to export it",
        addr, length, page, start, end, base, allocation.size));
  }
  return {start, static_cast<size_t>(end - start)};
}

std::string fd_target(int fd) {
  char link[512] = {};
  const ssize_t n = fd < 0 ? -1 : ::readlink(fmt::format("/proc/self/fd/{}", fd).c_str(), link, sizeof link - 1);
  return n > 0 ? std::string(link, static_cast<size_t>(n)) : std::string();
}

void check_kernel_dmabuf(int fd, uint64_t offset, size_t length) {
  // A dma-buf file is "anon_inode:dmabuf" (older kernels) or "/dmabuf:<name>" (its own
  // pseudo-filesystem since 5.x); dma_buf_get refuses every other file with EINVAL.
  const std::string target = fd_target(fd);
  struct stat st {};
  if ((target.rfind("anon_inode:dmabuf", 0) != 0 && target.rfind("/dmabuf:", 0) != 0) || ::fstat(fd, &st) != 0) {
    throw InvalidArgumentError(fmt::format("fd {} is not a dma-buf ({})", fd,
                                           target.empty() ? "not an open descriptor" : "it is '" + target + "'"));
  }
  const auto size = static_cast<uint64_t>(st.st_size);  // a dma-buf's inode has the buffer's size
  if (length == 0 || offset > size || length > size - offset) {
    throw InvalidArgumentError(
        fmt::format("[{}, +{}) is empty or runs past the {}-byte dma-buf (fd {})", offset, length, size, fd));
  }
}

bool sim_selected() {
  const char* value = std::getenv("DLSLIME_GPU_SIM");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

Runtime& runtime() { return sim_selected() ? sim_runtime() : cuda_runtime(); }

std::string unavailable_reason() {
  try {
    runtime();
    return {};
  } catch (const GpuUnavailableError& e) {
    return e.what();
  }
}

#ifndef DLSLIME_WITH_CUDA
// Without the toolkit's headers neither CUDA nor the simulated GPU (which is built against
// them) exists.
namespace {
[[noreturn]] void no_gpu_runtime() {
  throw GpuUnavailableError(
      "no GPU runtime: DLSlime was built without CUDA, which the simulated GPU (DLSLIME_GPU_SIM=1) needs too (install "
      "the CUDA toolkit and configure with -DBUILD_CUDA=ON)");
}
}  // namespace
Runtime& cuda_runtime() { no_gpu_runtime(); }
Runtime& sim_runtime() { no_gpu_runtime(); }
SimObjectCounts sim_object_counts() { no_gpu_runtime(); }
const SimGpuExports* sim_gpu_exports() { return nullptr; }
#endif

}  // namespace dlslime::gpu
