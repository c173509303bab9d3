#!/usr/bin/env bash
# Every RDMA check on a host with a real RDMA NIC (docs/rdma.md, "Checking on a NIC"):
# builds the project with libibverbs and runs the conformance suite over rdma, the
# two-process RDMA examples and `dlslime-bench --transport rdma`, all on the NIC (loopback
# between two endpoints on one port is enough). A few minutes. CI runs the same checks on
# the simulated device (DLSLIME_RDMA_SIM=1) instead.
#   tests/hardware/run_rdma_checks.sh      # build dir: build/rdma-hw (RDMA_CHECKS_BUILD_DIR)
#   SLIME_VISIBLE_DEVICES=mlx5_0 tests/hardware/run_rdma_checks.sh   # pick the NIC
# Without an RDMA NIC it says so, naming what it looked for, and exits 0 (skipped).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
BUILD=${RDMA_CHECKS_BUILD_DIR:-build/rdma-hw}
JOBS=${JOBS:-$(nproc)}
unset DLSLIME_RDMA_SIM  # the real device only: never the simulated one

nics=$(ls /sys/class/infiniband 2>/dev/null || true)
if [ -z "$nics" ]; then
  echo "SKIP: no RDMA NIC on this host (/sys/class/infiniband is empty: no mlx5_*/irdma*/rxe* device; " \
       "install the NIC's driver and rdma-core, or run CI's simulated-device checks with DLSLIME_RDMA_SIM=1)"
  exit 0
fi
echo "RDMA devices: $nics"
command -v ibv_devinfo >/dev/null && ibv_devinfo -l || true

printf '\n==== build (BUILD_RDMA=ON) ====\n'
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTS=ON -DBUILD_RDMA=ON -DBUILD_PYTHON=ON \
  -Dpybind11_DIR="$("$PYTHON" -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
  -DPython_EXECUTABLE="$(command -v "$PYTHON")" >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target dlslime_conformance_tests dlslime-bench _dlslime

printf '\n==== is a port usable? ====\n'
PYTHONPATH="$PWD/$BUILD/python" "$PYTHON" - <<'PY'
import sys
import dlslime
nics = dlslime.available_nic()
print("available_nic():", nics)
if not nics:
    sys.exit("FAIL: libibverbs lists no device with an ACTIVE port (check the link, `ibv_devinfo`, "
             "SLIME_VISIBLE_DEVICES)")
PY

printf '\n==== conformance suite over rdma, on the NIC (C++) ====\n'
"$BUILD/tests/cpp/dlslime_conformance_tests" --gtest_filter='Transports/Conformance.*/rdma'

printf '\n==== two-process RDMA examples, on the NIC ====\n'
for ex in examples/python/p2p_rdma_rc_*.py; do
  echo "-- $ex"
  PYTHONPATH="$PWD/$BUILD/python" timeout 180 "$PYTHON" "$ex"
done

printf '\n==== dlslime-bench --transport rdma ====\n'
timeout 300 "$BUILD/bench/dlslime-bench" --transport rdma --op write
timeout 300 "$BUILD/bench/dlslime-bench" --transport rdma --op read
echo "RDMA checks: ok"
