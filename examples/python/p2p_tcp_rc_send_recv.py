"""Two-sided send/recv between two processes over a raw TcpEndpoint.

    python examples/python/p2p_tcp_rc_send_recv.py
"""

import ctypes
import sys

from _two_process import run

MESSAGES = [b"hello", b"from", b"dlslime " * 1000]


def target(pipe):
    from dlslime import TcpEndpoint

    ep = TcpEndpoint(ip="127.0.0.1", port=0)  # both processes run here; between hosts: docs/deploy.md
    pipe.send(ep.endpoint_info())
    ep.connect(pipe.recv())
    for expected in MESSAGES:
        buf = ctypes.create_string_buffer(16384)
        fut = ep.recv((ctypes.addressof(buf), 0, len(buf)))
        status = fut.wait()
        got = buf.raw[: fut.nbytes]
        print(f"[target] recv status={status} nbytes={fut.nbytes}")
        if status != 0 or got != expected:
            sys.exit(1)
    reply = ctypes.create_string_buffer(b"thanks", 6)
    if ep.send((ctypes.addressof(reply), 0, 6)).wait() != 0:
        sys.exit(1)
    ep.shutdown()


def initiator(pipe):
    from dlslime import TcpEndpoint

    ep = TcpEndpoint(ip="127.0.0.1", port=0)  # both processes run here; between hosts: docs/deploy.md
    pipe.send(ep.endpoint_info())
    ep.connect(pipe.recv())
    reply = ctypes.create_string_buffer(64)
    reply_fut = ep.recv((ctypes.addressof(reply), 0, 64))
    for msg in MESSAGES:
        buf = ctypes.create_string_buffer(msg, len(msg))
        status = ep.send((ctypes.addressof(buf), 0, len(msg))).wait()
        print(f"[initiator] send {len(msg)} B status={status}")
        if status != 0:
            sys.exit(1)
    if reply_fut.wait() != 0 or reply.raw[: reply_fut.nbytes] != b"thanks":
        sys.exit(1)
    ep.shutdown()


if __name__ == "__main__":
    run(target, initiator)
