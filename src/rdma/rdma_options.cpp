// RdmaOptions: parsing and validation, through one table of names (from_json, to_json
// and validate all read it, so a key cannot be accepted by one and unknown to another).
#include <functional>
#include <limits>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dlslime/errors.h"
#include "dlslime/rdma_endpoint.h"
#include "rdma/rdma_device.h"

namespace dlslime {

namespace {

constexpr int64_t kMaxTimeoutMs = 365LL * 24 * 3600 * 1000;

struct IntOption {
  const char* name;
  int64_t min, max;
  std::function<int64_t(const RdmaOptions&)> get;
  std::function<void(RdmaOptions&, int64_t)> set;
};

const std::vector<IntOption>& int_options() {
  static const std::vector<IntOption> table = {
      {"ib_port", 1, 255, [](const RdmaOptions& o) { return int64_t(o.ib_port); },
       [](RdmaOptions& o, int64_t v) { o.ib_port = static_cast<uint8_t>(v); }},
      {"gid_index", -1, 255, [](const RdmaOptions& o) { return int64_t(o.gid_index); },
       [](RdmaOptions& o, int64_t v) { o.gid_index = static_cast<int>(v); }},
      {"num_qp", 1, 64, [](const RdmaOptions& o) { return int64_t(o.num_qp); },
       [](RdmaOptions& o, int64_t v) { o.num_qp = static_cast<uint32_t>(v); }},
      {"max_send_wr", 2, 16384, [](const RdmaOptions& o) { return int64_t(o.max_send_wr); },
       [](RdmaOptions& o, int64_t v) { o.max_send_wr = static_cast<uint32_t>(v); }},
      {"max_recv_wr", 1, 16384, [](const RdmaOptions& o) { return int64_t(o.max_recv_wr); },
       [](RdmaOptions& o, int64_t v) { o.max_recv_wr = static_cast<uint32_t>(v); }},
      {"max_inline_data", 0, 1024, [](const RdmaOptions& o) { return int64_t(o.max_inline_data); },
       [](RdmaOptions& o, int64_t v) { o.max_inline_data = static_cast<uint32_t>(v); }},
      {"chunk_size", 4096, int64_t(1) << 30, [](const RdmaOptions& o) { return int64_t(o.chunk_size); },
       [](RdmaOptions& o, int64_t v) { o.chunk_size = static_cast<uint64_t>(v); }},
      {"op_timeout_ms", 0, kMaxTimeoutMs, [](const RdmaOptions& o) { return int64_t(o.op_timeout.count()); },
       [](RdmaOptions& o, int64_t v) { o.op_timeout = std::chrono::milliseconds(v); }},
      {"recv_timeout_ms", 0, kMaxTimeoutMs, [](const RdmaOptions& o) { return int64_t(o.recv_timeout.count()); },
       [](RdmaOptions& o, int64_t v) { o.recv_timeout = std::chrono::milliseconds(v); }},
      {"keepalive_ms", 0, kMaxTimeoutMs, [](const RdmaOptions& o) { return int64_t(o.keepalive.count()); },
       [](RdmaOptions& o, int64_t v) { o.keepalive = std::chrono::milliseconds(v); }},
      {"ack_timeout", 0, 31, [](const RdmaOptions& o) { return int64_t(o.ack_timeout); },
       [](RdmaOptions& o, int64_t v) { o.ack_timeout = static_cast<uint32_t>(v); }},
      {"retry_cnt", 0, 7, [](const RdmaOptions& o) { return int64_t(o.retry_cnt); },
       [](RdmaOptions& o, int64_t v) { o.retry_cnt = static_cast<uint32_t>(v); }},
      {"rnr_retry", 0, 7, [](const RdmaOptions& o) { return int64_t(o.rnr_retry); },
       [](RdmaOptions& o, int64_t v) { o.rnr_retry = static_cast<uint32_t>(v); }},
  };
  return table;
}

}  // namespace

RdmaOptions RdmaOptions::from_json(const nlohmann::json& options, RdmaOptions base) {
  if (options.is_null()) return base;
  if (!options.is_object()) {
    throw InvalidArgumentError(fmt::format("RDMAEndpoint options must be an object, not {}", options.dump()));
  }
  for (const auto& item : options.items()) {
    const std::string& key = item.key();
    const nlohmann::json& value = item.value();
    if (key == "device_name" || key == "link_type") {
      if (!value.is_string()) {
        throw InvalidArgumentError(fmt::format("RDMAEndpoint option {} must be a string, not {}", key, value.dump()));
      }
      (key == "device_name" ? base.device_name : base.link_type) = value.get<std::string>();
      continue;
    }
    const IntOption* opt = nullptr;
    for (const IntOption& o : int_options()) {
      if (key == o.name) opt = &o;
    }
    if (opt == nullptr) {
      std::string known = "device_name, link_type";
      for (const IntOption& o : int_options()) known += fmt::format(", {}", o.name);
      throw InvalidArgumentError(fmt::format("unknown RDMAEndpoint option '{}' (known: {})", key, known));
    }
    if (!value.is_number_integer()) {
      throw InvalidArgumentError(fmt::format("RDMAEndpoint option {} must be an integer, not {}", key, value.dump()));
    }
    if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(opt->max)) {
      throw InvalidArgumentError(fmt::format("RDMAEndpoint option {}={} is out of range (allowed: {}..{})", key,
                                             value.dump(), opt->min, opt->max));
    }
    const int64_t v = value.get<int64_t>();
    if (v < opt->min || v > opt->max) {
      throw InvalidArgumentError(
          fmt::format("RDMAEndpoint option {}={} is out of range (allowed: {}..{})", key, v, opt->min, opt->max));
    }
    opt->set(base, v);
  }
  base.validate();
  return base;
}

RdmaOptions RdmaOptions::from_json(const nlohmann::json& options) { return from_json(options, RdmaOptions()); }

void RdmaOptions::validate() const {
  for (const IntOption& o : int_options()) {
    const int64_t v = o.get(*this);
    if (v < o.min || v > o.max) {
      throw InvalidArgumentError(
          fmt::format("RDMAEndpoint option {}={} is out of range (allowed: {}..{})", o.name, v, o.min, o.max));
    }
  }
  rdma::parse_link_type(link_type);  // throws for anything but auto, RoCE, IB
}

nlohmann::json RdmaOptions::to_json() const {
  nlohmann::json out = {{"device_name", device_name}, {"link_type", link_type}};
  for (const IntOption& o : int_options()) out[o.name] = o.get(*this);
  return out;
}

}  // namespace dlslime
