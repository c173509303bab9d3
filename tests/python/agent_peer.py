"""A PeerAgent in a child process (multiprocessing, spawn), driven over a Pipe."""

import ctypes


def run_agent(pipe, ctrl_url, alias, peer_alias, size):
    """Registers a `size`-byte region 'big' filled with 0x5A, connects to `peer_alias` over
    TCP, reports "ready", then answers ("bytes", start, end) until ("exit",)."""
    from dlslime import PeerAgent

    buf = ctypes.create_string_buffer(b"\x5a" * size, size)
    agent = PeerAgent(ctrl_url=ctrl_url, alias=alias)
    agent.register_memory_region("big", ctypes.addressof(buf), 0, size)
    pipe.send("registered")
    conn = agent.connect_to(peer_alias, transport="tcp")
    conn.wait(30)
    pipe.send("ready")
    while True:
        cmd = pipe.recv()
        if cmd[0] == "bytes":
            pipe.send(buf.raw[cmd[1]:cmd[2]])
        elif cmd[0] == "exit":
            agent.shutdown()
            pipe.send("bye")
            return
