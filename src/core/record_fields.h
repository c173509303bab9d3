// Reading a peer agent's published record (NanoCtrl), which anyone may write where NanoCtrl
// has no token: every field is read by type, and one of the wrong type reads as absent,
// never as an exception. Shared by the agent and the transports' agent hooks
// (core/transport_registry.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace dlslime {

inline std::string text_field(const nlohmann::json& entry, const char* key) {
  return entry.is_object() && entry.contains(key) && entry[key].is_string() ? entry[key].get<std::string>()
                                                                             : std::string();
}

inline std::optional<int64_t> int_field(const nlohmann::json& entry, const char* key) {
  if (!entry.is_object() || !entry.contains(key) || !entry[key].is_number_integer()) return std::nullopt;
  return entry[key].get<int64_t>();
}

}  // namespace dlslime
