"""One-sided RDMA read between two processes over RDMAEndpoint (RC queue pairs).

The target fills a registered region; the initiator reads pieces of it with offsets on
both sides and checks them. Without an RDMA NIC, run it on the simulated device:

    DLSLIME_RDMA_SIM=1 python examples/python/p2p_rdma_rc_read.py
"""

import ctypes
import sys

from _two_process import run

SIZE = 4 * 1024 * 1024


def content(n):
    return bytes((i * 13 + 1) & 0xFF for i in range(256)) * (n // 256)


def endpoint():
    from dlslime import RDMAEndpoint, available_nic

    # The first device with an active port (as device_name="" would pick), two QPs.
    return RDMAEndpoint(device_name=available_nic()[0], ib_port=1, link_type="auto", num_qp=2)


def target(pipe):
    buf = ctypes.create_string_buffer(content(SIZE), SIZE)
    ep = endpoint()
    ep.register_memory_region("weights", ctypes.addressof(buf), 0, SIZE)
    pipe.send(ep.endpoint_info())  # carries mr_info["weights"]: addr, rkey, length
    ep.connect(pipe.recv())
    # Stay up until the initiator says it is done reading, then say goodbye.
    done = ctypes.create_string_buffer(8)
    status = ep.recv((ctypes.addressof(done), 0, 8)).wait()
    bye = ctypes.create_string_buffer(b"bye", 3)
    status = status or ep.send((ctypes.addressof(bye), 0, 3)).wait()
    ep.shutdown()
    sys.exit(0 if status == 0 else 1)


def initiator(pipe):
    dst = ctypes.create_string_buffer(SIZE)
    ep = endpoint()
    h_local = ep.register_memory_region("dst", ctypes.addressof(dst), 0, SIZE)
    pipe.send(ep.endpoint_info())
    peer = pipe.recv()
    ep.connect(peer)
    h_remote = ep.register_remote_memory_region("weights", peer["mr_info"]["weights"])
    # (local_handle, remote_handle, target_offset=remote, source_offset=local, length):
    # remote [1000, +5000) -> local [8, +5000), and the second half to the second half
    # (striped over both QPs).
    half = SIZE // 2
    fut = ep.read([(h_local, h_remote, 1000, 8, 5000), (h_local, h_remote, half, half, half)])
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
