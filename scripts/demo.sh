#!/usr/bin/env bash
# The main job (README): installs what is missing, builds and installs DLSlime, then
#   1. starts an embedded NanoCtrl and two PeerAgents in two processes and prints their
#      TCP transfer table (python -m dlslime.demo), and
#   2. prints dlslime-bench's MORI-IO-style sweep for a raw two-process TCP write.
# Extra arguments go to dlslime.demo (e.g. --sizes 4096,1048576 --iters 50).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

echo "==== dependencies ===="
bash scripts/install_deps.sh
echo "==== build and install (pip install .) ===="
"$PYTHON" -m pip install -q --no-build-isolation .
cd /tmp  # import the installed package, not the source tree
echo "==== PeerAgent transfer: embedded NanoCtrl, two agents in two processes ===="
"$PYTHON" -m dlslime.demo "$@"
echo "==== dlslime-bench: raw TcpEndpoint write, two processes on loopback ===="
"$PYTHON" -m dlslime.bench --op write --sizes 8..1048576 --batch 256 --iters 32 --progress none
