#pragma once

#include <string>

#include "dlslime/export.h"

namespace dlslime {

// Log levels: "trace", "debug", "info", "warn", "error", "critical", "off". The default
// comes from DLSLIME_LOG_LEVEL when the first dlslime object is built, else "warn".
// Throws InvalidArgumentError on an unknown level name.
DLSLIME_API void set_log_level(const std::string& level);
DLSLIME_API std::string get_log_level();

}  // namespace dlslime
