// The simulated GPU as the simulated NIC's peer-memory client (sim_device.h): what
// nvidia-peermem and the dma-buf importer do between a real GPU's driver and a NIC's.
// Part of libdlslime, which loads both simulated libraries: the NIC's reaches the GPU's
// only through the client registered here, and this reaches the GPU's through the C
// functions it exports (sim_cudart.h), as the GPU adapter resolved them.
#include <string>

#include "gpu/device_runtime.h"
#include "gpu/sim_cudart.h"
#include "rdma/sim_device.h"

namespace dlslime::rdma::sim {
namespace {

// The view the GPU library handed over, held (and released through it) while the MR is.
DeviceView adopt(const gpu::SimGpuExports& gpu, const DlslimeSimGpuView& view) {
  auto release = gpu.release_view;
  return DeviceView{view.data, std::shared_ptr<const void>(view.keep, [release](const void* keep) {
                      release(const_cast<void*>(keep));
                    })};
}

}  // namespace

void attach_simulated_gpu(void (*set)(const PeerMemory* client)) {
  // Without the simulated GPU's library (a build without CUDA) there is no device memory:
  // the NIC pins everything as host memory.
  const gpu::SimGpuExports* gpu = gpu::sim_gpu_exports();
  if (set == nullptr || gpu == nullptr) return;
  PeerMemory client;
  client.view = [gpu](uintptr_t addr, size_t length, std::string& error) -> std::optional<DeviceView> {
    DlslimeSimGpuView view{};
    const int rc = gpu->nic_view(addr, length, &view);
    if (rc < 0) error = gpu->last_error();
    if (rc <= 0) return std::nullopt;  // no device memory: the NIC pins it as host memory
    return adopt(*gpu, view);
  };
  client.map_dmabuf = [gpu](int fd, uint64_t offset, size_t length, std::string& error) -> std::optional<DeviceView> {
    DlslimeSimGpuView view{};
    if (gpu->map_dmabuf(fd, offset, length, &view) != 0) {
      error = gpu->last_error();
      return std::nullopt;
    }
    return adopt(*gpu, view);
  };
  set(&client);
}

}  // namespace dlslime::rdma::sim
