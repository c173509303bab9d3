"""One-sided write between two processes over a raw TcpEndpoint.

The initiator writes into the target's registered region; the target checks the bytes.

    python examples/python/p2p_tcp_rc_write.py
"""

import ctypes
import sys

from _two_process import run

SIZE = 8 * 1024 * 1024


def pattern(n):
    return bytes((i * 7 + 3) & 0xFF for i in range(256)) * (n // 256)


def target(pipe):
    from dlslime import TcpEndpoint

    buf = ctypes.create_string_buffer(SIZE)
    ep = TcpEndpoint(ip="127.0.0.1", port=0)  # both processes run here; between hosts: docs/deploy.md
    ep.register_memory_region("kv", ctypes.addressof(buf), 0, SIZE)
    pipe.send(ep.endpoint_info())  # carries mr_info["kv"]
    ep.connect(pipe.recv())
    # The initiator tells us when its write completed.
    done = ctypes.create_string_buffer(8)
    if ep.recv((ctypes.addressof(done), 0, 8)).wait() != 0:
        sys.exit(1)
    expected = pattern(SIZE // 2)
    ok = buf.raw[4096 : 4096 + SIZE // 2] == expected and buf.raw[:4096] == bytes(4096)
    print(f"[target] region holds the written bytes: {ok}")
    # Tell the initiator we are done, so it does not shut down under our connect().
    bye = ctypes.create_string_buffer(b"bye", 3)
    ep.send((ctypes.addressof(bye), 0, 3)).wait()
    ep.shutdown()
    sys.exit(0 if ok else 1)


def initiator(pipe):
    from dlslime import TcpEndpoint

    src = ctypes.create_string_buffer(pattern(SIZE // 2), SIZE // 2)
    ep = TcpEndpoint(ip="127.0.0.1", port=0)  # both processes run here; between hosts: docs/deploy.md
    h_local = ep.register_memory_region("src", ctypes.addressof(src), 0, SIZE // 2)
    pipe.send(ep.endpoint_info())
    peer = pipe.recv()
    ep.connect(peer)
    h_remote = ep.register_remote_memory_region("kv", peer["mr_info"]["kv"])
    # (local_handle, remote_handle, target_offset=remote, source_offset=local, length)
    status = ep.write([(h_local, h_remote, 4096, 0, SIZE // 2)]).wait()
    print(f"[initiator] write {SIZE // 2} B status={status}")
    bye = ctypes.create_string_buffer(8)
    bye_fut = ep.recv((ctypes.addressof(bye), 0, 8))
    note = ctypes.create_string_buffer(b"done", 8)
    if status != 0 or ep.send((ctypes.addressof(note), 0, 8)).wait() != 0 or bye_fut.wait() != 0:
        sys.exit(1)
    ep.shutdown()


if __name__ == "__main__":
    run(target, initiator)
