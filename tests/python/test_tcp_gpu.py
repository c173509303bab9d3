"""GPU memory over TCP (docs/tcp.md "GPU memory") on the strict simulated GPU: regions in
device memory on either side, staged through bounded pools of pinned host buffers. Each
test runs its scenario in a child process with DLSLIME_GPU_SIM=1 (the variable must be set
before the library looks for a GPU); the simulated device memory is PROT_NONE to host code,
so any host touch of it in the library kills the child with SIGSEGV and fails the test."""

import textwrap
from conftest import run_script

COMMON = textwrap.dedent(
    """
    import ctypes
    import sys
    import time

    import dlslime
    from dlslime import testing

    CHUNK = 64 * 1024

    def pattern(n, seed):
        block = bytes((i * 31 + seed) & 0xFF for i in range(251))
        return (block * (n // 251 + 1))[:n]

    class Host:
        def __init__(self, n):
            self.buf = ctypes.create_string_buffer(n)
            self.ptr = ctypes.addressof(self.buf)
            self.nbytes = n
        def write(self, off, data):
            ctypes.memmove(self.ptr + off, data, len(data))
        def read(self, off, n):
            return ctypes.string_at(self.ptr + off, n)
        def close(self):
            pass

    def make(kind, n):
        return testing.device_buffer(n) if kind == "device" else Host(n)

    def pair(**options):
        a = dlslime.TcpEndpoint("127.0.0.1", 0, chunk_size=CHUNK, **options)
        b = dlslime.TcpEndpoint("127.0.0.1", 0, chunk_size=CHUNK, **options)
        a.connect(b.endpoint_info())
        b.connect(a.endpoint_info())
        return a, b

    def wait_until(cond, timeout=10.0):
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, "condition not met before the deadline"
            time.sleep(0.001)

    def transfer(a, b, op, a_kind, b_kind, n, a_off, b_off, tag):
        # a is the initiator; b the target. Both regions are padded so that the bytes
        # around the range are checked too.
        size_a, size_b = n + a_off + 7, n + b_off + 7
        buf_a, buf_b = make(a_kind, size_a), make(b_kind, size_b)
        fill_a, fill_b = pattern(size_a, 1), pattern(size_b, 2)
        buf_a.write(0, fill_a)
        buf_b.write(0, fill_b)
        ha = a.register_memory_region("a" + tag, buf_a.ptr, 0, size_a)
        b.register_memory_region("b" + tag, buf_b.ptr, 0, size_b)
        hb = a.register_remote_memory_region("b" + tag, b.endpoint_info()["mr_info"]["b" + tag])
        item = (ha, hb, b_off, a_off, n)
        fut = a.write([item]) if op == "write" else a.read([item])
        status = fut.wait_for(60)
        assert status == 0, (op, a_kind, b_kind, n, status, fut.message)
        if op == "write":
            want = fill_b[:b_off] + fill_a[a_off:a_off + n] + fill_b[b_off + n:]
            got = buf_b.read(0, size_b)
        else:
            want = fill_a[:a_off] + fill_b[b_off:b_off + n] + fill_a[a_off + n:]
            got = buf_a.read(0, size_a)
        assert got == want, (op, a_kind, b_kind, n, a_off, b_off)
        a.unregister_memory_region("a" + tag)
        b.unregister_memory_region("b" + tag)
        buf_a.close()
        buf_b.close()
    """
)

DIRECTIONS = COMMON + textwrap.dedent(
    """
    a, b = pair()
    assert a.capabilities()["device_memory"]
    sizes = [1, 4095, CHUNK, CHUNK + 1, 3 * CHUNK + 17, (8 << 20) + 5]
    k = 0
    for a_kind, b_kind in (("device", "device"), ("device", "host"), ("host", "device")):
        for op in ("write", "read"):
            for n in sizes:
                for a_off, b_off in ((0, 0), (3, 5)):
                    transfer(a, b, op, a_kind, b_kind, n, a_off, b_off, str(k))
                    k += 1
    a.shutdown()
    b.shutdown()
    print("OK", k)
    """
)

LARGE = COMMON + textwrap.dedent(
    """
    # 64 MiB at the default chunk size, device to device both ways.
    a = dlslime.TcpEndpoint("127.0.0.1", 0)
    b = dlslime.TcpEndpoint("127.0.0.1", 0)
    a.connect(b.endpoint_info())
    b.connect(a.endpoint_info())
    n = 64 << 20
    transfer(a, b, "write", "device", "device", n, 0, 0, "w")
    transfer(a, b, "read", "device", "device", n, 0, 0, "r")
    print("OK")
    """
)

BOUNDED = COMMON + textwrap.dedent(
    """
    # Staging per endpoint is at most `slots` chunk-sized buffers per direction, however
    # large the transfer: 16 MiB of 64 KiB chunks, with 2 slots.
    slots = int(sys.argv[1])
    a, b = pair()
    n = 16 << 20
    for op in ("write", "read"):
        transfer(a, b, op, "device", "device", n, 0, 0, op)
    for ep in (a, b):
        stats = ep.listener_stats()
        assert stats["gpu_staging_slots"] == slots, stats
        high = stats["gpu_staging_high_water_bytes"]
        assert 0 < high <= 2 * slots * CHUNK, (high, slots)
        # Every slot is given back once the transfers are done.
        wait_until(lambda: ep.listener_stats()["gpu_staging_bytes_in_use"] == 0)
    # A host-only endpoint never stages.
    c, d = pair()
    transfer(c, d, "write", "host", "host", 1 << 20, 0, 0, "h")
    assert c.listener_stats()["gpu_staging_high_water_bytes"] == 0
    print("OK")
    """
)

BAD_HANDLES = COMMON + textwrap.dedent(
    """
    UNKNOWN_HANDLE, OUT_OF_BOUNDS = 405, 404
    a, b = pair()
    src, dst = testing.device_buffer(1 << 20), testing.device_buffer(1 << 20)
    src.write(0, pattern(1 << 20, 9))
    ha = a.register_memory_region("src", src.ptr, 0, 1 << 20)
    b.register_memory_region("dst", dst.ptr, 0, 1 << 20)
    hb = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"])
    # A forged remote entry: the owner refuses it (its table is authoritative), alone.
    forged = a.register_remote_memory_region("forged", {"handle": 12345, "addr": 0, "length": 1 << 30})
    for op in (a.write, a.read):
        fut = op([(ha, forged, 0, 0, 4096)])
        assert fut.wait_for(10) == UNKNOWN_HANDLE and "peer reported" in fut.message, fut.message
        fut = op([(ha, forged, (1 << 20) + 1, 0, 300000)])   # several chunks, all refused
        assert fut.wait_for(10) == UNKNOWN_HANDLE, fut.message
    # Local bounds fail at once, before any copy.
    fut = a.write([(ha, hb, 0, 1, 1 << 20)])
    assert fut.wait_for(10) != 0
    # The endpoints still work, byte-exact.
    assert a.write([(ha, hb, 0, 0, 1 << 20)]).wait_for(30) == 0
    assert dst.read(0, 1 << 20) == src.read(0, 1 << 20)
    # A message buffer that runs past its GPU allocation is refused at the call, never touched.
    for op in (a.send, b.recv):
        try:
            op((src.ptr, (1 << 20) - 8, 16))
        except ValueError as e:
            assert "runs past its device allocation" in str(e), e
        else:
            raise AssertionError("a buffer past its GPU allocation was accepted")
    print("OK")
    """
)

MESSAGES = COMMON + textwrap.dedent(
    """
    OK_ = 0
    TOO_LARGE = int(dlslime.StatusCode.MESSAGE_TOO_LARGE)
    a, b = pair()
    # Every direction, sizes around the chunk, offsets on both sides; the recv posted
    # before the send (straight into GPU memory) and after it (held, then copied in).
    sizes = [1, 4095, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK + 17]
    n_max = max(sizes) + 32
    for s_kind, r_kind in (("device", "device"), ("device", "host"), ("host", "device")):
        src, dst = make(s_kind, n_max), make(r_kind, n_max)
        for k, n in enumerate(sizes):
            for posted_first in (True, False):
                s_off, r_off = (k * 3) % 17, (k * 5) % 13
                data = pattern(n, k + (7 if posted_first else 0))
                src.write(s_off, data)
                dst.write(0, b"\\x5a" * n_max)
                if posted_first:
                    rv = b.recv((dst.ptr, r_off, n))
                    sd = a.send((src.ptr, s_off, n))
                else:
                    sd = a.send((src.ptr, s_off, n))
                    assert sd.wait_for(30) == OK_, sd.message   # held by the receiver
                    rv = b.recv((dst.ptr, r_off, n))
                assert sd.wait_for(30) == OK_, (s_kind, r_kind, n, sd.message)
                assert rv.wait_for(30) == OK_ and rv.nbytes == n, (s_kind, r_kind, n, rv.message)
                got = dst.read(0, n_max)
                assert got[r_off:r_off + n] == data, (s_kind, r_kind, n, posted_first)
                assert got[:r_off] == b"\\x5a" * r_off and got[r_off + n:] == b"\\x5a" * (n_max - r_off - n)
    # Messages keep their order across host and GPU buffers: a burst mixing both, each
    # GPU send staged while later host sends wait behind it.
    msgs = []
    for i in range(12):
        kind = "device" if i % 3 else "host"
        n = (i + 1) * 9000
        buf = make(kind, n)
        buf.write(0, pattern(n, 40 + i))
        msgs.append((buf, n))
    boxes = [make("device" if i % 2 else "host", 12 * 9000) for i in range(12)]
    sends = [a.send((buf.ptr, 0, n)) for buf, n in msgs]
    recvs = [b.recv((box.ptr, 0, box.nbytes)) for box in boxes]
    for i, (fut, rv) in enumerate(zip(sends, recvs)):
        assert fut.wait_for(30) == OK_, fut.message
        n = msgs[i][1]
        assert rv.wait_for(30) == OK_ and rv.nbytes == n, (i, rv.message)
        assert boxes[i].read(0, n) == pattern(n, 40 + i), i
    # A message too large for a GPU recv: refused at both ends, nothing written.
    box = make("device", 64)
    box.write(0, b"\\xaa" * 64)
    big = make("device", 3 * CHUNK)
    rv = b.recv((box.ptr, 8, 16))
    sd = a.send((big.ptr, 0, 3 * CHUNK))
    assert rv.wait_for(30) == TOO_LARGE and sd.wait_for(30) == TOO_LARGE, (rv.message, sd.message)
    assert box.read(0, 64) == b"\\xaa" * 64
    # exact_size on a GPU recv: a shorter message fails it and the sender learns why.
    rv = b.recv((box.ptr, 0, 64), exact_size=True)
    sd = a.send((big.ptr, 0, 10))
    assert rv.wait_for(30) != OK_ and sd.wait_for(30) != OK_ and "exact_size" in sd.message, sd.message
    # Every staging slot was given back, and staging stayed bounded.
    for ep in (a, b):
        wait_until(lambda: ep.listener_stats()["gpu_staging_bytes_in_use"] == 0)
        st = ep.listener_stats()
        assert st["gpu_staging_high_water_bytes"] <= 2 * st["gpu_staging_slots"] * CHUNK, st
    a.shutdown()
    b.shutdown()
    print("OK")
    """
)

MESSAGE_ENDS_EARLY = COMMON + textwrap.dedent(
    """
    TIMEOUT = int(dlslime.StatusCode.TIMEOUT)
    # A GPU recv that times out while its message is arriving completes (not hangs) and
    # nothing lands in its memory after that; the endpoints keep working.
    a, b = pair(recv_timeout=0.05)
    n = 64 * CHUNK
    src, dst = testing.device_buffer(n), testing.device_buffer(n)
    src.write(0, pattern(n, 3))
    rv = b.recv((dst.ptr, 0, n))
    assert rv.wait_for(30) == TIMEOUT, rv.message
    # Nothing was sent: the buffer is untouched. Now one arrives with no recv posted
    # and is held; a later GPU recv takes it.
    dst.write(0, b"\\x11" * n)
    assert a.send((src.ptr, 0, 3 * CHUNK)).wait_for(30) == 0
    rv = b.recv((dst.ptr, 0, n))
    assert rv.wait_for(30) == 0 and rv.nbytes == 3 * CHUNK, rv.message
    assert dst.read(0, 3 * CHUNK) == src.read(0, 3 * CHUNK)
    assert dst.read(3 * CHUNK, 16) == b"\\x11" * 16
    # Shutting down with a GPU recv posted fails it at once.
    rv = b.recv((dst.ptr, 0, n))
    b.shutdown()
    assert rv.wait_for(30) not in (0, None), rv.message
    a.shutdown()
    print("OK")
    """
)

PEER_KILLED = COMMON + textwrap.dedent(
    """
    import multiprocessing as mp
    import os
    import signal

    def peer(conn, n):
        ep = dlslime.TcpEndpoint("127.0.0.1", 0, chunk_size=CHUNK)
        dst = testing.device_buffer(n)
        ep.register_memory_region("dst", dst.ptr, 0, n)
        conn.send(ep.endpoint_info())
        ep.connect(conn.recv())
        conn.send("connected")
        conn.recv()   # blocks until the test kills it

    if __name__ == "__main__":
        mp.set_start_method("spawn")
        n = 256 << 20
        parent, child = mp.Pipe()
        proc = mp.Process(target=peer, args=(child, n))
        proc.start()
        info = parent.recv()
        a = dlslime.TcpEndpoint("127.0.0.1", 0, chunk_size=CHUNK)
        src = testing.device_buffer(n)
        ha = a.register_memory_region("src", src.ptr, 0, n)
        parent.send(a.endpoint_info())
        a.connect(info)
        assert parent.recv() == "connected"
        hb = a.register_remote_memory_region("dst", info["mr_info"]["dst"])
        fut = a.write([(ha, hb, 0, 0, n)])
        # Kill it once staging has started (bytes are crossing), not before.
        wait_until(lambda: a.listener_stats()["gpu_staging_high_water_bytes"] > 0 or fut.done())
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        status = fut.wait_for(30)
        assert status not in (0, None), status        # failed, not hung and not "done"
        # The next op fails at once (not connected), and every slot was given back.
        assert a.write([(ha, hb, 0, 0, 16)]).wait_for(10) != 0
        wait_until(lambda: a.listener_stats()["gpu_staging_bytes_in_use"] == 0)
        a.shutdown()
        print("OK")
    """
)


def run_sim(tmp_path, script, *args, extra_env=None):
    return run_script(tmp_path, script, *args, env={"DLSLIME_GPU_SIM": "1", **(extra_env or {})}, timeout=300)


def test_write_and_read_gpu_to_gpu_gpu_to_host_and_host_to_gpu_are_byte_exact_at_any_size_and_offset(tmp_path):
    run_sim(tmp_path, DIRECTIONS)


def test_64_mib_device_to_device_write_and_read_at_the_default_chunk_size(tmp_path):
    run_sim(tmp_path, LARGE)


def test_staging_memory_is_bounded_by_the_slot_count_not_the_transfer_size(tmp_path):
    run_sim(tmp_path, BOUNDED, "4")
    run_sim(tmp_path, BOUNDED, "2", extra_env={"DLSLIME_TCP_GPU_STAGING_CHUNKS": "2"})


def test_bad_handles_on_device_regions_fail_alone_and_gpu_buffers_past_their_allocation_are_refused(tmp_path):
    run_sim(tmp_path, BAD_HANDLES)


def test_send_and_recv_of_gpu_memory_are_byte_exact_in_every_direction_and_keep_message_order(tmp_path):
    run_sim(tmp_path, MESSAGES)


def test_a_gpu_recv_that_times_out_or_is_shut_down_completes_and_held_messages_reach_gpu_recvs(tmp_path):
    run_sim(tmp_path, MESSAGE_ENDS_EARLY)


def test_a_peer_killed_mid_transfer_fails_the_device_write_without_a_hang(tmp_path):
    run_sim(tmp_path, PEER_KILLED)
