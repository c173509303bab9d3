"""The main job's program runs end to end on a tiny configuration and verifies its bytes."""

import subprocess
import sys


def test_demo_runs_two_agents_and_prints_a_verified_table():
    proc = subprocess.run(
        [sys.executable, "-m", "dlslime.demo", "--sizes", "4096,65536", "--batch", "4", "--iters", "3"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "embedded" in proc.stdout
    assert proc.stdout.count("verified") >= 2  # both read rows, plus the closing line
    assert "all transfers verified" in proc.stdout
    for op in ("write", "read"):
        assert f"| {op} |" in proc.stdout.replace("|  read |", "| read |")


def test_demo_rejects_bad_arguments():
    proc = subprocess.run([sys.executable, "-m", "dlslime.demo", "--sizes", "abc"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "--sizes" in proc.stderr
