"""One-sided write between two PeerAgents in two processes over TCP, by region name.

    python examples/python/p2p_tcp_rc_write_peer_agent.py [--ctrl-url URL]
"""

import ctypes
import sys

from _two_process import run_agents as run

SIZE = 4 * 1024 * 1024


def pattern():
    return bytes((i * 5 + 1) & 0xFF for i in range(256)) * (SIZE // 256)


def target(ctrl_url, me, peer):
    from dlslime import PeerAgent

    kv = ctypes.create_string_buffer(SIZE)
    with PeerAgent(ctrl_url=ctrl_url, alias=me) as agent:
        agent.register_memory_region("kv", ctypes.addressof(kv), 0, SIZE)  # before connect_to
        agent.connect_to(peer, transport="tcp").wait()
        done = ctypes.create_string_buffer(8)
        ok = agent.recv(peer, (ctypes.addressof(done), 0, 8)).wait() == 0
        ok = ok and kv.raw[1024:1024 + SIZE // 2] == pattern()[: SIZE // 2] and kv.raw[:1024] == bytes(1024)
        print(f"[{me}] kv holds the written bytes: {ok}")
        # The closing handshake: the initiator leaves only once this reply arrives, so its
        # "done" is never lost with a connection it already closed (issue 27).
        bye = ctypes.create_string_buffer(b"bye", 8)
        ok = agent.send(peer, (ctypes.addressof(bye), 0, 8)).wait() == 0 and ok
    sys.exit(0 if ok else 1)


def initiator(ctrl_url, me, peer):
    from dlslime import PeerAgent

    src = ctypes.create_string_buffer(pattern(), SIZE)
    with PeerAgent(ctrl_url=ctrl_url, alias=me) as agent:
        agent.register_memory_region("src", ctypes.addressof(src), 0, SIZE)
        agent.connect_to(peer, transport="tcp").wait()
        # (local_name, remote_name, local_offset, remote_offset, length)
        status = agent.write(peer, [("src", "kv", 0, 1024, SIZE // 2)]).wait()
        print(f"[{me}] write {SIZE // 2} B status={status}")
        bye = ctypes.create_string_buffer(8)
        reply = agent.recv(peer, (ctypes.addressof(bye), 0, 8))  # posted first: the reply cannot miss it
        note = ctypes.create_string_buffer(b"done", 8)
        ok = status == 0 and agent.send(peer, (ctypes.addressof(note), 0, 8)).wait() == 0
        ok = reply.wait() == 0 and ok  # stay until the target has its "done"
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    run(target, initiator)
