// The strict simulated HIXL engine (hixl_engine.h, DLSLIME_ASCEND_SIM=1): test hooks and the
// environment it reads. The engine itself is made by make_sim_engine().
//
// How it works: an engine named "ip:port" listens on the abstract unix socket
// "@dlslime-sim-hixl-<ip>:<port>"; Connect opens a SOCK_SEQPACKET connection there, and the
// listener answers with a snapshot of its registered memory, which is all the link can
// reach. Bytes move on the responder's side (the listener): it checks each request against
// what it has registered now and copies with process_vm_readv/process_vm_writev into or out
// of the requester (SO_PEERCRED names it), or memcpy when both engines share a process.
// Simulated NPU memory on either side is reached through the simulation's read-write view.
//
// Environment, read when an engine is made (a malformed value makes Initialize return
// PARAM_INVALID, naming the variable in the log):
//  - DLSLIME_ASCEND_SIM_CAPS="async=0,notify=0": the capabilities GetCapability reports
//    (each 0 or 1, default 1); with one off, its calls return UNSUPPORTED, as on old ADXL.
//  - DLSLIME_ASCEND_SIM_FAULT: comma-separated faults this engine shows as a responder
//    (see SimFault), e.g. "delay_ms=50", "hang=1", "die_after=3".
#pragma once

#include <cstdint>
#include <string>

#include "ascend/hixl_engine.h"

namespace dlslime::ascend {

// Faults an engine shows when it serves transfers (as the responder). Notifies are never
// affected, so a test can still tell a hung peer from a dead one.
struct SimFault {
  // Each transfer request is served (bytes moved, answer sent) this many milliseconds after
  // it arrives, without holding up the engine's other work. 0..60000.
  int delay_ms = 0;
  // Transfer requests are read and never served: no byte moves, no answer comes (a hung
  // peer; the library sets no deadline, so an async request stays WAITING).
  bool hang = false;
  // >= 0: the first die_after transfer requests are served; when the next one arrives the
  // process calls _exit(1) before moving a byte (a peer that dies mid-job). -1: never. Only
  // for a process of its own (a forked child, another test process).
  int64_t die_after = -1;
};

// "delay_ms=50,hang=1,die_after=3" (any subset; "" is no fault). InvalidArgumentError for
// an unknown key or a bad value.
SimFault parse_sim_fault(const std::string& spec);
// "async=0,notify=1" (any subset; "" is everything on). InvalidArgumentError otherwise.
HixlEngine::Capability parse_sim_caps(const std::string& spec);

// Test hooks; they override the environment for this engine and take effect at once.
// InvalidArgumentError when `engine` is not a simulated engine.
void set_sim_fault(HixlEngine& engine, const SimFault& fault);
void set_sim_capability(HixlEngine& engine, const HixlEngine::Capability& caps);

}  // namespace dlslime::ascend
