// A program linked against the toolkit's shared libcudart and nothing of DLSlime, as another
// project's test binary is. Run with LD_PRELOAD=libdlslime_sim_cudart.so (docs/nvlink.md), its
// runtime calls reach the simulated GPU: two devices named as the simulation names them,
// bytes through device memory and back on a stream, waited for through an event. Prints
// "moved N bytes" or why not.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <vector>

namespace {

int fail(const char* what, cudaError_t err) {
  std::fprintf(stderr, "cudart_probe: %s: %s\n", what, cudaGetErrorName(err));
  return 1;
}

}  // namespace

int main() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return fail("cudaGetDeviceCount (is LD_PRELOAD set?)", err);
  cudaDeviceProp prop{};
  if ((err = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess) return fail("cudaGetDeviceProperties", err);
  if (count != 2 || std::strncmp(prop.name, "DLSlime simulated GPU", 21) != 0) {
    std::fprintf(stderr, "cudart_probe: expected the two simulated GPUs, got %d ('%s')\n", count, prop.name);
    return 1;
  }
  const size_t n = 1 << 16;
  std::vector<unsigned char> src(n), back(n, 0);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<unsigned char>(i * 13 + 5);
  void* dev = nullptr;
  cudaStream_t s = nullptr;
  cudaEvent_t done = nullptr;
  if ((err = cudaMalloc(&dev, n)) != cudaSuccess) return fail("cudaMalloc", err);
  if ((err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess) return fail("stream", err);
  if ((err = cudaEventCreateWithFlags(&done, cudaEventDisableTiming)) != cudaSuccess) return fail("event", err);
  if ((err = cudaMemcpyAsync(dev, src.data(), n, cudaMemcpyHostToDevice, s)) != cudaSuccess) return fail("H2D", err);
  if ((err = cudaMemcpyAsync(back.data(), dev, n, cudaMemcpyDeviceToHost, s)) != cudaSuccess) return fail("D2H", err);
  if ((err = cudaEventRecord(done, s)) != cudaSuccess) return fail("cudaEventRecord", err);
  if ((err = cudaEventSynchronize(done)) != cudaSuccess) return fail("cudaEventSynchronize", err);
  if (back != src) {
    std::fprintf(stderr, "cudart_probe: the bytes back differ\n");
    return 1;
  }
  if (cudaEventDestroy(done) != cudaSuccess || cudaStreamDestroy(s) != cudaSuccess || cudaFree(dev) != cudaSuccess) {
    return fail("teardown", cudaGetLastError());
  }
  std::printf("moved %zu bytes through %s\n", n, prop.name);
  return 0;
}
