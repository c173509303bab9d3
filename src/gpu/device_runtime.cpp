// Names, handle encoding and runtime selection for the device-runtime seam (device_runtime.h).
#include "gpu/device_runtime.h"

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
Runtime& cuda_runtime() {
  throw GpuUnavailableError(fmt::format(
      "no GPU runtime: DLSlime was built without CUDA (install the CUDA toolkit and configure with "
      "-DBUILD_CUDA=ON), or {}",
      kSimHint));
}
#endif

}  // namespace dlslime::gpu
