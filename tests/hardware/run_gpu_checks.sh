#!/usr/bin/env bash
# Every GPU test on a host with a GPU (docs/nvlink.md, "Checking on a GPU"): builds the
# project with the CUDA runtime and runs the device-runtime tests and dlslime.testing on the
# real GPU, where they must run, not skip. A few minutes. CI runs the same tests on the
# simulated GPU (DLSLIME_GPU_SIM=1) instead.
#   tests/hardware/run_gpu_checks.sh            # build dir: build/gpu-hw (GPU_CHECKS_BUILD_DIR)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
BUILD=${GPU_CHECKS_BUILD_DIR:-build/gpu-hw}
JOBS=${JOBS:-$(nproc)}
unset DLSLIME_GPU_SIM

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || \
  echo "nvidia-smi not found: the checks below say whether the CUDA runtime sees a GPU"

printf '\n==== build (BUILD_CUDA=ON) ====\n'
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTS=ON -DBUILD_CUDA=ON -DBUILD_PYTHON=ON \
  -Dpybind11_DIR="$("$PYTHON" -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
  -DPython_EXECUTABLE="$(command -v "$PYTHON")" >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target dlslime_gpu_tests _dlslime

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
  -k "real_gpu or simulated" 2>&1 | tee /tmp/gpu_checks_py.$$
if grep -q SKIPPED /tmp/gpu_checks_py.$$; then
  rm -f /tmp/gpu_checks_py.$$; echo "FAIL: a real-GPU Python test skipped"; exit 1
fi
rm -f /tmp/gpu_checks_py.$$
echo "GPU checks: ok"
