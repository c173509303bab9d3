"""AscendDirectEndpoint (docs/ascend.md) on the simulated HIXL: upstream's forms (init,
address-first registration, mr_info-first remote registration, named assignments), NPU
memory on both sides, notifications, option checks, and the two-process example; and, without
DLSLIME_ASCEND_SIM, the error that names what is missing. The variable is read on each call,
so tests set it for themselves (monkeypatch) and this process's other transports stay as
they are. The conformance suites cover the contract over ascend (scripts/test.sh)."""

import os
import subprocess
import sys

import pytest

import dlslime
from dlslime import testing
from conftest import REPO

AscendDirectEndpoint = getattr(dlslime, "AscendDirectEndpoint", None)
pytestmark = pytest.mark.skipif(AscendDirectEndpoint is None,
                                reason="Ascend transport not built (configure with -DBUILD_ASCEND=ON)")
OK = int(dlslime.StatusCode.SUCCESS)
OUT_OF_BOUNDS = int(dlslime.StatusCode.OUT_OF_BOUNDS)
DEADLINE = 20


def pattern(n, seed):
    return bytes((i * 131 + seed) & 0xFF for i in range(n))


@pytest.fixture
def sim(monkeypatch):
    monkeypatch.setenv("DLSLIME_ASCEND_SIM", "1")


def test_without_the_cann_runtime_or_the_variable_it_says_so(monkeypatch):
    monkeypatch.delenv("DLSLIME_ASCEND_SIM", raising=False)
    (ascend,) = [t for t in dlslime.available_transports() if t["name"] == "ascend"]
    assert ascend["built"]
    if ascend["available"]:
        pytest.skip("this host has the CANN runtime and an NPU")
    assert "DLSLIME_ASCEND_SIM" in ascend["reason"] and "CANN" in ascend["reason"], ascend["reason"]
    with pytest.raises(ConnectionError, match="DLSLIME_ASCEND_SIM"):
        AscendDirectEndpoint()
    with pytest.raises(NotImplementedError, match="DLSLIME_ASCEND_SIM"):
        dlslime.make_endpoint("ascend")
    with pytest.raises(ConnectionError, match="DLSLIME_ASCEND_SIM"):
        testing.npu_buffer(64)


def test_the_simulation_makes_it_available(sim):
    (ascend,) = [t for t in dlslime.available_transports() if t["name"] == "ascend"]
    assert ascend["available"] and ascend["reason"] == "" and ascend["devices"], ascend
    caps = AscendDirectEndpoint().capabilities()
    assert caps["read"] and caps["write"] and caps["notify"] and caps["host_memory"] and caps["device_memory"]
    assert not caps["send_recv"] and not caps["write_with_imm"]


def test_upstream_forms_move_npu_memory_both_ways_with_a_notification(sim):
    a, b = AscendDirectEndpoint(), AscendDirectEndpoint()
    a.init("127.0.0.1", 0)
    b.init("127.0.0.1", 0)
    assert a.engine_name.startswith("127.0.0.1:") and a.engine_name != b.engine_name
    src, dst = testing.npu_buffer(1 << 16), testing.npu_buffer(1 << 16)
    assert testing.pointer_type(src.ptr) == "npu"
    src.write(0, pattern(1 << 16, 7))
    dst.write(0, bytes(1 << 16))
    a.register_memory_region(src.ptr, 0, 1 << 16, "src")  # upstream: address first
    b.register_memory_region(dst.ptr, 0, 1 << 16, "dst")
    a.connect(b.endpoint_info())
    b.connect(a.endpoint_info())
    # upstream: the mr_info entry first; named items (local, remote, target_off, source_off, len)
    a.register_remote_memory_region(b.endpoint_info()["mr_info"]["dst"], "dst")
    f = a.write([("src", "dst", 100, 4096, 3000)], notify=b"kv ready")
    assert f.wait_for(DEADLINE) == OK, f.message
    n = b.recv_notify(timeout_ms=DEADLINE * 1000)
    assert n.wait_for(DEADLINE) == OK and n.notification() == b"kv ready"
    assert dst.read(100, 3000) == pattern(1 << 16, 7)[4096:7096]
    # a read back into a's memory, out of b's
    dst.write(0, pattern(8192, 9))
    f = a.read([("src", "dst", 0, 0, 8192)])
    assert f.wait_for(DEADLINE) == OK and f.nbytes == 8192
    assert src.read(0, 8192) == pattern(8192, 9)
    # a range past the remote region fails that op alone
    f = a.read([("src", "dst", (1 << 16) - 10, 0, 20)])
    assert f.wait_for(DEADLINE) == OUT_OF_BOUNDS
    with pytest.raises(NotImplementedError):
        a.write_with_imm([(0, 0, 0, 0, 8)], 1)
    for ep in (a, b):
        ep.shutdown()
    src.close()
    dst.close()


def test_a_large_binary_notification_arrives_whole(sim):
    a, b = AscendDirectEndpoint(), AscendDirectEndpoint()
    a.connect(b.endpoint_info())
    b.connect(a.endpoint_info())
    note = bytes(range(256)) * 16  # 4 KiB, NUL bytes included: several library notifies
    assert a.send_notify(note).wait_for(DEADLINE) == OK
    n = b.recv_notify(timeout_ms=DEADLINE * 1000)
    assert n.wait_for(DEADLINE) == OK and n.notification() == note
    a.shutdown()
    b.shutdown()


def test_options_are_checked_against_what_the_library_documents(sim):
    with pytest.raises(ValueError, match="unknown AscendDirectEndpoint option 'op_timeout'"):
        AscendDirectEndpoint(op_timeout=5)
    with pytest.raises(ValueError, match="RdmaServiceLevel='9'"):
        AscendDirectEndpoint(RdmaServiceLevel=9)
    with pytest.raises(ValueError, match="IPv4"):
        AscendDirectEndpoint(host="not-an-address")
    ep = AscendDirectEndpoint(RdmaTrafficClass=132, op_timeout_ms=1000)
    assert ep.options["RdmaTrafficClass"] == "132" and ep.options["op_timeout_ms"] == 1000
    buf = testing.npu_buffer(64)
    ep.register_memory_region("x", buf.ptr, 0, 64)
    with pytest.raises(ValueError, match="before registering memory"):
        ep.init("127.0.0.1", 0)
    ep.shutdown()


def test_a_peer_engine_nobody_serves_fails_connect_within_connect_timeout(sim):
    ep = AscendDirectEndpoint(connect_timeout_ms=300)
    dead = AscendDirectEndpoint()
    info = dead.endpoint_info()
    dead.shutdown()
    del dead
    with pytest.raises(ConnectionError, match="TIMEOUT"):
        ep.connect(info)
    ep.shutdown()


def test_example_p2p_ascend_runs_across_two_processes():
    path = os.path.join(REPO, "examples", "python", "p2p_ascend.py")
    env = dict(os.environ, DLSLIME_ASCEND_SIM="1")
    proc = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("OK")
