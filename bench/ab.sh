#!/usr/bin/env bash
# bench/ab.sh: an interleaved A/B of two builds with bench/compare.sh.
#
# Each round runs `compare.sh -n 1` on build A, then on build B (alternating which goes
# first, so drift and warm-up hit both alike); the summary prints, per figure, the median
# over rounds for A and B and the ratio B/A. Baselines (iperf3, ping-pong RTT) are measured
# in every round of both, so their two columns show how noisy the host was.
#
# usage: bench/ab.sh -a BUILD_A -b BUILD_B [-n ROUNDS]
#   BUILD_A, BUILD_B   build directories with bench/dlslime-bench and bench/tcp_pingpong
#   -n ROUNDS          rounds (default 5)
# environment: BIG_ITERS, SMALL_ITERS, IPERF_TIME as in compare.sh.
set -euo pipefail

A="" B="" ROUNDS=5
while [[ $# -gt 0 ]]; do
  case "$1" in
    -a) A="$2"; shift 2 ;;
    -b) B="$2"; shift 2 ;;
    -n) ROUNDS="$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "ab.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$A" && -n "$B" ]] || { echo "ab.sh: -a BUILD_A and -b BUILD_B are required" >&2; exit 2; }
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh: -n needs a positive integer" >&2; exit 2; }
for d in "$A" "$B"; do
  [[ -x "$d/bench/dlslime-bench" && -x "$d/bench/tcp_pingpong" ]] ||
    { echo "ab.sh: $d has no bench/dlslime-bench and bench/tcp_pingpong (build those targets)" >&2; exit 2; }
done

HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
for round in $(seq "$ROUNDS"); do
  order=(a b)
  (( round % 2 == 0 )) && order=(b a)
  for side in "${order[@]}"; do
    dir=$A
    [[ $side == b ]] && dir=$B
    echo "ab.sh: round $round/$ROUNDS, build $side ($dir)" >&2
    COMPARE_JSON="$OUT/$side-$round.json" "$HERE/compare.sh" -n 1 -b "$dir" >/dev/null
  done
done

python3 - "$OUT" "$ROUNDS" "$A" "$B" <<'EOF'
import json, os, statistics, sys

out, rounds, a_dir, b_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def runs(side):
    return [json.load(open(os.path.join(out, f"{side}-{r}.json"))) for r in range(1, rounds + 1)]
a, b = runs("a"), runs("b")
print(f"A = {a_dir}\nB = {b_dir}\n{rounds} interleaved rounds; medians over rounds")
w = max(len(k) for k in a[0])
print(f"{'':{w}} {'A':>9} {'B':>9}  {'B/A':>6}   B runs")
for k in a[0]:
    ma, mb = statistics.median(r[k] for r in a), statistics.median(r[k] for r in b)
    ratio = mb / ma if ma else float("nan")
    print(f"{k:{w}} {ma:9.2f} {mb:9.2f}  {ratio:6.2f}   " + " ".join(f"{r[k]:.2f}" for r in b))
EOF
