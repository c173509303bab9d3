// NPU memory as the Ascend transport and dlslime.testing see it (docs/ascend.md): which
// addresses are device memory (RegisterMem's MEM_DEVICE or MEM_HOST), and, for tests and
// examples, allocating device memory and copying host bytes in and out of it.
//
// Two implementations: the CANN runtime (acl: aclrtMalloc, aclrtMemcpy,
// aclrtPointerGetAttributes; with the library, hixl_library.cpp) and the simulated NPU
// (sim_npu_memory.cpp, DLSLIME_ASCEND_SIM=1). Simulated device memory cannot be touched
// by host code, like the simulated GPU's: a device pointer is a PROT_NONE view of a memfd,
// and only the simulation (its copies, and the simulated engine moving bytes) uses the
// private read-write view behind it.
//
// Every call throws: InvalidArgumentError for a bad argument (an unknown device, a copy
// past an allocation, a free of something that is not one), ConnectionError when there is
// no NPU runtime to use (naming it and DLSLIME_ASCEND_SIM).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ascend/hixl_engine.h"
#include "dlslime/export.h"

namespace dlslime::ascend {

class DLSLIME_API NpuMemory {
 public:
  virtual ~NpuMemory() = default;
  virtual const char* name() const = 0;  // "acl" or "sim"
  virtual int device_count() = 0;

  virtual void* alloc(int device, size_t nbytes) = 0;
  virtual void free(void* device_ptr) = 0;
  // Synchronous copies between host memory and device memory (aclrtMemcpy).
  virtual void copy_to_device(void* device_dst, const void* host_src, size_t n) = 0;
  virtual void copy_to_host(void* host_dst, const void* device_src, size_t n) = 0;

  // kDevice when [addr, +len) lies inside one device allocation, kHost when none of it is
  // device memory; InvalidArgumentError when it is partly device memory or runs past its
  // allocation.
  virtual MemType classify(uintptr_t addr, size_t len) = 0;
};

// The simulated NPU when DLSLIME_ASCEND_SIM=1 (read on each call), else the CANN runtime.
DLSLIME_API NpuMemory& npu_memory();

// The two implementations behind it (sim_npu_memory.cpp, hixl_library.cpp); the CANN one
// throws ConnectionError where the runtime is missing.
NpuMemory& sim_npu_memory();
NpuMemory& acl_npu_memory();

}  // namespace dlslime::ascend
