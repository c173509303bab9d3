"""Upstream DLSlime 0.1.23's PeerAgent and NanoCtrlClient names and arguments (issue 14's
list; docs/upstream-compat.md), byte-exact: on TCP here, and on RDMA on the simulated
device in a child process (DLSLIME_RDMA_SIM=1 must be set before the library looks for
devices). The endpoint-level names and the two-process upstream scripts are in
test_upstream_compat.py; RDMA transport selection ("auto") in test_upstream_agent.py."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

import dlslime
from dlslime import PeerAgent
from conftest import Buffer, wait_until

OK = 0

# upstream dlslime 0.1.23, peer_agent/_agent.py: PeerAgent.connect_to's parameters in order.
UPSTREAM_CONNECT_TO = ["peer_alias", "local_device", "peer_device", "ib_port", "qp_num", "min_bw", "transport",
                       "local_host", "local_port"]


@pytest.fixture
def agent():
    made = []

    def make(*args, **kw):
        made.append(PeerAgent(*args, **kw))
        return made[-1]

    yield make
    for a in made:
        a.shutdown()


def parameters(doc):
    """The parameter names of a pybind11 signature line `name(self: ..., a: T = d, ...)`."""
    inside = doc.split("(", 1)[1].split(") ->", 1)[0]
    names = re.findall(r"(?:^|, )(\w+):", inside)
    return [n for n in names if n != "self"]


def test_connect_to_takes_upstreams_positional_order(agent, ctrl_url, unique):
    assert parameters(PeerAgent.connect_to.__doc__) == UPSTREAM_CONNECT_TO, PeerAgent.connect_to.__doc__
    a = agent(ctrl_url, f"po_a_{unique}")
    b = agent(ctrl_url, f"po_b_{unique}")
    src = Buffer(4096, b"positional")
    dst = Buffer(4096)
    a.register_memory_region("src", src.addr, 0, 4096)
    b.register_memory_region("dst", dst.addr, 0, 4096)
    # Every argument by position, as upstream's signature orders them.
    ca = a.connect_to(b.alias, None, None, 1, 1, "10", "tcp", None, 0)
    cb = b.connect_to(a.alias, transport="tcp", local_host="127.0.0.1", min_bw=5)  # keywords still work
    ca.wait(10)
    cb.wait(10)
    assert ca.transport == "tcp" and ca.selection_reason == "tcp: requested"
    assert a.write(b.alias, [("src", "dst", 0, 0, 4096)]).wait() == OK
    assert dst.bytes() == src.bytes()
    # This package's earlier order put the transport second: now a clear error, not an
    # RDMA device called "tcp".
    with pytest.raises(ValueError, match='transport="tcp"'):
        a.connect_to(b.alias, "tcp")
    with pytest.raises(ValueError, match="min_bw"):
        a.connect_to(b.alias, None, None, 1, 1, "fast", "tcp")
    with pytest.raises(TypeError):
        a.connect_to(b.alias, None, None, "one", 1, None, "tcp")


def test_upstream_peer_agent_names_on_tcp(agent, ctrl_url, unique):
    # Upstream's positional order: (nanoctrl_url, alias, device, scope).
    a = agent(ctrl_url, f"up_a_{unique}", None, f"s{unique}")
    b = agent(nanoctrl_url=ctrl_url, alias=f"up_b_{unique}", device=None, scope=f"s{unique}")
    assert a.scope == f"s{unique}"
    src = Buffer(8192, bytes(range(199)))
    dst = Buffer(8192)
    a.register_memory_region("src", src.addr, 0, 8192)
    b.register_memory_region("dst", dst.addr, 0, 8192)
    assert a.list_agents() == sorted([a.alias, b.alias])
    assert a.list_mem_keys() == ["src"]
    assert a.list_mem_keys(b.alias) == ["dst"]
    assert a.list_mem_keys("nobody") == []
    assert a.get_mr_info(b.alias, "dst")["length"] == 8192
    assert a.get_mr_info(peer_alias=b.alias, mr_name="nope") is None
    res = a.get_resource()
    assert res["schema_version"] == 1 and res["memory_keys"] == ["src"], res
    assert res["host"]["address"] and res["transports"][0]["name"] == "tcp", res
    assert a.get_resource("nobody") is None

    ca = a.connect_to(b.alias, transport="tcp").wait(10)
    b.connect_to(a.alias, transport="tcp").wait(10)
    assert ca.selection_reason == "tcp: requested"
    assert ca.local_nic is None and ca.remote_nic is None
    conns = a.get_connections()
    assert list(conns) == [b.alias] and list(conns[b.alias]) == [ca.conn_id], conns
    assert a.query_connection(b.alias, local_nic=None, remote_nic=None).conn_id == ca.conn_id
    assert a.query_connection(b.alias, local_nic="mlx5_0") is None
    assert a.write(b.alias, [("src", "dst", 0, 0, 8192)], None, local_nic=None, remote_nic=None).wait() == OK
    assert dst.bytes() == src.bytes()
    late = Buffer(64)
    b.register_memory_region("late", late.addr, 0, 64)
    assert sorted(ca.sync_memory_regions()) == ["dst", "late"]
    assert sorted(a.sync_memory_regions(b.alias)) == ["dst", "late"]
    with pytest.raises(ConnectionError, match="remote_nic"):
        a.send(b.alias, (src.addr, 0, 8), remote_nic="mlx5_1")
    assert a.unregister_memory_region("src") is True
    assert a.unregister_memory_region("src") is False


def test_nanoctrl_client_heartbeat_thread_reports_not_found(ctrl_url, unique):
    from dlslime.ctrl import NanoCtrlClient
    from nanoctrl_fixtures import http

    c = NanoCtrlClient(ctrl_url)
    assert c.register(f"{unique}-hb", "cache") is True
    lost = []
    c.start_heartbeat(interval=0.02, on_not_found=lambda: lost.append(True), name="test-hb")
    status, body = http(ctrl_url, "/unregister", {"entity_id": f"{unique}-hb"})  # NanoCtrl forgets it
    assert status == 200, body
    wait_until(lambda: lost, what="on_not_found")
    c.stop_heartbeat(timeout=2.0)
    c.stop()
    with pytest.raises(ValueError):
        c.start_heartbeat(interval=0)


SIM_SCRIPT = textwrap.dedent(
    """
    import ctypes
    import time
    import dlslime
    from dlslime import PeerAgent, nanoctrl

    def wait_until(pred, timeout=10.0):
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, "condition not reached"
            time.sleep(0.005)

    with nanoctrl.serve(port=0) as url:
        a = PeerAgent(url, "ur_a", "sim_rdma0")
        b = PeerAgent(nanoctrl_url=url, alias="ur_b", device="sim_rdma0", scope=None)
        src = ctypes.create_string_buffer(bytes(range(256)) * 64)  # 16 KiB
        dst = ctypes.create_string_buffer(len(src.raw))
        back = ctypes.create_string_buffer(4096)
        a.register_memory_region("src", ctypes.addressof(src), 0, len(src.raw))
        a.register_memory_region("back", ctypes.addressof(back), 0, 4096)
        b.register_memory_region("dst", ctypes.addressof(dst), 0, len(dst.raw))

        # Upstream's positional order: (peer_alias, local_device, peer_device, ib_port, qp_num,
        # min_bw, transport).
        ca = a.connect_to("ur_b", "sim_rdma0", "sim_rdma0", 1, 2, None, "rdma").wait(10)
        wait_until(lambda: b.query_connection("ur_a") is not None and b.query_connection("ur_a").is_connected())
        cb = b.query_connection("ur_a", local_nic="sim_rdma0", remote_nic="sim_rdma0")
        assert cb is not None and cb.transport == "rdma"
        assert ca.local_nic == "sim_rdma0" and ca.remote_nic == "sim_rdma0" and ca.selection_reason == "rdma: requested"
        assert ca.peer_endpoint_info["num_qp"] == 2
        nics = dict(local_nic="sim_rdma0", remote_nic="sim_rdma0")

        # I/O in upstream's forms: stream positional, peer_alias=/assign=, the NIC filters.
        assert a.write("ur_b", [("src", "dst", 0, 0, len(src.raw))], None, **nics).wait() == 0
        assert dst.raw == src.raw
        assert a.read(peer_alias="ur_b", assign=("back", "dst", 0, 4096, 4096), stream=None, **nics).wait() == 0
        assert back.raw == src.raw[4096:8192]
        imm = b.imm_recv("ur_a", None, **nics)
        handle = ca.endpoint.mr_info()["src"]["handle"]
        remote = ca.endpoint.register_remote_memory_region("dst", ca.peer_endpoint_info["mr_info"]["dst"])
        ctypes.memset(ctypes.addressof(dst), 0, 64)
        assert a.write_with_imm(peer_alias="ur_b", assign=[(handle, remote, 0, 0, 64)], imm_data=7, stream=None,
                                **nics).wait() == 0
        assert imm.wait() == 0 and imm.imm_data() == 7 and dst.raw[:64] == src.raw[:64]
        msg = ctypes.create_string_buffer(b"upstream send", 13)
        inbox = ctypes.create_string_buffer(32)
        rv = b.recv(peer_alias="ur_a", chunk=(ctypes.addressof(inbox), 0, 32), stream=None, **nics)
        assert a.send("ur_b", (ctypes.addressof(msg), 0, 13), None, **nics).wait() == 0
        assert rv.wait() == 0 and inbox.raw[: rv.nbytes] == b"upstream send"
        assert sorted(ca.sync_memory_regions()) == ["dst"]
        assert a.get_resource("ur_b")["nics"] == [
            {"name": "sim_rdma0", "device": "sim_rdma0", "ib_port": 1, "link_type": "RoCE"}]

        # A second connection to the same peer, on another pair (TCP: no NICs): get_connections
        # lists both, query_connection without filters gives the first made (upstream's),
        # and I/O without filters refuses to guess, naming both.
        ct = a.connect_to("ur_b", transport="tcp").wait(10)
        assert ct.conn_id != ca.conn_id and ct.local_nic is None
        conns = a.get_connections()
        assert sorted(conns["ur_b"]) == sorted([ca.conn_id, ct.conn_id]), conns
        assert a.query_connection("ur_b").conn_id == ca.conn_id
        assert a.query_connection("ur_b", local_nic="sim_rdma0").conn_id == ca.conn_id
        try:
            a.write("ur_b", [("src", "dst", 0, 0, 64)])
        except ValueError as e:
            assert "local_nic='sim_rdma0' remote_nic='sim_rdma0'" in str(e) and "local_nic=None" in str(e), e
        else:
            raise AssertionError("an ambiguous write was accepted")
        ctypes.memset(ctypes.addressof(dst), 0, len(dst.raw))
        assert a.write("ur_b", [("src", "dst", 0, 0, len(src.raw))], local_nic="sim_rdma0").wait() == 0
        assert dst.raw == src.raw
        assert a.connect_to("ur_b", "sim_rdma0", None, 1, 2, None, "rdma").conn_id == ca.conn_id  # the live one
        for x in (a, b):
            x.shutdown()
    print("OK")
    """
)


def test_upstream_peer_agent_names_on_rdma_on_the_simulated_device(agent, ctrl_url, unique):
    if not hasattr(dlslime, "RDMAEndpoint"):
        # A build without RDMA: upstream's RDMA call keeps its clear error.
        a = agent(ctrl_url, f"nr_a_{unique}")
        with pytest.raises(NotImplementedError, match="rdma"):
            a.connect_to(f"nr_b_{unique}", "sim_rdma0", "sim_rdma0", 1, 2, None, "rdma")
        return
    env = dict(os.environ, DLSLIME_RDMA_SIM="1")
    proc = subprocess.run([sys.executable, "-c", SIM_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr
