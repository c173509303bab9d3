#!/usr/bin/env bash
# Every GPU test on a host with a GPU (docs/nvlink.md, "Checking on a GPU"): builds the
# project with the CUDA runtime and NVLink, runs the device-runtime tests and dlslime.testing
# on the real GPU, where they must run, not skip, and then dlslime-bench: TCP with host
# memory next to TCP through GPU staging (GPU-to-GPU, GPU-to-host, host-to-GPU) in the same
# run, and NVLink between two processes, all byte-verified. A few minutes. CI runs the same
# tests on the simulated GPU (DLSLIME_GPU_SIM=1) instead.
#   tests/hardware/run_gpu_checks.sh            # build dir: build/gpu-hw (GPU_CHECKS_BUILD_DIR)
#   GPU_CHECKS_SIM=1 tests/hardware/run_gpu_checks.sh
#       a rehearsal on a host without a GPU: only the dlslime-bench part, on the simulated GPU,
#       at small sizes (its figures measure the code, not a GPU)
#   GPU_CHECKS_OUT=DIR   keep the bench's JSON reports and the summary there (default: a temp dir)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
BUILD=${GPU_CHECKS_BUILD_DIR:-build/gpu-hw}
JOBS=${JOBS:-$(nproc)}
SIM=${GPU_CHECKS_SIM:-0}
OUT=${GPU_CHECKS_OUT:-$(mktemp -d /tmp/gpu_checks.XXXXXX)}
mkdir -p "$OUT"
if [[ $SIM == 1 ]]; then
  export DLSLIME_GPU_SIM=1
else
  unset DLSLIME_GPU_SIM
fi

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || \
  echo "nvidia-smi not found: the checks below say whether the CUDA runtime sees a GPU"

printf '\n==== build (BUILD_CUDA=ON, BUILD_NVLINK=ON) ====\n'
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTS=ON -DBUILD_CUDA=ON -DBUILD_NVLINK=ON \
  -DBUILD_PYTHON=ON -Dpybind11_DIR="$("$PYTHON" -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
  -DPython_EXECUTABLE="$(command -v "$PYTHON")" >/dev/null
if [[ $SIM == 1 ]]; then
  cmake --build "$BUILD" -j "$JOBS" --target dlslime-bench _dlslime
else
  cmake --build "$BUILD" -j "$JOBS" --target dlslime_gpu_tests _dlslime dlslime-bench
fi

if [[ $SIM != 1 ]]; then
  printf '\n==== device runtime on the GPU (C++) ====\n'
  # --gtest_fail_if_no_test... is not in every GoogleTest: count the skips instead.
  out=$("$BUILD/tests/cpp/gpu/dlslime_gpu_tests" --gtest_filter='Runtimes/DeviceRuntime.*/cuda:GpuRuntimeSelection.*' 2>&1) || {
    echo "$out"; exit 1; }
  echo "$out"
  if grep -q '\[  SKIPPED \]' <<<"$out"; then
    echo "FAIL: the CUDA runtime tests skipped: this host's GPU is not usable (see the reason above)"; exit 1
  fi

  printf '\n==== device runtime on the simulated GPU (C++, the same contract) ====\n'
  "$BUILD/tests/cpp/gpu/dlslime_gpu_tests" --gtest_filter='Runtimes/DeviceRuntime.*/sim:SimGpu.*'

  printf '\n==== dlslime.testing on the GPU (Python) ====\n'
  PYTHONPATH="$PWD/$BUILD/python" "$PYTHON" -m pytest tests/python/test_gpu_sim.py -q -p no:cacheprovider -rs \
    -k "real_gpu or simulated" 2>&1 | tee "$OUT/pytest.txt"
  if grep -q SKIPPED "$OUT/pytest.txt"; then
    echo "FAIL: a real-GPU Python test skipped"; exit 1
  fi
fi

# dlslime-bench (docs/bench.md): every run verifies the bytes of its last batch per size and
# fails the script otherwise. TCP's host path and its GPU staging paths run back to back
# with the same sizes and options, so the summary compares them on this host, in this run.
BENCH=("$BUILD/bench/dlslime-bench" --progress none --quiet)
if [[ $SIM == 1 ]]; then
  SIZES=(--sizes 4K,64K,1M --batch 8 --iters 10 --warmup 2)
  NVSIZES=(--sizes 4K,1M,4M --batch 2 --iters 5 --warmup 1)
else
  SIZES=(--sizes 4K,64K,1M,16M --batch 16 --iters 30 --warmup 3)
  # The NVLink sizes of issue 13: 4 KiB, 1 MiB and 256 MiB, byte-exact.
  NVSIZES=(--sizes 4K,1M,256M --batch 2 --iters 10 --warmup 2)
fi
bench() {  # bench NAME ARGS...: one run, its table on stdout, its report in $OUT/NAME.json
  local name=$1; shift
  printf '\n---- dlslime-bench %s ----\n' "$*"
  "${BENCH[@]}" "$@" --json "$OUT/$name.json"
}
printf '\n==== dlslime-bench: TCP, host memory vs GPU staging (same run) ====\n'
for op in write read; do
  bench "tcp-$op-host" --op "$op" "${SIZES[@]}"
  bench "tcp-$op-gpu-both" --op "$op" --device-memory both "${SIZES[@]}"
  bench "tcp-$op-gpu-initiator" --op "$op" --device-memory initiator "${SIZES[@]}"
  bench "tcp-$op-gpu-target" --op "$op" --device-memory target "${SIZES[@]}"
done
bench "tcp-send-host" --op send "${SIZES[@]}"   # messages: GPU buffers staged as writes are
bench "tcp-send-gpu-both" --op send --device-memory both "${SIZES[@]}"
printf '\n==== dlslime-bench: NVLink (CUDA IPC, two processes) ====\n'
for op in write read; do
  bench "nvlink-$op" --transport nvlink --op "$op" "${NVSIZES[@]}"
done

printf '\n==== summary: average bandwidth (GB/s) ====\n'
"$PYTHON" - "$OUT" <<'PY' | tee "$OUT/summary.md"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def rows(name):
    doc = json.loads((out / f"{name}.json").read_text())
    assert doc["config"]["verified"], name
    return doc["config"], {r["msg_size"]: r["avg_bw_gbps"] for r in doc["rows"]}
def fmt(v):
    return "-" if v is None else f"{v:.2f}"
config, _ = rows("tcp-write-host")
runtime = config["memory"]["initiator"].get("runtime") or rows("tcp-write-gpu-both")[0]["memory"]["initiator"]["runtime"]
print(f"GPU runtime: {runtime}; host {config['hostname']}, {config['cpus']} CPUs, {config['date']}, "
      f"batch {config['batch']}, iters {config['iters']}, lanes {config['lanes']}, chunk_size {config['chunk_size']}")
if runtime == "sim":
    print("simulated GPU: these figures measure the code paths, not a GPU")
cols = ["host", "gpu-both", "gpu-initiator", "gpu-target"]
for op in ("write", "read"):
    data = {c: rows(f"tcp-{op}-{c}")[1] for c in cols}
    print(f"\nTCP {op} | " + " | ".join(cols))
    print("|".join(["---"] * (len(cols) + 1)))
    for size in data["host"]:
        print(f"{size} | " + " | ".join(fmt(data[c].get(size)) for c in cols))
print("\nNVLink | write | read")
print("---|---|---")
w, r = rows("nvlink-write")[1], rows("nvlink-read")[1]
for size in w:
    print(f"{size} | {fmt(w[size])} | {fmt(r.get(size))}")
PY
echo "reports: $OUT"
echo "GPU checks: ok"
