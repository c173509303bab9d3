#include "core/remote_regions.h"

#include <limits>

namespace dlslime {

int32_t add_owner_resolved(OwnerRemoteRegions& table, const std::string& name, const nlohmann::json& entry) {
  if (name.empty()) throw InvalidArgumentError("remote memory region name must not be empty");
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!entry.is_object() || !entry.contains(key) || !entry[key].is_number_integer()) {
      throw InvalidArgumentError(fmt::format(
          "remote memory region '{}': mr_info entry needs an integer '{}' (got {})", name, key, entry.dump()));
    }
    return entry[key];
  };
  const int64_t peer_handle = field("handle").get<int64_t>();
  if (peer_handle < 0 || peer_handle > std::numeric_limits<int32_t>::max()) {
    throw InvalidArgumentError(fmt::format("remote memory region '{}': handle {} out of range", name, peer_handle));
  }
  const nlohmann::json& length = field("length");
  if (!length.is_number_unsigned() && length.get<int64_t>() < 0) {
    throw InvalidArgumentError(fmt::format("remote memory region '{}': negative length", name));
  }
  return table.add(name, length.get<uint64_t>(), static_cast<int32_t>(peer_handle));
}

}  // namespace dlslime
