#!/usr/bin/env bash
# The library with every transport off (-DBUILD_TCP=OFF, -DBUILD_RDMA=OFF, -DBUILD_NVLINK=OFF,
# -DBUILD_ASCEND=OFF): it must still configure, build,
# link (library, Python module, bench, NanoCtrl, PeerAgent) and pass the tests that need
# no transport. Guards the transport layer against a core that names a transport.
set -euo pipefail
cd "$(dirname "$0")/.."
# A wildcard bind advertises the default route's interface (docs/deploy.md); the tests'
# traffic stays on loopback, so every endpoint they make advertises lo.
export DLSLIME_TCP_ADVERTISE_INTERFACE=${DLSLIME_TCP_ADVERTISE_INTERFACE:-lo}
PYTHON=${PYTHON:-python3}
BUILD=${DLSLIME_NO_TRANSPORT_BUILD_DIR:-build/no-transport}
JOBS=${JOBS:-$(nproc)}

printf "\n==== build with every transport off (-DBUILD_TCP=OFF -DBUILD_RDMA=OFF -DBUILD_NVLINK=OFF -DBUILD_ASCEND=OFF) ====\n"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTS=ON -DBUILD_TCP=OFF -DBUILD_RDMA=OFF -DBUILD_NVLINK=OFF \
  -DBUILD_ASCEND=OFF \
  -DBUILD_PYTHON=ON -Dpybind11_DIR="$("$PYTHON" -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
  -DPython_EXECUTABLE="$(command -v "$PYTHON")" >/dev/null
cmake --build "$BUILD" -j "$JOBS"

printf '\n==== C++ tests without a transport (ctest) ====\n'
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" --timeout 300 --no-tests=error

printf '\n==== Python module without a transport ====\n'
PYTHONPATH="$PWD/$BUILD/python" "$PYTHON" - <<'PY'
import dlslime
ts = {t["name"]: t for t in dlslime.available_transports()}
assert not ts["tcp"]["built"] and "BUILD_TCP" in ts["tcp"]["reason"], ts["tcp"]
assert not any(t["available"] for t in ts.values()), ts
assert not hasattr(dlslime, "TcpEndpoint") and not hasattr(dlslime, "AscendDirectEndpoint")
assert not ts["ascend"]["built"] and "BUILD_ASCEND" in ts["ascend"]["reason"], ts["ascend"]
try:
    dlslime.make_endpoint("tcp")
except NotImplementedError as e:
    assert "BUILD_TCP" in str(e), e
else:
    raise SystemExit("make_endpoint('tcp') worked in a build without TCP")
print("dlslime", dlslime.__version__, "without transports: ok;", sorted(ts))
PY
