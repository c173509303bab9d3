#!/usr/bin/env bash
# Sanitizer runs (issue 6): builds libdlslime, its tests and the Python module with
# ASan+UBSan (build-asan) and, separately, with TSan (build-tsan), then runs the C++ tests
# (ctest) and the TCP and PeerAgent Python tests against each build. Any sanitizer report
# fails the run.
#
#   scripts/sanitize.sh              # both
#   scripts/sanitize.sh asan         # or: tsan
#   SANITIZE_PYTEST_ARGS="-k write" scripts/sanitize.sh asan
#
# Environment: JOBS (2), CC/CXX (gcc/g++: the runtime preloaded into Python below must be
# the compiler's own), SANITIZE_PYTESTS (the Python test files), SANITIZE_SOAK_SECONDS (10:
# the soak test's duration under the sanitizers; 0 skips it).
#
# How the Python tests run: python3 itself is not instrumented, so the sanitizer runtime
# must be loaded first, with LD_PRELOAD (libasan.so / libtsan.so of the same compiler).
# The interpreter's own allocations are not leak-checked (detect_leaks=0); the C++ tests
# keep leak checking on. The module is imported from the build tree (PYTHONPATH=<build>/python);
# nothing is pip-installed.
set -euo pipefail
cd "$(dirname "$0")/.."
# A wildcard bind advertises the default route's interface (docs/deploy.md); the tests'
# traffic stays on loopback, so every endpoint they make advertises lo.
export DLSLIME_TCP_ADVERTISE_INTERFACE=${DLSLIME_TCP_ADVERTISE_INTERFACE:-lo}
ROOT=$PWD
JOBS=${JOBS:-2}
PYTHON=${PYTHON:-python3}
export CC=${CC:-gcc} CXX=${CXX:-g++}
WHICH=${1:-all}
PYTESTS=${SANITIZE_PYTESTS:-tests/python/test_tcp.py tests/python/test_tcp_auth.py tests/python/test_peer_agent_tcp.py tests/python/test_hostile.py tests/python/test_lifetimes.py tests/python/test_soak.py}
SOAK_SECONDS=${SANITIZE_SOAK_SECONDS:-10}

step() { printf '\n==== %s ====\n' "$*"; }
now() { date +%s; }
declare -A TIMES=()

runtime_of() {  # the compiler's sanitizer runtime, e.g. libasan.so
  local path
  path=$("$CXX" -print-file-name="$1")
  [ -e "$path" ] || { echo "cannot find $1 for $CXX" >&2; exit 1; }
  readlink -f "$path"
}

# True when there are reports and every one of them is only the runtime failing to map
# its shadow memory (no race, leak or error report among them).
runtime_mapping_failure_only() {
  local logs=$1 f
  compgen -G "$logs/*" >/dev/null || return 1
  for f in "$logs"/*; do
    grep -q 'Sanitizer failed to allocate .* bytes at address' "$f" || return 1
    ! grep -q -E 'WARNING: ThreadSanitizer|ERROR: AddressSanitizer|runtime error|SUMMARY' "$f" || return 1
  done
}

# True when there are reports, each of them only LeakSanitizer's own tracer dying at exit
# ("Tracer caught signal 11", no leak, error or race report), and as many as the tests that
# failed. GCC 12's LeakSanitizer guesses the bounds of a dynamic TLS block (a thread_local of
# a dlopen'd library: the simulated GPU's, NIC's and HIXL's) from a glibc 2.19 header whenever
# the block's address is 16 mod 4096, reads garbage bounds and its tracer faults
# (google/sanitizers#1409, fixed in LLVM 17): seen once in ~40 runs of a test, after the test
# itself passed. Not scanning TLS instead (use_tls=0) reports glibc's and OpenSSL's
# per-thread allocations as leaks.
lsan_tracer_crash_only() {
  local logs=$1 build=$2 f n=0
  compgen -G "$logs/*" >/dev/null || return 1
  for f in "$logs"/*; do
    grep -q 'Tracer caught signal' "$f" && grep -q 'LeakSanitizer has encountered a fatal error' "$f" || return 1
    ! grep -q -E 'ERROR: AddressSanitizer|detected memory leaks|runtime error|SUMMARY' "$f" || return 1
    n=$((n + 1))
  done
  [ -f "$build/Testing/Temporary/LastTestsFailed.log" ] &&
    [ "$(wc -l < "$build/Testing/Temporary/LastTestsFailed.log")" -eq "$n" ]
}

run_one() {
  local name=$1 flags=$2 runtime=$3
  local build=build-$name t0 rc=0
  local logs=$ROOT/$build/sanitizer-logs
  # Reports go to files as well as stderr: pytest captures stderr and loses it when the
  # process aborts. Any file there after a run is a finding.
  rm -rf "$logs" "$logs.runtime-failures" && mkdir -p "$logs"
  local san_env=()
  if [ "$name" = asan ]; then
    san_env=(ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=1:strict_init_order=1:log_path=$logs/asan"
             UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$logs/ubsan"
             LSAN_OPTIONS="suppressions=$ROOT/tests/fuzz/lsan.supp")
  else
    san_env=(TSAN_OPTIONS="halt_on_error=0:second_deadlock_stack=1:log_path=$logs/tsan:suppressions=$ROOT/tests/fuzz/tsan.supp")
  fi

  step "$name: configure and build ($build, $CXX $flags)"
  t0=$(now)
  # -O1 -g1 (line tables only): what the sanitizers' own docs suggest, and 40% less compile
  # time than RelWithDebInfo's -O2 -g here; reports still name every function and line.
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTS=ON -DBUILD_PYTHON=ON -DBUILD_BENCH=OFF \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -Dpybind11_DIR="$("$PYTHON" -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
    -DPython_EXECUTABLE="$(command -v "$PYTHON")" \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" -DCMAKE_MODULE_LINKER_FLAGS="$flags" \
    >/dev/null
  cmake --build "$build" -j "$JOBS"
  TIMES[$name-build]=$(( $(now) - t0 ))

  step "$name: C++ tests (ctest)"
  t0=$(now)
  # InstalledPackage builds an uninstrumented app against the instrumented library: left
  # out. So is the EMFILE test: it uses up every descriptor of the process, and the
  # sanitizer runtime itself needs one to check memory (UBSan's vptr check then reports
  # "memory cannot be printed" on any object); it runs in the plain ctest of test.sh. The
  # fork test's child starts threads after a multi-threaded fork, which TSan does not
  # support ("dup thread with used id" even with die_after_fork=0): plain ctest and ASan only.
  # TSan also skips the TCP conformance suite across two processes: its peer process reads
  # and fills its buffers when the test process tells it to, ordered after the ops only
  # through that other process, which TSan cannot see, so it reports the peer's command loop
  # against the I/O thread (a suppression by its frames did not hold for every report). The
  # same suite runs under TSan in one process (Conformance.*/tcp), and core's cross_copy
  # (SameHost.*) under TSan too; the across-process run is plain and ASan.
  local exclude='InstalledPackage|TcpListenerLimits.AcceptBacksOffOnEmfileAndRecovers'
  [ "$name" = tsan ] && exclude+='|IoRuntimeFork|TcpSameHost.ConformanceAcrossProcesses'
  env "${san_env[@]}" ctest --test-dir "$build" --output-on-failure -j "$JOBS" --timeout 600 \
    -E "$exclude" || rc=1
  # The tests whose only failure was LeakSanitizer's tracer dying (see above) run once more;
  # anything else, or the same again, fails the run.
  if [ "$rc" = 1 ] && [ "$name" = asan ] && lsan_tracer_crash_only "$logs" "$ROOT/$build"; then
    step "$name: LeakSanitizer's tracer died at exit (google/sanitizers#1409), not a finding; running those tests again"
    mkdir -p "$logs.runtime-failures"
    for f in "$logs"/*; do echo "--- $f"; head -n 5 "$f"; mv "$f" "$logs.runtime-failures/$(basename "$f").ctest"; done
    rc=0
    env "${san_env[@]}" ctest --test-dir "$build" --output-on-failure -j "$JOBS" --timeout 600 --rerun-failed || rc=1
  fi
  TIMES[$name-ctest]=$(( $(now) - t0 ))

  step "$name: Python tests ($PYTESTS)"
  t0=$(now)
  local py_env=("${san_env[@]}")
  if [ "$name" = asan ]; then
    py_env=(ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:detect_stack_use_after_return=1:log_path=$logs/asan"
            UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$logs/ubsan")
  fi
  # libstdc++ is preloaded too: python3 does not link it, and the runtime must find the real
  # __cxa_throw when it starts ("CHECK failed: real___cxa_throw != 0" otherwise).
  local preload
  preload="$runtime $(readlink -f "$("$CXX" -print-file-name=libstdc++.so)")"
  # TSan's shadow memory sits at fixed addresses; with address-space randomisation a
  # mapping can land where the runtime cannot shadow it, and the runtime then dies with
  # "failed to allocate ... bytes at address" (seen once in CI, mid-run, in the pytest
  # process itself). Running without randomisation (setarch -R, inherited by child
  # processes) is the runtime's documented remedy; it changes nothing a race report sees.
  local launcher=()
  if [ "$name" = tsan ] && setarch "$(uname -m)" -R true 2>/dev/null; then
    launcher=(setarch "$(uname -m)" -R)
  fi
  local attempt pyrc
  for attempt in 1 2 3; do
    pyrc=0
    # -p no:faulthandler: its signal stack confuses the sanitizers' own SEGV reports.
    env "${py_env[@]}" LD_PRELOAD="$preload" PYTHONPATH="$ROOT/$build/python" \
      DLSLIME_SOAK_SECONDS="$SOAK_SECONDS" \
      "${launcher[@]}" "$PYTHON" -m pytest $PYTESTS -q -p no:cacheprovider -p no:faulthandler \
      ${SANITIZE_PYTEST_ARGS:-} || pyrc=1
    # A runtime that could not map its own memory is not a finding about this code (it
    # struck at different tests in different runs, about 20 s in, and never on a rerun so
    # far). Say so loudly and run the tests again, at most twice; anything else (a race, a
    # leak, a third such failure) fails the run.
    if [ "$attempt" -lt 3 ] && runtime_mapping_failure_only "$logs"; then
      step "$name: the sanitizer runtime could not map its memory; running the Python tests again"
      mkdir -p "$logs.runtime-failures"
      for f in "$logs"/*; do echo "--- $f"; head -n 20 "$f"; mv "$f" "$logs.runtime-failures/$(basename "$f").attempt$attempt"; done
      continue
    fi
    break
  done
  [ "$pyrc" = 0 ] || rc=1
  TIMES[$name-pytest]=$(( $(now) - t0 ))
  if compgen -G "$logs/*" >/dev/null; then
    step "$name: sanitizer reports ($logs)"
    for f in "$logs"/*; do echo "--- $f"; head -n 80 "$f"; done
    rc=1
  fi
  return $rc
}

failed=()
if [ "$WHICH" = all ] || [ "$WHICH" = asan ]; then
  run_one asan "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
    "$(runtime_of libasan.so)" || failed+=(asan)
fi
if [ "$WHICH" = all ] || [ "$WHICH" = tsan ]; then
  run_one tsan "-fsanitize=thread -fno-omit-frame-pointer" "$(runtime_of libtsan.so)" || failed+=(tsan)
fi

step "times (seconds)"
for k in "${!TIMES[@]}"; do echo "$k ${TIMES[$k]}"; done | sort
if [ ${#failed[@]} -gt 0 ]; then
  echo "sanitizer runs FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "sanitizer runs clean: $WHICH"
