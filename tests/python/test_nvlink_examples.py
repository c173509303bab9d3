"""The two-process NVLink PeerAgent example in examples/python, run as a user would run it,
on the simulated GPU (DLSLIME_GPU_SIM=1): two agents (an embedded NanoCtrl) in two
processes, transport="auto" choosing NVLink, bytes checked on both sides."""

import os
import subprocess
import sys

import pytest

import dlslime
from conftest import REPO

pytestmark = pytest.mark.skipif(not hasattr(dlslime, "NVLinkEndpoint"),
                                reason="NVLink transport not built (configure with -DBUILD_NVLINK=ON)")


def test_nvlink_peer_agent_example_runs_across_two_processes_and_verifies_bytes():
    path = os.path.join(REPO, "examples", "python", "p2p_nvlink_peer_agent.py")
    env = dict(os.environ, DLSLIME_GPU_SIM="1")
    proc = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("OK")
    assert "connected over nvlink: nvlink: both agents on host " in proc.stdout, proc.stdout
