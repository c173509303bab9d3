"""PeerAgent under failure: a peer process killed mid-transfer, NanoCtrl restarts (Redis and
memory stores), and an alias coming back after its agent died."""

import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

from dlslime import PeerAgent, nanoctrl
from conftest import Buffer, wait_until
from nanoctrl_fixtures import RedisServer, free_port

OK = 0
PEER_CLOSED = 407


def start_child_agent(ctrl_url, alias, peer_alias, size):
    from agent_peer import run_agent

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=run_agent, args=(child, ctrl_url, alias, peer_alias, size), daemon=True)
    proc.start()
    assert parent.poll(60) and parent.recv() == "registered", "child agent did not register"
    return proc, parent


def test_peer_process_killed_mid_transfer_and_alias_reused(unique):
    size = 64 * 1024 * 1024
    # A short TTL, so the dead agent's alias frees up quickly.
    with nanoctrl.serve(port=0, ttl=1.0) as url:
        me, them = f"parent_{unique}", f"child_{unique}"
        agent = PeerAgent(ctrl_url=url, alias=me, heartbeat_interval=0.2)
        proc, pipe = start_child_agent(url, them, me, size)
        try:
            conn = agent.connect_to(them, transport="tcp")
            conn.wait(30)
            assert pipe.poll(30) and pipe.recv() == "ready"
            local = np.ones(size, dtype=np.uint8)
            agent.register_memory_region("local", local.ctypes.data, 0, size)
            box = Buffer(64)
            futures = [agent.recv(them, (box.addr, 0, 64))]
            for _ in range(3):
                futures.append(agent.write(them, [("local", "big", 0, 0, size)]))
                futures.append(agent.read(them, [("local", "big", 0, 0, size)]))
            os.kill(proc.pid, signal.SIGKILL)
            statuses = [f.wait_for(15) for f in futures]
            assert None not in statuses, "a future hung after the peer died"
            assert statuses[0] == PEER_CLOSED
            assert all(s in (OK, PEER_CLOSED) for s in statuses)
            proc.join(10)
            # The alias is free again once the dead agent's record expired; a new agent
            # under it is accepted and the survivor connects to it.
            client = nanoctrl.NanoCtrlClient(url)
            wait_until(lambda: them not in [a["name"] for a in client.query()], 15, what="dead agent expired")
            proc2, pipe2 = start_child_agent(url, them, me, 4096)
            conn2 = agent.connect_to(them, transport="tcp")
            conn2.wait(30)
            assert pipe2.poll(30) and pipe2.recv() == "ready"
            dst = np.zeros(4096, dtype=np.uint8)
            agent.register_memory_region("dst", dst.ctypes.data, 0, 4096)
            assert agent.read(them, [("dst", "big", 0, 0, 4096)]).wait_for(10) == OK
            assert (dst == 0x5A).all()
            pipe2.send(("exit",))
            assert pipe2.poll(30) and pipe2.recv() == "bye"
            proc2.join(10)
        finally:
            if proc.is_alive():
                proc.kill()
            agent.shutdown()


@pytest.mark.parametrize("store", ["redis", "memory"])
def test_nanoctrl_restart_while_agents_are_live(unique, store):
    port = free_port()
    redis = RedisServer() if store == "redis" else None
    redis_url = redis.url if redis else None
    try:
        server = nanoctrl.NanoCtrlServer(port=port, redis_url=redis_url, ttl=2.0)
        server.start()
        url = server.url
        a = PeerAgent(ctrl_url=url, alias=f"ra_{unique}", heartbeat_interval=0.1)
        b = PeerAgent(ctrl_url=url, alias=f"rb_{unique}", heartbeat_interval=0.1)
        conn = a.connect_to(f"rb_{unique}", transport="tcp")
        conn_b = b.connect_to(f"ra_{unique}", transport="tcp")
        conn.wait(10)
        conn_b.wait(10)  # both sides: b's finishes on its own mailbox thread

        server.stop()
        server = nanoctrl.NanoCtrlServer(port=port, redis_url=redis_url, ttl=2.0)
        server.start()
        client = nanoctrl.NanoCtrlClient(url)
        # Redis kept the records; the memory store lost them and the agents register again.
        wait_until(lambda: {f"ra_{unique}", f"rb_{unique}"} <= {x["name"] for x in client.query()}, 15,
                   what="agents known to the restarted NanoCtrl")

        # The data plane never depended on NanoCtrl.
        msg, box = Buffer(7, b"survive"), Buffer(16)
        rv = b.recv(f"ra_{unique}", (box.addr, 0, 16))
        assert a.send(f"rb_{unique}", (msg.addr, 0, 7)).wait_for(10) == OK
        assert rv.wait_for(10) == OK and box.bytes(0, 7) == b"survive"

        # New handshakes go through the restarted NanoCtrl's mailbox.
        c = PeerAgent(ctrl_url=url, alias=f"rc_{unique}", heartbeat_interval=0.1)
        conn_c = c.connect_to(f"ra_{unique}", transport="tcp")
        conn_c.wait(15)
        wait_until(lambda: a.connection(f"rc_{unique}") is not None, 10, what="a's side of c's connection")
        a.connection(f"rc_{unique}").wait(10)
        rv = a.recv(f"rc_{unique}", (box.addr, 0, 16))
        assert c.send(f"ra_{unique}", (msg.addr, 0, 7)).wait_for(10) == OK
        assert rv.wait_for(10) == OK
        for ag in (a, b, c):
            ag.shutdown()
        server.stop()
    finally:
        if redis:
            redis.stop()
