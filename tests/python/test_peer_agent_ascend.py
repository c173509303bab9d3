"""PeerAgent over the ascend transport on the simulated HIXL (docs/ascend.md, "PeerAgent"):
connect_to(transport="ascend") and "auto" choosing it, between two agents of this process,
with NPU memory on both sides, moving bytes by name and a notification. The agent reaches the
transport through the registry's hooks alone (src/ascend/ascend_transport.cpp)."""

import pytest

import dlslime
from dlslime import testing

OK = 0
SIZE = 64 * 1024
PeerAgent = getattr(dlslime, "PeerAgent", None)
pytestmark = pytest.mark.skipif(PeerAgent is None or not hasattr(dlslime, "AscendDirectEndpoint"),
                                reason="PeerAgent or the Ascend transport not built")


def pattern(n, seed):
    return bytes(((i * 131 + seed) ^ (i >> 9)) & 0xFF for i in range(n))


@pytest.mark.parametrize("transport", ["ascend", "auto"])
def test_agents_move_npu_memory_over_ascend(monkeypatch, ctrl_url, unique, transport):
    monkeypatch.setenv("DLSLIME_ASCEND_SIM", "1")  # before the agents look at their transports
    a = PeerAgent(ctrl_url=ctrl_url, alias=f"asc_a_{unique}")
    b = PeerAgent(ctrl_url=ctrl_url, alias=f"asc_b_{unique}")
    bufs = []
    try:
        for agent, seed in ((a, 1), (b, 2)):
            buf = testing.npu_buffer(SIZE)
            buf.write(0, pattern(SIZE, seed))
            agent.register_memory_region("kv", buf.ptr, 0, SIZE)
            bufs.append(buf)
        conn_a = a.connect_to(f"asc_b_{unique}", transport=transport)
        conn_b = b.connect_to(f"asc_a_{unique}", transport=transport)
        conn_a.wait(30)
        conn_b.wait(30)
        assert conn_a.transport == "ascend", conn_a.selection_reason
        assert isinstance(conn_a.endpoint, dlslime.AscendDirectEndpoint)
        # a writes into b's NPU region and reads back from it, by name, at offsets.
        f = a.write(f"asc_b_{unique}", [("kv", "kv", 100, 7000, 5000)])
        assert f.wait() == OK, f.message
        assert bufs[1].read(7000, 5000) == pattern(SIZE, 1)[100:5100]
        f = a.read(f"asc_b_{unique}", [("kv", "kv", 40000, 20000, 4096)])
        assert f.wait() == OK, f.message
        assert bufs[0].read(40000, 4096) == pattern(SIZE, 2)[20000:24096]
        # a notification after a write reaches b once the bytes are in place.
        n = b.recv_notify(f"asc_a_{unique}", timeout_ms=20000)
        f = a.write(f"asc_b_{unique}", [("kv", "kv", 0, 0, 64)], notify=b"kv ready")
        assert f.wait() == OK, f.message
        assert n.wait() == OK and n.notification() == b"kv ready", n.message
    finally:
        a.shutdown()
        b.shutdown()
        for buf in bufs:
            buf.close()
