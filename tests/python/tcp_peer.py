"""Peer endpoints that run in a child process (multiprocessing, spawn). Each function
talks to the test over a Pipe: it sends its endpoint_info, receives the test's, and then
serves the scenario."""

import ctypes

import dlslime


def fill_pattern(buf, size, seed):
    data = bytes((i * 31 + seed) & 0xFF for i in range(256)) * (size // 256 + 1)
    ctypes.memmove(buf, data[:size], size)


def serve_region(conn, size, seed, ip="127.0.0.1"):
    """Registers a `size`-byte region 'peer' filled with a pattern, connects, then answers
    commands: ("bytes", start, end) -> the bytes; ("send", data) -> sends a message and
    reports its status; ("recv", n) -> posts a recv and returns (status, bytes);
    ("exit",) -> shuts down."""
    buf = ctypes.create_string_buffer(size)
    fill_pattern(buf, size, seed)
    ep = dlslime.TcpEndpoint(ip=ip, port=0)
    ep.register_memory_region("peer", ctypes.addressof(buf), 0, size)
    conn.send(ep.endpoint_info())
    peer_info = conn.recv()
    ep.connect(peer_info)
    conn.send("connected")
    while True:
        cmd = conn.recv()
        if cmd[0] == "bytes":
            conn.send(buf.raw[cmd[1]:cmd[2]])
        elif cmd[0] == "send":
            data = ctypes.create_string_buffer(cmd[1], len(cmd[1]))
            conn.send(ep.send((ctypes.addressof(data), 0, len(cmd[1]))).wait())
        elif cmd[0] == "recv":
            rbuf = ctypes.create_string_buffer(cmd[1])
            fut = ep.recv((ctypes.addressof(rbuf), 0, cmd[1]))
            status = fut.wait()
            conn.send((status, rbuf.raw[: fut.nbytes]))
        elif cmd[0] == "exit":
            ep.shutdown()
            conn.send("bye")
            return
