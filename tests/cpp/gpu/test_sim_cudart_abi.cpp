// The simulated GPU's library called through the CUDA runtime ABI directly, as any CUDA
// program calls libcudart: the toolkit's header, the library, gtest, nothing of libdlslime.
// What the seam's tests check through cuda_runtime.cpp, this checks at the C ABI: the codes,
// the last error and the struct layouts are CUDA's.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/sim_cudart.h"

namespace {

std::vector<uint8_t> patterned(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + seed);
  return v;
}

TEST(SimCudartAbi, DevicesAndPropertiesAreReportedAsCudaReportsThem) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, dlslime::gpu::sim::kDeviceCount);
  cudaDeviceProp a{}, b{};
  ASSERT_EQ(cudaGetDeviceProperties(&a, 0), cudaSuccess);
  ASSERT_EQ(cudaGetDeviceProperties(&b, 1), cudaSuccess);
  EXPECT_NE(std::memcmp(a.uuid.bytes, b.uuid.bytes, sizeof a.uuid.bytes), 0) << "two devices with one UUID";
  EXPECT_EQ(cudaSetDevice(count), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
}

// Host -> device -> device -> host on one stream, waited for through an event.
TEST(SimCudartAbi, MemcpyAsyncMovesBytesInStreamOrderAndAnEventSaysWhenTheyMoved) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const size_t n = (1 << 20) + 3;
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, n), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, n), cudaSuccess);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, static_cast<uint8_t*>(a) + 10), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attr.device, 0);
  cudaStream_t s = nullptr;
  cudaEvent_t done = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), cudaSuccess);
  const std::vector<uint8_t> src = patterned(n, 3);
  std::vector<uint8_t> back(n, 0);
  dlslime::gpu::sim::hold_streams(true);  // the copies stay queued: the event cannot be done
  ASSERT_EQ(cudaMemcpyAsync(a, src.data(), n, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), b, n, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(done, s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "not ready is no error";
  dlslime::gpu::sim::hold_streams(false);
  ASSERT_EQ(cudaEventSynchronize(done), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
  EXPECT_EQ(back, src);
  EXPECT_EQ(cudaEventDestroy(done), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaFree(a), cudaSuccess);
  EXPECT_EQ(cudaFree(b), cudaSuccess);
}

// CUDA's rule: a process cannot open its own IPC handle; the handle is cudaIpcMemHandle_t.
TEST(SimCudartAbi, AProcessCannotOpenItsOwnIpcHandle) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 4096), cudaSuccess);
  cudaIpcMemHandle_t handle{};
  ASSERT_EQ(cudaIpcGetMemHandle(&handle, static_cast<uint8_t*>(dev) + 100), cudaSuccess);
  void* opened = nullptr;
  EXPECT_EQ(cudaIpcOpenMemHandle(&opened, handle, cudaIpcMemLazyEnablePeerAccess), cudaErrorInvalidValue);
  EXPECT_NE(std::string(dlslime_sim_gpu_last_error()).find("its own IPC handle"), std::string::npos)
      << dlslime_sim_gpu_last_error();
  EXPECT_EQ(opened, nullptr);
  EXPECT_EQ(cudaFree(dev), cudaSuccess);
}

// A failure is the thread's last error until cudaGetLastError returns it; a later success
// does not clear it, and it is per thread.
TEST(SimCudartAbi, TheLastErrorStaysUntilCudaGetLastErrorReturnsIt) {
  cudaGetLastError();  // clears what an earlier test on this thread left
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<uint8_t> host(16);
  const auto before = dlslime::gpu::sim::object_counts();
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidValue);
  EXPECT_EQ(dlslime::gpu::sim::object_counts().errors, before.errors + 1) << "a refused free is counted";
  EXPECT_EQ(cudaEventDestroy(reinterpret_cast<cudaEvent_t>(host.data())), cudaErrorInvalidResourceHandle);
  int count = 0;
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaSuccess);  // a success in between
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_STREQ(cudaGetErrorName(cudaErrorInvalidResourceHandle), "cudaErrorInvalidResourceHandle");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument");
}

}  // namespace
