// The simulated GPU runtime behind DLSLIME_GPU_SIM=1 (docs/nvlink.md, "The simulated GPU").
// Internal to src/gpu and the tests: the library reaches it only through device_runtime.h.
//
// What it enforces, as a GPU would:
//  - Device memory is not host memory: a device pointer is a PROT_NONE view of a memfd, so
//    any host load or store through it faults (SIGSEGV). The copies use a second,
//    private read-write view of the same memfd that only this file knows about.
//  - IPC handles work across processes and only there: the opener takes the owner's memfd
//    with pidfd_open + pidfd_getfd (which needs ptrace permission over the owner: the same
//    user, and under Yama ptrace_scope 1 the owner's PR_SET_PTRACER_ANY, which exporting a
//    handle sets). A handle of a freed allocation, or one of this process's own, fails.
//  - Copies are asynchronous: each stream is a worker thread that runs its queue in order;
//    the host learns of completion only through events. Copies that run past a device
//    allocation fail when they are queued (InvalidArgumentError).
#pragma once

namespace dlslime::gpu::sim {

inline constexpr int kDeviceCount = 2;

// Test hook: while held, no stream starts queued work (it stays queued, in order), so a
// test can observe work that has not happened yet. Destroying a stream drains it anyway.
void hold_streams(bool held);

}  // namespace dlslime::gpu::sim
