// TcpOptions: parsing and validation. Compiled in every build (also -DBUILD_TCP=OFF):
// PeerAgentOptions carries TCP's options whether or not the transport is built.
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/advertise_address.h"
#include "core/env.h"
#include "core/host_name.h"
#include "core/port_range.h"
#include "dlslime/errors.h"
#include "dlslime/tcp_endpoint.h"
#include "tcp/frame_codec.h"

namespace dlslime {

namespace {

// The allowed range of every numeric option. from_env() and validate() both use it, so an
// environment variable and a keyword argument are held to the same bounds.
struct Range {
  int64_t min, max;
};
constexpr int64_t kMaxTimeoutMs = 365LL * 24 * 3600 * 1000;  // a year: far from overflowing a deadline
constexpr Range kLanes{1, 64};
constexpr Range kChunkSize{4096, static_cast<int64_t>(tcp::kMaxDataPayload)};
constexpr Range kConnectTimeoutMs{1, kMaxTimeoutMs};
constexpr Range kOpTimeoutMs{0, kMaxTimeoutMs};  // 0 = no deadline
constexpr Range kSocketBuffer{0, std::numeric_limits<int>::max()};  // 0 = OS default
// The kernel's own bounds (MAX_TCP_KEEPIDLE, MAX_TCP_KEEPINTVL, MAX_TCP_KEEPCNT): beyond
// them setsockopt fails with EINVAL.
constexpr Range kKeepaliveIdleS{1, 32767};
constexpr Range kKeepaliveIntervalS{1, 32767};
constexpr Range kKeepaliveCount{1, 127};
constexpr Range kMaxInflightOps{1, 1 << 24};
constexpr Range kMaxBatchItems{1, 1 << 24};
constexpr Range kUnexpectedBufferBytes{0, 1LL << 40};
constexpr Range kGpuStagingChunks{1, 64};  // tcp::GpuStaging::kMaxSlots

template <class T>
void env_option(const char* name, Range r, T& field) {
  field = static_cast<T>(env_integer(name, r.min, r.max, static_cast<int64_t>(field)));
}

void env_option(const char* name, Range r, std::chrono::milliseconds& field) {
  field = std::chrono::milliseconds(env_integer(name, r.min, r.max, field.count()));
}

template <class T>
void check_option(const char* option, T value, Range r, const char* note = "") {
  bool ok;
  if constexpr (std::is_unsigned_v<T>) {
    ok = value >= static_cast<uint64_t>(r.min) && value <= static_cast<uint64_t>(r.max);
  } else {
    ok = static_cast<int64_t>(value) >= r.min && static_cast<int64_t>(value) <= r.max;
  }
  if (!ok) {
    throw InvalidArgumentError(
        fmt::format("TcpEndpoint option {}={} is out of range (allowed: {}..{}){}", option, value, r.min, r.max, note));
  }
}

void check_option(const char* option, std::chrono::milliseconds value, Range r, const char* note = "") {
  check_option(option, value.count(), r, note);
}

}  // namespace

TcpOptions TcpOptions::from_env() {
  TcpOptions o;
  if (const char* host = std::getenv("DLSLIME_TCP_ADVERTISE_HOST"); host && *host) o.advertise_host = host;
  if (const char* name = std::getenv("DLSLIME_TCP_ADVERTISE_INTERFACE"); name && *name) o.advertise_interface = name;
  if (const char* range = std::getenv("DLSLIME_TCP_PORT_RANGE"); range && *range) o.port_range = range;
  if (const char* token = std::getenv("DLSLIME_TCP_TOKEN"); token && *token) o.token = token;
  if (const char* v = std::getenv("DLSLIME_TCP_SAME_HOST"); v && *v) {
    if (std::string_view(v) != "0" && std::string_view(v) != "1") {
      throw InvalidArgumentError(fmt::format("DLSLIME_TCP_SAME_HOST='{}' must be 0 or 1", v));
    }
    o.same_host = *v == '1';
  }
  env_option("DLSLIME_TCP_LANES", kLanes, o.lanes);
  env_option("DLSLIME_TCP_CHUNK_SIZE", kChunkSize, o.chunk_size);
  env_option("DLSLIME_TCP_CONNECT_TIMEOUT_MS", kConnectTimeoutMs, o.connect_timeout);
  env_option("DLSLIME_TCP_OP_TIMEOUT_MS", kOpTimeoutMs, o.op_timeout);
  env_option("DLSLIME_TCP_RECV_TIMEOUT_MS", kOpTimeoutMs, o.recv_timeout);
  env_option("DLSLIME_TCP_SNDBUF", kSocketBuffer, o.sndbuf);
  env_option("DLSLIME_TCP_RCVBUF", kSocketBuffer, o.rcvbuf);
  env_option("DLSLIME_TCP_KEEPALIVE_IDLE_S", kKeepaliveIdleS, o.keepalive_idle_s);
  env_option("DLSLIME_TCP_KEEPALIVE_INTERVAL_S", kKeepaliveIntervalS, o.keepalive_interval_s);
  env_option("DLSLIME_TCP_KEEPALIVE_COUNT", kKeepaliveCount, o.keepalive_count);
  env_option("DLSLIME_TCP_MAX_INFLIGHT_OPS", kMaxInflightOps, o.max_inflight_ops);
  env_option("DLSLIME_TCP_MAX_BATCH_ITEMS", kMaxBatchItems, o.max_batch_items);
  env_option("DLSLIME_TCP_UNEXPECTED_BUFFER_BYTES", kUnexpectedBufferBytes, o.unexpected_buffer_bytes);
  env_option("DLSLIME_TCP_GPU_STAGING_CHUNKS", kGpuStagingChunks, o.gpu_staging_chunks);
  return o;
}

void TcpOptions::validate() const {
  check_option("lanes", lanes, kLanes);
  check_option("chunk_size", chunk_size, kChunkSize);
  check_option("connect_timeout_ms", connect_timeout, kConnectTimeoutMs);
  check_option("op_timeout_ms", op_timeout, kOpTimeoutMs, " (0 = no deadline)");
  check_option("recv_timeout_ms", recv_timeout, kOpTimeoutMs, " (0 = no deadline)");
  check_option("sndbuf", sndbuf, kSocketBuffer, " (0 = OS default)");
  check_option("rcvbuf", rcvbuf, kSocketBuffer, " (0 = OS default)");
  check_option("keepalive_idle", keepalive_idle_s, kKeepaliveIdleS, " seconds (the kernel's limit)");
  check_option("keepalive_interval", keepalive_interval_s, kKeepaliveIntervalS, " seconds (the kernel's limit)");
  check_option("keepalive_count", keepalive_count, kKeepaliveCount, " (the kernel's limit)");
  check_option("max_inflight_ops", max_inflight_ops, kMaxInflightOps);
  check_option("max_batch_items", max_batch_items, kMaxBatchItems);
  check_option("unexpected_buffer_bytes", unexpected_buffer_bytes, kUnexpectedBufferBytes);
  check_option("gpu_staging_chunks", gpu_staging_chunks, kGpuStagingChunks);
  if (!advertise_host.empty()) check_host_text(advertise_host, "TcpEndpoint option advertise_host");
  if (!advertise_interface.empty()) check_interface_name(advertise_interface, "TcpEndpoint option advertise_interface");
  if (!advertise_host.empty() && !advertise_interface.empty()) {
    throw InvalidArgumentError(fmt::format("TcpEndpoint options advertise_host ('{}') and advertise_interface ('{}') "
                                           "are both set (as options or by DLSLIME_TCP_ADVERTISE_HOST and "
                                           "DLSLIME_TCP_ADVERTISE_INTERFACE): set one",
                                           advertise_host, advertise_interface));
  }
  PortRange::parse(port_range, "TcpEndpoint option port_range");
  // Anyone who can reach the port can get a MAC over a nonce of its choosing and guess
  // the token offline, so a short one is refused rather than silently weak.
  if (!token.empty() && token.size() < kMinTokenSize) {
    throw InvalidArgumentError(fmt::format("TcpEndpoint option token must be at least {} bytes (it is {}); e.g. "
                                           "`openssl rand -hex 16`",
                                           kMinTokenSize, token.size()));
  }
}

TcpOptions TcpOptions::from_json(const nlohmann::json& options, TcpOptions base) {
  if (options.is_null()) return base;
  if (!options.is_object()) {
    throw InvalidArgumentError(fmt::format("TcpEndpoint options must be a JSON object, not {}", options.type_name()));
  }
  TcpOptions& o = base;
  // An advertise option given here beats the environment's value of the other one.
  bool explicit_host = false, explicit_interface = false;
  // Iterators, not structured bindings: the lambdas below capture the key and value,
  // which clang before 16 does not allow for bindings.
  for (auto it = options.begin(); it != options.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& value = it.value();
    const auto text = [&]() -> std::string {
      if (!value.is_string()) {
        throw InvalidArgumentError(fmt::format("TcpEndpoint option {} must be a string, not {}", key, value.dump()));
      }
      return value.get<std::string>();
    };
    // Range-checked by validate() below; here only the type and the field's own width.
    const auto integer = [&](auto& field) {
      using T = std::decay_t<decltype(field)>;
      const bool fits = value.is_number_unsigned()
                            ? value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                            : value.is_number_integer() && value.get<int64_t>() >= int64_t{std::numeric_limits<T>::min()} &&
                                  value.get<int64_t>() <= static_cast<int64_t>(std::min<uint64_t>(
                                                              std::numeric_limits<T>::max(), INT64_MAX));
      if (!value.is_number_integer()) {
        throw InvalidArgumentError(fmt::format("TcpEndpoint option {} must be an integer, not {}", key, value.dump()));
      }
      if (!fits) {
        throw InvalidArgumentError(fmt::format("TcpEndpoint option {}={} is out of range ({}..{})", key, value.dump(),
                                               std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
      }
      field = value.get<T>();
    };
    const auto millis = [&](std::chrono::milliseconds& field) {
      int64_t ms = 0;
      integer(ms);
      field = std::chrono::milliseconds(ms);
    };
    if (key == "advertise_host") {
      o.advertise_host = text();
      explicit_host = true;
    } else if (key == "advertise_interface") {
      o.advertise_interface = text();
      explicit_interface = true;
    } else if (key == "port_range") o.port_range = text();
    else if (key == "token") o.token = text();
    else if (key == "same_host") {
      if (!value.is_boolean()) {
        throw InvalidArgumentError(fmt::format("TcpEndpoint option same_host must be true or false, not {}", value.dump()));
      }
      o.same_host = value.get<bool>();
    }
    else if (key == "lanes") integer(o.lanes);
    else if (key == "chunk_size") integer(o.chunk_size);
    else if (key == "connect_timeout_ms") millis(o.connect_timeout);
    else if (key == "op_timeout_ms") millis(o.op_timeout);
    else if (key == "recv_timeout_ms") millis(o.recv_timeout);
    else if (key == "sndbuf") integer(o.sndbuf);
    else if (key == "rcvbuf") integer(o.rcvbuf);
    else if (key == "keepalive_idle_s") integer(o.keepalive_idle_s);
    else if (key == "keepalive_interval_s") integer(o.keepalive_interval_s);
    else if (key == "keepalive_count") integer(o.keepalive_count);
    else if (key == "max_inflight_ops") integer(o.max_inflight_ops);
    else if (key == "max_batch_items") integer(o.max_batch_items);
    else if (key == "unexpected_buffer_bytes") integer(o.unexpected_buffer_bytes);
    else if (key == "gpu_staging_chunks") integer(o.gpu_staging_chunks);
    else throw InvalidArgumentError(fmt::format("unknown TcpEndpoint option '{}'", key));
  }
  if (explicit_host && !explicit_interface && !o.advertise_host.empty()) o.advertise_interface.clear();
  if (explicit_interface && !explicit_host && !o.advertise_interface.empty()) o.advertise_host.clear();
  o.validate();
  return o;
}

nlohmann::json TcpOptions::to_json() const {
  return {{"advertise_host", advertise_host},
          {"advertise_interface", advertise_interface},
          {"port_range", port_range},
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
          {"gpu_staging_chunks", gpu_staging_chunks},
          {"same_host", same_host},
          // Whether a token is set, never the token.
          {"authenticated", !token.empty()}};
}

}  // namespace dlslime
