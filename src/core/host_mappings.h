// Whether a range of this process's address space is mapped as a transport needs it, from
// /proc/self/maps: what pinning host pages checks (get_user_pages, behind ibv_reg_mr).
// Registration asks, so that memory the process cannot touch (PROT_NONE, a guard page, a
// hole) is refused with a clear error instead of faulting an I/O thread later (hostile
// review 16m); the simulated NIC asks the same question a real one does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dlslime {

// Why [start, start+length) is not all mapped readable (and writable, with `write`):
// "memory at 0x... is not mapped", "... is not readable (PROT_NONE)", "... is read-only",
// with the permissions /proc/self/maps shows; nullopt when it is. nullopt too when
// /proc/self/maps cannot be read (no procfs): the check is then left to the hardware.
std::optional<std::string> host_pages_problem(uintptr_t start, uint64_t length, bool write);

}  // namespace dlslime
