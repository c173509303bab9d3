#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang with ASan+UBSan) and runs each one:
# first the checked-in corpus (tests/fuzz/corpus/<target>/: seeds and the reproducers of
# every crash found so far) is replayed, then the target fuzzes for FUZZ_SECONDS (30).
# Any crash, sanitizer report, leak, timeout or broken invariant fails the run; the input
# that did it is left in <build>/fuzz-artifacts/<target>/ - add it to the target's corpus
# directory as crash-<what> so it is replayed from then on.
#
#   scripts/fuzz.sh                      # all targets, 30 s each
#   FUZZ_SECONDS=300 scripts/fuzz.sh fuzz_tcp_stream
#   FUZZ_SECONDS=0 scripts/fuzz.sh       # build and replay the corpus only
#
# Environment: FUZZ_SECONDS, DLSLIME_FUZZ_BUILD_DIR (build-fuzz), JOBS (2), CC/CXX (clang).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${DLSLIME_FUZZ_BUILD_DIR:-build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
JOBS=${JOBS:-2}
ALL_TARGETS=(fuzz_frame_header fuzz_handshake fuzz_tcp_stream fuzz_tcp_initiator fuzz_nanoctrl_request)
if [ $# -gt 0 ]; then TARGETS=("$@"); else TARGETS=("${ALL_TARGETS[@]}"); fi

# Per-target options: the longest input worth trying, and a dictionary.
declare -A MAX_LEN=([fuzz_frame_header]=41 [fuzz_handshake]=65 [fuzz_tcp_stream]=65536
                    [fuzz_tcp_initiator]=4096 [fuzz_nanoctrl_request]=4096)
declare -A DICT=([fuzz_nanoctrl_request]=tests/fuzz/nanoctrl.dict)

step() { printf '\n==== %s ====\n' "$*"; }

step "build ($BUILD)"
export CC=${CC:-clang} CXX=${CXX:-clang++}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_FUZZERS=ON -DBUILD_TESTS=OFF \
  -DBUILD_PYTHON=OFF >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}"

# Leaks are checked (libFuzzer's default); the sanitizers abort on the first report.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export DLSLIME_LOG_LEVEL=off

failed=()
for t in "${TARGETS[@]}"; do
  bin=$BUILD/fuzz/$t
  seeds=$ROOT/tests/fuzz/corpus/$t
  work=$BUILD/fuzz-corpus/$t
  artifacts=$BUILD/fuzz-artifacts/$t
  mkdir -p "$work" "$artifacts"
  opts=(-timeout=10 -rss_limit_mb=2048 -max_len="${MAX_LEN[$t]:-4096}" -artifact_prefix="$artifacts/")
  [ -n "${DICT[$t]:-}" ] && opts+=(-dict="$ROOT/${DICT[$t]}")

  step "$t: replay $(find "$seeds" -type f | wc -l) corpus files"
  if ! "$bin" "${opts[@]}" -runs=0 "$seeds" 2>&1 | tail -n 40; then
    failed+=("$t (corpus replay)")
    continue
  fi
  if [ "$FUZZ_SECONDS" -gt 0 ]; then
    step "$t: fuzz for ${FUZZ_SECONDS}s"
    start=$(date +%s)
    # New interesting inputs go to $work (the first directory); the seeds are read only.
    if ! "$bin" "${opts[@]}" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 "$work" "$seeds" \
        >"$artifacts/log.txt" 2>&1; then
      tail -n 60 "$artifacts/log.txt"
      echo "$t FAILED: reproducer(s) in $artifacts/ (replay: $bin <file>)" >&2
      failed+=("$t")
      continue
    fi
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added)|cov:' "$artifacts/log.txt" \
      | tail -n 4
    echo "$t: clean after $(( $(date +%s) - start ))s"
  fi
done

step "summary"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "all fuzz targets clean (${FUZZ_SECONDS}s each): ${TARGETS[*]}"
