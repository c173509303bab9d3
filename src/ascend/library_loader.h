// How the CANN libraries reach libdlslime (docs/ascend.md, "Setup"). Two routes, because the
// two libraries are different kinds of thing:
//
//  - HIXL (or ADXL) is a C++ class, hixl::Hixl / adxl::AdxlEngine: it cannot be resolved
//    symbol by symbol with dlsym the way libcudart is, so something has to link it. That
//    something is a small plugin, libdlslime_ascend_hixl.so (hixl_plugin.cpp), built only
//    where the toolkit is found. It links libcann_hixl.so (or libllm_datadist.so) and
//    libascendcl.so and exports the C entry points below. libdlslime itself never links
//    CANN (the packaging test checks its NEEDED list): it dlopens the plugin at the first
//    engine it makes (hixl_library.cpp). On a host without CANN only that dlopen fails, with
//    the loader's message, and every other transport is unaffected.
//  - The ACL runtime (aclrtMalloc, aclrtMemcpy, aclrtPointerGetAttributes) is a C API, so
//    libdlslime opens libascendcl.so itself, as it does libcudart (acl_npu_memory()).
//
// The plugin and libdlslime are built by the same CMake run, with the same compiler and
// flags, and hand each other C++ objects (a HixlEngine, its std::string arguments). The info
// block below lets the loader refuse a plugin from another build instead of crashing in it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ascend/hixl_engine.h"
#include "ascend/npu_memory.h"

namespace dlslime::ascend {

// The CANN runtime's NPU memory (dlopen of libascendcl.so). Throws ConnectionError when this
// build has no CANN toolkit or the runtime or an NPU is missing at run time, naming
// DLSLIME_ASCEND_SIM; npu_memory() picks between it and the simulated NPU.
NpuMemory& acl_npu_memory();

// What the last failing call of an engine from the plugin on this thread added to its status
// code (the CANN runtime's own message, or why the adapter refused: no current NPU context, an
// option this library lacks); "" when there is nothing, or no plugin is loaded. The seam's
// calls return only codes, so the transport asks for this when it builds an error message.
std::string library_last_error();

// --- the plugin's C interface ------------------------------------------------------------

// Bumped whenever HixlEngine's layout, or this block, changes.
inline constexpr uint32_t kHixlPluginAbi = 1;
inline constexpr const char* kHixlPluginSoname = "libdlslime_ascend_hixl.so";
inline constexpr const char* kHixlPluginInfoSymbol = "dlslime_ascend_hixl_plugin_info";
inline constexpr const char* kHixlPluginCreateSymbol = "dlslime_ascend_hixl_plugin_create";
// Points the loader at another copy of the plugin (a path or a soname).
inline constexpr const char* kHixlPluginPathVariable = "DLSLIME_ASCEND_HIXL_PLUGIN";

// Which std::string ABI a translation unit was built with: the plugin and libdlslime pass
// std::string across the seam, so they must agree (CANN's own interface does not care:
// ge::AscendString keeps its std::string behind out-of-line members).
#if defined(_GLIBCXX_USE_CXX11_ABI)
inline constexpr uint32_t kStringAbi = _GLIBCXX_USE_CXX11_ABI ? 1 : 0;
#else
inline constexpr uint32_t kStringAbi = 2;  // not libstdc++
#endif

struct HixlPluginInfo {
  uint32_t abi;             // kHixlPluginAbi of the plugin's build
  uint32_t string_abi;      // kStringAbi of the plugin's build
  uint32_t sizeof_string;   // sizeof(std::string) there, a second check on the same thing
  const char* flavour;      // "hixl" or "adxl"
  const char* built_with;   // e.g. "CANN HIXL (libcann_hixl.so), headers with TransferAsync and notifies"
  // library_last_error() for engines from this plugin (thread-local text, never null).
  const char* (*last_error)();
};

extern "C" {
using HixlPluginInfoFn = const HixlPluginInfo*();
// A new, uninitialized engine (the caller owns it and deletes it), or null with the reason
// in last_error(). Never throws.
using HixlPluginCreateFn = HixlEngine*();
}

}  // namespace dlslime::ascend
