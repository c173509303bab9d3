"""PeerAgent over TCP: the seed guide's "TCP through PeerAgent" snippets and beyond."""

import ctypes
import threading
import time

import numpy as np
import pytest

import dlslime
from dlslime import PeerAgent
from conftest import Buffer, wait_until

OK = 0
PEER_CLOSED = 407
CANCELLED = 406
TIMEOUT = int(dlslime.StatusCode.TIMEOUT)


def agent_pair(ctrl_url, unique, **kw):
    a = PeerAgent(ctrl_url=ctrl_url, alias=f"tcp_a_{unique}", **kw)
    b = PeerAgent(ctrl_url=ctrl_url, alias=f"tcp_b_{unique}", **kw)
    return a, b


def test_seed_snippet_send_recv(ctrl_url, unique):
    agent_a = PeerAgent(ctrl_url=ctrl_url, alias=f"tcp_a_{unique}")
    agent_b = PeerAgent(ctrl_url=ctrl_url, alias=f"tcp_b_{unique}")

    conn_a = agent_a.connect_to(f"tcp_b_{unique}", transport="tcp")
    conn_b = agent_b.connect_to(f"tcp_a_{unique}", transport="tcp")
    conn_a.wait()
    conn_b.wait()

    buf_a = Buffer(64, b"hello")
    buf_b = Buffer(64)
    addr_a, addr_b = buf_a.addr, buf_b.addr
    # Two-sided I/O works through the same agent facade as RDMA:
    agent_a.send(f"tcp_b_{unique}", (addr_a, 0, 5)).wait()
    fut = agent_b.recv(f"tcp_a_{unique}", (addr_b, 0, 5))
    assert fut.wait_for(10) == OK and buf_b.bytes(0, 5) == b"hello"
    assert conn_a.is_connected() and conn_b.is_connected()
    assert conn_a.state == "connected" and conn_a.peer_alias == f"tcp_b_{unique}"
    agent_a.shutdown()
    agent_b.shutdown()


def test_seed_snippet_one_sided_write_through_the_endpoint(ctrl_url, unique):
    agent_a, agent_b = agent_pair(ctrl_url, unique)
    src, dst = Buffer(64, b"w"), Buffer(64)
    addr_a, addr_b = src.addr, dst.addr
    agent_a.register_memory_region("buf_a", addr_a, 0, 64)
    agent_b.register_memory_region("buf_b", addr_b, 0, 64)

    conn_a = agent_a.connect_to(f"tcp_b_{unique}", transport="tcp")
    agent_b.connect_to(f"tcp_a_{unique}", transport="tcp")
    conn_a.wait()

    ep_a = conn_a.endpoint                       # TcpEndpoint
    peer_info = conn_a.peer_endpoint_info        # set by mailbox post-handshake
    h_local = ep_a.register_memory_region("buf_a_loc", addr_a, 0, 64)
    h_remote = ep_a.register_remote_memory_region(
        "buf_b_rem", peer_info["mr_info"]["buf_b"]
    )
    ep_a.write([(h_local, h_remote, 0, 0, 32)]).wait()

    assert isinstance(ep_a, dlslime.TcpEndpoint)
    assert dst.bytes(0, 32) == b"w" * 32 and dst.bytes(32) == bytes(32)
    agent_a.shutdown()
    agent_b.shutdown()


def test_one_sided_read_and_write_by_handle(ctrl_url, unique):
    agent_a, agent_b = agent_pair(ctrl_url, unique)
    local, remote = Buffer(4096), Buffer(4096, bytes(range(256)))
    h_local = agent_a.register_memory_region("local", local.addr, 0, 4096)
    agent_b.register_memory_region("remote", remote.addr, 0, 4096)
    conn = agent_a.connect_to(f"tcp_b_{unique}", transport="tcp")
    agent_b.connect_to(f"tcp_a_{unique}", transport="tcp").wait(10)
    conn.wait(10)
    h_remote = conn.endpoint.register_remote_memory_region("remote", conn.peer_endpoint_info["mr_info"]["remote"])
    # Agent regions are the endpoint's regions: the agent handle works on the endpoint.
    fut = agent_a.read(f"tcp_b_{unique}", [(h_local, h_remote, 100, 0, 200)])
    assert fut.wait_for(10) == OK and local.bytes(0, 200) == remote.bytes(100, 300)
    local.set(b"written-by-a", 1000)
    fut = agent_a.write(f"tcp_b_{unique}", [(h_local, h_remote, 3000, 1000, 12)])
    assert fut.wait_for(10) == OK and remote.bytes(3000, 3012) == b"written-by-a"
    agent_a.shutdown()
    agent_b.shutdown()


def test_named_regions_work_on_tcp(ctrl_url, unique):
    agent_a, agent_b = agent_pair(ctrl_url, unique)
    kv_a, kv_b = Buffer(1024), Buffer(1024, bytes(range(256)))
    agent_a.register_memory_region("kv", kv_a.addr, 0, 1024)
    agent_b.register_memory_region("kv", kv_b.addr, 0, 1024)
    peer = f"tcp_b_{unique}"
    conn = agent_a.connect_to(peer, transport="tcp")
    agent_b.connect_to(f"tcp_a_{unique}", transport="tcp")
    conn.wait(10)
    # ("name", local_off, remote_off, length): LOCAL offset first.
    assert agent_a.read(peer, [("kv", 8, 16, 32)]).wait_for(10) == OK
    assert kv_a.bytes(8, 40) == kv_b.bytes(16, 48)
    assert agent_a.read(peer, ("kv", 100, 200, 10)).wait_for(10) == OK  # a single tuple
    assert kv_a.bytes(100, 110) == kv_b.bytes(200, 210)
    # A region registered after the handshake is found through NanoCtrl; 5-name form.
    extra = Buffer(256)
    agent_b.register_memory_region("extra", extra.addr, 0, 256)
    kv_a.set(b"five-name", 500)
    assert agent_a.write(peer, [("kv", "extra", 500, 7, 9)]).wait_for(10) == OK
    assert extra.bytes(7, 16) == b"five-name"
    agent_a.shutdown()
    agent_b.shutdown()


def test_every_agent_op_takes_a_deadline_and_a_timed_out_recv_consumes_nothing(ctrl_url, unique):
    # Issue 24, "Deadlines on every op": PeerAgent's ops take timeout_ms as the endpoints'
    # do; a recv that times out takes no message, and the next recv gets the next one.
    agent_a, agent_b = agent_pair(ctrl_url, unique)
    a, b = f"tcp_a_{unique}", f"tcp_b_{unique}"
    kv_a, kv_b = Buffer(256, b"x"), Buffer(256)
    agent_a.register_memory_region("kv", kv_a.addr, 0, 256)
    agent_b.register_memory_region("kv", kv_b.addr, 0, 256)
    conn = agent_a.connect_to(b, transport="tcp")
    agent_b.connect_to(a, transport="tcp").wait(10)
    conn.wait(10)
    box = Buffer(16)
    started = time.monotonic()
    timed_out = agent_b.recv(a, (box.addr, 0, 16), timeout_ms=200)
    assert timed_out.wait_for(10) == TIMEOUT, timed_out.message
    assert 0.15 < time.monotonic() - started < 5
    second = agent_b.recv(a, (box.addr, 0, 16), timeout_ms=10_000, exact_size=True)
    assert agent_a.send(b, (Buffer(16, b"late-message!!!!").addr, 0, 16), timeout_ms=5000).wait_for(10) == OK
    assert second.wait_for(10) == OK and box.bytes(0, 16) == b"late-message!!!!"
    # Named and handle ops take it too; a bad one is a TypeError naming it.
    assert agent_a.write(b, [("kv", 0, 0, 64)], timeout_ms=5000).wait_for(10) == OK
    assert kv_b.bytes(0, 64) == kv_a.bytes(0, 64)
    assert agent_a.read(b, ("kv", 64, 0, 8), timeout_ms=5000).wait_for(10) == OK
    with pytest.raises(TypeError, match="timeout_ms"):
        agent_a.send(b, (box.addr, 0, 16), timeout_ms="1")
    with pytest.raises(NotImplementedError):
        agent_b.imm_recv(a, timeout_ms=50)
    agent_a.shutdown()
    agent_b.shutdown()


def test_imm_operations_raise_not_implemented_on_tcp(ctrl_url, unique):
    agent_a, agent_b = agent_pair(ctrl_url, unique)
    conn = agent_a.connect_to(f"tcp_b_{unique}", transport="tcp")
    agent_b.connect_to(f"tcp_a_{unique}", transport="tcp")
    conn.wait(10)
    # The error points at the completion signal TCP has: notifications.
    with pytest.raises(NotImplementedError, match="notify"):
        agent_a.write_with_imm(f"tcp_b_{unique}", [(0, 0, 0, 0, 8)], 1)
    with pytest.raises(NotImplementedError):
        agent_a.imm_recv(f"tcp_b_{unique}")
    agent_a.shutdown()
    agent_b.shutdown()


def test_notifications_through_the_agent_follow_the_writes_they_ride_on(ctrl_url, unique):
    # Issue 24, "Notifications": PeerAgent has write(notify=), send_notify and recv_notify,
    # peer alias first; a named write resolved again still delivers its notification once.
    agent_a, agent_b = agent_pair(ctrl_url, unique)
    a, b = f"tcp_a_{unique}", f"tcp_b_{unique}"
    kv_a, kv_b = Buffer(4096, b"n"), Buffer(4096)
    agent_a.register_memory_region("kv", kv_a.addr, 0, 4096)
    agent_b.register_memory_region("kv", kv_b.addr, 0, 4096)
    conn = agent_a.connect_to(b, transport="tcp")
    agent_b.connect_to(a, transport="tcp").wait(10)
    conn.wait(10)
    seen = []
    got = agent_b.recv_notify(a, timeout_ms=10_000)
    got.on_complete(lambda f: seen.append(kv_b.bytes(0, 4096)))
    assert agent_a.write(b, [("kv", 0, 0, 4096)], notify=b"layer-0").wait_for(10) == OK
    assert got.wait_for(10) == OK, got.message
    assert got.notification() == b"layer-0"
    wait_until(lambda: seen, what="the recv_notify continuation")
    assert seen[0] == kv_a.bytes(0, 4096), "the notification arrived before the bytes"
    # The peer registers "kv" again (a new handle): the named write resolves again, and
    # its notification arrives once.
    kv_b2 = Buffer(4096)
    agent_b.register_memory_region("kv", kv_b2.addr, 0, 4096)
    assert agent_a.write(b, [("kv", 0, 0, 4096)], notify=b"layer-1").wait_for(10) == OK
    assert agent_a.send_notify(b, b"done").wait_for(10) == OK
    first, second = agent_b.recv_notify(a, timeout_ms=10_000), agent_b.recv_notify(a, timeout_ms=10_000)
    assert first.wait_for(10) == OK and first.notification() == b"layer-1"
    assert kv_b2.bytes(0, 4096) == kv_a.bytes(0, 4096)
    assert second.wait_for(10) == OK and second.notification() == b"done"
    extra = agent_b.recv_notify(a, timeout_ms=200)
    assert extra.wait_for(10) == TIMEOUT, "a notification was delivered twice"
    with pytest.raises(ValueError, match="4096"):
        agent_a.send_notify(b, bytes(4097))
    with pytest.raises(TypeError, match="notify"):
        agent_a.write(b, [("kv", 0, 0, 8)], notify="text")
    agent_a.shutdown()
    agent_b.shutdown()


@pytest.mark.parametrize("order", ["a_then_b", "b_then_a", "concurrent", "only_a"])
def test_connect_orders(ctrl_url, unique, order):
    agent_a, agent_b = agent_pair(ctrl_url, unique)
    a, b = f"tcp_a_{unique}", f"tcp_b_{unique}"
    if order == "a_then_b":
        ca = agent_a.connect_to(b, transport="tcp")
        cb = agent_b.connect_to(a, transport="tcp")
    elif order == "b_then_a":
        cb = agent_b.connect_to(a, transport="tcp")
        ca = agent_a.connect_to(b, transport="tcp")
    elif order == "concurrent":
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("cb", agent_b.connect_to(a, transport="tcp")))
        t.start()
        ca = agent_a.connect_to(b, transport="tcp")
        t.join(30)
        cb = out["cb"]
    else:  # B never calls connect_to: the handshake makes its side of the connection
        ca = agent_a.connect_to(b, transport="tcp")
        ca.wait(10)
        cb = wait_until(lambda: agent_b.connection(a), 10, what="b's mirror connection")
    ca.wait(10)
    cb.wait(10)
    msg, box = Buffer(4, b"ping"), Buffer(8)
    rv = agent_b.recv(a, (box.addr, 0, 8))
    assert agent_a.send(b, (msg.addr, 0, 4)).wait_for(10) == OK
    assert rv.wait_for(10) == OK and box.bytes(0, 4) == b"ping"
    rv = agent_a.recv(b, (box.addr, 0, 8))
    assert agent_b.send(a, (msg.addr, 0, 4)).wait_for(10) == OK
    assert rv.wait_for(10) == OK
    agent_a.shutdown()
    agent_b.shutdown()


def test_bad_arguments(ctrl_url, unique):
    agent_a, agent_b = agent_pair(ctrl_url, unique)
    b = f"tcp_b_{unique}"
    ghost = agent_a.connect_to(f"nobody_{unique}", transport="tcp")  # may register later...
    with pytest.raises(TimeoutError, match="no agent 'nobody_.*' has registered"):
        ghost.wait(0.3)  # ...but never does
    assert ghost.state == "connecting"
    with pytest.raises(ValueError, match="itself"):
        agent_a.connect_to(f"tcp_a_{unique}", transport="tcp")
    with pytest.raises(NotImplementedError, match='transport "rdma" is not available here: .*; available here: tcp'):
        agent_a.connect_to(b)  # rdma is the default and this build has none
    with pytest.raises(ValueError, match="unknown transport"):
        agent_a.connect_to(b, transport="carrier-pigeon")
    with pytest.raises(ConnectionError, match="connect_to"):
        agent_a.send(b, (Buffer(8).addr, 0, 8))  # no connection yet (NOT_CONNECTED)
    conn = agent_a.connect_to(b, transport="tcp")
    agent_b.connect_to(f"tcp_a_{unique}", transport="tcp")
    conn.wait(10)
    with pytest.raises(TypeError):
        agent_a.read(b, [("kv", 0, 8)])  # 3 fields
    with pytest.raises(TypeError):
        agent_a.read(b, [(1, 2, 3)])
    with pytest.raises(KeyError, match="no local memory region"):
        agent_a.read(b, [("never_registered", 0, 0, 8)])
    buf = Buffer(64)
    agent_a.register_memory_region("mine", buf.addr, 0, 64)
    with pytest.raises(KeyError, match="has no memory region"):
        agent_a.read(b, [("mine", "theirs_missing", 0, 0, 8)])
    agent_a.shutdown()
    agent_b.shutdown()


def test_duplicate_alias_is_refused_until_the_old_agent_is_gone(ctrl_url, unique):
    first = PeerAgent(ctrl_url=ctrl_url, alias=f"dup_{unique}")
    with pytest.raises(RuntimeError, match="already registered"):
        PeerAgent(ctrl_url=ctrl_url, alias=f"dup_{unique}")
    first.shutdown()
    second = PeerAgent(ctrl_url=ctrl_url, nanoctrl_url=ctrl_url, alias=f"dup_{unique}")
    assert second.alias == f"dup_{unique}"
    second.shutdown()


def test_connect_to_a_peer_that_registers_later(ctrl_url, unique):
    early = PeerAgent(ctrl_url=ctrl_url, alias=f"early_{unique}")
    conn = early.connect_to(f"late_{unique}", transport="tcp")
    late = PeerAgent(ctrl_url=ctrl_url, alias=f"late_{unique}")
    conn.wait(10)
    wait_until(lambda: late.connection(f"early_{unique}") is not None, 10, what="late agent's side")
    late.connection(f"early_{unique}").wait(10)
    early.shutdown()
    late.shutdown()


def test_auto_alias(ctrl_url):
    with PeerAgent(ctrl_url=ctrl_url) as agent:
        assert agent.alias


def test_scopes_do_not_see_each_other(ctrl_url, unique):
    a = PeerAgent(ctrl_url=ctrl_url, alias=f"s_a_{unique}", scope=f"red_{unique}")
    b = PeerAgent(ctrl_url=ctrl_url, alias=f"s_b_{unique}", scope=f"blue_{unique}")
    b_twin = PeerAgent(ctrl_url=ctrl_url, alias=f"s_a_{unique}", scope=f"blue_{unique}")  # same alias, other scope
    with pytest.raises(TimeoutError, match="has registered"):
        a.connect_to(f"s_b_{unique}", transport="tcp").wait(0.3)
    conn = b.connect_to(f"s_a_{unique}", transport="tcp")
    b_twin.connect_to(f"s_b_{unique}", transport="tcp")
    conn.wait(10)
    assert a.peers() == [f"s_b_{unique}"]  # the pending attempt only
    assert not a.connection(f"s_b_{unique}").is_connected()
    for x in (a, b, b_twin):
        x.shutdown()


def test_shutdown_fails_peer_futures_promptly_and_allows_reconnect(ctrl_url, unique):
    agent_a, agent_b = agent_pair(ctrl_url, unique)
    a, b = f"tcp_a_{unique}", f"tcp_b_{unique}"
    conn = agent_a.connect_to(b, transport="tcp")
    agent_b.connect_to(a, transport="tcp")
    conn.wait(10)
    box = Buffer(16)
    pending = agent_a.recv(b, (box.addr, 0, 16))
    t0 = time.monotonic()
    agent_b.shutdown()
    assert pending.wait_for(10) in (PEER_CLOSED, CANCELLED)
    assert time.monotonic() - t0 < 5
    client = dlslime.nanoctrl.NanoCtrlClient(ctrl_url)
    wait_until(lambda: b not in [x["name"] for x in client.query()], 10, what="b's record removed")
    # The same alias comes back and the survivor connects to it again.
    agent_b2 = PeerAgent(ctrl_url=ctrl_url, alias=b)
    conn2 = agent_a.connect_to(b, transport="tcp")
    cb2 = agent_b2.connect_to(a, transport="tcp")
    conn2.wait(10)
    cb2.wait(10)
    rv = agent_b2.recv(a, (box.addr, 0, 16))
    msg = Buffer(5, b"again")
    assert agent_a.send(b, (msg.addr, 0, 5)).wait_for(10) == OK
    assert rv.wait_for(10) == OK and box.bytes(0, 5) == b"again"
    agent_a.shutdown()
    agent_b2.shutdown()


def test_full_mesh_of_8_agents(ctrl_url, unique):
    n, size = 8, 64 * 1024
    agents = [PeerAgent(ctrl_url=ctrl_url, alias=f"m{i}_{unique}") for i in range(n)]
    bufs = [np.full(size * n, i, dtype=np.uint8) for i in range(n)]  # slot j of agent i: written by j
    for i, ag in enumerate(agents):
        ag.register_memory_region("slots", bufs[i].ctypes.data, 0, bufs[i].nbytes)
    conns = {}
    for i, ag in enumerate(agents):
        for j in range(n):
            if i != j:
                conns[i, j] = ag.connect_to(f"m{j}_{unique}", transport="tcp")
    for c in conns.values():
        c.wait(30)
    srcs = [np.full(size, 100 + i, dtype=np.uint8) for i in range(n)]
    for i, ag in enumerate(agents):
        ag.register_memory_region("src", srcs[i].ctypes.data, 0, size)
    futs = []
    for i, ag in enumerate(agents):
        for j in range(n):
            if i != j:
                # agent i writes its src into slot i of agent j: both ways across every pair.
                futs.append(ag.write(f"m{j}_{unique}", [("src", "slots", 0, i * size, size)]))
    assert [f.wait_for(30) for f in futs] == [OK] * len(futs)
    for j in range(n):
        for i in range(n):
            expected = j if i == j else 100 + i
            assert (bufs[j][i * size:(i + 1) * size] == expected).all(), (i, j)
    for ag in agents:
        ag.shutdown()
