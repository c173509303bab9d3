#pragma once

namespace dlslime::bench {

// The default mode: runs this program twice, as target and initiator, on loopback. The two
// children talk over a socketpair() the parent makes (each inherits one end and gets its
// number with --control-fd), so no bootstrap port is needed and nothing can race for one.
// Returns the exit status for the parent: 0 only if both children succeeded.
int run_loopback_pair(int argc, char** argv);

}  // namespace dlslime::bench
