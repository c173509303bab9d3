// PeerAgent test fixtures shared by the agent test files: an in-process NanoCtrl on a free
// port, agent options, and TCP connect options.
#pragma once

#include <string>

#include "dlslime/nanoctrl.h"
#include "dlslime/peer_agent.h"

namespace dlslime::test_support {

inline NanoCtrlConfig local_ctrl() {
  NanoCtrlConfig c;
  c.port = 0;
  return c;
}

inline PeerAgentOptions agent(const std::string& url, const std::string& alias) {
  PeerAgentOptions o;
  o.ctrl_url = url;
  o.alias = alias;
  return o;
}

inline ConnectOptions tcp() {
  ConnectOptions o;
  o.transport = "tcp";
  return o;
}

// An in-process NanoCtrl, started on construction and stopped with the object.
struct StartedCtrl {
  NanoCtrlServer server{local_ctrl()};
  StartedCtrl() { server.start(); }
};

}  // namespace dlslime::test_support
