"""``python -m dlslime.bench``: run the ``dlslime-bench`` C++ program with the same arguments.

This is a launcher, not a benchmark: every measurement is made by the compiled program, so
Python and C++ users get the same numbers. See docs/bench.md for the options
(``python -m dlslime.bench --help``).

The binary is looked up in this order:

1. ``$DLSLIME_BENCH_BIN`` (an explicit choice, e.g. a build tree's ``bench/dlslime-bench``);
2. ``dlslime/bin/dlslime-bench`` inside this package (``pip install`` puts it there, and a
   build tree links it there);
3. a compiled ``dlslime-bench`` on ``PATH`` (not the console script of the same name, which
   runs this module).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import List, Optional

BINARY_NAME = "dlslime-bench"


def _package_dir() -> Path:
    # Not resolve(): in a build tree this file is a symlink into the source tree, and the
    # package (with bin/ and the extension module) is where the link is.
    return Path(os.path.abspath(__file__)).parent


def find_binary() -> Optional[str]:
    """Returns the path of the dlslime-bench executable, or None if there is none."""
    env = os.environ.get("DLSLIME_BENCH_BIN")
    if env:
        return env
    packaged = _package_dir() / "bin" / BINARY_NAME
    if packaged.is_file() and os.access(packaged, os.X_OK):
        return str(packaged)
    # On PATH, `dlslime-bench` may be the console script that runs this very module; exec'ing
    # it would loop. Only a compiled program will do.
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = shutil.which(BINARY_NAME, path=directory) if directory else None
        if candidate and _is_elf(candidate):
            return candidate
    return None


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _child_environment() -> dict:
    env = dict(os.environ)
    # --plot runs `python -m dlslime.bench_plot`: use this interpreter and this package.
    env.setdefault("DLSLIME_PYTHON", sys.executable)
    package_parent = str(_package_dir().parent)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if package_parent not in paths:
        env["PYTHONPATH"] = os.pathsep.join([package_parent] + paths)
    return env


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    binary = find_binary()
    if binary is None:
        sys.stderr.write(
            "dlslime.bench: cannot find the dlslime-bench program. It is installed with the package "
            "(dlslime/bin/dlslime-bench); for a build tree set DLSLIME_BENCH_BIN=<build>/bench/dlslime-bench.\n"
        )
        return 127
    if env_bin := os.environ.get("DLSLIME_BENCH_BIN"):
        if not (os.path.isfile(env_bin) and os.access(env_bin, os.X_OK)):
            sys.stderr.write(f"dlslime.bench: DLSLIME_BENCH_BIN={env_bin} is not an executable file\n")
            return 127
    sys.stdout.flush()
    sys.stderr.flush()
    # exec, not subprocess: signals (Ctrl-C), exit status and the terminal (progress bar)
    # belong to the benchmark itself.
    os.execve(binary, [binary] + args, _child_environment())
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
