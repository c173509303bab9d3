"""One-sided read between two processes over a raw TcpEndpoint.

The target fills a registered region; the initiator reads pieces of it with offsets on
both sides and checks them.

    python examples/python/p2p_tcp_rc_read.py
"""

import ctypes
import sys

from _two_process import run

SIZE = 4 * 1024 * 1024


def content(n):
    return bytes((i * 13 + 1) & 0xFF for i in range(256)) * (n // 256)


def target(pipe):
    from dlslime import TcpEndpoint

    buf = ctypes.create_string_buffer(content(SIZE), SIZE)
    ep = TcpEndpoint(ip="127.0.0.1", port=0)  # both processes run here; between hosts: docs/deploy.md
    ep.register_memory_region("weights", ctypes.addressof(buf), 0, SIZE)
    pipe.send(ep.endpoint_info())
    ep.connect(pipe.recv())
    # Stay up until the initiator says it is done reading.
    done = ctypes.create_string_buffer(8)
    status = ep.recv((ctypes.addressof(done), 0, 8)).wait()
    # Tell the initiator we are done, so it does not shut down under our connect().
    bye = ctypes.create_string_buffer(b"bye", 3)
    status = status or ep.send((ctypes.addressof(bye), 0, 3)).wait()
    ep.shutdown()
    sys.exit(0 if status == 0 else 1)


def initiator(pipe):
    from dlslime import TcpEndpoint

    dst = ctypes.create_string_buffer(SIZE)
    ep = TcpEndpoint(ip="127.0.0.1", port=0)  # both processes run here; between hosts: docs/deploy.md
    h_local = ep.register_memory_region("dst", ctypes.addressof(dst), 0, SIZE)
    pipe.send(ep.endpoint_info())
    peer = pipe.recv()
    ep.connect(peer)
    h_remote = ep.register_remote_memory_region("weights", peer["mr_info"]["weights"])
    # Two pieces in one batch: remote [1000, +5000) -> local [8, +5000), and the whole
    # second half to the local second half.
    half = SIZE // 2
    batch = [(h_local, h_remote, 1000, 8, 5000), (h_local, h_remote, half, half, half)]
    fut = ep.read(batch)
    status = fut.wait()
    expected = content(SIZE)
    ok = (status == 0 and fut.nbytes == 5000 + half and dst.raw[8:5008] == expected[1000:6000]
          and dst.raw[half:] == expected[half:])
    print(f"[initiator] read {fut.nbytes} B status={status} bytes match: {ok}")
    bye = ctypes.create_string_buffer(8)
    bye_fut = ep.recv((ctypes.addressof(bye), 0, 8))
    note = ctypes.create_string_buffer(b"done", 8)
    ok = ok and ep.send((ctypes.addressof(note), 0, 8)).wait() == 0 and bye_fut.wait() == 0
    ep.shutdown()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    run(target, initiator)
