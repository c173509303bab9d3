#pragma once

#include <cstdint>

namespace dlslime {

// The one parser for the library's environment variables. Each reads the variable once per
// call, treats unset and empty alike, and throws InvalidArgumentError naming the variable,
// its value and what is allowed for anything else: a typo never silently means "default".

// `fallback` when `name` is unset or empty, else its value, which must be a plain decimal
// integer (no sign other than '-', no spaces) in min..max; never a silent cast or wrap-around.
int64_t env_integer(const char* name, int64_t min, int64_t max, int64_t fallback);

// A switch such as DLSLIME_RDMA_SIM: false when unset, empty or "0", true when "1".
bool env_flag(const char* name);

}  // namespace dlslime
