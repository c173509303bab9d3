#include "dlslime/tcp_endpoint.h"

#include <string>

#include <nlohmann/json.hpp>

#include "core/notify_fence.h"
#include "core/remote_regions.h"
#include "tcp/tcp_endpoint_impl.h"

namespace dlslime {

TcpEndpoint::TcpEndpoint(const std::string& ip, uint16_t port, TcpOptions options)
    : TcpEndpoint(ip, port, std::move(options), nullptr) {}

TcpEndpoint::TcpEndpoint(const std::string& ip, uint16_t port, TcpOptions options,
                         std::shared_ptr<MemoryRegistry> regions)
    : impl_(std::make_shared<TcpEndpointImpl>(ip, port, std::move(options), std::move(regions))) {
  impl_->start();
  order_notifications(submit_while_alive(impl_));
}

TcpEndpoint::~TcpEndpoint() { impl_->shutdown(); }

nlohmann::json TcpEndpoint::endpoint_info() const { return impl_->endpoint_info(); }
void TcpEndpoint::connect(const nlohmann::json& peer_info) { impl_->connect(peer_info); }
bool TcpEndpoint::is_connected() const { return impl_->is_connected(); }

int32_t TcpEndpoint::register_memory_region(const std::string& name, uintptr_t addr, uint64_t offset,
                                            uint64_t length) {
  if (impl_->is_shut_down()) refuse_after_shutdown("register_memory_region");
  return impl_->local_regions->add(name, addr, offset, length);  // device memory: see region_added
}

int32_t TcpEndpoint::register_remote_memory_region(const std::string& name, const nlohmann::json& mr_info_entry) {
  return impl_->add_remote_region(name, mr_info_entry);
}

void TcpEndpoint::unregister_memory_region(const std::string& name) { impl_->local_regions->remove(name); }
void TcpEndpoint::unregister_memory_region(int32_t handle) { impl_->local_regions->remove(handle); }
nlohmann::json TcpEndpoint::mr_info() const { return impl_->local_regions->mr_info(); }
nlohmann::json TcpEndpoint::mr_info_of(const std::string& name) const { return impl_->local_regions->mr_info_of(name); }

Capabilities TcpEndpoint::capabilities() const {
  Capabilities caps;
  caps.transport = "tcp";
  caps.read = caps.write = caps.send_recv = caps.notify = true;
  caps.host_memory = true;
  caps.device_memory = true;  // staged through pinned host buffers (docs/tcp.md "GPU memory")
  return caps;
}

void TcpEndpoint::shutdown() { impl_->shutdown(); }
std::string TcpEndpoint::host() const { return impl_->host(); }
uint16_t TcpEndpoint::port() const { return impl_->port(); }
nlohmann::json TcpEndpoint::listener_stats() const {
  const auto s = impl_->listener_stats();
  const auto g = impl_->gpu_staging_stats();
  return {{"accepted", s.accepted},
          {"accept_failures", s.accept_failures},
          {"handshakes_completed", s.handshakes_completed},
          {"handshakes_refused", s.handshakes_refused},
          {"handshakes_timed_out", s.handshakes_timed_out},
          {"handshakes_evicted", s.handshakes_evicted},
          // GPU staging (docs/tcp.md "GPU memory"): pinned bytes in use, and the most ever.
          {"gpu_staging_bytes_in_use", g.in_use_bytes},
          {"gpu_staging_high_water_bytes", g.high_water_bytes},
          {"gpu_staging_slots", g.slots_per_direction}};
}
const TcpOptions& TcpEndpoint::options() const { return impl_->options(); }
nlohmann::json TcpEndpoint::same_host() const { return impl_->same_host(); }
Future TcpEndpoint::do_submit(OpRequest request) { return impl_->submit(std::move(request)); }

}  // namespace dlslime
