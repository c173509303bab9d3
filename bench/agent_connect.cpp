// agent_connect: what connecting two PeerAgents costs, and how fast named ops go over the
// connection (docs/performance.md "PeerAgent"). An in-process NanoCtrl; one agent connects
// to --peers fresh agents in turn over TCP (each peer answers the handshake itself, as a
// passive side) and the wall time of connect_to().wait() is reported (median, p90); then,
// over one of those connections, --ops named writes of --size bytes each, one at a time
// (ops/s and GB/s, the median of --rounds rounds). Usage:
//   agent_connect [--peers N] [--ops M] [--size B] [--rounds R]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "agent_bench.h"


int main(int argc, char** argv) {
  using namespace dlslime;
  using clock = std::chrono::steady_clock;
  using bench::arg;
  const auto at = bench::percentile;
  const size_t peers = std::max<size_t>(arg(argc, argv, "--peers", 20), 1);
  const size_t ops = std::max<size_t>(arg(argc, argv, "--ops", 2000), 1);
  const size_t size = std::max<size_t>(arg(argc, argv, "--size", 4096), 1);
  const size_t rounds = std::max<size_t>(arg(argc, argv, "--rounds", 5), 1);
  const bench::LocalCtrl ctrl;
  auto options = [&](const std::string& alias) { return ctrl.agent(alias); };
  const ConnectOptions tcp = bench::LocalCtrl::tcp();
  PeerAgent agent(options("ac_main"));
  std::vector<uint8_t> src(size, 0x5a), dst(size, 0);
  agent.register_memory_region("src", reinterpret_cast<uintptr_t>(src.data()), 0, size);
  std::vector<std::unique_ptr<PeerAgent>> others;
  std::vector<double> connect_ms;
  for (size_t i = 0; i < peers; ++i) {
    const std::string alias = "ac_peer" + std::to_string(i);
    others.push_back(std::make_unique<PeerAgent>(options(alias)));
    if (i == 0) others.back()->register_memory_region("dst", reinterpret_cast<uintptr_t>(dst.data()), 0, size);
    const auto t0 = clock::now();
    agent.connect_to(alias, tcp).wait(std::chrono::seconds(30));
    connect_ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - t0).count());
  }
  std::vector<double> rates;
  const std::vector<NamedAssignment> one{{"src", "dst", 0, 0, size}};
  for (size_t r = 0; r < rounds; ++r) {
    const auto t0 = clock::now();
    for (size_t i = 0; i < ops; ++i) {
      Future f = agent.write("ac_peer0", one);
      if (f.wait() != 0) {
        std::fprintf(stderr, "named write failed: %s\n", f.message().c_str());
        return 1;
      }
    }
    rates.push_back(static_cast<double>(ops) / std::chrono::duration<double>(clock::now() - t0).count());
  }
  const double rate = at(rates, 0.5);
  std::printf("connect_to().wait() over tcp, %zu peers: median %.2f ms, p90 %.2f ms\n", peers, at(connect_ms, 0.5),
              at(connect_ms, 0.9));
  std::printf("named write %zu B, one at a time, %zu ops x %zu rounds: median %.0f ops/s (%.3f GB/s)\n", size, ops,
              rounds, rate, rate * static_cast<double>(size) / 1e9);
  return 0;
}
