// agent_register: what registering one memory region costs a PeerAgent that already has
// many regions and many connected peers (docs/performance.md "PeerAgent"). An in-process
// NanoCtrl, one agent with --peers connected TCP peers, then --regions registrations; it
// reports the calling thread's CPU time and the wall time of each of the last --sample
// registrations (median and p99): the agent's own work (its registry, the per-connection
// records it publishes) and the NanoCtrl request. Usage:
//   agent_register [--regions N] [--peers P] [--sample S]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "agent_bench.h"

namespace {

double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dlslime;
  using bench::arg;
  using bench::percentile;
  const size_t regions = arg(argc, argv, "--regions", 1000);
  const size_t peers = arg(argc, argv, "--peers", 16);
  const size_t sample = std::min(arg(argc, argv, "--sample", 100), regions);
  const bench::LocalCtrl ctrl;
  auto options = [&](const std::string& alias) { return ctrl.agent(alias); };
  PeerAgent agent(options("reg_main"));
  std::vector<std::unique_ptr<PeerAgent>> others;
  const ConnectOptions tcp = bench::LocalCtrl::tcp();
  for (size_t i = 0; i < peers; ++i) {
    others.push_back(std::make_unique<PeerAgent>(options("reg_peer" + std::to_string(i))));
    PeerConnection mine = agent.connect_to(others.back()->alias(), tcp);
    others.back()->connect_to("reg_main", tcp).wait(std::chrono::seconds(30));
    mine.wait(std::chrono::seconds(30));
  }
  std::vector<uint8_t> memory(regions * 64);
  std::vector<double> cpu, wall;
  for (size_t i = 0; i < regions; ++i) {
    const double c0 = thread_cpu_us();
    const auto w0 = std::chrono::steady_clock::now();
    agent.register_memory_region("r" + std::to_string(i), reinterpret_cast<uintptr_t>(memory.data()), i * 64, 64);
    const double c1 = thread_cpu_us();
    const auto w1 = std::chrono::steady_clock::now();
    if (i + sample >= regions) {
      cpu.push_back(c1 - c0);
      wall.push_back(std::chrono::duration<double, std::micro>(w1 - w0).count());
    }
  }
  std::printf("agent_register: %zu regions, %zu connected peers; the last %zu registrations:\n", regions, peers,
              sample);
  std::printf("  calling thread CPU per registration: median %.1f us, p99 %.1f us\n", percentile(cpu, 0.5),
              percentile(cpu, 0.99));
  std::printf("  wall time per registration:          median %.1f us, p99 %.1f us\n", percentile(wall, 0.5),
              percentile(wall, 0.99));
  for (auto& o : others) o->shutdown();
  agent.shutdown();
  return 0;
}
