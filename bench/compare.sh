#!/usr/bin/env bash
# bench/compare.sh: dlslime-bench side by side with loopback TCP baselines, in one session.
#
#   throughput: iperf3 -c 127.0.0.1 -l 1M (one stream)  vs  dlslime-bench write/read 1 MiB x 256,
#               and the same with --one-slot (every item on the first slot: a cache-resident
#               working set, as iperf3 rewrites one 1 MiB buffer; the like-for-like comparison)
#   latency:    tcp_pingpong 8 B round trip (TCP_NODELAY) vs  dlslime-bench write/read/send 8 B x 256
#
# Each run does every measurement once, interleaved, so drift hits all of them alike; the
# summary prints each run, the medians and the ratios (issue 5 targets: >= 0.90x iperf3 at
# 1 MiB, < 5x RTT per 8 B x 256 batch), the send message rate at 8 B and the CPU cost
# (bytes per CPU-second) at 1 MiB. Loopback only: every socket is on 127.0.0.1.
#
# usage: bench/compare.sh [-n RUNS] [-b BUILD_DIR] [-k] [-- EXTRA_DLSLIME_BENCH_ARGS...]
#   -n RUNS       runs of each measurement (default 3)
#   -b BUILD_DIR  where bench/dlslime-bench and bench/tcp_pingpong were built
#   -k            keep the raw JSON/text results (their directory is printed)
# environment: DLSLIME_BENCH_BIN, TCP_PINGPONG_BIN (binaries), BIG_ITERS (default 20) and
# SMALL_ITERS (default 500) timed batches, IPERF_TIME (default 5 s), IPERF3 (default iperf3),
# COMPARE_JSON (also write the medians there as JSON; bench/ab.sh uses it).
set -euo pipefail

RUNS=3
BUILD_DIR=""
KEEP=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) RUNS="$2"; shift 2 ;;
    -b) BUILD_DIR="$2"; shift 2 ;;
    -k) KEEP=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    --) shift; break ;;
    *) echo "compare.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
EXTRA=("$@")
BIG_ITERS=${BIG_ITERS:-20}
SMALL_ITERS=${SMALL_ITERS:-500}
IPERF_TIME=${IPERF_TIME:-5}
IPERF3=${IPERF3:-iperf3}
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: -n needs a positive integer" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
find_bin() {  # name, explicit path
  local name=$1 explicit=$2
  if [[ -n "$explicit" ]]; then echo "$explicit"; return; fi
  local dirs=()
  [[ -n "$BUILD_DIR" ]] && dirs+=("$BUILD_DIR/bench")
  dirs+=("$ROOT/build/bench" "$ROOT"/build-*/bench "$ROOT"/build/*/bench)
  for d in "${dirs[@]}"; do
    if [[ -x "$d/$name" ]]; then echo "$d/$name"; return; fi
  done
  command -v "$name" || true
}
BENCH=$(find_bin dlslime-bench "${DLSLIME_BENCH_BIN:-}")
PINGPONG=$(find_bin tcp_pingpong "${TCP_PINGPONG_BIN:-}")
[[ -x "$BENCH" ]] || { echo "compare.sh: dlslime-bench not found (use -b BUILD_DIR or DLSLIME_BENCH_BIN)" >&2; exit 1; }
[[ -x "$PINGPONG" ]] || { echo "compare.sh: tcp_pingpong not found (use -b BUILD_DIR or TCP_PINGPONG_BIN)" >&2; exit 1; }
command -v "$IPERF3" >/dev/null || { echo "compare.sh: $IPERF3 is not installed" >&2; exit 1; }

OUT=$(mktemp -d "${TMPDIR:-/tmp}/dlslime-compare.XXXXXX")
IPERF_PID=""
cleanup() {
  if [[ -n "$IPERF_PID" ]]; then kill "$IPERF_PID" 2>/dev/null || true; wait "$IPERF_PID" 2>/dev/null || true; fi
  if [[ $KEEP -eq 0 ]]; then rm -rf "$OUT"; else echo "raw results kept in $OUT"; fi
}
trap cleanup EXIT

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
"$IPERF3" -s -B 127.0.0.1 -p "$PORT" >"$OUT/iperf3-server.log" 2>&1 &
IPERF_PID=$!
for _ in $(seq 50); do  # wait until the server accepts (5 s at most)
  if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $PORT), 0.2).close()" 2>/dev/null; then break; fi
  sleep 0.1
done

bench() {  # out.json, dlslime-bench args...
  local out=$1; shift
  if ! "$BENCH" "$@" --progress none --quiet --json "$out" "${EXTRA[@]}" >"$out.txt" 2>&1; then
    echo "compare.sh: dlslime-bench $* failed:" >&2; cat "$out.txt" >&2; exit 1
  fi
}

echo "compare.sh: $RUNS run(s); dlslime-bench=$BENCH; iperf3 on 127.0.0.1:$PORT" >&2
for run in $(seq "$RUNS"); do
  echo "compare.sh: run $run/$RUNS" >&2
  "$IPERF3" -c 127.0.0.1 -p "$PORT" -l 1M -t "$IPERF_TIME" -J >"$OUT/iperf-$run.json"
  bench "$OUT/write-1m-$run.json" --op write --size 1M --batch 256 --iters "$BIG_ITERS" --warmup 2
  bench "$OUT/read-1m-$run.json" --op read --size 1M --batch 256 --iters "$BIG_ITERS" --warmup 2
  bench "$OUT/write-1m-hot-$run.json" --op write --size 1M --batch 256 --iters "$BIG_ITERS" --warmup 2 --one-slot
  bench "$OUT/read-1m-hot-$run.json" --op read --size 1M --batch 256 --iters "$BIG_ITERS" --warmup 2 --one-slot
  "$PINGPONG" --size 8 >"$OUT/pingpong-$run.txt"
  bench "$OUT/write-8-$run.json" --op write --size 8 --batch 256 --iters "$SMALL_ITERS" --warmup 20
  bench "$OUT/read-8-$run.json" --op read --size 8 --batch 256 --iters "$SMALL_ITERS" --warmup 20
  bench "$OUT/send-8-$run.json" --op send --size 8 --batch 256 --iters "$SMALL_ITERS" --warmup 20
done

COMPARE_JSON=${COMPARE_JSON:-} python3 - "$OUT" "$RUNS" "$IPERF_TIME" "$BIG_ITERS" "$SMALL_ITERS" "${EXTRA[*]:-}" <<'EOF'
import json, os, platform, re, statistics, sys

out, runs, iperf_time, big_iters, small_iters, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
R = range(1, runs + 1)

def load(name):
    with open(os.path.join(out, name)) as f:
        return json.load(f)

def row(name):
    return load(name)["rows"][0]

def iperf(run):
    d = load(f"iperf-{run}.json")
    end = d["end"]
    bps = end["sum_received"]["bytes"] / end["sum_received"]["seconds"]
    cpu = end.get("cpu_utilization_percent", {})
    cpu_s = (cpu.get("host_total", 0) + cpu.get("remote_total", 0)) / 100 * end["sum_received"]["seconds"]
    return bps / 1e9, (end["sum_received"]["bytes"] / cpu_s / 1e9) if cpu_s > 0 else float("nan")

def pingpong(run):
    with open(os.path.join(out, f"pingpong-{run}.txt")) as f:
        return float(re.search(r"median_us=([0-9.]+)", f.read()).group(1))

series = {
    "iperf3 -l 1M, 1 stream (GB/s)": [iperf(r)[0] for r in R],
    "write 1 MiB x 256, avg BW (GB/s)": [row(f"write-1m-{r}.json")["avg_bw_gbps"] for r in R],
    "read  1 MiB x 256, avg BW (GB/s)": [row(f"read-1m-{r}.json")["avg_bw_gbps"] for r in R],
    "write 1 MiB x 256, one slot (GB/s)": [row(f"write-1m-hot-{r}.json")["avg_bw_gbps"] for r in R],
    "read  1 MiB x 256, one slot (GB/s)": [row(f"read-1m-hot-{r}.json")["avg_bw_gbps"] for r in R],
    "TCP ping-pong RTT, 8 B (us)": [pingpong(r) for r in R],
    "write 8 B x 256, avg batch lat (us)": [row(f"write-8-{r}.json")["avg_lat_us"] for r in R],
    "read  8 B x 256, avg batch lat (us)": [row(f"read-8-{r}.json")["avg_lat_us"] for r in R],
    "send  8 B x 256, avg batch lat (us)": [row(f"send-8-{r}.json")["avg_lat_us"] for r in R],
    "send  8 B recv message rate (Mmsg/s)": [row(f"send-8-{r}.json")["recv_msgs_per_s"] / 1e6 for r in R],
    "iperf3 1 MiB, GB per CPU-second": [iperf(r)[1] for r in R],
    "write 1 MiB, GB per CPU-second": [row(f"write-1m-{r}.json")["bytes_per_cpu_s"] / 1e9 for r in R],
    "read  1 MiB, GB per CPU-second": [row(f"read-1m-{r}.json")["bytes_per_cpu_s"] / 1e9 for r in R],
    "write 1 MiB one slot, GB per CPU-s": [row(f"write-1m-hot-{r}.json")["bytes_per_cpu_s"] / 1e9 for r in R],
    "read  1 MiB one slot, GB per CPU-s": [row(f"read-1m-hot-{r}.json")["bytes_per_cpu_s"] / 1e9 for r in R],
}
med = {k: statistics.median(v) for k, v in series.items()}
if os.environ.get("COMPARE_JSON"):
    with open(os.environ["COMPARE_JSON"], "w") as f:
        json.dump(med, f)
cfg = load("write-1m-1.json")["config"]
iperf_bw, rtt = med["iperf3 -l 1M, 1 stream (GB/s)"], med["TCP ping-pong RTT, 8 B (us)"]

def verdict(ok):
    return "meets target" if ok else "misses target"

notes = {
    "write 1 MiB x 256, avg BW (GB/s)": lambda m: f"{m / iperf_bw:5.2f}x iperf3  ({verdict(m >= 0.9 * iperf_bw)} >= 0.90x)",
    "read  1 MiB x 256, avg BW (GB/s)": lambda m: f"{m / iperf_bw:5.2f}x iperf3  ({verdict(m >= 0.9 * iperf_bw)} >= 0.90x)",
    "write 1 MiB x 256, one slot (GB/s)": lambda m: f"{m / iperf_bw:5.2f}x iperf3  (like for like: cache-resident)",
    "read  1 MiB x 256, one slot (GB/s)": lambda m: f"{m / iperf_bw:5.2f}x iperf3  (like for like: cache-resident)",
    "write 8 B x 256, avg batch lat (us)": lambda m: f"{m / rtt:5.2f}x RTT     ({verdict(m < 5 * rtt)} < 5x)",
    "read  8 B x 256, avg batch lat (us)": lambda m: f"{m / rtt:5.2f}x RTT     ({verdict(m < 5 * rtt)} < 5x)",
    "send  8 B x 256, avg batch lat (us)": lambda m: f"{m / rtt:5.2f}x RTT     ({verdict(m < 5 * rtt)} < 5x)",
    "write 1 MiB, GB per CPU-second": lambda m: f"{m / med['iperf3 1 MiB, GB per CPU-second']:5.2f}x iperf3",
    "read  1 MiB, GB per CPU-second": lambda m: f"{m / med['iperf3 1 MiB, GB per CPU-second']:5.2f}x iperf3",
    "write 1 MiB one slot, GB per CPU-s": lambda m: f"{m / med['iperf3 1 MiB, GB per CPU-second']:5.2f}x iperf3",
    "read  1 MiB one slot, GB per CPU-s": lambda m: f"{m / med['iperf3 1 MiB, GB per CPU-second']:5.2f}x iperf3",
}

print(f"dlslime-bench vs loopback baselines: {runs} run(s), medians; host {platform.node()}, "
      f"{os.cpu_count()} CPUs, lanes {cfg.get('lanes')}, chunk {cfg.get('chunk_size')} B, {cfg.get('layout')}"
      + (f", extra args: {extra}" if extra.strip() else ""))
print(f"(iperf3 -c 127.0.0.1 -l 1M -t {iperf_time}; dlslime-bench 1 MiB: {big_iters} batches, 8 B: {small_iters} "
      f"batches; RTT: tcp_pingpong --size 8, median)")
name_w = max(len(k) for k in series)
head = f"{'':{name_w}} " + " ".join(f"{'run ' + str(r):>9}" for r in R) + f" {'median':>9}  ratio"
print(head)
print("-" * len(head))
groups = [("iperf3 -l 1M", "throughput"), ("TCP ping-pong", "latency"), ("iperf3 1 MiB, GB per", "cpu")]
for k, v in series.items():
    if any(k.startswith(g) for g, _ in groups) and k != next(iter(series)):
        print()
    line = f"{k:{name_w}} " + " ".join(f"{x:9.2f}" if x >= 0.01 or x == 0 else f"{x:9.4f}" for x in v)
    line += f" {med[k]:9.2f}"
    if k in notes:
        line += "  " + notes[k](med[k])
    print(line)
EOF
