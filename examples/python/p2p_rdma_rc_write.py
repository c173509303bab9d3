"""One-sided RDMA write between two processes over RDMAEndpoint (RC queue pairs).

The initiator writes into the target's registered region; the target checks the bytes.
Without an RDMA NIC, run it on the simulated device:

    DLSLIME_RDMA_SIM=1 python examples/python/p2p_rdma_rc_write.py
"""

import ctypes
import sys

from _two_process import run

SIZE = 8 * 1024 * 1024


def pattern(n):
    return bytes((i * 7 + 3) & 0xFF for i in range(256)) * (n // 256)


def endpoint():
    from dlslime import RDMAEndpoint

    return RDMAEndpoint(device_name="", num_qp=2)  # "": the first device with an active port


def target(pipe):
    buf = ctypes.create_string_buffer(SIZE)
    ep = endpoint()
    ep.register_memory_region("kv", ctypes.addressof(buf), 0, SIZE)
    pipe.send(ep.endpoint_info())  # carries mr_info["kv"]
    ep.connect(pipe.recv())
    # The initiator tells us when its write completed (acknowledged: the bytes are here).
    done = ctypes.create_string_buffer(8)
    if ep.recv((ctypes.addressof(done), 0, 8)).wait() != 0:
        sys.exit(1)
    ok = buf.raw[4096 : 4096 + SIZE // 2] == pattern(SIZE // 2) and buf.raw[:4096] == bytes(4096)
    print(f"[target] region holds the written bytes: {ok}")
    bye = ctypes.create_string_buffer(b"bye", 3)
    ep.send((ctypes.addressof(bye), 0, 3)).wait()
    ep.shutdown()
    sys.exit(0 if ok else 1)


def initiator(pipe):
    src = ctypes.create_string_buffer(pattern(SIZE // 2), SIZE // 2)
    ep = endpoint()
    h_local = ep.register_memory_region("src", ctypes.addressof(src), 0, SIZE // 2)
    pipe.send(ep.endpoint_info())
    peer = pipe.recv()
    ep.connect(peer)
    h_remote = ep.register_remote_memory_region("kv", peer["mr_info"]["kv"])
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
