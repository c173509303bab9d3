"""The two-process smoke tests in examples/python run as a user would run them."""

import os
import subprocess
import sys

import pytest

from conftest import REPO

EXAMPLES = [
    "p2p_tcp_rc_send_recv.py",
    "p2p_tcp_rc_write.py",
    "p2p_tcp_rc_read.py",
    # Two PeerAgents in two processes; each starts an embedded NanoCtrl unless
    # DLSLIME_CTRL_URL names one.
    "p2p_tcp_send_recv_peer_agent.py",
    "p2p_tcp_rc_write_peer_agent.py",
    "p2p_tcp_rc_read_peer_agent.py",
]


@pytest.mark.parametrize("script", EXAMPLES)
def test_example_runs_and_verifies_bytes(script):
    path = os.path.join(REPO, "examples", "python", script)
    proc = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("OK")
