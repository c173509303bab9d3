// The CANN side of the Ascend seams (library_loader.h): make_library_engine() through the
// plugin libdlslime_ascend_hixl.so, and the ACL runtime's NPU memory through libascendcl.so,
// both opened with dlopen at first use. libdlslime never links either, so it loads, and
// every other transport runs, on hosts without CANN. tests/hardware/run_ascend_checks.sh runs
// this file on an NPU.
//
// Built in two forms: without the toolkit (DLSLIME_WITH_HIXL undefined) every entry point
// says this build has no CANN and how to get one; with it (DLSLIME_WITH_HIXL=1, the ACL
// headers on the include path) the ACL function types come from the headers, so each call is
// type-checked at build time, as the CUDA runtime's are in gpu/cuda_runtime.cpp.
#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "ascend/hixl_engine.h"
#include "ascend/library_loader.h"
#include "ascend/npu_memory.h"
#include "core/shared_library.h"
#include "dlslime/errors.h"

#if defined(DLSLIME_WITH_HIXL)
#include <acl/acl.h>
#endif

namespace dlslime::ascend {

#if !defined(DLSLIME_WITH_HIXL)

namespace {

std::string no_toolkit(const char* what) {
  return fmt::format(
      "no {}: this build has no CANN toolkit: rebuild on a host with CANN >= 8.2 (ADXL) or 8.5 (HIXL) "
      "(source <toolkit>/set_env.sh, or set ASCEND_TOOLKIT_HOME, before running CMake); {}",
      what, kSimHint);
}

}  // namespace

std::unique_ptr<HixlEngine> make_library_engine() { throw ConnectionError(no_toolkit("Ascend transfer library")); }
std::string library_unavailable_reason() { return no_toolkit("Ascend transfer library"); }
std::string library_last_error() { return {}; }
NpuMemory& acl_npu_memory() { throw ConnectionError(no_toolkit("NPU runtime")); }

#else  // DLSLIME_WITH_HIXL

#ifndef DLSLIME_HIXL_FLAVOUR_NAME
#define DLSLIME_HIXL_FLAVOUR_NAME "hixl"
#endif

namespace {

// ACL error codes this file tells apart (acl_base.h).
constexpr aclError kAclInvalidParam = 100000;  // ACL_ERROR_INVALID_PARAM

// --- the ACL runtime -----------------------------------------------------------------------

struct AclApi {
  decltype(&::aclrtGetDeviceCount) GetDeviceCount = nullptr;
  decltype(&::aclrtSetDevice) SetDevice = nullptr;
  decltype(&::aclrtMalloc) Malloc = nullptr;
  decltype(&::aclrtFree) Free = nullptr;
  decltype(&::aclrtMemcpy) Memcpy = nullptr;
  decltype(&::aclrtPointerGetAttributes) PointerGetAttributes = nullptr;
  // Optional. aclrtMemGetAddressRange (CANN 9.0) says which allocation holds an address;
  // without it classify() knows only the allocations made through alloc().
  decltype(&::aclrtMemGetAddressRange) MemGetAddressRange = nullptr;
  decltype(&::aclGetRecentErrMsg) GetRecentErrMsg = nullptr;

  std::string message() const {
    const char* m = GetRecentErrMsg ? GetRecentErrMsg() : nullptr;
    return m && *m ? fmt::format(": {}", m) : std::string();
  }
};

class AclNpuMemory final : public NpuMemory {
 public:
  AclNpuMemory(const AclApi& api, int devices) : api_(api), devices_(devices) {}

  const char* name() const override { return "acl"; }
  int device_count() override { return devices_; }

  void* alloc(int device, size_t nbytes) override {
    if (nbytes == 0) throw InvalidArgumentError("alloc: zero bytes");
    set_device(device);
    void* p = nullptr;
    check(api_.Malloc(&p, nbytes, ACL_MEM_MALLOC_HUGE_FIRST), fmt::format("aclrtMalloc({})", nbytes));
    std::lock_guard lock(mu_);
    allocations_[reinterpret_cast<uintptr_t>(p)] = {nbytes, device};
    return p;
  }

  void free(void* device_ptr) override {
    int device = -1;
    {
      std::lock_guard lock(mu_);
      auto it = allocations_.find(reinterpret_cast<uintptr_t>(device_ptr));
      // Only what alloc() returned: freeing anything else (a tensor's memory, an offset into
      // an allocation) would free memory someone else owns.
      if (it == allocations_.end()) throw InvalidArgumentError(fmt::format("free: {} is not from alloc()", device_ptr));
      device = it->second.device;
      allocations_.erase(it);
    }
    set_device(device);
    check(api_.Free(device_ptr), "aclrtFree");
  }

  void copy_to_device(void* device_dst, const void* host_src, size_t n) override {
    copy(device_dst, host_src, n, ACL_MEMCPY_HOST_TO_DEVICE, device_dst);
  }
  void copy_to_host(void* host_dst, const void* device_src, size_t n) override {
    copy(host_dst, device_src, n, ACL_MEMCPY_DEVICE_TO_HOST, device_src);
  }

  MemType classify(uintptr_t addr, size_t len) override {
    if (len == 0) throw InvalidArgumentError("classify: zero length");
    if (addr + len < addr) throw InvalidArgumentError(fmt::format("classify: [{:#x}, +{}) wraps around", addr, len));
    const bool first = is_device(addr);
    const bool last = is_device(addr + len - 1);
    if (!first && !last) return MemType::kHost;
    if (first != last) {
      throw InvalidArgumentError(fmt::format("[{:#x}, +{}) is partly NPU memory and partly not", addr, len));
    }
    const Range r = allocation(addr);
    if (r.size != 0 && (addr - r.base >= r.size || len > r.size - (addr - r.base))) {
      throw InvalidArgumentError(fmt::format("[{:#x}, +{}) runs past its NPU allocation [{:#x}, +{})", addr, len,
                                             r.base, r.size));
    }
    return MemType::kDevice;
  }

 private:
  struct Allocation {
    size_t size = 0;
    int device = -1;
  };
  struct Range {
    uintptr_t base = 0;
    size_t size = 0;  // 0: unknown (no aclrtMemGetAddressRange and not from alloc())
    int device = -1;
  };

  // ACL documents aclrtPointerGetAttributes for memory it allocated; for other addresses it
  // fails or answers HOST/UNREGISTERED. All of those mean "not NPU memory" here: at worst a
  // device buffer is registered as MEM_HOST and the library refuses it, and host code never
  // touches memory this says is the device's.
  bool is_device(uintptr_t addr) {
    aclrtPtrAttributes attr{};
    if (api_.PointerGetAttributes(reinterpret_cast<const void*>(addr), &attr) != ACL_SUCCESS) return false;
    return attr.location.type == ACL_MEM_LOCATION_TYPE_DEVICE;
  }

  Range allocation(uintptr_t addr) {
    {
      std::lock_guard lock(mu_);
      auto it = allocations_.upper_bound(addr);
      if (it != allocations_.begin()) {
        --it;
        if (addr - it->first < it->second.size) return {it->first, it->second.size, it->second.device};
      }
    }
    if (api_.MemGetAddressRange) {
      void* base = nullptr;
      size_t size = 0;
      if (api_.MemGetAddressRange(reinterpret_cast<void*>(addr), &base, &size) == ACL_SUCCESS && base) {
        aclrtPtrAttributes attr{};
        int device = -1;
        if (api_.PointerGetAttributes(base, &attr) == ACL_SUCCESS) device = static_cast<int>(attr.location.id);
        return {reinterpret_cast<uintptr_t>(base), size, device};
      }
    }
    return {};
  }

  void copy(void* dst, const void* src, size_t n, aclrtMemcpyKind kind, const void* device_side) {
    if (n == 0) return;
    const auto addr = reinterpret_cast<uintptr_t>(device_side);
    if (classify(addr, n) != MemType::kDevice) {
      throw InvalidArgumentError(fmt::format("{} is not NPU memory", device_side));
    }
    // The copy runs in the current thread's context: make it the allocation's device.
    if (const Range r = allocation(addr); r.device >= 0) set_device(r.device);
    check(api_.Memcpy(dst, n, src, n, kind), fmt::format("aclrtMemcpy({} bytes)", n));
  }

  void set_device(int device) {
    if (device < 0 || device >= devices_) {
      throw InvalidArgumentError(fmt::format("no NPU device {} (this host has {})", device, devices_));
    }
    check(api_.SetDevice(device), fmt::format("aclrtSetDevice({})", device));
  }

  void check(aclError err, const std::string& what) {
    if (err == ACL_SUCCESS) return;
    const std::string text = fmt::format("{} failed: aclError {}{}", what, static_cast<int>(err), api_.message());
    if (err == kAclInvalidParam) throw InvalidArgumentError(text);
    throw Error(StatusCode::kFailed, text);
  }

  AclApi api_;
  int devices_;
  std::mutex mu_;
  std::map<uintptr_t, Allocation> allocations_;  // alloc()'s, by base address
};

struct LoadedAcl {
  std::unique_ptr<AclNpuMemory> memory;
  std::string reason;
};

const LoadedAcl& acl() {
  static const LoadedAcl* loaded = [] {
    auto* out = new LoadedAcl;
    static SharedLibrary lib("libascendcl", {"libascendcl.so"}, "DLSLIME_ASCENDCL_LIBRARY");
    if (!lib.handle()) {
      out->reason = fmt::format(
          "no NPU runtime: CANN was found at build time but its runtime is missing at run time: {} (source "
          "<toolkit>/set_env.sh so that LD_LIBRARY_PATH holds its lib64); {}",
          lib.error(), kSimHint);
      return out;
    }
    AclApi api;
    lib.resolve(api.GetDeviceCount, "aclrtGetDeviceCount");
    lib.resolve(api.SetDevice, "aclrtSetDevice");
    lib.resolve(api.Malloc, "aclrtMalloc");
    lib.resolve(api.Free, "aclrtFree");
    lib.resolve(api.Memcpy, "aclrtMemcpy");
    lib.resolve(api.PointerGetAttributes, "aclrtPointerGetAttributes");
    lib.resolve_optional(api.MemGetAddressRange, "aclrtMemGetAddressRange");
    lib.resolve_optional(api.GetRecentErrMsg, "aclGetRecentErrMsg");
    if (std::string missing = lib.missing_error(); !missing.empty()) {
      out->reason = fmt::format("no NPU runtime: {}; {}", missing, kSimHint);
      return out;
    }
    uint32_t count = 0;
    if (const aclError err = api.GetDeviceCount(&count); err != ACL_SUCCESS) {
      out->reason = fmt::format("no NPU: aclrtGetDeviceCount failed: aclError {}{} (is the NPU driver installed and "
                                "/dev/davinci* visible?); {}",
                                static_cast<int>(err), api.message(), kSimHint);
      return out;
    }
    if (count == 0) {
      out->reason = fmt::format("no NPU: the CANN runtime sees no device (ASCEND_RT_VISIBLE_DEVICES?); {}", kSimHint);
      return out;
    }
    out->memory = std::make_unique<AclNpuMemory>(api, static_cast<int>(count));
    return out;
  }();
  return *loaded;
}

// --- the HIXL/ADXL plugin ------------------------------------------------------------------

struct LoadedPlugin {
  HixlPluginCreateFn* create = nullptr;
  const HixlPluginInfo* info = nullptr;
  std::string reason;
};

const LoadedPlugin& plugin() {
  static const LoadedPlugin* loaded = [] {
    auto* out = new LoadedPlugin;
    // Beside libdlslime first (build tree and install), then the loader's search path. Its
    // NEEDED libcann_hixl.so / libascendcl.so are what usually fail here: the loader's text
    // names the one it could not find.
    static SharedLibrary lib("libdlslime_ascend_hixl",
                             {own_library_directory() + kHixlPluginSoname, kHixlPluginSoname}, kHixlPluginPathVariable);
    if (!lib.handle()) {
      out->reason = fmt::format(
          "no Ascend transfer library: CANN's {} was found at build time but is missing at run time: {} (source "
          "<toolkit>/set_env.sh of the CANN the library was built with, >= 8.5 for HIXL or >= 8.2 for ADXL); {}",
          DLSLIME_HIXL_FLAVOUR_NAME, lib.error(), kSimHint);
      return out;
    }
    HixlPluginInfoFn* info_fn = nullptr;
    lib.resolve(info_fn, kHixlPluginInfoSymbol);
    lib.resolve(out->create, kHixlPluginCreateSymbol);
    if (std::string missing = lib.missing_error(); !missing.empty()) {
      out->reason = fmt::format("no Ascend transfer library: {}; {}", missing, kSimHint);
      out->create = nullptr;
      return out;
    }
    const HixlPluginInfo* info = info_fn();
    if (info->abi != kHixlPluginAbi || info->string_abi != kStringAbi ||
        info->sizeof_string != sizeof(std::string)) {
      // Calling into it would pass objects of another layout: refuse.
      out->reason = fmt::format(
          "no Ascend transfer library: {} is from another build of DLSlime (plugin ABI {}, std::string ABI {}; this "
          "library expects {} and {}): install the plugin built with this libdlslime, or point {} at it; {}",
          lib.path(), info->abi, info->string_abi, kHixlPluginAbi, kStringAbi, kHixlPluginPathVariable, kSimHint);
      out->create = nullptr;
      return out;
    }
    out->info = info;
    return out;
  }();
  return *loaded;
}

}  // namespace

std::string library_unavailable_reason() {
  if (const LoadedPlugin& p = plugin(); !p.create) return p.reason;
  // The engine is useless without an NPU: say so here rather than at Initialize.
  if (const LoadedAcl& a = acl(); !a.memory) return a.reason;
  return {};
}

std::unique_ptr<HixlEngine> make_library_engine() {
  if (std::string reason = library_unavailable_reason(); !reason.empty()) throw ConnectionError(reason);
  const LoadedPlugin& p = plugin();
  std::unique_ptr<HixlEngine> engine(p.create());
  if (!engine) {
    throw ConnectionError(fmt::format("the Ascend transfer library could not make an engine: {}", p.info->last_error()));
  }
  return engine;
}

std::string library_last_error() {
  const LoadedPlugin& p = plugin();
  return p.info ? std::string(p.info->last_error()) : std::string();
}

NpuMemory& acl_npu_memory() {
  const LoadedAcl& a = acl();
  if (!a.memory) throw ConnectionError(a.reason);
  return *a.memory;
}

#endif  // DLSLIME_WITH_HIXL

}  // namespace dlslime::ascend
