#!/usr/bin/env bash
# Every Ascend check on a host with an NPU and CANN (docs/ascend.md, "Checking on an NPU"):
# builds the project with the toolkit (libdlslime plus the HIXL plugin
# libdlslime_ascend_hixl.so), runs the conformance suites over ascend (C++ and Python), the
# two-process example and `dlslime-bench --transport ascend`, all on the NPU, where they must
# run, not skip. A few minutes. CI runs the same suites on the simulated HIXL
# (DLSLIME_ASCEND_SIM=1) instead.
#   tests/hardware/run_ascend_checks.sh             # build dir: build/ascend-hw (ASCEND_CHECKS_BUILD_DIR)
#   ASCEND_CHECKS_FLAVOUR=adxl tests/hardware/...   # ADXL (CANN 8.2 to 8.4) instead of HIXL (8.5+)
#   ASCEND_RT_VISIBLE_DEVICES=0,1 tests/hardware/...  # which NPUs the runtime sees
# Without an NPU it says so, naming what it looked for, and exits 0 (skipped); set
# ASCEND_CHECKS_REQUIRE=1 to make that a failure (on a host that is meant to have one).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
BUILD=${ASCEND_CHECKS_BUILD_DIR:-build/ascend-hw}
JOBS=${JOBS:-$(nproc)}
FLAVOUR=${ASCEND_CHECKS_FLAVOUR:-hixl}
OUT=${ASCEND_CHECKS_OUT:-$(mktemp -d /tmp/ascend_checks.XXXXXX)}
mkdir -p "$OUT"
unset DLSLIME_ASCEND_SIM  # the real library and NPU only: never the simulation

fail() { echo "FAIL: $*" >&2; exit 1; }

if ! ls /dev/davinci[0-9]* >/dev/null 2>&1; then
  msg="no NPU on this host (no /dev/davinci*: install the Ascend driver, or map the devices into the container)"
  [[ ${ASCEND_CHECKS_REQUIRE:-0} == 1 ]] && fail "$msg"
  echo "SKIP: $msg; CI's simulated-HIXL checks run with DLSLIME_ASCEND_SIM=1"
  exit 0
fi

# CANN's environment: set_env.sh puts its lib64 on LD_LIBRARY_PATH and sets ASCEND_TOOLKIT_HOME
# (older layouts) or ASCEND_HOME_PATH (newer ones), which CMake's search below uses.
if [[ -z ${ASCEND_TOOLKIT_HOME:-}${ASCEND_HOME_PATH:-} ]]; then
  for env in /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/cann/set_env.sh; do
    # shellcheck disable=SC1090
    [[ -f $env ]] && { set +u; source "$env"; set -u; echo "sourced $env"; break; }
  done
fi
[[ -n ${ASCEND_TOOLKIT_HOME:-}${ASCEND_HOME_PATH:-} ]] || \
  fail "CANN's environment is not set (source <toolkit>/set_env.sh, or set ASCEND_TOOLKIT_HOME)"
echo "CANN: ${ASCEND_TOOLKIT_HOME:-$ASCEND_HOME_PATH} ($(head -1 "${ASCEND_TOOLKIT_HOME:-$ASCEND_HOME_PATH}"/version.cfg 2>/dev/null || echo 'version.cfg not found'))"
command -v npu-smi >/dev/null && npu-smi info || echo "npu-smi not found: the checks below say whether the runtime sees an NPU"

printf '\n==== build (BUILD_ASCEND=ON, flavour %s) ====\n' "$FLAVOUR"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTS=ON -DBUILD_ASCEND=ON \
  -DDLSLIME_HIXL_FLAVOUR="$FLAVOUR" -DBUILD_PYTHON=ON \
  -Dpybind11_DIR="$("$PYTHON" -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
  -DPython_EXECUTABLE="$(command -v "$PYTHON")" >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target dlslime_conformance_tests dlslime-bench _dlslime dlslime_ascend_hixl
# The packaging rule the plugin exists for: libdlslime itself names no CANN library.
if readelf -d "$BUILD"/src/libdlslime.so* 2>/dev/null | grep -E 'NEEDED.*(hixl|llm_datadist|ascendcl)'; then
  fail "libdlslime.so links a CANN library: it must only dlopen the plugin"
fi

printf '\n==== is the library usable here? ====\n'
PYTHONPATH="$PWD/$BUILD/python" "$PYTHON" - <<'PY'
import sys
import dlslime
available = dlslime.available_transports()
print("available_transports():", available)
if "ascend" not in available:
    sys.exit("FAIL: ascend is not available here; the reason above says why (plugin, CANN runtime or NPU)")
PY

printf '\n==== conformance suite over ascend, on the NPU (C++) ====\n'
out=$("$BUILD/tests/cpp/dlslime_conformance_tests" --gtest_filter='*ascend*' 2>&1) || { echo "$out"; fail "C++ conformance"; }
echo "$out"
grep -q '\[  PASSED  \] [1-9]' <<<"$out" || fail "no C++ conformance test ran over ascend"
if grep -q '\[  SKIPPED \]' <<<"$out"; then fail "C++ conformance tests over ascend skipped on an NPU host"; fi

printf '\n==== conformance suite over ascend, on the NPU (Python) ====\n'
if ! PYTHONPATH="$PWD/$BUILD/python" DLSLIME_TEST_TRANSPORTS=ascend timeout 900 "$PYTHON" -m pytest \
    tests/python/test_conformance.py -q -p no:cacheprovider -rs -k ascend 2>&1 | tee "$OUT/pytest.txt"; then
  fail "Python conformance"
fi
grep -q ' passed' "$OUT/pytest.txt" || fail "no Python conformance test ran over ascend"
if grep -q SKIPPED "$OUT/pytest.txt"; then fail "a Python conformance test over ascend skipped on an NPU host"; fi

printf '\n==== two-process example, on the NPU ====\n'
PYTHONPATH="$PWD/$BUILD/python" timeout 180 "$PYTHON" examples/python/p2p_ascend.py || fail "examples/python/p2p_ascend.py"

printf '\n==== dlslime-bench --transport ascend ====\n'
for op in write read; do
  timeout 300 "$BUILD/bench/dlslime-bench" --transport ascend --op "$op" --progress none \
    --json "$OUT/ascend-$op.json" || fail "dlslime-bench --transport ascend --op $op"
done
"$PYTHON" - "$OUT" <<'PY'
import json, pathlib, sys
for op in ("write", "read"):
    doc = json.loads((pathlib.Path(sys.argv[1]) / f"ascend-{op}.json").read_text())
    assert doc["config"]["verified"], f"ascend {op}: bytes not verified"
    print(f"ascend {op}: " + ", ".join(f"{r['msg_size']}: {r['avg_bw_gbps']:.2f} GB/s" for r in doc["rows"]))
PY
echo "reports: $OUT"
echo "Ascend checks: ok"
