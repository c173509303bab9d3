"""Bounded soak test (issue 6): many concurrent mixed operations between several endpoint
pairs for DLSLIME_SOAK_SECONDS (default 60; keep it <= 60 in CI), checking every byte and
that the process's descriptors (/proc/self/fd) and RSS (/proc/self/status VmRSS) stay
flat.

Traffic, all at once:
- 3 in-process pairs; on each, 2 threads write random batches into the peer's region
  (disjoint slices) and read them back, and 2 threads exchange messages, one per direction
  (some sent before their recv is posted, so the held-message path runs too);
- 1 pair across two processes: one thread writes and reads back, one sends messages that
  the child echoes back;
- 1 churn thread that keeps building a fresh pair, connecting it, moving bytes and shutting
  it down (descriptor and memory leaks in setup/teardown show up here).

Every wait has a deadline; nothing sleeps to synchronise. Any failure is recorded with its
status and message and fails the test at the end.
"""

import ctypes
import os
import threading
import time

import numpy as np
import pytest

import dlslime
from dlslime import TcpEndpoint
from conftest import SANITIZED, connect_pair, fd_count, rss_bytes

OK = 0
DURATION = float(os.environ.get("DLSLIME_SOAK_SECONDS", "60"))
REGION = 1 << 20  # bytes per region
OP_DEADLINE = 30  # seconds any single op may take before the soak fails
EXIT = b"__soak_exit__"




class Failures:
    def __init__(self):
        self.lock = threading.Lock()
        self.items = []

    def add(self, *what):
        with self.lock:
            if len(self.items) < 50:
                self.items.append(what)


class Counters:
    def __init__(self):
        self.lock = threading.Lock()
        self.ops = {}
        self.bytes = 0

    def add(self, kind, nbytes):
        with self.lock:
            self.ops[kind] = self.ops.get(kind, 0) + 1
            self.bytes += nbytes


def diff_summary(got, want):
    """(first differing index, number of differing bytes, a few got/want bytes there)."""
    if len(got) != len(want):
        return ("lengths", len(got), len(want))
    bad = np.flatnonzero(got != want)
    if bad.size == 0:
        return ("equal",)
    i = int(bad[0])
    return ("first", i, "count", int(bad.size), "last", int(bad[-1]), "got", got[i:i + 8].tobytes(),
            "want", want[i:i + 8].tobytes())


def random_batch(rng, base, span):
    """1-8 non-overlapping items inside [base, base+span): (offset, length) pairs."""
    n = int(rng.integers(1, 9))
    cuts = np.sort(rng.choice(span, size=2 * n, replace=False))
    items = []
    for i in range(n):
        lo, hi = int(cuts[2 * i]), int(cuts[2 * i + 1])
        length = min(hi - lo, int(rng.choice([1, 7, 64, 4096, 65536, 262144])))
        items.append((base + lo, max(1, length)))
    return items


def one_sided_worker(ep, h_src, h_back, h_dst, src, back, dst_view, base, span, seed, stop, fails, counts, label):
    """Writes random batches from src into the peer (slice [base, base+span)), checks the
    peer's bytes when it can see them (dst_view), reads them back into back and checks."""
    rng = np.random.default_rng(seed)
    while not stop.is_set():
        items = random_batch(rng, base, span)
        for off, n in items:
            src[off:off + n] = rng.integers(0, 256, n, dtype=np.uint8)
        # Same offset locally and remotely keeps the check simple; lengths vary.
        batch = [(h_src, h_dst, off, off, n) for off, n in items]
        fut = ep.write(batch)
        st = fut.wait_for(OP_DEADLINE)
        if st != OK:
            fails.add(label, "write", st, fut.message)
            return
        if dst_view is not None:
            for off, n in items:
                if not np.array_equal(dst_view[off:off + n], src[off:off + n]):
                    fails.add(label, "write bytes differ", off, n)
                    return
        for off, n in items:
            back[off:off + n] = 0
        fut = ep.read([(h_back, h_dst, off, off, n) for off, n in items])
        st = fut.wait_for(OP_DEADLINE)
        if st != OK:
            fails.add(label, "read", st, fut.message)
            return
        for off, n in items:
            if not np.array_equal(back[off:off + n], src[off:off + n]):
                fails.add(label, "read bytes differ", off, n)
                return
        counts.add("write", sum(n for _, n in items))
        counts.add("read", sum(n for _, n in items))


def message_worker(sender, receiver, seed, stop, fails, counts, label):
    """sender -> receiver messages of random sizes; half the time the message is sent before
    its recv is posted (held by the receiver until then)."""
    rng = np.random.default_rng(seed)
    out = np.zeros(1 << 17, dtype=np.uint8)
    box = np.zeros(1 << 17, dtype=np.uint8)
    while not stop.is_set():
        n = int(rng.choice([0, 1, 100, 4096, 50000, 1 << 17]))
        out[:n] = rng.integers(0, 256, n, dtype=np.uint8)
        box[:] = 0xEE
        send_first = bool(rng.integers(0, 2))
        if send_first:
            sf = sender.send((out.ctypes.data, 0, n))
            rf = receiver.recv((box.ctypes.data, 0, box.nbytes))
        else:
            rf = receiver.recv((box.ctypes.data, 0, box.nbytes))
            sf = sender.send((out.ctypes.data, 0, n))
        ss, rs = sf.wait_for(OP_DEADLINE), rf.wait_for(OP_DEADLINE)
        if ss != OK or rs != OK:
            fails.add(label, "send/recv", ss, sf.message, rs, rf.message)
            return
        if rf.nbytes != n or not np.array_equal(box[:n], out[:n]) or (n < box.nbytes and box[n] != 0xEE):
            fails.add(label, "message bytes differ", n, rf.nbytes, *diff_summary(box[:n], out[:n]))
            return
        counts.add("send", n)


# --- the peer in another process ------------------------------------------------------


def echo_peer(conn):
    """Child process: an endpoint with a REGION-byte region 'peer' that echoes every message
    back until it receives EXIT."""
    buf = ctypes.create_string_buffer(REGION)
    ep = TcpEndpoint(ip="127.0.0.1", port=0)
    ep.register_memory_region("peer", ctypes.addressof(buf), 0, REGION)
    conn.send(ep.endpoint_info())
    ep.connect(conn.recv())
    conn.send("connected")
    box = ctypes.create_string_buffer(1 << 17)
    while True:
        fut = ep.recv((ctypes.addressof(box), 0, len(box)))
        if fut.wait() != OK:
            conn.send(("recv failed", fut.status, fut.message))
            break
        data = box.raw[:fut.nbytes]
        if data == EXIT:
            conn.send("bye")
            break
        out = ctypes.create_string_buffer(data, max(1, len(data)))
        st = ep.send((ctypes.addressof(out), 0, len(data))).wait()
        if st != OK:
            conn.send(("send failed", st))
            break
    ep.shutdown()


def echo_worker(ep, seed, stop, fails, counts, label):
    rng = np.random.default_rng(seed)
    out = np.zeros(1 << 16, dtype=np.uint8)
    box = np.zeros(1 << 17, dtype=np.uint8)
    while not stop.is_set():
        n = int(rng.choice([1, 333, 4096, 1 << 16]))
        out[:n] = rng.integers(0, 256, n, dtype=np.uint8)
        if out[:n].tobytes() == EXIT:
            continue
        rf = ep.recv((box.ctypes.data, 0, box.nbytes))
        sf = ep.send((out.ctypes.data, 0, n))
        ss, rs = sf.wait_for(OP_DEADLINE), rf.wait_for(OP_DEADLINE)
        if ss != OK or rs != OK:
            fails.add(label, "echo", ss, sf.message, rs, rf.message)
            return
        if rf.nbytes != n or not np.array_equal(box[:n], out[:n]):
            fails.add(label, "echo bytes differ", n, rf.nbytes, *diff_summary(box[:n], out[:n]))
            return
        counts.add("echo", 2 * n)


def churn_worker(seed, stop, fails, counts):
    rng = np.random.default_rng(seed)
    while not stop.is_set():
        a = TcpEndpoint(ip="127.0.0.1", port=0)
        b = TcpEndpoint(ip="127.0.0.1", port=0)
        try:
            n = int(rng.integers(1, 65536))
            src = rng.integers(0, 256, n, dtype=np.uint8)
            dst = np.zeros(n, dtype=np.uint8)
            h_src = a.register_memory_region("src", src.ctypes.data, 0, n)
            b.register_memory_region("dst", dst.ctypes.data, 0, n)
            connect_pair(a, b)
            h_dst = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"])
            st = a.write([(h_src, h_dst, 0, 0, n)]).wait_for(OP_DEADLINE)
            if st != OK or not np.array_equal(src, dst):
                fails.add("churn", "write", st)
                return
            counts.add("churn", n)
        finally:
            a.shutdown()
            b.shutdown()


# --- the test -------------------------------------------------------------------------


def test_soak_mixed_traffic_keeps_bytes_fds_and_rss_flat(spawn_ctx):
    assert DURATION > 0
    fails, counts = Failures(), Counters()
    stop = threading.Event()
    endpoints = []
    threads = []
    keep = []  # buffers that must outlive the endpoints

    # The cross-process pair first (spawning is the slow part).
    parent_pipe, child_pipe = spawn_ctx.Pipe()
    proc = spawn_ctx.Process(target=echo_peer, args=(child_pipe,), daemon=True)
    proc.start()
    try:
        assert parent_pipe.poll(60), "the peer process did not start"
        peer_info = parent_pipe.recv()
        x = TcpEndpoint(ip="127.0.0.1", port=0)
        endpoints.append(x)
        xsrc, xback = np.zeros(REGION, dtype=np.uint8), np.zeros(REGION, dtype=np.uint8)
        keep += [xsrc, xback]
        hx_src = x.register_memory_region("src", xsrc.ctypes.data, 0, REGION)
        hx_back = x.register_memory_region("back", xback.ctypes.data, 0, REGION)
        x.connect(peer_info)
        parent_pipe.send(x.endpoint_info())
        assert parent_pipe.poll(30) and parent_pipe.recv() == "connected"
        hx_peer = x.register_remote_memory_region("peer", peer_info["mr_info"]["peer"])
        threads.append(threading.Thread(target=one_sided_worker, args=(
            x, hx_src, hx_back, hx_peer, xsrc, xback, None, 0, REGION, 100, stop, fails, counts, "xproc")))
        threads.append(threading.Thread(target=echo_worker, args=(x, 101, stop, fails, counts, "xproc-echo")))

        # In-process pairs.
        for p in range(3):
            a = TcpEndpoint(ip="127.0.0.1", port=0)
            b = TcpEndpoint(ip="127.0.0.1", port=0)
            endpoints += [a, b]
            src, back, dst = (np.zeros(REGION, dtype=np.uint8) for _ in range(3))
            keep += [src, back, dst]
            h_src = a.register_memory_region("src", src.ctypes.data, 0, REGION)
            h_back = a.register_memory_region("back", back.ctypes.data, 0, REGION)
            b.register_memory_region("dst", dst.ctypes.data, 0, REGION)
            connect_pair(a, b)
            h_dst = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"])
            half = REGION // 2
            for t in range(2):
                threads.append(threading.Thread(target=one_sided_worker, args=(
                    a, h_src, h_back, h_dst, src, back, dst, t * half, half, 10 * p + t, stop, fails, counts,
                    f"pair{p}-rw{t}")))
            threads.append(threading.Thread(target=message_worker, args=(a, b, 50 + p, stop, fails, counts,
                                                                         f"pair{p}-a->b")))
            threads.append(threading.Thread(target=message_worker, args=(b, a, 60 + p, stop, fails, counts,
                                                                         f"pair{p}-b->a")))

        fds_before = fd_count()
        threads.append(threading.Thread(target=churn_worker, args=(7, stop, fails, counts)))
        t0 = time.monotonic()
        for th in threads:
            th.daemon = True
            th.start()

        # Sample once a second (waiting on the stop event, which a failure never sets, so
        # this is a timed sampling loop, not synchronisation).
        samples = []
        warm_at = t0 + max(2.0, DURATION * 0.2)
        warm = None
        while time.monotonic() - t0 < DURATION:
            stop.wait(min(1.0, max(0.0, DURATION - (time.monotonic() - t0))))
            now = time.monotonic()
            samples.append((round(now - t0, 1), fd_count(), rss_bytes()))
            if warm is None and now >= warm_at:
                warm = samples[-1]
            if fails.items:
                break
        stop.set()
        for th in threads:
            th.join(OP_DEADLINE + 10)
        hung = [th for th in threads if th.is_alive()]
        assert not hung, f"{len(hung)} worker(s) did not stop: an op hung"
        assert not fails.items, fails.items
        elapsed = time.monotonic() - t0

        end_fds, end_rss = fd_count(), rss_bytes()
        print(f"\nsoak: {elapsed:.0f}s, ops {counts.ops}, {counts.bytes / 1e9:.2f} GB moved; "
              f"fds {fds_before}->{end_fds} (peak {max(s[1] for s in samples)}), "
              f"RSS warm {warm[2] >> 20 if warm else '-'} MiB -> end {end_rss >> 20} MiB")
        # Every op kind ran.
        for kind in ("write", "read", "send", "echo", "churn"):
            assert counts.ops.get(kind, 0) > 0, f"no {kind} op completed"
        # Descriptors: the churn pairs are gone, so we are back where we started.
        assert end_fds <= fds_before + 2, f"descriptors leaked: {fds_before} -> {end_fds}"
        assert max(s[1] for s in samples) <= fds_before + 64
        # RSS: after warm-up it stays flat (bounded growth, whatever the duration).
        if warm is not None and not SANITIZED:
            grown = end_rss - warm[2]
            assert grown < 48 << 20, f"RSS grew by {grown >> 20} MiB after warm-up: {samples}"
    finally:
        stop.set()
        for th in threads:
            th.join(OP_DEADLINE + 10)
        try:
            if endpoints and proc.is_alive():
                x = endpoints[0]
                msg = ctypes.create_string_buffer(EXIT, len(EXIT))
                x.send((ctypes.addressof(msg), 0, len(EXIT))).wait_for(10)
                parent_pipe.poll(10)
        finally:
            for ep in endpoints:
                ep.shutdown()
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
