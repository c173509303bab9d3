"""The two-process RDMA examples in examples/python, run as a user would run them, on the
simulated device (DLSLIME_RDMA_SIM=1): two processes, each with its own sim_rdma0, moving
bytes between each other across the process boundary (docs/rdma.md, "Across processes")."""

import os
import subprocess
import sys

import pytest

import dlslime
from conftest import REPO

pytestmark = pytest.mark.skipif(not hasattr(dlslime, "RDMAEndpoint"),
                                reason="RDMA transport not built (configure with -DBUILD_RDMA=ON)")

EXAMPLES = [
    "p2p_rdma_rc_read.py",
    "p2p_rdma_rc_write.py",
    "p2p_rdma_rc_write_with_imm_data.py",
    "p2p_rdma_rc_send_recv.py",
    "p2p_rdma_rc_write_peer_agent.py",  # two PeerAgents (an embedded NanoCtrl), transport="rdma"
]


@pytest.mark.parametrize("script", EXAMPLES)
def test_rdma_example_runs_across_two_processes_and_verifies_bytes(script):
    path = os.path.join(REPO, "examples", "python", script)
    env = dict(os.environ, DLSLIME_RDMA_SIM="1")
    proc = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("OK")
