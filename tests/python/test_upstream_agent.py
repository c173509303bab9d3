"""PeerAgent over RDMA and transport="auto" (on the simulated device, in a child process so
DLSLIME_RDMA_SIM=1 is set before the library looks for devices), auto without devices, and
NanoCtrl's topology for an agent not registered yet. Upstream DLSlime 0.1.23's PeerAgent and
NanoCtrlClient names and arguments are checked in test_upstream_api.py."""

import os
import textwrap

import pytest

import dlslime
from dlslime import PeerAgent
from dlslime.ctrl import NanoCtrlClient as UpstreamClient
from conftest import run_script

SIM_SCRIPT = textwrap.dedent(
    """
    import ctypes
    import dlslime
    from dlslime import PeerAgent, nanoctrl

    def wait_until(pred, timeout=10.0):
        import time
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, "condition not reached"
            time.sleep(0.005)

    with nanoctrl.serve(port=0) as url:
        a = PeerAgent(url, "ua_a")
        b = PeerAgent(nanoctrl_url=url, alias="ua_b", device=None, scope=None)
        src = ctypes.create_string_buffer(bytes(range(256)) * 64)  # 16 KiB
        dst = ctypes.create_string_buffer(len(src.raw))
        late = ctypes.create_string_buffer(4096)
        back = ctypes.create_string_buffer(4096)
        a.register_memory_region("src", ctypes.addressof(src), 0, len(src.raw))
        a.register_memory_region("back", ctypes.addressof(back), 0, 4096)
        b.register_memory_region("dst", ctypes.addressof(dst), 0, len(dst.raw))
        if not hasattr(dlslime, "RDMAEndpoint"):
            # No RDMA in this build: rdma keeps its clear error, auto picks tcp saying why.
            try:
                a.connect_to("ua_b", transport="rdma")
            except NotImplementedError as e:
                assert "rdma" in str(e), e
            else:
                raise AssertionError("rdma accepted without the transport")
            c = a.connect_to("ua_b", transport="auto").wait(10)
            assert c.transport == "tcp" and "(rdma: not available here (" in c.selection_reason, c.selection_reason
            print("OK")
            raise SystemExit(0)

        ca = a.connect_to("ua_b", transport="rdma", local_device="sim_rdma0", peer_device="sim_rdma0",
                          ib_port=1, qp_num=2).wait(10)
        wait_until(lambda: b.query_connection("ua_a") is not None and b.query_connection("ua_a").is_connected())
        cb = b.query_connection("ua_a")
        assert ca.transport == "rdma" and cb.transport == "rdma", (ca.transport, cb.transport)
        assert isinstance(ca.endpoint, dlslime.RDMAEndpoint), type(ca.endpoint)
        assert ca.selection_reason == "rdma: requested", ca.selection_reason
        assert ca.local_nic == "sim_rdma0" and ca.remote_nic == "sim_rdma0", (ca.local_nic, ca.remote_nic)
        assert ca.peer_endpoint_info["num_qp"] == 2

        # Named regions: from the handshake, and one registered later (its published record).
        assert a.write("ua_b", [("src", "dst", 0, 0, len(src.raw))]).wait() == 0
        assert dst.raw == src.raw
        b.register_memory_region("late", ctypes.addressof(late), 0, 4096)
        assert a.write("ua_b", ("src", "late", 0, 0, 4096)).wait() == 0
        assert late.raw == src.raw[:4096]
        assert a.read("ua_b", [("back", "late", 0, 0, 4096)]).wait() == 0
        assert back.raw == late.raw
        assert sorted(ca.sync_memory_regions()) == ["dst", "late"]
        info = a.get_mr_info("ua_b", "late")
        assert info["length"] == 4096 and info["endpoints"], info
        try:
            a.send("ua_b", (ctypes.addressof(src), 0, 8), local_nic="mlx5_9")
        except ConnectionError as e:
            assert "local_nic" in str(e), e
        else:
            raise AssertionError("a NIC filter that matches nothing was ignored")
        msg = ctypes.create_string_buffer(b"over rdma", 9)
        inbox = ctypes.create_string_buffer(32)
        rv = b.recv("ua_a", (ctypes.addressof(inbox), 0, 32), None)
        assert a.send("ua_b", (ctypes.addressof(msg), 0, 9), None).wait() == 0
        assert rv.wait() == 0 and inbox.raw[: rv.nbytes] == b"over rdma"

        # auto: both agents publish sim_rdma0 (RoCE).
        c = PeerAgent(url, "ua_c")
        cc = c.connect_to("ua_a", transport="auto").wait(10)
        assert cc.transport == "rdma", cc.selection_reason
        assert cc.selection_reason.startswith("rdma: both agents serve RoCE (sim_rdma0 here, sim_rdma0 on 'ua_a')"), cc.selection_reason
        try:
            PeerAgent(url, "ua_d", "mlx5_0")
        except ValueError as e:
            assert "mlx5_0" in str(e) and "sim_rdma0" in str(e), e
        else:
            raise AssertionError("an unknown device was accepted")
        for x in (c, a, b):
            x.shutdown()
    print("OK")
    """
)


def test_peer_agent_rdma_and_auto_on_the_simulated_device(tmp_path):
    run_script(tmp_path, SIM_SCRIPT, env={"DLSLIME_RDMA_SIM": "1"})


@pytest.fixture
def agent():
    made = []

    def make(*args, **kw):
        made.append(PeerAgent(*args, **kw))
        return made[-1]

    yield make
    for a in made:
        a.shutdown()


def test_auto_without_rdma_devices_picks_tcp_and_says_why(agent, ctrl_url, unique):
    if os.environ.get("DLSLIME_RDMA_SIM"):
        pytest.fail("this test checks the no-device path: run it without DLSLIME_RDMA_SIM")
    a = agent(ctrl_url=ctrl_url, alias=f"an_a_{unique}")
    b = agent(ctrl_url=ctrl_url, alias=f"an_b_{unique}")
    ca = a.connect_to(b.alias, transport="auto")
    ca.wait(10)
    assert ca.transport == "tcp"
    # The chosen transport's reason, then each one ranked above it with why it was passed over.
    assert ca.selection_reason.startswith("tcp: both agents serve it ("), ca.selection_reason
    assert "(rdma: not available here (no RDMA device" in ca.selection_reason, ca.selection_reason
    with pytest.raises(NotImplementedError, match="rdma"):
        a.connect_to(f"an_c_{unique}", transport="rdma")
    with pytest.raises(ValueError, match="device"):
        PeerAgent(ctrl_url=ctrl_url, alias=f"an_d_{unique}", device="mlx5_0")


def test_nanoctrl_topology_for_an_agent_not_registered_yet_and_redis_url(agent, ctrl_url, unique):
    client = UpstreamClient(ctrl_url)
    alias = f"tp_a_{unique}"
    reply = client.set_desired_topology(alias, target_peers=[f"tp_b_{unique}"], min_bw="100")
    assert reply["status"] == "ok", reply
    a = agent(ctrl_url=ctrl_url, alias=alias)  # registering keeps the spec set before it
    spec = dlslime.NanoCtrlClient(ctrl_url).get_desired_topology(a.alias)
    assert spec is not None and spec["target_peers"] == [f"tp_b_{unique}"], spec
    assert "pending" not in spec, spec
    redis = os.environ.get("DLSLIME_TEST_REDIS_URL")  # set by scripts/test.sh with its NanoCtrl
    if not os.environ.get("DLSLIME_TEST_CTRL_URL"):
        assert client.get_redis_url() is None  # the in-process NanoCtrl uses the memory store
    elif redis:
        url = client.get_redis_url()  # NanoCtrl on Redis hands out its address (and db)
        assert url is not None and url.startswith(redis), (url, redis)
