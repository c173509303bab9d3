"""PeerAgent reaches transports through the registry (issue 11): connect_to validates the
transport, agents publish what they serve, and connect messages carry an incarnation."""

import pytest

import dlslime
from dlslime import PeerAgent, nanoctrl
from conftest import Buffer, wait_until
from nanoctrl_fixtures import http

OK = 0


@pytest.fixture
def agent():
    """Makes PeerAgents that are shut down after the test, also when it fails."""
    made = []

    def make(**kw):
        made.append(PeerAgent(**kw))
        return made[-1]

    yield make
    for a in made:
        a.shutdown()


def test_tcp_connection_is_byte_exact_and_accepts_the_rdma_keywords(agent, ctrl_url, unique):
    """The RDMA keywords stay accepted (DLSlime's signature) and do not disturb TCP."""
    a = agent(ctrl_url=ctrl_url, alias=f"tx_a_{unique}")
    b = agent(ctrl_url=ctrl_url, alias=f"tx_b_{unique}")
    src = Buffer(1 << 20, bytes(range(251)))
    dst = Buffer(1 << 20)
    a.register_memory_region("src", src.addr, 0, 1 << 20)
    b.register_memory_region("dst", dst.addr, 0, 1 << 20)
    ca = a.connect_to(b.alias, transport="tcp", ib_port=2, qp_num=4, local_device="mlx5_0", peer_device="mlx5_1")
    b.connect_to(a.alias, transport="tcp")
    ca.wait(10)
    assert ca.transport == "tcp"
    assert isinstance(ca.endpoint, dlslime.TcpEndpoint)
    assert a.write(b.alias, [("src", "dst", 0, 0, 1 << 20)]).wait_for(10) == OK
    assert dst.bytes() == src.bytes()


def test_unknown_transport_raises_value_error_naming_the_known_ones(agent, ctrl_url, unique):
    a = agent(ctrl_url=ctrl_url, alias=f"tu_a_{unique}")
    known = [t["name"] for t in dlslime.available_transports()]
    with pytest.raises(ValueError, match='unknown transport "bogus"') as e:
        a.connect_to(f"tu_b_{unique}", transport="bogus")
    for name in known:
        assert name in str(e.value)
    assert a.peers() == []


def test_unavailable_transport_raises_not_implemented_with_the_reason(agent, ctrl_url, unique):
    a = agent(ctrl_url=ctrl_url, alias=f"tr_a_{unique}")
    rdma = next(t for t in dlslime.available_transports() if t["name"] == "rdma")
    assert not rdma["available"] and rdma["reason"]
    with pytest.raises(NotImplementedError) as e:
        a.connect_to(f"tr_b_{unique}", transport="rdma", qp_num=2)
    assert f'transport "rdma" is not available here: {rdma["reason"]}' in str(e.value)
    assert "available here: tcp" in str(e.value)
    assert a.peers() == []


def test_agents_publish_the_transports_they_serve(agent, ctrl_url, unique):
    a = agent(ctrl_url=ctrl_url, alias=f"tp_a_{unique}")
    record = nanoctrl.NanoCtrlClient(ctrl_url).get_peer_agent(a.alias)
    published = record["metadata"]["transports"]
    available = [t for t in dlslime.available_transports() if t["available"]]
    assert [t["name"] for t in published] == [t["name"] for t in available]
    assert published[0] == {"name": "tcp", "devices": []}


def test_a_peer_that_does_not_serve_the_transport_fails_the_connection(agent, ctrl_url, unique):
    a = agent(ctrl_url=ctrl_url, alias=f"tn_a_{unique}")
    status, body = http(ctrl_url, "/start_peer_agent",
                        {"alias": f"tn_rdma_{unique}", "address": "127.0.0.1",
                         "metadata": {"transports": [{"name": "rdma", "devices": ["mlx5_0"]}]}})
    assert status == 200, body
    conn = a.connect_to(f"tn_rdma_{unique}", transport="tcp")
    with pytest.raises(ConnectionError, match=r'does not serve transport "tcp" \(it serves: rdma\)'):
        conn.wait(10)
    assert conn.state == "failed"


def test_connect_messages_without_a_valid_incarnation_are_rejected(agent, ctrl_url, unique):
    """Missing, mistyped or malformed incarnations are dropped without a crash and without a
    dial; a message with a valid one (from another sender) still makes its connection."""
    victim = agent(ctrl_url=ctrl_url, alias=f"ti_v_{unique}")
    target = dlslime.make_endpoint("tcp", ip="127.0.0.1")
    info = target.endpoint_info()
    bad = [None, 12345, "", "0123456789abcde", "0123456789ABCDEF", "zzzzzzzzzzzzzzzz", {"id": 1}]
    senders = [f"ti_bad{i}_{unique}" for i in range(len(bad))] + [f"ti_good_{unique}"]
    for s in senders:
        status, body = http(ctrl_url, "/start_peer_agent", {"alias": s, "address": "127.0.0.1"})
        assert status == 200, body
    for s, inc in zip(senders, bad + ["00000000000000a7"]):
        msg = {"type": "connect", "transport": "tcp", "conn_id": f"{s}#0", "have_peer_info": True,
               "endpoint_info": info}
        if inc is not None:
            msg["incarnation"] = inc
        status, body = http(ctrl_url, "/mailbox/post", {"to": victim.alias, "from": s, "message": msg})
        assert status == 200, body
    # The mailbox is read in order: once the good message made its connection, the bad ones
    # before it were handled.
    wait_until(lambda: senders[-1] in victim.peers(), 10, what="the valid connect message handled")
    assert victim.peers() == [senders[-1]]

    real = agent(ctrl_url=ctrl_url, alias=f"ti_r_{unique}")
    src, dst = Buffer(4096, b"\x6b"), Buffer(4096)
    victim.register_memory_region("dst", dst.addr, 0, 4096)
    real.register_memory_region("src", src.addr, 0, 4096)
    real.connect_to(victim.alias, transport="tcp").wait(10)
    assert real.write(victim.alias, [("src", "dst", 0, 0, 4096)]).wait_for(10) == OK
    assert dst.bytes() == src.bytes()
    target.shutdown()


def test_connect_attempts_in_progress_are_bounded(agent, ctrl_url, unique):
    """Hostile review N10: attempts towards registered agents that never answer each hold an
    endpoint; past max_connecting one fails at once with ConnectionError."""
    with pytest.raises(ValueError, match="max_connecting must be >= 1"):
        PeerAgent(ctrl_url=ctrl_url, alias=f"tb_zero_{unique}", max_connecting=0)
    with pytest.raises(TypeError, match="max_connecting must be an int"):
        PeerAgent(ctrl_url=ctrl_url, alias=f"tb_type_{unique}", max_connecting="2")
    a = agent(ctrl_url=ctrl_url, alias=f"tb_a_{unique}", max_connecting=2)
    ghosts = [f"tb_ghost{i}_{unique}" for i in range(3)]
    for g in ghosts:
        status, body = http(ctrl_url, "/start_peer_agent", {"alias": g, "address": "127.0.0.1"})
        assert status == 200, body
    held = [a.connect_to(g, transport="tcp") for g in ghosts[:2]]
    assert [c.state for c in held] == ["connecting", "connecting"]
    with pytest.raises(ConnectionError, match=r"2 connect_to\(\) attempts in progress, the most it allows"):
        a.connect_to(ghosts[2], transport="tcp")
    assert sorted(a.peers()) == sorted(ghosts[:2])


def test_a_malformed_peer_record_leaves_auto_on_tcp_with_no_json_error(agent, ctrl_url, unique):
    """Hostile review N9: transports entries of the wrong types are skipped, never a raw JSON
    type error from connect_to."""
    a = agent(ctrl_url=ctrl_url, alias=f"tm_a_{unique}")
    peer = f"tm_bad_{unique}"
    status, body = http(ctrl_url, "/start_peer_agent", {
        "alias": peer, "address": "127.0.0.1",
        "metadata": {"transports": [5, None, {"name": 7}, {"name": "tcp", "devices": []},
                                    {"name": "rdma", "devices": ["x"], "ports": [{"device": "x", "ib_port": "1",
                                                                                 "link_layer": "Ethernet"}]}]}})
    assert status == 200, body
    conn = a.connect_to(peer, transport="auto")
    assert conn.transport == "tcp"
    assert conn.state == "connecting"
