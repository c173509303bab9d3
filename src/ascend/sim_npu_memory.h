// The simulated NPU (npu_memory.h, DLSLIME_ASCEND_SIM=1). Each allocation is a memfd mapped
// twice: a PROT_NONE view whose address is the device pointer (a host load or store through
// it faults, as it would on a real NPU) and a read-write view that only the simulation uses,
// for its copies and for the simulated HIXL engine moving bytes.
//
// Devices: 2, or DLSLIME_ASCEND_SIM_DEVICES=N (1..16), read once, when the simulated NPU is
// first used. A bad value makes every call that needs the count throw InvalidArgumentError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "ascend/npu_memory.h"

namespace dlslime::ascend {

// The process's simulated NPU (made on first use).
NpuMemory& sim_npu_memory();

// For the simulated engine: the read-write view of [addr, +len) when it lies inside one
// simulated NPU allocation. nullptr with *why == "" when none of it is NPU memory (host
// memory, which the engine uses as it is); nullptr with *why saying so when it is partly NPU
// memory or runs past its allocation. The view stays valid until the allocation is freed.
uint8_t* sim_host_view(uintptr_t addr, size_t len, std::string* why);

// Live simulated allocations in this process, for tests.
int64_t sim_npu_allocations();

// Held by the simulated engine while it moves bytes (its "DMA"), as the NPU's own copies hold
// it: a device orders its DMA with the host's copies, and this process's order is then one
// ThreadSanitizer sees too. Without it, a responder's copy into a region and the owner's
// later copy_to_host are ordered only through the other process (the initiator completes
// the op and tells the owner), which TSan cannot see. Engine lock first, then this one.
std::unique_lock<std::mutex> sim_npu_dma_lock();

}  // namespace dlslime::ascend
