#!/usr/bin/env bash
# The test command (README, .ci/run): installs what is missing, builds libdlslime with its
# GoogleTest suite, runs it (including a C++ app built against the installed package),
# pip-installs the Python package and runs the pytest suite. Any failure fails the run;
# pytest collecting no test at all is a failure too.
set -euo pipefail
cd "$(dirname "$0")/.."
# A wildcard bind advertises the default route's interface (docs/deploy.md); the tests'
# traffic stays on loopback, so every endpoint they make advertises lo.
export DLSLIME_TCP_ADVERTISE_INTERFACE=${DLSLIME_TCP_ADVERTISE_INTERFACE:-lo}
ROOT=$PWD
PYTHON=${PYTHON:-python3}
BUILD=${DLSLIME_TEST_BUILD_DIR:-build/test}
JOBS=${JOBS:-$(nproc)}

step() { printf '\n==== %s ====\n' "$*"; }

step "dependencies"
bash scripts/install_deps.sh

step "build (C++ library and tests)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTS=ON -DBUILD_PYTHON=OFF >/dev/null
cmake --build "$BUILD" -j "$JOBS"

step "C++ tests (ctest)"
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" --timeout 300

step "Python package (pip install .)"
"$PYTHON" -m pip install -q --no-build-isolation .
(cd /tmp && "$PYTHON" -c "import dlslime; print('dlslime', dlslime.__version__, 'from', dlslime.__file__)")

step "services: redis-server and a NanoCtrl daemon on it"
# The PeerAgent tests run against this NanoCtrl (the multi-host configuration: Redis
# store). Tests that restart Redis or NanoCtrl start their own instances.
RUN_DIR=$(mktemp -d /tmp/dlslime-test.XXXXXX)
free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
REDIS_PORT=$(free_port)
cleanup() {
  "$PYTHON" -m dlslime.nanoctrl stop --pid-file "$RUN_DIR/nanoctrl.pid" >/dev/null 2>&1 || true
  [ -n "${REDIS_PID:-}" ] && kill "$REDIS_PID" 2>/dev/null || true
  rm -rf "$RUN_DIR"
}
trap cleanup EXIT
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --loglevel warning \
  >"$RUN_DIR/redis.log" 2>&1 &
REDIS_PID=$!
for _ in $(seq 100); do
  redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
  sleep 0.1
done
redis-cli -p "$REDIS_PORT" ping >/dev/null
NANOCTRL_PORT=$(free_port)
(cd /tmp && "$PYTHON" -m dlslime.nanoctrl start --port "$NANOCTRL_PORT" \
  --redis-url "redis://127.0.0.1:$REDIS_PORT" --pid-file "$RUN_DIR/nanoctrl.pid")
export DLSLIME_TEST_CTRL_URL="http://127.0.0.1:$NANOCTRL_PORT"
export DLSLIME_TEST_REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
echo "redis on $DLSLIME_TEST_REDIS_URL, NanoCtrl on $DLSLIME_TEST_CTRL_URL"

step "Python tests (pytest)"
set +e
(cd "$ROOT" && "$PYTHON" -m pytest tests/python -v -p no:cacheprovider "$@")
rc=$?
set -e
if [ $rc -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
[ $rc -eq 0 ] || exit $rc

# The Python conformance suite over TCP with the peer in a second process: once on the
# same-host path (the default between two processes of one host), once with it off.
step "Python conformance over TCP across two processes (same-host path on, then off)"
(cd "$ROOT" && DLSLIME_TEST_PEER_PROCESS=1 "$PYTHON" -m pytest tests/python/test_conformance.py -v -p no:cacheprovider \
  -k tcp)
(cd "$ROOT" && DLSLIME_TEST_PEER_PROCESS=1 DLSLIME_TCP_SAME_HOST=0 "$PYTHON" -m pytest tests/python/test_conformance.py \
  -v -p no:cacheprovider -k tcp)

# The Python conformance suite once more, on the simulated RDMA device, when RDMA is built.
# Exit 5 (nothing collected) fails here too.
if "$PYTHON" -c 'import sys, dlslime; sys.exit(0 if hasattr(dlslime, "RDMAEndpoint") else 1)'; then
  step "Python conformance on the simulated RDMA device"
  (cd "$ROOT" && DLSLIME_RDMA_SIM=1 "$PYTHON" -m pytest tests/python/test_conformance.py -v -p no:cacheprovider \
    -k rdma)
fi

# And over ascend on the simulated HIXL, when Ascend is built: two endpoints of one process,
# then with the peer in a second process.
if "$PYTHON" -c 'import sys, dlslime; sys.exit(0 if hasattr(dlslime, "AscendDirectEndpoint") else 1)'; then
  step "Python conformance over ascend on the simulated HIXL (one process, then two)"
  (cd "$ROOT" && DLSLIME_ASCEND_SIM=1 "$PYTHON" -m pytest tests/python/test_conformance.py -v -p no:cacheprovider \
    -k ascend)
  (cd "$ROOT" && DLSLIME_ASCEND_SIM=1 DLSLIME_TEST_PEER_PROCESS=1 "$PYTHON" -m pytest tests/python/test_conformance.py \
    -v -p no:cacheprovider -k ascend)
fi

# And over nvlink on the simulated GPU, when NVLink is built (its peer runs in a second
# process: a process cannot open its own CUDA IPC handles).
if "$PYTHON" -c 'import sys, dlslime; sys.exit(0 if hasattr(dlslime, "NVLinkEndpoint") else 1)'; then
  step "Python conformance over nvlink, and the TCP soak with GPU memory, on the simulated GPU"
  (cd "$ROOT" && DLSLIME_GPU_SIM=1 "$PYTHON" -m pytest tests/python/test_conformance.py -v -p no:cacheprovider \
    -k "nvlink or staging")
fi
