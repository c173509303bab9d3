// The simulated GPU's library called through the CUDA runtime ABI directly, as any CUDA
// program calls libcudart: the toolkit's header, the library, gtest, nothing of libdlslime.
// What the seam's tests check through cuda_runtime.cpp, this checks at the C ABI: the codes,
// the last error and the struct layouts are CUDA's.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
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

// CUDA's sticky error, at the ABI: a copy past its allocation is queued without complaint
// and faults its device's context when it runs. From then on each call in that context
// returns cudaErrorIllegalAddress (the driver CUDA_ERROR_ILLEGAL_ADDRESS), cudaGetLastError
// returns it every time, work queued after the fault does not run (host functions
// included, as cudaLaunchHostFunc documents), and another device works on. Nothing clears
// it, so this runs in a process of its own; it prints what broke and exits 1, or exits 0.
void a_faulted_context_stays_faulted() {
  auto require = [](bool ok, const std::string& what) {
    if (ok) return;
    std::fprintf(stderr, "FAILED: %s (detail: %s)\n", what.c_str(), dlslime_sim_gpu_last_error());
    std::_Exit(1);
  };
  require(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
  void* a = nullptr;
  void* b = nullptr;
  require(cudaMalloc(&a, 4096) == cudaSuccess && cudaMalloc(&b, 4096) == cudaSuccess, "cudaMalloc");
  cudaStream_t s = nullptr;
  cudaEvent_t done = nullptr;
  require(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "cudaStreamCreateWithFlags");
  require(cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess, "cudaEventCreateWithFlags");
  const int64_t errors_before = dlslime::gpu::sim::object_counts().errors;
  dlslime::gpu::sim::hold_streams(true);  // all of it queued before any of it runs
  require(cudaMemcpyAsync(b, a, 8192, cudaMemcpyDeviceToDevice, s) == cudaSuccess,
          "a copy past its allocation is queued without complaint, as on a GPU");
  const std::vector<uint8_t> src = patterned(64, 9);
  std::vector<uint8_t> back(64, 0);
  require(cudaMemcpyAsync(a, src.data(), src.size(), cudaMemcpyHostToDevice, s) == cudaSuccess, "a later copy queues");
  require(cudaMemcpyAsync(back.data(), a, back.size(), cudaMemcpyDeviceToHost, s) == cudaSuccess, "another queues");
  int called = 0;
  require(cudaLaunchHostFunc(s, [](void* arg) { ++*static_cast<int*>(arg); }, &called) == cudaSuccess,
          "cudaLaunchHostFunc queues");
  require(cudaEventRecord(done, s) == cudaSuccess, "cudaEventRecord queues");
  dlslime::gpu::sim::hold_streams(false);
  require(cudaEventSynchronize(done) == cudaErrorIllegalAddress, "cudaEventSynchronize after the fault");
  require(std::string(dlslime_sim_gpu_last_error()).find("ran past the end of its device allocation") !=
              std::string::npos,
          "the detail says which copy faulted");
  require(cudaGetLastError() == cudaErrorIllegalAddress && cudaGetLastError() == cudaErrorIllegalAddress,
          "cudaGetLastError returns the sticky error every time");
  require(cudaEventQuery(done) == cudaErrorIllegalAddress, "cudaEventQuery");
  void* more = nullptr;
  require(cudaMalloc(&more, 64) == cudaErrorIllegalAddress, "cudaMalloc in the faulted context");
  require(cudaFree(a) == cudaErrorIllegalAddress, "cudaFree in the faulted context");
  require(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaErrorIllegalAddress, "stream creation");
  CUdeviceptr base = 0;
  size_t size = 0;
  require(cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(a)) == CUDA_ERROR_ILLEGAL_ADDRESS,
          "a driver call in the faulted context");
  require(called == 0, "a host function queued after the fault never runs");
  require(back == std::vector<uint8_t>(64, 0), "a copy queued after the fault never runs");
  require(dlslime::gpu::sim::object_counts().errors == errors_before + 1, "the fault is counted once");
  require(std::string(cudaGetErrorName(cudaErrorIllegalAddress)) == "cudaErrorIllegalAddress", "the name");

  // Device 1 has a context of its own.
  require(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1)");
  cudaGetLastError();
  require(cudaGetLastError() == cudaSuccess, "device 1's thread state is clean");
  void* c = nullptr;
  cudaStream_t s1 = nullptr;
  cudaEvent_t done1 = nullptr;
  require(cudaMalloc(&c, 64) == cudaSuccess, "cudaMalloc on device 1");
  require(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess, "a stream on device 1");
  require(cudaEventCreateWithFlags(&done1, cudaEventDisableTiming) == cudaSuccess, "an event on device 1");
  require(cudaMemcpyAsync(c, src.data(), src.size(), cudaMemcpyHostToDevice, s1) == cudaSuccess &&
              cudaMemcpyAsync(back.data(), c, back.size(), cudaMemcpyDeviceToHost, s1) == cudaSuccess &&
              cudaEventRecord(done1, s1) == cudaSuccess && cudaEventSynchronize(done1) == cudaSuccess,
          "copies on device 1");
  require(back == src, "device 1's copies moved the bytes");
  require(cudaEventRecord(done, s1) == cudaErrorIllegalAddress, "device 0's event stays faulted");
  std::_Exit(0);
}

TEST(SimCudartAbiDeathTest, ACopyPastItsAllocationFaultsItsDevicesContextForGood) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: nothing clears the fault
  EXPECT_EXIT(a_faulted_context_stays_faulted(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
