"""One-sided read between two PeerAgents in two processes over TCP, through the
connection's endpoint and the peer's endpoint_info (as in the seed guide).

    python examples/python/p2p_tcp_rc_read_peer_agent.py [--ctrl-url URL]
"""

import ctypes
import sys

from _two_process import run_agents as run

SIZE = 1024 * 1024


def content():
    return bytes((i * 11 + 7) & 0xFF for i in range(256)) * (SIZE // 256)


def target(ctrl_url, me, peer):
    from dlslime import PeerAgent

    weights = ctypes.create_string_buffer(content(), SIZE)
    with PeerAgent(ctrl_url=ctrl_url, alias=me) as agent:
        agent.register_memory_region("weights", ctypes.addressof(weights), 0, SIZE)
        agent.connect_to(peer, transport="tcp").wait()
        # Serve until the initiator says it is done reading.
        done = ctypes.create_string_buffer(8)
        ok = agent.recv(peer, (ctypes.addressof(done), 0, 8)).wait() == 0
        # The closing handshake: the initiator leaves only once this reply arrives, so its
        # "done" is never lost with a connection it already closed (issue 27).
        bye = ctypes.create_string_buffer(b"bye", 8)
        ok = agent.send(peer, (ctypes.addressof(bye), 0, 8)).wait() == 0 and ok
    sys.exit(0 if ok else 1)


def initiator(ctrl_url, me, peer):
    from dlslime import PeerAgent

    dst = ctypes.create_string_buffer(SIZE)
    with PeerAgent(ctrl_url=ctrl_url, alias=me) as agent:
        h_local = agent.register_memory_region("dst", ctypes.addressof(dst), 0, SIZE)
        conn = agent.connect_to(peer, transport="tcp")
        conn.wait()
        ep = conn.endpoint                                     # TcpEndpoint
        h_remote = ep.register_remote_memory_region("weights", conn.peer_endpoint_info["mr_info"]["weights"])
        # (local_handle, remote_handle, target_offset=REMOTE, source_offset=LOCAL, length)
        fut = agent.read(peer, [(h_local, h_remote, 4096, 0, SIZE - 4096)])
        status = fut.wait()
        ok = status == 0 and dst.raw[: SIZE - 4096] == content()[4096:]
        print(f"[{me}] read {fut.nbytes} B status={status} bytes match: {ok}")
        bye = ctypes.create_string_buffer(8)
        reply = agent.recv(peer, (ctypes.addressof(bye), 0, 8))  # posted first: the reply cannot miss it
        note = ctypes.create_string_buffer(b"done", 8)
        ok = agent.send(peer, (ctypes.addressof(note), 0, 8)).wait() == 0 and ok
        ok = reply.wait() == 0 and ok  # stay until the target has its "done"
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    run(target, initiator)
