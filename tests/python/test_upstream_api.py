"""Upstream DLSlime 0.1.23's names and arguments, as issue 14 lists them
(docs/upstream-compat.md), byte-exact. Each test is an upstream script shape: upstream's
argument names and positions and imports; where upstream's contract loses data
(truncation, silent connect failure) the test asserts ours instead. Covered: the endpoint
forms, futures, logging, memory pools, module functions, PeerAgent and NanoCtrlClient, and upstream's two-process PeerAgent script
shape, on TCP here and on RDMA on the simulated device in a child process
(DLSLIME_RDMA_SIM=1 must be set before the library looks for devices). RDMA transport
selection ("auto") is in test_upstream_agent.py, upstream's RDMA object forms in
test_rdma_upstream.py."""

import ctypes
import logging
import os
import re
import textwrap

import pytest

import dlslime
from dlslime import PeerAgent, TcpEndpoint
from conftest import Buffer, run_script, wait_until

OK = 0


@pytest.fixture
def upstream_pair():
    """Two endpoints connected the way upstream's TCP examples do it (remote_info=)."""
    a = TcpEndpoint("127.0.0.1", 0)
    b = TcpEndpoint(ip="127.0.0.1", port=0)
    a.connect(remote_info=b.endpoint_info())
    b.connect(a.endpoint_info())
    yield a, b
    a.shutdown()
    b.shutdown()


# --- TcpEndpoint ops: upstream's positional and keyword forms --------------------------


def test_send_recv_positional_and_keyword_forms(upstream_pair):
    a, b = upstream_pair
    src = Buffer(16, b"hello world!")
    dst = Buffer(16)
    # recv(chunk, stream=None, exact_size=False); send(chunk, stream=None, timeout_ms=30000)
    r = b.recv((dst.addr, 0, 16), None, False)
    s = a.send((src.addr, 0, 12), None, 30000)
    assert s.wait() == OK and r.wait_for(timeout_seconds=10.0) == OK
    assert dst.bytes(0, 12) == b"hello world!" and r.nbytes == 12

    dst2 = Buffer(16)
    r = b.recv(chunk=(dst2.addr, 0, 16), stream=None, exact_size=False)
    s = a.send(chunk=(src.addr, 4, 8), stream=None, timeout_ms=5000)
    assert s.wait_for(10.0) == OK and r.wait() == OK
    assert dst2.bytes(0, 8) == b"o world!"


def test_async_names_are_the_same_ops(upstream_pair):
    a, b = upstream_pair
    src = Buffer(32, b"abcdefgh")
    dst = Buffer(32)
    r = b.async_recv((dst.addr, 0, 32))
    assert a.async_send((src.addr, 0, 32), timeout_ms=5000).wait() == OK
    assert r.wait() == OK and dst.bytes() == src.bytes()

    hl = a.register_memory_region("l", data_ptr=src.addr, offset=0, length=32)
    hb = b.register_memory_region("r", dst.addr, 0, 32)
    hr = a.register_remote_memory_region("r", b.endpoint_info()["mr_info"]["r"])
    assert hb >= 0
    dst.set(b"\0" * 32)
    assert a.async_write([(hl, hr, 8, 0, 8)], None, 5000).wait() == OK
    assert dst.bytes(8, 16) == b"abcdefgh"
    back = Buffer(32)
    hback = a.register_memory_region("back", back.addr, 0, 32)
    assert a.async_read(assign=[(hback, hr, 8, 16, 8)]).wait() == OK
    assert back.bytes(16, 24) == b"abcdefgh"


def test_read_write_take_upstreams_assign_stream_timeout_ms(upstream_pair):
    a, b = upstream_pair
    local = Buffer(64, b"0123456789")
    remote = Buffer(64)
    h = a.register_memory_region("buf", data_ptr=local.addr, offset=0, length=64)
    b.register_memory_region("buf", remote.addr, 0, 64)
    hr = a.register_remote_memory_region("buf", b.endpoint_info()["mr_info"]["buf"])
    # Upstream order: (local_handle, remote_handle, target_offset=REMOTE, source_offset=LOCAL, length)
    assert a.write([(h, hr, 0, 0, 10)], None, 30000).wait() == OK
    assert a.write(assign=[(h, hr, 32, 2, 4)], stream=None, timeout_ms=1000).wait() == OK
    assert remote.bytes(0, 10) == b"0123456789" and remote.bytes(32, 36) == b"2345"
    got = Buffer(64)
    hg = a.register_memory_region("got", got.addr, 0, 64)
    f = a.read(assign=[(hg, hr, 32, 8, 4)], timeout_ms=1000)
    assert f.wait_for(timeout_seconds=10.0) == OK and got.bytes(8, 12) == b"2345"


def test_renamed_arguments_are_one_argument(upstream_pair):
    a, _ = upstream_pair
    buf = Buffer(8)
    with pytest.raises(TypeError, match="both 'addr' and 'data_ptr'"):
        a.register_memory_region("x", buf.addr, 0, 8, data_ptr=buf.addr)
    with pytest.raises(TypeError, match="missing required argument 'assignments' \\(or 'assign'\\)"):
        a.write()
    with pytest.raises(TypeError, match="both"):
        a.connect({}, remote_info={})
    with pytest.raises(ValueError, match="timeout_ms"):
        a.send((buf.addr, 0, 8), None, -1)


def test_wait_for_timeout_seconds_keyword_and_none(upstream_pair):
    _, b = upstream_pair
    dst = Buffer(8)
    r = b.recv((dst.addr, 0, 8))
    # Upstream: None while the op is still running.
    assert r.wait_for(timeout_seconds=0.05) is None
    assert r.wait_for(0) is None
    b.shutdown()
    assert r.wait_for(timeout_seconds=10.0) not in (None, OK)


def test_exact_size_recv_fails_a_shorter_message(upstream_pair):
    a, b = upstream_pair
    src = Buffer(16, b"x")
    dst = Buffer(16)
    r = b.recv((dst.addr, 0, 16), None, exact_size=True)
    # Ours: the sender learns its message was refused (upstream's waits for more bytes).
    assert a.send((src.addr, 0, 12)).wait() == int(dlslime.StatusCode.FAILED)
    status = r.wait_for(10.0)
    assert status == int(dlslime.StatusCode.FAILED) and r.status == status
    assert "12 bytes" in r.message and isinstance(r, dlslime.Future)
    # A message that fills the buffer passes the check.
    r = b.recv((dst.addr, 0, 12), exact_size=True)
    assert a.send((src.addr, 0, 12)).wait() == OK
    assert r.wait() == OK and r.status == OK and r.message == ""


def test_longer_message_fails_instead_of_truncating(upstream_pair):
    # Upstream truncates to the buffer and reports success; ours fails the recv.
    a, b = upstream_pair
    src = Buffer(32, b"y")
    dst = Buffer(32)
    r = b.recv((dst.addr, 0, 8))
    a.send((src.addr, 0, 32))
    assert r.wait_for(10.0) == int(dlslime.StatusCode.MESSAGE_TOO_LARGE)


def test_imm_ops_accept_stream_and_say_tcp_cannot(upstream_pair):
    a, _ = upstream_pair
    buf = Buffer(8)
    h = a.register_memory_region("m", buf.addr, 0, 8)
    with pytest.raises(NotImplementedError):
        a.write_with_imm([(h, h, 0, 0, 8)], 7, None)
    with pytest.raises(NotImplementedError):
        a.write_with_imm(assign=[(h, h, 0, 0, 8)], imm_data=7, stream=None)
    with pytest.raises(NotImplementedError):
        a.imm_recv(None)
    with pytest.raises(NotImplementedError):
        a.imm_recv(stream=None)


def test_failed_connect_leaves_is_connected_false():
    # Upstream returns silently from a failed connect and scripts check is_connected();
    # ours raises, and is_connected() is False as well.
    with TcpEndpoint("127.0.0.1", 0, connect_timeout=2.0) as dead, TcpEndpoint("127.0.0.1", 0) as ep:
        info = dead.endpoint_info()
        dead.shutdown()
        with pytest.raises(ConnectionError):
            ep.connect(remote_info=info)
        assert ep.is_connected() is False


# --- Names --------------------------------------------------------------------------


def test_set_log_level_accepts_upstreams_forms():
    before = dlslime.get_log_level()
    try:
        for level, name in (("INFO", "info"), ("info", "info"), (logging.DEBUG, "debug"),
                            (logging.WARNING, "warning"), ("WARNING", "warning"), (logging.ERROR, "error")):
            dlslime.set_log_level(level)
            assert dlslime.get_log_level() == name, level
        with pytest.raises(ValueError):
            dlslime.set_log_level("loud")
        with pytest.raises(TypeError):
            dlslime.set_log_level(2.5)
    finally:
        dlslime.set_log_level(before)


def test_get_logger_names_and_set_log_level_sets_the_python_logger():
    assert dlslime.get_logger().name == "slime"
    assert dlslime.get_logger("rpc").name == "slime.rpc"
    assert dlslime.get_logger("slime.peer").name == "slime.peer"
    before = dlslime.get_log_level()
    try:
        logger = dlslime.set_log_level(logging.INFO)
        assert logger is dlslime.get_logger() and logger.level == logging.INFO
        assert dlslime.get_log_level() == "info"
    finally:
        dlslime.set_log_level(before)


def test_future_class_names(upstream_pair):
    a, b = upstream_pair
    src = Buffer(8, b"f")
    dst = Buffer(8)
    r = b.recv((dst.addr, 0, 8))
    s = a.send((src.addr, 0, 8))
    assert isinstance(s, dlslime.SlimeTcpSendFuture) and isinstance(r, dlslime.SlimeTcpRecvFuture)
    h = a.register_memory_region("w", src.addr, 0, 8)
    b.register_memory_region("w", dst.addr, 0, 8)
    hr = a.register_remote_memory_region("w", b.endpoint_info()["mr_info"]["w"])
    w = a.write([(h, hr, 0, 0, 8)])
    assert isinstance(w, dlslime.SlimeTcpReadWriteFuture)
    assert s.wait() == OK and r.wait() == OK and w.wait() == OK
    # The upstream names are our Future classes, so our own checks hold too.
    assert all(isinstance(f, dlslime.Future) for f in (s, r, w))


def test_available_nic_and_discover_topology_without_rdma_devices():
    nics = dlslime.available_nic()
    assert isinstance(nics, list) and all(isinstance(n, str) for n in nics)
    topo = dlslime.discover_topology()
    assert topo["schema_version"] == 1 and topo["host"]["address"]
    assert [n["name"] for n in topo["nics"]] == nics
    assert {t["name"] for t in topo["transports"]} >= {"tcp"}
    assert dlslime.discover_topology(None, 1, None, "/sys", [])["nics"] == []
    with pytest.raises(ValueError):
        dlslime.discover_topology(ib_port=0)


def test_peer_agent_module_and_start_peer_agent(ctrl_url, unique):
    from dlslime.peer_agent import PeerAgent, start_peer_agent

    assert PeerAgent is dlslime.PeerAgent and dlslime.start_peer_agent is start_peer_agent
    with start_peer_agent(nanoctrl_url=ctrl_url, alias=f"{unique}-a") as agent:
        assert isinstance(agent, PeerAgent) and agent.alias == f"{unique}-a"


def test_tcp_memory_pool_on_its_own_and_with_an_endpoint(upstream_pair):
    a, b = upstream_pair
    pool = dlslime.TcpMemoryPool()
    src = Buffer(32, b"pool")
    h = pool.register_memory_region(src.addr, 32, "src")
    assert h == 0 and pool.get_mr_handle("src") == 0 and pool.get_mr_handle("nope") == -1
    assert pool.mr_info() == {"src": {"addr": src.addr, "length": 32, "handle": 0, "name": "src"}}
    # Upstream: -1 for an empty name; ours raises.
    with pytest.raises(ValueError):
        pool.register_memory_region(src.addr, 32, "")
    with pytest.raises(TypeError):
        pool.register_memory_region("0x10", 32, "bad")
    # A peer's entry: the same entry keeps its handle, a name overrides the entry's.
    dst = Buffer(32)
    b.register_memory_region("dst", dst.addr, 0, 32)
    entry = b.endpoint_info()["mr_info"]["dst"]
    r0 = pool.register_remote_memory_region(dict(entry, name="dst"))
    assert pool.register_remote_memory_region(dict(entry, name="dst")) == r0
    assert pool.register_remote_memory_region(entry, "named") != r0
    # The pool's regions move bytes through an endpoint.
    handles = pool.register_into(a)
    hr = a.register_remote_memory_region("dst", entry)
    assert a.write([(handles["src"], hr, 0, 0, 32)]).wait() == OK
    assert dst.bytes() == src.bytes()


def test_tcp_endpoints_on_a_memory_pool_share_its_regions():
    # TcpEndpoint(pool=...): one table of regions for the pool and every endpoint on it.
    pool = dlslime.TcpMemoryPool()
    src = Buffer(64, b"pooled bytes")
    h = pool.register_memory_region(src.addr, 64, "src")
    a = TcpEndpoint("127.0.0.1", 0, pool=pool)
    a2 = TcpEndpoint("127.0.0.1", 0, pool=pool, lanes=2)
    b = TcpEndpoint("127.0.0.1", 0)
    try:
        assert a.get_pool() is pool and b.get_pool() is None
        assert a.mr_info()["src"]["handle"] == h and a2.mr_info()["src"]["handle"] == h
        back = Buffer(64)
        h_back = a.register_memory_region("back", back.addr, 0, 64)
        assert pool.get_mr_handle("back") == h_back and a2.mr_info()["back"]["handle"] == h_back
        dst = Buffer(64)
        b.register_memory_region("dst", dst.addr, 0, 64)
        a.connect(b.endpoint_info())
        b.connect(a.endpoint_info())
        hr = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"])
        # The pool's handle is the endpoint's: no register_into needed.
        assert a.write([(h, hr, 0, 0, 12)], None, 30000).wait() == OK
        assert dst.bytes(0, 12) == b"pooled bytes"
        assert a.read([(h_back, hr, 0, 4, 8)]).wait() == OK and back.bytes(4, 12) == b"pooled b"
        # Unregistered through the pool: gone from every endpoint on it.
        assert pool.unregister_memory_region("src") == 0
        assert "src" not in a.mr_info() and "src" not in a2.mr_info()
        assert a.write([(h, hr, 0, 0, 12)]).wait() == int(dlslime.StatusCode.UNKNOWN_HANDLE)
        with pytest.raises(TypeError):
            TcpEndpoint("127.0.0.1", 0, pool={"not": "a pool"})
    finally:
        for ep in (a, a2, b):
            ep.shutdown()


# --- PeerAgent: upstream's I/O forms --------------------------------------------------


def upstream_target(pipe, ctrl_url, alias, peer):
    """The target half of upstream's p2p_tcp_rc_read_peer_agent_two_process.py, as
    written for upstream (start_peer_agent, a named region, connect_to, wait)."""
    from dlslime.peer_agent import start_peer_agent

    buf = ctypes.create_string_buffer(bytes(range(256)) * 4, 1024)
    agent = start_peer_agent(nanoctrl_url=ctrl_url, alias=alias)
    agent.register_memory_region("target_buf", ctypes.addressof(buf), 0, 1024)
    agent.connect_to(peer, transport="tcp").wait()
    pipe.send("ready")
    pipe.recv()  # the initiator has read
    agent.shutdown()
    pipe.send("bye")


def test_two_process_peer_agent_one_sided_read_as_upstream_writes_it(ctrl_url, unique, spawn_ctx):
    from dlslime.peer_agent import start_peer_agent

    init_name, target_name = f"{unique}-init", f"{unique}-target"
    parent, child = spawn_ctx.Pipe()
    proc = spawn_ctx.Process(target=upstream_target, args=(child, ctrl_url, target_name, init_name))
    proc.start()
    try:
        agent = start_peer_agent(nanoctrl_url=ctrl_url, alias=init_name)
        local = Buffer(1024)
        agent.register_memory_region("local_buf", local.addr, 0, 1024)
        agent.connect_to(target_name, transport="tcp").wait()
        assert parent.poll(60) and parent.recv() == "ready"
        # (local_name, remote_name, local_offset, remote_offset, length)
        fut = agent.read(target_name, [("local_buf", "target_buf", 0, 256, 512)], None)
        assert fut.wait() == OK
        assert local.bytes(0, 512) == (bytes(range(256)) * 4)[256:768]
        parent.send("done")
        assert parent.poll(60) and parent.recv() == "bye"
        agent.shutdown()
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0


def test_peer_agent_io_takes_upstreams_forms(ctrl_url, unique):
    from dlslime.peer_agent import PeerAgent

    a_name, b_name = f"{unique}-ua", f"{unique}-ub"
    with PeerAgent(nanoctrl_url=ctrl_url, alias=a_name) as a, PeerAgent(nanoctrl_url=ctrl_url, alias=b_name) as b:
        src = Buffer(64, b"0123456789abcdef")
        dst = Buffer(64)
        a.register_memory_region("kv", src.addr, 0, 64)
        b.register_memory_region("kv", dst.addr, 0, 64)
        # Upstream's connect_to keywords: None for its defaults, min_bw reserved.
        ca = a.connect_to(b_name, transport="tcp", local_host=None, ib_port=None, qp_num=None, min_bw="10")
        cb = b.connect_to(a_name, transport="tcp")
        ca.wait(30)
        cb.wait(30)
        with pytest.raises(ValueError, match="min_bw"):
            a.connect_to(b_name, transport="tcp", min_bw="fast")
        conns = a.get_connections()
        assert list(conns) == [b_name] and list(conns[b_name]) == [ca.conn_id]
        assert conns[b_name][ca.conn_id].is_connected()
        assert a.query_connection(b_name).conn_id == ca.conn_id
        assert a.query_connection(f"{unique}-nobody") is None
        # Named items put the LOCAL offset first: ("kv", local_off, remote_off, length).
        assert a.write(b_name, [("kv", 0, 8, 8)], None).wait() == OK
        assert dst.bytes(8, 16) == b"01234567"
        assert a.write(peer_alias=b_name, assign=("kv", 10, 32, 6), stream=None).wait_for(10) == OK
        assert dst.bytes(32, 38) == b"abcdef"
        got = Buffer(64)
        a.register_memory_region("got", got.addr, 0, 64)
        assert a.read(b_name, [("got", "kv", 4, 32, 6)], stream=None).wait() == OK
        assert got.bytes(4, 10) == b"abcdef"

        msg = Buffer(16, b"ping")
        inbox = Buffer(16)
        r = b.recv(a_name, (inbox.addr, 0, 16), None)
        assert a.send(peer_alias=b_name, chunk=(msg.addr, 0, 4), stream=None).wait() == OK
        assert r.wait_for(timeout_seconds=10) == OK and inbox.bytes(0, 4) == b"ping"
        with pytest.raises(NotImplementedError):
            a.imm_recv(peer_alias=b_name, stream=None)

        # Upstream's convention: True once unregistered, False for an unknown name.
        assert a.unregister_memory_region("got") is True
        assert a.unregister_memory_region("got") is False


# --- NanoCtrl: upstream's client and payloads ---------------------------------------


def test_nanoctrl_accepts_upstream_payloads(ctrl_url, unique):
    from nanoctrl_fixtures import http, is_error

    # register(endpoint=<dict>): upstream's client sends the endpoint as an object.
    status, body = http(ctrl_url, "/register", {"entity_id": f"{unique}-svc", "kind": "cache",
                                                 "endpoint": {"host": "10.0.0.1", "port": 80}})
    assert status == 200 and body["status"] == "ok", body
    status, body = http(ctrl_url, "/get_entity_info", {"entity_id": f"{unique}-svc"})
    assert body["entity_info"]["endpoint"] == {"host": "10.0.0.1", "port": 80}
    status, body = http(ctrl_url, "/register", {"entity_id": f"{unique}-bad", "kind": "x", "endpoint": 7})
    assert is_error(status, body, 400) and "endpoint" in body["message"]

    # set_desired_topology with upstream's numeric-string min_bw.
    client = dlslime.NanoCtrlClient(ctrl_url)
    for name in ("a", "b"):
        client.start_peer_agent(alias=f"{unique}-{name}", address="127.0.0.1")
    status, body = http(ctrl_url, f"/v1/desired_topology/{unique}-a",
                        {"target_peers": [f"{unique}-b"], "min_bw": "100"})
    assert status == 200 and body["status"] == "ok", body
    assert client.get_desired_topology(f"{unique}-a")["min_bw"] == 100.0
    status, body = http(ctrl_url, f"/v1/desired_topology/{unique}-a",
                        {"target_peers": [f"{unique}-b"], "min_bw": "fast"})
    assert is_error(status, body, 400) and "min_bw" in body["message"]


def test_ctrl_nanoctrl_client_upstream_names_and_returns(ctrl_url, unique):
    from dlslime.ctrl import NanoCtrlClient

    c = NanoCtrlClient(ctrl_url.replace("http://", ""))  # upstream adds the scheme
    c.check_connection()
    # Entities: bools and strings, never exceptions.
    assert c.heartbeat() == "not_found" and c.unregister() is False
    assert c.register(f"{unique}-e", "cache", endpoint={"host": "h", "port": 1}, metadata={"gb": 8}) is True
    info = c.get_entity_info(f"{unique}-e")
    assert info["kind"] == "cache" and info["endpoint"] == {"host": "h", "port": 1} and info["metadata"] == {"gb": 8}
    assert any(e["entity_id"] == f"{unique}-e" for e in c.list_entities(kind="cache"))
    assert c.heartbeat() == "ok"
    assert c.register("", "cache") is False
    assert c.get_entity_info(f"{unique}-nope") is None
    # The Redis URL of a NanoCtrl on Redis (scripts/test.sh's), None on the memory store.
    redis = os.environ.get("DLSLIME_TEST_REDIS_URL") if os.environ.get("DLSLIME_TEST_CTRL_URL") else None
    if redis:
        assert (c.get_redis_url() or "").startswith(redis), (c.get_redis_url(), redis)
    else:
        assert c.get_redis_url() is None
    assert c.unregister() is True and c.get_entity_info(f"{unique}-e") is None

    # Peers: dict replies.
    r = c.register_peer(alias=f"{unique}-p", address="127.0.0.1")
    assert r["name"] == f"{unique}-p"
    c.register_peer(alias=f"{unique}-q", address="127.0.0.1")
    assert f"{unique}-p" in [p["name"] for p in c.query_peers()]
    assert c.heartbeat_peer(f"{unique}-p")["status"] == "ok"
    assert c.set_desired_topology(f"{unique}-p", target_peers=[f"{unique}-q"], min_bw="25")["status"] == "ok"
    with pytest.raises(ValueError):
        c.set_desired_topology(f"{unique}-p", target_peers=[f"{unique}-q"], min_bw="fast")
    assert c.cleanup_peer(f"{unique}-p")["status"] == "ok"
    c.stop()

    dead = NanoCtrlClient("127.0.0.1:1")
    with pytest.raises(RuntimeError):
        dead.check_connection()
    assert dead.register("x", "y") is False and dead.list_entities() == []


# --- PeerAgent and NanoCtrlClient -----------------------------------------------------

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


def test_upstream_peer_agent_names_on_rdma_on_the_simulated_device(agent, ctrl_url, unique, tmp_path):
    if not hasattr(dlslime, "RDMAEndpoint"):
        # A build without RDMA: upstream's RDMA call keeps its clear error.
        a = agent(ctrl_url, f"nr_a_{unique}")
        with pytest.raises(NotImplementedError, match="rdma"):
            a.connect_to(f"nr_b_{unique}", "sim_rdma0", "sim_rdma0", 1, 2, None, "rdma")
        return
    run_script(tmp_path, SIM_SCRIPT, env={"DLSLIME_RDMA_SIM": "1"})
