"""One-sided Ascend reads and writes with a notification between two processes, over
Huawei's HIXL, in upstream DLSlime's forms: AscendDirectEndpoint() then init(host, port),
register_memory_region(addr, offset, length, name) and named assignments (local_name,
remote_name, target_offset, source_offset, length), where target_offset is in the remote
region and source_offset in the local one.

The target fills an NPU buffer; the initiator reads pieces of it, writes one back with a
notification, which the target's recv_notify receives once the bytes are in place. Without
an NPU, run it on the simulated HIXL:

    DLSLIME_ASCEND_SIM=1 python examples/python/p2p_ascend.py
"""

import sys

from _two_process import run

SIZE = 1 << 20


def content(n, seed):
    return bytes((i * 13 + seed) & 0xFF for i in range(256)) * (n // 256)


def endpoint():
    from dlslime import AscendDirectEndpoint

    ep = AscendDirectEndpoint()  # upstream's two steps; AscendDirectEndpoint("127.0.0.1", 0) is one
    ep.init("127.0.0.1", 0)  # port 0: a free one
    return ep


def target(pipe):
    from dlslime import testing

    buf = testing.npu_buffer(SIZE)  # or a torch_npu tensor's data_ptr()
    buf.write(0, content(SIZE, 1))
    ep = endpoint()
    ep.register_memory_region(buf.ptr, 0, SIZE, "buffer")  # upstream's argument order
    pipe.send(ep.endpoint_info())  # carries mr_info["buffer"]: the engine, address and length
    ep.connect(pipe.recv())
    # The initiator's write carries a notification: once it arrives, so have the bytes.
    fut = ep.recv_notify(timeout_ms=60000)
    if fut.wait() != 0:
        print(f"[target] no notification: {fut.message}", file=sys.stderr)
        sys.exit(1)
    ok = fut.notification() == b"done" and buf.read(2000, 4096) == content(SIZE, 2)[262144:266240]
    print(f"[target] notification {fut.notification()!r}, the initiator's write arrived: {ok}")
    ep.shutdown()
    sys.exit(0 if ok else 1)


def initiator(pipe):
    from dlslime import testing

    dst = testing.npu_buffer(SIZE)
    dst.write(0, content(SIZE, 2))
    ep = endpoint()
    ep.register_memory_region(dst.ptr, 0, SIZE, "dst")
    pipe.send(ep.endpoint_info())
    ep.connect(pipe.recv())  # links to the target's engine; "buffer" is now a remote region
    # read: remote "buffer"[1000:+5000] -> local "dst"[8:+5000], and a second piece.
    fut = ep.read([("dst", "buffer", 1000, 8, 5000), ("dst", "buffer", 65536, 131072, 65536)])
    status = fut.wait()
    expected = content(SIZE, 1)
    ok = (status == 0 and fut.nbytes == 5000 + 65536 and dst.read(8, 5000) == expected[1000:6000]
          and dst.read(131072, 65536) == expected[65536:131072])
    print(f"[initiator] read {fut.nbytes} B status={status} bytes match: {ok}")
    # write: local "dst"[262144:+4096] -> remote "buffer"[2000:+4096], then the notification;
    # the future completes once the target holds the notification.
    ok = ok and ep.write([("dst", "buffer", 2000, 262144, 4096)], notify=b"done").wait() == 0
    ep.shutdown()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    run(target, initiator)
