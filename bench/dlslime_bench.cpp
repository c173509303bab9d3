// dlslime-bench: bandwidth and latency of DLSlime transfers, in MORI-IO's table format.
// See docs/bench.md.

#include <signal.h>

#include <cstdio>
#include <exception>

#include "bench_config.h"
#include "dlslime/transport.h"
#include "bench_session.h"
#include "loopback_pair.h"

int main(int argc, char** argv) {
  using namespace dlslime::bench;
  BenchConfig cfg;
  try {
    bool help = false;
    cfg = parse_command_line(argc, argv, &help);
    if (help) {
      std::fputs(usage_text().c_str(), stdout);
      return 0;
    }
    if (cfg.list_transports) {
      for (const dlslime::TransportInfo& t : dlslime::available_transports()) {
        std::printf("%-8s %s\n", t.name.c_str(), t.available ? "available" : t.reason.c_str());
      }
      return 0;
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "dlslime-bench: error: %s\n(run dlslime-bench --help for the options)\n", e.what());
    return 2;
  }
  // A peer that vanishes must surface as an error on the control socket, not kill us.
  ::signal(SIGPIPE, SIG_IGN);

  const char* who = cfg.role == Role::kTarget ? "dlslime-bench target" : "dlslime-bench";
  try {
    switch (cfg.role) {
      case Role::kLoopbackPair: return run_loopback_pair(argc, argv);
      case Role::kInitiator: return run_initiator(cfg);
      case Role::kTarget: return run_target(cfg);
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: error: %s\n", who, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", who, e.what());
    return 1;
  }
  return 1;
}
