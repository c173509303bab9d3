"""dlslime.RDMAEndpoint from Python: on the strict simulated device (DLSLIME_RDMA_SIM=1, in a
child process so the variable is set before the library looks for devices) and, in this
process, without any RDMA device (a clear error, never a silent fallback)."""

import os
import subprocess
import sys
import textwrap

import pytest

import dlslime

pytestmark = pytest.mark.skipif(not hasattr(dlslime, "RDMAEndpoint"),
                                reason="RDMA transport not built (configure with -DBUILD_RDMA=ON)")

SIM_SCRIPT = textwrap.dedent(
    """
    import ctypes
    import dlslime

    assert dlslime.available_nic() == ["sim_rdma0"], dlslime.available_nic()
    a = dlslime.RDMAEndpoint(num_qp=2)
    b = dlslime.RDMAEndpoint(device_name="sim_rdma0", ib_port=1, link_type="RoCE", num_qp=2)
    assert isinstance(a, dlslime.Endpoint)
    info = a.endpoint_info()
    assert len(info["qp_info"] if "qp_info" in info else info["qps"]) == 2, info.keys()

    src = ctypes.create_string_buffer(bytes(range(256)) * 16)   # 4096 bytes
    dst = ctypes.create_string_buffer(8192)
    back = ctypes.create_string_buffer(4096)
    h_src = a.register_memory_region("src", ctypes.addressof(src), 0, 4096)
    h_back = a.register_memory_region("back", ctypes.addressof(back), 0, 4096)
    b.register_memory_region("dst", ctypes.addressof(dst), 0, 8192)
    a.connect(b.endpoint_info())
    b.connect(a.endpoint_info())
    h_dst = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"])
    assert "rkey" in b.endpoint_info()["mr_info"]["dst"]

    w = a.write([(h_src, h_dst, 100, 7, 1000)])
    assert w.wait() == 0, w.message
    assert dst.raw[100:1100] == src.raw[7:1007]
    r = a.read([(h_back, h_dst, 100, 0, 1000)])
    assert r.wait() == 0, r.message
    assert back.raw[:1000] == src.raw[7:1007]

    # Out of range fails that op alone; the next one works.
    bad = a.write([(h_src, h_dst, 8000, 0, 4096)])
    assert bad.wait() == int(dlslime.StatusCode.OUT_OF_BOUNDS), (bad.status, bad.message)
    assert a.write([(h_src, h_dst, 0, 0, 16)]).wait() == 0

    imm = b.imm_recv()
    wi = a.write_with_imm([(h_src, h_dst, 2000, 0, 64)], 0xBEEF, None)   # upstream's positional stream
    assert wi.wait() == 0, wi.message
    assert imm.wait() == 0, imm.message
    assert imm.imm_data() == 0xBEEF, imm.imm_data()
    assert dst.raw[2000:2064] == src.raw[:64]

    inbox = ctypes.create_string_buffer(64)
    rv = b.recv((ctypes.addressof(inbox), 0, 64))
    msg = ctypes.create_string_buffer(b"over rdma", 9)
    assert a.send((ctypes.addressof(msg), 0, 9)).wait() == 0
    assert rv.wait() == 0 and inbox.raw[: rv.nbytes] == b"over rdma"

    try:
        dlslime.RDMAEndpoint(num_qp=0)
    except ValueError as e:
        assert "num_qp" in str(e), e
    else:
        raise AssertionError("num_qp=0 was accepted")
    try:
        dlslime.RDMAEndpoint(no_such_option=1)
    except ValueError as e:
        assert "no_such_option" in str(e), e
    else:
        raise AssertionError("an unknown option was accepted")
    a.shutdown()
    b.shutdown()
    print("OK")
    """
)


def test_rdma_endpoint_on_the_simulated_device_moves_bytes_and_immediates():
    env = dict(os.environ, DLSLIME_RDMA_SIM="1")
    proc = subprocess.run([sys.executable, "-c", SIM_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr


def test_without_a_device_rdma_endpoint_raises_naming_the_missing_device():
    if os.environ.get("DLSLIME_RDMA_SIM"):
        pytest.fail("this test checks the no-device path: run it without DLSLIME_RDMA_SIM")
    if dlslime.available_nic():
        pytest.skip(f"this host has an RDMA NIC ({dlslime.available_nic()}): the no-device path cannot be checked")
    with pytest.raises(ConnectionError, match="RDMA device"):
        dlslime.RDMAEndpoint()
    rdma = [t for t in dlslime.available_transports() if t["name"] == "rdma"][0]
    assert not rdma["available"] and "device" in rdma["reason"], rdma


FORK_SCRIPT = textwrap.dedent(
    """
    import ctypes, os, signal, sys
    import dlslime

    def pair():
        a, b = dlslime.RDMAEndpoint(), dlslime.RDMAEndpoint()
        a.connect(b.endpoint_info()); b.connect(a.endpoint_info())
        return a, b

    def write(a, b, payload, tag):
        src = ctypes.create_string_buffer(payload, len(payload))
        dst = ctypes.create_string_buffer(len(payload))
        hs = a.register_memory_region("s" + tag, ctypes.addressof(src), 0, len(payload))
        b.register_memory_region("d" + tag, ctypes.addressof(dst), 0, len(payload))
        hd = a.register_remote_memory_region("d" + tag, b.endpoint_info()["mr_info"]["d" + tag])
        assert a.write([(hs, hd, 0, 0, len(payload))]).wait_for(10) == 0
        return dst.raw

    a, b = pair()
    assert write(a, b, b"parent" * 500, "p") == b"parent" * 500
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)  # a hang in the child ends it with SIGALRM, which the parent sees
        for call in (lambda: a.write([(0, 0, 0, 0, 8)]), lambda: a.register_memory_region("x", 1, 0, 8),
                     lambda: a.connect(b.endpoint_info())):
            try:
                call()
            except ConnectionError as e:
                assert "before fork()" in str(e), e
            else:
                raise AssertionError("the parent's endpoint was usable in the child")
        a.shutdown()  # returns at once and touches nothing of the parent's
        c, d = pair()  # the child's own device and endpoints work
        assert write(c, d, b"child" * 900, "c") == b"child" * 900
        c.shutdown(); d.shutdown()
        sys.exit(0)  # through interpreter exit: the inherited endpoints' destructors run
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"
    # The parent's connection is untouched by the child.
    assert write(a, b, b"after" * 800, "q") == b"after" * 800
    a.shutdown(); b.shutdown()
    print("OK")
    """
)


def test_a_forked_child_cannot_use_the_parents_rdma_endpoint_and_makes_its_own():
    # docs/api.md: an endpoint created before fork() raises ConnectionError in the child,
    # which makes its own; the child's simulated device is its own (review N8).
    env = dict(os.environ, DLSLIME_RDMA_SIM="1")
    proc = subprocess.run([sys.executable, "-c", FORK_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr
