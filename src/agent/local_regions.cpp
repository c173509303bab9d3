#include "agent/local_regions.h"

namespace dlslime {

using nlohmann::json;

int32_t LocalRegions::add(const std::string& name, uintptr_t addr, uint64_t offset, uint64_t length) {
  const int32_t handle = regions_->add(name, addr, offset, length);
  try {
    ctrl_.register_mr(owner_, name, record(name));
  } catch (...) {
    regions_->remove(handle);
    throw;
  }
  return handle;
}

void LocalRegions::remove(const std::string& name) {
  regions_->remove(name);
  ctrl_.unregister_mr(owner_, name);
}

void LocalRegions::publish_all() {
  // Held in a local: items() of the temporary would iterate a destroyed object.
  const json info = regions_->mr_info();
  for (const auto& [name, entry] : info.items()) ctrl_.register_mr(owner_, name, record(name));
}

std::vector<std::string> LocalRegions::names() const {
  std::vector<std::string> out;
  const json info = regions_->mr_info();
  for (const auto& [name, entry] : info.items()) out.push_back(name);
  return out;
}

json LocalRegions::record(const std::string& name) const {
  json out = regions_->mr_info_of(name);
  json own = json::object();
  for (const auto& [incarnation, ep] : endpoints_()) {
    json entry = ep->mr_info_of(name);
    if (!entry.is_null() && entry != out) own[incarnation] = std::move(entry);
  }
  if (!own.empty()) out["endpoints"] = std::move(own);
  return out;
}

}  // namespace dlslime
