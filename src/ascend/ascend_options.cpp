// AscendOptions: parsed and validated once, at construction (docs/ascend.md, "Options").
// The library's own keys are checked against the values it documents here, so a typo fails
// at construction with our message, not deep inside Initialize with a bare PARAM_INVALID.
#include <arpa/inet.h>

#include <charconv>
#include <functional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dlslime/ascend_endpoint.h"
#include "dlslime/errors.h"

namespace dlslime {

namespace {

constexpr int64_t kMaxTimeoutMs = 365LL * 24 * 3600 * 1000;

int64_t int_option(const std::string& key, const nlohmann::json& value, int64_t lo, int64_t hi) {
  const bool ok = value.is_number_integer() &&
                  !(value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(hi)) &&
                  value.get<int64_t>() >= lo && value.get<int64_t>() <= hi;
  if (!ok) {
    throw InvalidArgumentError(
        fmt::format("AscendDirectEndpoint option {}={} must be an integer in {}..{}", key, value.dump(), lo, hi));
  }
  return value.get<int64_t>();
}

std::optional<int64_t> parse_int(std::string_view s) {
  int64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// The library's option keys and what it documents for each; the check returns "" when the
// (string) value is acceptable, else what is expected.
struct EngineKey {
  const char* name;
  std::function<std::string(const std::string&)> check;
};

std::function<std::string(const std::string&)> int_in(int64_t lo, int64_t hi) {
  return [lo, hi](const std::string& v) -> std::string {
    const auto n = parse_int(v);
    return n && *n >= lo && *n <= hi ? "" : fmt::format("an integer in {}..{}", lo, hi);
  };
}

const std::vector<EngineKey>& engine_keys() {
  static const std::vector<EngineKey> keys = {
      {"RdmaTrafficClass",
       [](const std::string& v) -> std::string {
         const auto n = parse_int(v);
         return n && *n >= 0 && *n <= 255 && *n % 4 == 0 ? "" : "an integer in 0..255, a multiple of 4";
       }},
      {"RdmaServiceLevel", int_in(0, 7)},
      // "<buffer count>:<buffer size in MB>", "0:0" for none.
      {"BufferPool",
       [](const std::string& v) -> std::string {
         const size_t colon = v.find(':');
         const auto count = colon == std::string::npos ? std::nullopt : parse_int(std::string_view(v).substr(0, colon));
         const auto size = colon == std::string::npos ? std::nullopt : parse_int(std::string_view(v).substr(colon + 1));
         const bool ok = count && size && *count >= 0 && *size >= 0 && ((*count == 0) == (*size == 0));
         return ok ? "" : "\"<count>:<size MB>\" (both 0 for none)";
       }},
      // The local communication resources, as the JSON text the library parses.
      {"LocalCommRes",
       [](const std::string& v) -> std::string {
         return nlohmann::json::accept(v) ? "" : "a JSON document (the local communication resources)";
       }},
      {"AutoConnect",
       [](const std::string& v) -> std::string { return v == "0" || v == "1" ? "" : "\"0\" or \"1\""; }},
      {"EnableUseFabricMem",
       [](const std::string& v) -> std::string { return v == "0" || v == "1" ? "" : "\"0\" or \"1\""; }},
      // A JSON object (connect_pool, comm_resource_config, channel_pool, ...); its fields are
      // the library's to check.
      {"GlobalResourceConfig",
       [](const std::string& v) -> std::string {
         const nlohmann::json j = nlohmann::json::parse(v, nullptr, /*allow_exceptions=*/false);
         return j.is_object() ? "" : "a JSON object";
       }},
  };
  return keys;
}

void check_engine_option(const std::string& key, const std::string& value) {
  for (const EngineKey& k : engine_keys()) {
    if (key != k.name) continue;
    if (std::string expected = k.check(value); !expected.empty()) {
      throw InvalidArgumentError(
          fmt::format("AscendDirectEndpoint engine option {}='{}' must be {}", key, value, expected));
    }
    return;
  }
  std::string known;
  for (const EngineKey& k : engine_keys()) known += fmt::format("{}{}", known.empty() ? "" : ", ", k.name);
  throw InvalidArgumentError(fmt::format("unknown AscendDirectEndpoint engine option '{}' (known: {})", key, known));
}

bool is_engine_key(const std::string& key) {
  for (const EngineKey& k : engine_keys()) {
    if (key == k.name) return true;
  }
  return false;
}

std::string engine_value(const std::string& key, const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_integer()) return value.dump();
  if (value.is_boolean()) return value.get<bool>() ? "1" : "0";
  throw InvalidArgumentError(fmt::format("AscendDirectEndpoint engine option {}={} must be a string or an integer",
                                         key, value.dump()));
}

}  // namespace

AscendOptions AscendOptions::from_json(const nlohmann::json& options, AscendOptions base) {
  if (options.is_null()) return base;
  if (!options.is_object()) {
    throw InvalidArgumentError(fmt::format("AscendDirectEndpoint options must be an object, not {}", options.dump()));
  }
  for (const auto& item : options.items()) {
    const std::string& key = item.key();
    const nlohmann::json& value = item.value();
    if (key == "host") {
      if (!value.is_string()) {
        throw InvalidArgumentError(fmt::format("AscendDirectEndpoint option host={} must be a string", value.dump()));
      }
      base.host = value.get<std::string>();
    } else if (key == "port") {
      base.port = static_cast<int>(int_option(key, value, 0, 65535));
    } else if (key == "device") {
      base.device = static_cast<int>(int_option(key, value, 0, 1 << 16));
    } else if (key == "connect_timeout_ms") {
      base.connect_timeout = std::chrono::milliseconds(int_option(key, value, 1, INT32_MAX));
    } else if (key == "op_timeout_ms") {
      base.op_timeout = std::chrono::milliseconds(int_option(key, value, 0, kMaxTimeoutMs));
    } else if (key == "recv_timeout_ms") {
      base.recv_timeout = std::chrono::milliseconds(int_option(key, value, 0, kMaxTimeoutMs));
    } else if (key == "engine_options") {
      if (!value.is_object()) {
        throw InvalidArgumentError(
            fmt::format("AscendDirectEndpoint option engine_options={} must be an object", value.dump()));
      }
      for (const auto& e : value.items()) base.engine_options[e.key()] = engine_value(e.key(), e.value());
    } else if (is_engine_key(key)) {
      base.engine_options[key] = engine_value(key, value);
    } else {
      std::string known = "host, port, device, connect_timeout_ms, op_timeout_ms, recv_timeout_ms, engine_options";
      for (const EngineKey& k : engine_keys()) known += fmt::format(", {}", k.name);
      throw InvalidArgumentError(fmt::format("unknown AscendDirectEndpoint option '{}' (known: {})", key, known));
    }
  }
  base.validate();
  return base;
}

AscendOptions AscendOptions::from_json(const nlohmann::json& options) { return from_json(options, AscendOptions()); }

void AscendOptions::validate() const {
  in_addr a{};
  if (inet_pton(AF_INET, host.c_str(), &a) != 1) {
    throw InvalidArgumentError(fmt::format(
        "AscendDirectEndpoint option host='{}' must be an IPv4 address (the engine is named \"ip:port\")", host));
  }
  if (port < 0 || port > 65535) {
    throw InvalidArgumentError(fmt::format("AscendDirectEndpoint option port={} must be in 0..65535", port));
  }
  if (device < 0) throw InvalidArgumentError(fmt::format("AscendDirectEndpoint option device={} must be >= 0", device));
  if (connect_timeout.count() < 1 || connect_timeout.count() > INT32_MAX) {
    throw InvalidArgumentError(fmt::format("AscendDirectEndpoint option connect_timeout_ms={} must be in 1..{}",
                                           connect_timeout.count(), INT32_MAX));
  }
  for (auto [name, value] : {std::pair{"op_timeout_ms", op_timeout}, std::pair{"recv_timeout_ms", recv_timeout}}) {
    if (value.count() < 0 || value.count() > kMaxTimeoutMs) {
      throw InvalidArgumentError(
          fmt::format("AscendDirectEndpoint option {}={} must be in 0..{}", name, value.count(), kMaxTimeoutMs));
    }
  }
  for (const auto& [key, value] : engine_options) check_engine_option(key, value);
  auto it = engine_options.find("EnableUseFabricMem");
  if (it != engine_options.end() && it->second == "1" && engine_options.count("BufferPool") != 0) {
    throw InvalidArgumentError("AscendDirectEndpoint engine options EnableUseFabricMem=1 and BufferPool exclude each "
                               "other (the library documents it)");
  }
}

nlohmann::json AscendOptions::to_json() const {
  nlohmann::json out = {{"host", host},
                        {"port", port},
                        {"device", device},
                        {"connect_timeout_ms", connect_timeout.count()},
                        {"op_timeout_ms", op_timeout.count()},
                        {"recv_timeout_ms", recv_timeout.count()}};
  for (const auto& [key, value] : engine_options) out[key] = value;
  return out;
}

}  // namespace dlslime
