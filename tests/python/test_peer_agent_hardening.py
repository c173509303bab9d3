"""PeerAgent hardening (issue 10, items 4, 16, 20, 22): regions published again after the
store forgot them, forged connect messages, a refused duplicate alias, and a region the
peer registered again."""

import socket

import pytest

from dlslime import PeerAgent, nanoctrl
from conftest import Buffer, fd_count, wait_until
from nanoctrl_fixtures import RedisServer, http

OK = 0
UNKNOWN_HANDLE = 405


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


def connect_both(a, b):
    ca = a.connect_to(b.alias, transport="tcp")
    cb = b.connect_to(a.alias, transport="tcp")
    ca.wait(10)
    cb.wait(10)


def redis_flushall(port):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"FLUSHALL\r\n")
        assert s.recv(16).startswith(b"+OK")


def test_regions_published_again_after_redis_is_emptied(agent, unique):
    """Item 4: the heartbeat registers the agent again and publishes its regions again (it
    used to fail with HTTP 400 on every region); a peer that connects afterwards writes."""
    with RedisServer() as redis:
        server = nanoctrl.NanoCtrlServer(port=0, redis_url=redis.url)
        server.start()
        try:
            client = nanoctrl.NanoCtrlClient(server.url)
            a = agent(ctrl_url=server.url, alias=f"fl_a_{unique}", heartbeat_interval=0.02)
            dst = Buffer(4096)
            a.register_memory_region("dst", dst.addr, 0, 4096)
            redis_flushall(redis.port)
            wait_until(lambda: client.get_mr_info(f"fl_a_{unique}", "dst") is not None, 10,
                       what="region published again after FLUSHALL")
            b = agent(ctrl_url=server.url, alias=f"fl_b_{unique}")
            src = Buffer(4096, b"\x5c")
            b.register_memory_region("src", src.addr, 0, 4096)
            connect_both(a, b)
            assert b.write(f"fl_a_{unique}", [("src", "dst", 0, 0, 4096)]).wait_for(10) == OK
            assert dst.bytes() == src.bytes()
            a.shutdown()  # while NanoCtrl still runs, so the cleanup reaches it
            b.shutdown()
        finally:
            server.stop()


def test_refused_duplicate_alias_cleans_up_nothing(agent, ctrl_url, unique):
    """Item 20: deleting the refused agent leaves the live one's record, regions and peers."""
    alias = f"dup_{unique}"
    first = agent(ctrl_url=ctrl_url, alias=alias)
    dst = Buffer(4096)
    first.register_memory_region("dst", dst.addr, 0, 4096)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="already registered"):
            PeerAgent(ctrl_url=ctrl_url, alias=alias)
    client = nanoctrl.NanoCtrlClient(ctrl_url)
    assert client.get_peer_agent(alias) is not None
    assert client.get_mr_info(alias, "dst") is not None
    peer = agent(ctrl_url=ctrl_url, alias=f"dup_peer_{unique}")
    src = Buffer(4096, b"\x21")
    peer.register_memory_region("src", src.addr, 0, 4096)
    connect_both(first, peer)
    assert peer.write(alias, [("src", "dst", 0, 0, 4096)]).wait_for(10) == OK
    assert dst.bytes() == src.bytes()


def test_named_write_follows_a_region_registered_again(agent, ctrl_url, unique):
    """Item 22: after the peer registers "buf" at a new buffer, the next named write lands
    there (it used to fail with 405 until a reconnect)."""
    a = agent(ctrl_url=ctrl_url, alias=f"rr_a_{unique}")
    b = agent(ctrl_url=ctrl_url, alias=f"rr_b_{unique}")
    src, old, new = Buffer(256, b"\x01"), Buffer(256), Buffer(256)
    a.register_memory_region("src", src.addr, 0, 256)
    b.register_memory_region("buf", old.addr, 0, 256)
    connect_both(a, b)
    assert a.write(b.alias, [("src", "buf", 0, 0, 256)]).wait_for(10) == OK
    b.register_memory_region("buf", new.addr, 0, 256)
    src.set(b"\x02" * 256)
    assert a.write(b.alias, [("src", "buf", 0, 0, 256)]).wait_for(10) == OK
    assert new.bytes() == b"\x02" * 256 and old.bytes() == b"\x01" * 256
    b.unregister_memory_region("buf")
    assert a.write(b.alias, [("src", "buf", 0, 0, 256)]).wait_for(10) == UNKNOWN_HANDLE


def test_forged_connect_messages_keep_no_fds_and_block_no_peer(agent, ctrl_url, unique):
    """Item 16: connect messages posted through NanoCtrl's HTTP routes under made-up aliases,
    pointing at a socket that accepts and never answers."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1024)
    victim = agent(ctrl_url=ctrl_url, alias=f"fv_{unique}", connect_timeout=1.0)
    real = agent(ctrl_url=ctrl_url, alias=f"fr_{unique}")
    dst, src = Buffer(4096), Buffer(4096, b"\x42")
    victim.register_memory_region("dst", dst.addr, 0, 4096)
    real.register_memory_region("src", src.addr, 0, 4096)
    baseline = fd_count()
    # Half the forged senders are registered too (anyone may register without a token), so
    # the victim answers and dials them; the other half it cannot even answer.
    for i in range(0, 60, 2):
        status, body = http(ctrl_url, "/start_peer_agent", {"alias": f"forged_{unique}_{i}"})
        assert status == 200, body
    info = {"transport": "tcp", "host": "127.0.0.1", "port": silent.getsockname()[1], "lanes": 1, "mr_info": {}}
    for i in range(60):
        status, body = http(ctrl_url, "/mailbox/post", {
            "to": victim.alias, "from": f"forged_{unique}_{i}",
            "message": {"type": "connect", "transport": "tcp", "conn_id": f"forged#{i}", "have_peer_info": True,
                        "incarnation": f"{1000 + i:016x}", "endpoint_info": info}})
        assert status == 200, body
    conn = real.connect_to(victim.alias, transport="tcp")
    conn.wait(10)  # used to time out: each forged message held the mailbox thread
    assert real.write(victim.alias, [("src", "dst", 0, 0, 4096)]).wait_for(10) == OK
    assert dst.bytes() == src.bytes()
    wait_until(lambda: victim.peers() == [real.alias], 15, what="forged connections forgotten")
    # Slack: the real connection's listener and lanes on both sides, pooled HTTP connections.
    wait_until(lambda: fd_count() <= baseline + 24, 15, what="descriptors back near the baseline")
    silent.close()
