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


def serve_target(conn, size, options, env):
    """A write target for the same-host path (test_tcp_same_host.py): `env` is set before
    the endpoint is made, `options` are its TcpOptions keywords. Registers an anonymous
    mapping of `size` bytes as 'peer' (zeros) and a 4 KiB one as 'spare', connects, then
    answers: ("digest", start, end) -> sha256 hex of those bytes; ("bytes", start, end);
    ("same_host",) -> ep.same_host; ("unregister",) -> unregisters 'peer', replies "done";
    ("munmap",) -> unmaps 'peer' WITHOUT unregistering it (a careless owner), replies
    "done"; ("fill", byte) -> sets every byte of 'peer', replies "done";
    ("post", [(offset, length)...]) / ("wait", seconds) -> recvs into 'peer' and their
    outcomes; ("send", offset, length, seconds) -> a send out of 'peer' and its outcome;
    ("shutdown_when", start, end, sha256, seconds) -> shuts down once those bytes
    hold that digest, replies "seen" (or "timeout"); ("exit",) -> shuts down."""
    import hashlib
    import mmap
    import os
    import time

    os.environ.update(env)
    region = mmap.mmap(-1, size)
    spare = mmap.mmap(-1, 4096)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(region))
    spare_addr = ctypes.addressof(ctypes.c_char.from_buffer(spare))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    ep = dlslime.TcpEndpoint(ip="127.0.0.1", port=0, **options)
    ep.register_memory_region("peer", addr, 0, size)
    ep.register_memory_region("spare", spare_addr, 0, 4096)
    conn.send(ep.endpoint_info())
    ep.connect(conn.recv())
    conn.send("connected")
    posted = []
    while True:
        cmd = conn.recv()
        if cmd[0] == "digest":
            conn.send(hashlib.sha256(ctypes.string_at(addr + cmd[1], cmd[2] - cmd[1])).hexdigest())
        elif cmd[0] == "bytes":
            conn.send(ctypes.string_at(addr + cmd[1], cmd[2] - cmd[1]))
        elif cmd[0] == "fill":
            ctypes.memset(addr, cmd[1], size)
            conn.send("done")
        elif cmd[0] == "spare":
            conn.send(ctypes.string_at(spare_addr, 4096))
        elif cmd[0] == "same_host":
            conn.send(ep.same_host)
        elif cmd[0] == "unregister":
            ep.unregister_memory_region("peer")
            conn.send("done")
        elif cmd[0] == "munmap":
            assert libc.munmap(addr, size) == 0
            conn.send("done")
        elif cmd[0] == "shutdown_when":
            # ("shutdown_when", start, end, sha256 hex, seconds): shuts down the moment those
            # bytes hold that digest (an application that sees its data and leaves at once).
            _, start, end, want, seconds = cmd
            deadline = time.monotonic() + seconds
            seen = False
            while not seen and time.monotonic() < deadline:
                seen = hashlib.sha256(ctypes.string_at(addr + start, end - start)).hexdigest() == want
                if not seen:
                    time.sleep(0.001)
            ep.shutdown()
            conn.send("seen" if seen else "timeout")
            return
        elif cmd[0] == "post":
            # ("post", [(offset, length), ...]) -> recvs into 'peer' at those places, kept for "wait"
            posted.extend(ep.recv((addr, off, n)) for off, n in cmd[1])
            conn.send("posted")
        elif cmd[0] == "wait":
            # ("wait", seconds) -> [(status, nbytes, message)] of the posted recvs, oldest first
            conn.send([(f.wait_for(cmd[1]), f.nbytes, f.message) for f in posted])
            posted.clear()
        elif cmd[0] == "send":
            # ("send", offset, length, seconds) -> (status, message) of a send out of 'peer'
            f = ep.send((addr, cmd[1], cmd[2]))
            conn.send((f.wait_for(cmd[3]), f.message))
        elif cmd[0] == "exit":
            ep.shutdown()
            conn.send("bye")
            return


def connect_then_die(conn, peer_info):
    """Connects an endpoint to `peer_info`, sends its endpoint_info() up `conn`, and on
    ("die",) kills itself with SIGKILL: its connections end without a goodbye."""
    import os
    import signal

    ep = dlslime.TcpEndpoint(ip="127.0.0.1", port=0)
    ep.connect(peer_info)
    conn.send(ep.endpoint_info())
    conn.recv()
    os.kill(os.getpid(), signal.SIGKILL)
