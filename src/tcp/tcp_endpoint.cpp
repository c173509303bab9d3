#include "dlslime/tcp_endpoint.h"

#include <cstdlib>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dlslime/errors.h"
#include "tcp/frame.h"
#include "tcp/tcp_endpoint_impl.h"

namespace dlslime {

namespace {

template <class T>
void env_number(const char* name, T& out) {
  const char* raw = std::getenv(name);
  if (!raw || !*raw) return;
  try {
    size_t used = 0;
    const long long v = std::stoll(raw, &used);
    if (used != std::string(raw).size()) throw std::invalid_argument(raw);
    out = static_cast<T>(v);
  } catch (const std::exception&) {
    throw InvalidArgumentError(fmt::format("environment variable {}='{}' is not an integer", name, raw));
  }
}

void env_ms(const char* name, std::chrono::milliseconds& out) {
  long long ms = out.count();
  env_number(name, ms);
  out = std::chrono::milliseconds(ms);
}

}  // namespace

TcpOptions TcpOptions::from_env() {
  TcpOptions o;
  if (const char* host = std::getenv("DLSLIME_TCP_ADVERTISE_HOST"); host && *host) o.advertise_host = host;
  if (const char* token = std::getenv("DLSLIME_TCP_TOKEN"); token && *token) o.token = token;
  env_number("DLSLIME_TCP_LANES", o.lanes);
  env_number("DLSLIME_TCP_CHUNK_SIZE", o.chunk_size);
  env_ms("DLSLIME_TCP_CONNECT_TIMEOUT_MS", o.connect_timeout);
  env_ms("DLSLIME_TCP_OP_TIMEOUT_MS", o.op_timeout);
  env_ms("DLSLIME_TCP_RECV_TIMEOUT_MS", o.recv_timeout);
  env_number("DLSLIME_TCP_SNDBUF", o.sndbuf);
  env_number("DLSLIME_TCP_RCVBUF", o.rcvbuf);
  env_number("DLSLIME_TCP_KEEPALIVE_IDLE_S", o.keepalive_idle_s);
  env_number("DLSLIME_TCP_KEEPALIVE_INTERVAL_S", o.keepalive_interval_s);
  env_number("DLSLIME_TCP_KEEPALIVE_COUNT", o.keepalive_count);
  env_number("DLSLIME_TCP_MAX_INFLIGHT_OPS", o.max_inflight_ops);
  env_number("DLSLIME_TCP_MAX_BATCH_ITEMS", o.max_batch_items);
  env_number("DLSLIME_TCP_UNEXPECTED_BUFFER_BYTES", o.unexpected_buffer_bytes);
  return o;
}

void TcpOptions::validate() const {
  auto bad = [](const std::string& what) { throw InvalidArgumentError("TcpEndpoint option " + what); };
  if (lanes < 1 || lanes > 64) bad(fmt::format("lanes={} must be in 1..64", lanes));
  if (chunk_size < 4096 || chunk_size > tcp::kMaxDataPayload) {
    bad(fmt::format("chunk_size={} must be in 4096..{}", chunk_size, tcp::kMaxDataPayload));
  }
  if (connect_timeout.count() <= 0) bad("connect_timeout must be positive");
  if (op_timeout.count() < 0) bad("op_timeout must be >= 0 (0 = no deadline)");
  if (recv_timeout.count() < 0) bad("recv_timeout must be >= 0 (0 = no deadline)");
  if (sndbuf < 0 || rcvbuf < 0) bad("sndbuf/rcvbuf must be >= 0 (0 = OS default)");
  if (keepalive_idle_s < 1 || keepalive_interval_s < 1 || keepalive_count < 1) {
    bad("keepalive_idle/keepalive_interval/keepalive_count must be >= 1");
  }
  if (max_inflight_ops < 1) bad("max_inflight_ops must be >= 1");
  if (max_batch_items < 1) bad("max_batch_items must be >= 1");
  // Anyone who can reach the port can get a MAC over a nonce of its choosing and guess
  // the token offline, so a short one is refused rather than silently weak.
  if (!token.empty() && token.size() < kMinTokenSize) {
    bad(fmt::format("token must be at least {} bytes (it is {}); e.g. `openssl rand -hex 16`", kMinTokenSize,
                    token.size()));
  }
}

nlohmann::json TcpOptions::to_json() const {
  return {{"advertise_host", advertise_host},
          {"lanes", lanes},
          {"chunk_size", chunk_size},
          {"connect_timeout_ms", connect_timeout.count()},
          {"op_timeout_ms", op_timeout.count()},
          {"recv_timeout_ms", recv_timeout.count()},
          {"sndbuf", sndbuf},
          {"rcvbuf", rcvbuf},
          {"keepalive_idle_s", keepalive_idle_s},
          {"keepalive_interval_s", keepalive_interval_s},
          {"keepalive_count", keepalive_count},
          {"max_inflight_ops", max_inflight_ops},
          {"max_batch_items", max_batch_items},
          {"unexpected_buffer_bytes", unexpected_buffer_bytes},
          // Whether a token is set, never the token.
          {"authenticated", !token.empty()}};
}

TcpEndpoint::TcpEndpoint(const std::string& ip, uint16_t port, TcpOptions options)
    : TcpEndpoint(ip, port, std::move(options), nullptr) {}

TcpEndpoint::TcpEndpoint(const std::string& ip, uint16_t port, TcpOptions options,
                         std::shared_ptr<LocalRegionTable> regions)
    : impl_(std::make_shared<TcpEndpointImpl>(ip, port, std::move(options), std::move(regions))) {
  impl_->start();
}

TcpEndpoint::~TcpEndpoint() { impl_->shutdown(); }

nlohmann::json TcpEndpoint::endpoint_info() const { return impl_->endpoint_info(); }
void TcpEndpoint::connect(const nlohmann::json& peer_info) { impl_->connect(peer_info); }
bool TcpEndpoint::is_connected() const { return impl_->is_connected(); }

int32_t TcpEndpoint::register_memory_region(const std::string& name, uintptr_t addr, uint64_t offset,
                                            uint64_t length) {
  return impl_->local_regions->add(name, addr, offset, length);
}

int32_t TcpEndpoint::register_remote_memory_region(const std::string& name, const nlohmann::json& mr_info_entry) {
  return impl_->remote_regions.add(name, mr_info_entry);
}

void TcpEndpoint::unregister_memory_region(const std::string& name) { impl_->local_regions->remove(name); }
void TcpEndpoint::unregister_memory_region(int32_t handle) { impl_->local_regions->remove(handle); }
nlohmann::json TcpEndpoint::mr_info() const { return impl_->local_regions->mr_info(); }

Capabilities TcpEndpoint::capabilities() const {
  Capabilities caps;
  caps.transport = "tcp";
  caps.read = caps.write = caps.send_recv = true;
  caps.host_memory = true;
  return caps;
}

void TcpEndpoint::shutdown() { impl_->shutdown(); }
std::string TcpEndpoint::host() const { return impl_->host(); }
uint16_t TcpEndpoint::port() const { return impl_->port(); }
const TcpOptions& TcpEndpoint::options() const { return impl_->options(); }
Future TcpEndpoint::do_submit(OpRequest request) { return impl_->submit(std::move(request)); }

}  // namespace dlslime
