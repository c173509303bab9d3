"""One-sided NVLink (CUDA IPC) reads and writes between two processes on one host, in
upstream DLSlime's forms: register_memory_region(ptr, offset, length, name) and named
assignments (local_name, remote_name, target_offset, source_offset, length), where
target_offset is in the remote region and source_offset in the local one.

The target fills a GPU buffer; the initiator reads pieces of it, writes some back, and
last writes a flag that tells the target it is done (NVLink has no messages: the target
learns it through its memory). Without a GPU, run it on the simulated one:

    DLSLIME_GPU_SIM=1 python examples/python/p2p_nvlink.py
"""

import sys
import time

from _two_process import run

SIZE = 1 << 20
FLAG = SIZE - 8  # the last 8 bytes of the target's buffer
DONE = b"finished"


def content(n, seed):
    return bytes((i * 13 + seed) & 0xFF for i in range(256)) * (n // 256)


def endpoint():
    from dlslime import NVLinkEndpoint

    return NVLinkEndpoint(device=0)


def target(pipe):
    from dlslime import testing

    buf = testing.device_buffer(SIZE)  # or a torch CUDA tensor's data_ptr()
    buf.write(0, content(SIZE, 1)[:FLAG] + bytes(8))
    ep = endpoint()
    ep.register_memory_region(buf.ptr, 0, SIZE, "buffer")  # upstream's argument order
    pipe.send(ep.endpoint_info())  # carries mr_info["buffer"]: the IPC handle and place
    ep.connect(pipe.recv())
    # Stay up (the initiator copies from and into this memory) until the flag arrives.
    deadline = time.monotonic() + 60
    while buf.read(FLAG, 8) != DONE:
        if time.monotonic() > deadline:
            print("[target] the initiator's flag never came", file=sys.stderr)
            sys.exit(1)
        time.sleep(0.001)
    ok = buf.read(2000, 4096) == content(SIZE, 2)[262144:266240]
    print(f"[target] initiator's write arrived: {ok}")
    ep.shutdown()
    sys.exit(0 if ok else 1)


def initiator(pipe):
    from dlslime import testing

    dst = testing.device_buffer(SIZE)
    dst.write(0, content(SIZE, 2))
    ep = endpoint()
    ep.register_memory_region(dst.ptr, 0, SIZE, "dst")
    pipe.send(ep.endpoint_info())
    ep.connect(pipe.recv())  # opens the target's IPC handles; "buffer" is now a remote region
    # read: remote "buffer"[1000:+5000] -> local "dst"[8:+5000], and a second piece.
    fut = ep.read([("dst", "buffer", 1000, 8, 5000), ("dst", "buffer", 65536, 131072, 65536)])
    status = fut.wait()
    expected = content(SIZE, 1)
    ok = (status == 0 and fut.nbytes == 5000 + 65536 and dst.read(8, 5000) == expected[1000:6000]
          and dst.read(131072, 65536) == expected[65536:131072])
    print(f"[initiator] read {fut.nbytes} B status={status} bytes match: {ok}")
    # write: local "dst"[262144:+4096] -> remote "buffer"[2000:+4096]; then the flag, after it.
    ok = ok and ep.write([("dst", "buffer", 2000, 262144, 4096)]).wait() == 0
    dst.write(0, DONE)
    ok = ok and ep.write([("dst", "buffer", FLAG, 0, 8)]).wait() == 0
    ep.shutdown()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    run(target, initiator)
