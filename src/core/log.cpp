#include "core/log.h"

#include <pthread.h>

#include <cstdlib>
#include <system_error>

#include <fmt/format.h>

#include <spdlog/sinks/stdout_sinks.h>

#include "dlslime/errors.h"
#include "dlslime/logging.h"

namespace dlslime {

namespace {

spdlog::level::level_enum parse_level(const std::string& name) {
  auto level = spdlog::level::from_str(name);
  // from_str maps unknown names to "off"; only accept "off" when it was asked for.
  if (level == spdlog::level::off && name != "off") {
    throw InvalidArgumentError("unknown log level '" + name +
                               "' (use trace, debug, info, warn, error, critical or off)");
  }
  return level;
}

spdlog::logger& the_logger();

// fork() copies the sink's mutex in whatever state it was: held by an I/O thread that was
// logging at that moment, the child's first log line would wait forever. The child gets a
// fresh sink; the old one is leaked, never destroyed with a mutex that may be held.
void fresh_sink_in_fork_child() {
  auto& sinks = the_logger().sinks();
  for (auto& sink : sinks) {
    new std::shared_ptr<spdlog::sinks::sink>(std::move(sink));  // leaked on purpose
    sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  }
}

std::shared_ptr<spdlog::logger> make_logger() {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto log = std::make_shared<spdlog::logger>("dlslime", std::move(sink));
  log->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%P] [dlslime] [%l] %v");
  auto level = spdlog::level::warn;
  if (const char* env = std::getenv("DLSLIME_LOG_LEVEL"); env && *env) {
    try {
      level = parse_level(env);
    } catch (const InvalidArgumentError& e) {
      log->warn("ignoring DLSLIME_LOG_LEVEL: {}", e.what());
    }
  }
  log->set_level(level);
  log->flush_on(spdlog::level::warn);
  return log;
}

spdlog::logger& the_logger() {
  static std::shared_ptr<spdlog::logger> instance = make_logger();
  return *instance;
}

}  // namespace

spdlog::logger& logger() {
  static const bool fork_safe = [] {
    the_logger();  // made before the handler can run
    pthread_atfork(nullptr, nullptr, [] { fresh_sink_in_fork_child(); });
    return true;
  }();
  (void)fork_safe;
  return the_logger();
}

void set_log_level(const std::string& level) { logger().set_level(parse_level(level)); }

std::string get_log_level() {
  auto sv = spdlog::level::to_string_view(logger().level());
  return std::string(sv.data(), sv.size());
}

}  // namespace dlslime
