#!/usr/bin/env bash
# Installs everything DLSlime needs to build, test and benchmark on a fresh Debian/Ubuntu
# machine: system packages through apt-get, Python packages through pip. Idempotent and
# quick when everything is already there.
set -euo pipefail

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libasio-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libgtest-dev libcpp-httplib-dev libhiredis-dev libssl-dev
  redis-server redis-tools iperf3 procps iproute2 util-linux ucx-utils nftables
  clang libclang-rt-14-dev
  libibverbs-dev
)
PIP_PACKAGES=(
  "scikit-build-core>=0.8" "pybind11>=2.10" "pytest>=7" "pytest-timeout>=2" "numpy" "matplotlib"
)

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[deps] apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" - "${PIP_PACKAGES[@]}" <<'PY'
import sys
from importlib.metadata import version, PackageNotFoundError
import re
for spec in sys.argv[1:]:
    name = re.split(r"[<>=]", spec)[0]
    try:
        version(name)
    except PackageNotFoundError:
        sys.exit(1)
PY
then
  echo "[deps] pip install ${PIP_PACKAGES[*]}"
  "$PYTHON" -m pip install -q "${PIP_PACKAGES[@]}"
fi
echo "[deps] ok"
