#!/usr/bin/env bash
# The long concurrency soak (issue 21, docs/reliability.md): the conformance suite's
# many-ops-in-flight test over every transport usable here (TCP; RDMA on the simulated
# device; NVLink and TCP with GPU memory on the simulated GPU), SOAK_SECONDS per transport
# and run (default 300), in C++ and then in Python. Each run prints its op counts; any
# failure, and a run that selects no test, fails the script.
#   SOAK_SECONDS=600 bash scripts/soak.sh        # SOAK_PYTHON=0 skips the Python half
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SOAK_SECONDS:-300}
BUILD=${DLSLIME_TEST_BUILD_DIR:-build/test}
PYTHON=${PYTHON:-python3}
BIN=$BUILD/tests/cpp/dlslime_conformance_tests
if [ ! -x "$BIN" ]; then
  bash scripts/install_deps.sh
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTS=ON -DBUILD_PYTHON=OFF >/dev/null
  cmake --build "$BUILD" -j "$(nproc)"
fi
LOG=$(mktemp /tmp/dlslime-soak.XXXXXX)
trap 'rm -f "$LOG"' EXIT
F='Transports/Conformance.ManyOpsInFlight*'

run() {  # run <what> <command...>: fails on a failure or on no test at all
  local what=$1
  shift
  printf '\n==== soak: %s (%s s) ====\n' "$what" "$SECS"
  "$@" 2>&1 | tee "$LOG" | grep -E 'soak |FAILED|Failure|passed|Expected|Which is' || true
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ] || grep -qE 'Running 0 tests|collected 0 items|no tests ran' "$LOG"; then
    echo "soak: $what failed (rc $rc); its output:" >&2
    tail -50 "$LOG" >&2
    exit 1
  fi
}

export DLSLIME_CONFORMANCE_SOAK_SECONDS=$SECS
run "C++ tcp" "$BIN" --gtest_filter="$F/tcp"
if DLSLIME_RDMA_SIM=1 "$BIN" --gtest_list_tests | grep -q '/rdma'; then
  run "C++ rdma (simulated device)" env DLSLIME_RDMA_SIM=1 "$BIN" --gtest_filter="$F/rdma"
fi
if DLSLIME_GPU_SIM=1 "$BIN" --gtest_list_tests | grep -q '/nvlink'; then
  run "C++ nvlink and tcp with GPU memory (simulated GPU)" env DLSLIME_GPU_SIM=1 "$BIN" \
    --gtest_filter="$F/nvlink:$F/tcp"
fi
[ "${SOAK_PYTHON:-1}" = 1 ] || exit 0
"$PYTHON" -c 'import dlslime' 2>/dev/null || "$PYTHON" -m pip install -q --no-build-isolation .
T=tests/python/test_conformance.py
run "Python tcp" "$PYTHON" -m pytest "$T" -p no:cacheprovider -q -s -k "many_ops and tcp and not staging"
if "$PYTHON" -c 'import sys, dlslime; sys.exit(0 if hasattr(dlslime, "RDMAEndpoint") else 1)'; then
  run "Python rdma (simulated device)" env DLSLIME_RDMA_SIM=1 "$PYTHON" -m pytest "$T" -p no:cacheprovider -q -s \
    -k "many_ops and rdma"
fi
if "$PYTHON" -c 'import sys, dlslime; sys.exit(0 if hasattr(dlslime, "NVLinkEndpoint") else 1)'; then
  run "Python nvlink and tcp with GPU memory (simulated GPU)" env DLSLIME_GPU_SIM=1 "$PYTHON" -m pytest "$T" \
    -p no:cacheprovider -q -s -k "many_ops and (nvlink or staging)"
fi
echo "soak: every run passed"
