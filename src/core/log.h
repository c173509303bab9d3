#pragma once

#include <memory>

#include <spdlog/spdlog.h>

namespace dlslime {

// The library's own logger (not in spdlog's global registry, so an application's spdlog
// setup is untouched). Created on first use; its level comes from DLSLIME_LOG_LEVEL then.
spdlog::logger& logger();

}  // namespace dlslime

#define DLSLIME_TRACE(...) SPDLOG_LOGGER_TRACE(&::dlslime::logger(), __VA_ARGS__)
#define DLSLIME_DEBUG(...) SPDLOG_LOGGER_DEBUG(&::dlslime::logger(), __VA_ARGS__)
#define DLSLIME_INFO(...) SPDLOG_LOGGER_INFO(&::dlslime::logger(), __VA_ARGS__)
#define DLSLIME_WARN(...) SPDLOG_LOGGER_WARN(&::dlslime::logger(), __VA_ARGS__)
#define DLSLIME_ERROR(...) SPDLOG_LOGGER_ERROR(&::dlslime::logger(), __VA_ARGS__)
