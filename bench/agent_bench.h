// What the PeerAgent benchmarks (agent_register, agent_connect) share: their --name N
// arguments, percentiles, and agents on an in-process NanoCtrl.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dlslime/nanoctrl.h"
#include "dlslime/peer_agent.h"

namespace dlslime::bench {

// The value after `name` on the command line, else `fallback`.
inline size_t arg(int argc, char** argv, const char* name, size_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::strtoull(argv[i + 1], nullptr, 10);
  }
  return fallback;
}

inline double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// A NanoCtrl on a free port, started for the object's life, and agent options for it.
class LocalCtrl {
 public:
  LocalCtrl() : server_(config()) { server_.start(); }
  PeerAgentOptions agent(const std::string& alias) const {
    PeerAgentOptions o;
    o.ctrl_url = server_.url();
    o.alias = alias;
    return o;
  }
  static ConnectOptions tcp() {
    ConnectOptions o;
    o.transport = "tcp";
    return o;
  }

 private:
  static NanoCtrlConfig config() {
    NanoCtrlConfig c;
    c.port = 0;
    return c;
  }
  NanoCtrlServer server_;
};

}  // namespace dlslime::bench
