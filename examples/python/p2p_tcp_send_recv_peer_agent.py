"""Two PeerAgents in two processes exchange messages over TCP (send/recv by peer alias).

    python examples/python/p2p_tcp_send_recv_peer_agent.py [--ctrl-url http://127.0.0.1:4479]
"""

import ctypes
import sys

from _two_process import run_agents as run


def target(ctrl_url, me, peer):
    from dlslime import PeerAgent

    with PeerAgent(ctrl_url=ctrl_url, alias=me) as agent:
        agent.connect_to(peer, transport="tcp").wait()
        buf = ctypes.create_string_buffer(64)
        fut = agent.recv(peer, (ctypes.addressof(buf), 0, 64))
        ok = fut.wait() == 0 and buf.raw[: fut.nbytes] == b"hello over tcp"
        print(f"[{me}] received {buf.raw[:fut.nbytes]!r}")
        reply = ctypes.create_string_buffer(b"hi back", 7)
        sent = agent.send(peer, (ctypes.addressof(reply), 0, 7))
        if sent.wait() != 0:
            print(f"[{me}] reply failed: {sent.status} {sent.message}", file=sys.stderr)
        ok = ok and sent.status == 0
    sys.exit(0 if ok else 1)


def initiator(ctrl_url, me, peer):
    from dlslime import PeerAgent

    with PeerAgent(ctrl_url=ctrl_url, alias=me) as agent:
        conn = agent.connect_to(peer, transport="tcp")
        conn.wait()
        print(f"[{me}] connected: {conn.conn_id}")
        inbox = ctypes.create_string_buffer(64)
        reply = agent.recv(peer, (ctypes.addressof(inbox), 0, 64))
        msg = ctypes.create_string_buffer(b"hello over tcp", 14)
        ok = agent.send(peer, (ctypes.addressof(msg), 0, 14)).wait() == 0
        ok = ok and reply.wait() == 0 and inbox.raw[: reply.nbytes] == b"hi back"
        print(f"[{me}] reply {inbox.raw[:reply.nbytes]!r}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    run(target, initiator)
