"""RDMA write with immediate data between two processes over RDMAEndpoint.

Each write_with_imm places its bytes in the target's region and then gives the target
exactly one imm_recv event carrying the immediate value, in order: the target needs no
other message to know a write has landed. Without an RDMA NIC:

    DLSLIME_RDMA_SIM=1 python examples/python/p2p_rdma_rc_write_with_imm_data.py
"""

import ctypes
import sys

from _two_process import run

SIZE = 1024 * 1024
WRITES = 4  # each fills one quarter of the region; its imm_data says which


def pattern(n, seed):
    return bytes((i * 11 + seed) & 0xFF for i in range(256)) * (n // 256)


def target(pipe):
    from dlslime import RDMAEndpoint

    buf = ctypes.create_string_buffer(SIZE)
    ep = RDMAEndpoint()
    ep.register_memory_region("inbox", ctypes.addressof(buf), 0, SIZE)
    pipe.send(ep.endpoint_info())
    ep.connect(pipe.recv())
    quarter = SIZE // WRITES
    ok = True
    for i in range(WRITES):
        fut = ep.imm_recv()
        status = fut.wait()
        which = fut.imm_data()
        landed = buf.raw[which * quarter : (which + 1) * quarter] == pattern(quarter, which)
        print(f"[target] imm_recv status={status} imm_data={which} nbytes={fut.nbytes} bytes match: {landed}")
        ok = ok and status == 0 and which == i and landed
    bye = ctypes.create_string_buffer(b"bye", 3)
    ok = ep.send((ctypes.addressof(bye), 0, 3)).wait() == 0 and ok
    ep.shutdown()
    sys.exit(0 if ok else 1)


def initiator(pipe):
    from dlslime import RDMAEndpoint

    quarter = SIZE // WRITES
    src = ctypes.create_string_buffer(b"".join(pattern(quarter, i) for i in range(WRITES)), SIZE)
    ep = RDMAEndpoint()
    h_local = ep.register_memory_region("src", ctypes.addressof(src), 0, SIZE)
    pipe.send(ep.endpoint_info())
    peer = pipe.recv()
    ep.connect(peer)
    h_remote = ep.register_remote_memory_region("inbox", peer["mr_info"]["inbox"])
    bye = ctypes.create_string_buffer(8)
    bye_fut = ep.recv((ctypes.addressof(bye), 0, 8))
    futs = [ep.write_with_imm([(h_local, h_remote, i * quarter, i * quarter, quarter)], imm_data=i)
            for i in range(WRITES)]
    statuses = [f.wait() for f in futs]
    print(f"[initiator] write_with_imm statuses={statuses}")
    ok = statuses == [0] * WRITES and bye_fut.wait() == 0
    ep.shutdown()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    run(target, initiator)
