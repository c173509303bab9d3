#!/usr/bin/env bash
# The test command (README, .ci/run): installs what is missing, builds libdlslime with its
# GoogleTest suite, runs it (including a C++ app built against the installed package),
# pip-installs the Python package and runs the pytest suite. Any failure fails the run;
# pytest collecting no test at all is a failure too.
set -euo pipefail
cd "$(dirname "$0")/.."
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

step "Python tests (pytest)"
set +e
(cd "$ROOT" && "$PYTHON" -m pytest tests/python -v -p no:cacheprovider "$@")
rc=$?
set -e
if [ $rc -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit $rc
