#include "core/shared_library.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>

#include <fmt/format.h>

namespace dlslime {

namespace {

std::string opened_path(void* handle, const char* fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && *map->l_name) {
    return map->l_name;
  }
  return fallback;
}

std::string loader_error() {
  const char* e = dlerror();
  return e ? e : "unknown error";
}

}  // namespace

std::string own_library_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_library_directory), &info) == 0 || info.dli_fname == nullptr) return {};
  std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

SharedLibrary::SharedLibrary(const char* what, const std::vector<std::string>& sonames, const char* path_variable)
    : what_(what), path_variable_(path_variable) {
  const char* chosen = std::getenv(path_variable);
  if (chosen != nullptr && *chosen != '\0') {
    handle_ = dlopen(chosen, RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      error_ = fmt::format("{} could not be loaded from {}='{}': {}", what_, path_variable_, chosen, loader_error());
      return;
    }
    path_ = opened_path(handle_, chosen);
    return;
  }
  std::string tried;
  for (const std::string& soname : sonames) {
    handle_ = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ != nullptr) {
      path_ = opened_path(handle_, soname.c_str());
      return;
    }
    tried += fmt::format("{}{}", tried.empty() ? "" : "; ", loader_error());
  }
  error_ = fmt::format("{} could not be loaded ({}); set {} to the path of a copy", what_, tried, path_variable_);
}

void* SharedLibrary::lookup(const char* symbol, bool required) {
  if (handle_ == nullptr) return nullptr;
  dlerror();  // clear a stale error
  void* p = dlsym(handle_, symbol);
  if (p == nullptr && required) missing_ += fmt::format("{}{}", missing_.empty() ? "" : " ", symbol);
  return p;
}

std::string SharedLibrary::missing_error() const {
  if (missing_.empty()) return {};
  return fmt::format("the {} at {} lacks {} (too old, or not {}); set {} to the path of another copy", what_, path_,
                     missing_, what_, path_variable_);
}

}  // namespace dlslime
