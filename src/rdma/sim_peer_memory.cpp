// The simulated GPU as the simulated NIC's peer-memory client (sim_device.h): what
// nvidia-peermem and the dma-buf importer do between a real GPU's driver and a NIC's.
// Part of libdlslime, because the simulated GPU lives there; the simulated NIC's library
// reaches it only through the client registered here.
#include <exception>

#include "gpu/sim_runtime.h"
#include "rdma/sim_device.h"

namespace dlslime::rdma::sim {

void attach_simulated_gpu(void (*set)(const PeerMemory* client)) {
  if (set == nullptr) return;
  PeerMemory client;
  client.view = [](uintptr_t addr, size_t length, std::string& error) -> std::optional<DeviceView> {
    try {
      std::optional<gpu::sim::NicView> view = gpu::sim::nic_view(addr, length);
      if (!view) return std::nullopt;  // no device memory: the NIC pins it as host memory
      return DeviceView{view->data, std::move(view->keep)};
    } catch (const std::exception& e) {
      error = e.what();
      return std::nullopt;
    }
  };
  client.map_dmabuf = [](int fd, uint64_t offset, size_t length, std::string& error) -> std::optional<DeviceView> {
    try {
      gpu::sim::NicView view = gpu::sim::map_dmabuf(fd, offset, length);
      return DeviceView{view.data, std::move(view.keep)};
    } catch (const std::exception& e) {
      error = e.what();
      return std::nullopt;
    }
  };
  set(&client);
}

}  // namespace dlslime::rdma::sim
