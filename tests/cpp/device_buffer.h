// Device memory of the simulated GPU for the C++ tests, written and read only through the
// runtime's copies: host code never touches device memory (the simulated GPU faults if it
// does, as a real one would).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpu/device_runtime.h"

namespace dlslime::test_support {

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n, int device = 0) : rt_(gpu::sim_runtime()), n_(n), ptr_(rt_.device_alloc(device, n)) {}
  ~DeviceBuffer() { rt_.device_free(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* ptr() const { return ptr_; }
  uintptr_t addr(size_t offset = 0) const { return reinterpret_cast<uintptr_t>(ptr_) + offset; }
  size_t size() const { return n_; }
  void write(const std::vector<uint8_t>& bytes, size_t offset = 0) {
    copy(static_cast<uint8_t*>(ptr_) + offset, bytes.data(), bytes.size());
  }
  std::vector<uint8_t> read() const { return read(0, n_); }
  std::vector<uint8_t> read(size_t offset, size_t n) const {
    std::vector<uint8_t> out(n);
    copy(out.data(), static_cast<const uint8_t*>(ptr_) + offset, n);
    return out;
  }

 private:
  void copy(void* dst, const void* src, size_t n) const {
    gpu::Event e = rt_.event_create(0);
    rt_.memcpy_async(dst, src, n, nullptr);
    rt_.event_record(e, nullptr);
    rt_.event_synchronize(e);
    rt_.event_destroy(e);
  }
  gpu::Runtime& rt_;
  size_t n_;
  void* ptr_;
};

}  // namespace dlslime::test_support
