#pragma once

#include <cstdint>
#include <memory>

#include <spdlog/spdlog.h>

namespace dlslime {

// The library's own logger (not in spdlog's global registry, so an application's spdlog
// setup is untouched). Created on first use; its level comes from DLSLIME_LOG_LEVEL then.
spdlog::logger& logger();

// The one parser for integer environment variables (DLSLIME_IO_THREADS, DLSLIME_TCP_*):
// `fallback` when `name` is unset or empty, else its value, which must be a plain decimal
// integer (no sign other than '-', no spaces) in min..max. Anything else throws
// InvalidArgumentError naming the variable, its value and the allowed range, never a
// silent cast or wrap-around.
int64_t env_integer(const char* name, int64_t min, int64_t max, int64_t fallback);

}  // namespace dlslime

#define DLSLIME_TRACE(...) SPDLOG_LOGGER_TRACE(&::dlslime::logger(), __VA_ARGS__)
#define DLSLIME_DEBUG(...) SPDLOG_LOGGER_DEBUG(&::dlslime::logger(), __VA_ARGS__)
#define DLSLIME_INFO(...) SPDLOG_LOGGER_INFO(&::dlslime::logger(), __VA_ARGS__)
#define DLSLIME_WARN(...) SPDLOG_LOGGER_WARN(&::dlslime::logger(), __VA_ARGS__)
#define DLSLIME_ERROR(...) SPDLOG_LOGGER_ERROR(&::dlslime::logger(), __VA_ARGS__)
