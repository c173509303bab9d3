"""What every transport owes (docs/conformance.md), run over each transport that
dlslime.available_transports() says is usable here. Endpoints come from
dlslime.make_endpoint() only, so nothing below names a transport except transport_options(). A
new transport passes this file unchanged; an op its capabilities() exclude is skipped with
a message naming the capability.

The C++ suite (tests/cpp/test_conformance.cpp) holds the same contract."""

import contextlib
import ctypes
import os
import signal
import time

import pytest

import dlslime
from conftest import Buffer, wait_until

OK = int(dlslime.StatusCode.SUCCESS)
PENDING = int(dlslime.StatusCode.PENDING)
OUT_OF_BOUNDS = int(dlslime.StatusCode.OUT_OF_BOUNDS)
UNKNOWN_HANDLE = int(dlslime.StatusCode.UNKNOWN_HANDLE)
CANCELLED = int(dlslime.StatusCode.CANCELLED)
PEER_CLOSED = int(dlslime.StatusCode.PEER_CLOSED)
NOT_CONNECTED = int(dlslime.StatusCode.NOT_CONNECTED)
TOO_LARGE = int(dlslime.StatusCode.MESSAGE_TOO_LARGE)
FAILED = int(dlslime.StatusCode.FAILED)
TIMEOUT = int(dlslime.StatusCode.TIMEOUT)

DEADLINE = 20  # seconds, any single op in this file on a loaded 2-core CI box


def transport_options(transport):
    """The options each transport's test endpoints are made with: loopback only, and
    deadlines short enough that a broken transport fails a test instead of stalling CI."""
    if transport == "tcp":
        return {"ip": "127.0.0.1", "port": 0, "connect_timeout_ms": 5000, "op_timeout_ms": 20000}
    return {}


def refusing_receiver_options(transport, op_timeout_ms):
    """transport_options() for a peer that takes no message while it has no recv posted (a
    send to it waits for its answer until a deadline ends it), with `op_timeout_ms`."""
    options = dict(transport_options(transport), op_timeout_ms=op_timeout_ms)
    if transport == "tcp":
        options["unexpected_buffer_bytes"] = 0  # holds nothing: the lane pauses
    return options  # rdma: a send waits for the receiver's DONE, which only a posted recv sends


def usable_transports():
    return [t["name"] for t in dlslime.available_transports() if t["available"]]


def make(transport):
    return dlslime.make_endpoint(transport, **transport_options(transport))


@pytest.fixture(params=usable_transports())
def transport(request):
    return request.param


@pytest.fixture
def pair(transport):
    """Two endpoints of `transport`, not yet connected; shut down afterwards."""
    a, b = make(transport), make(transport)
    yield a, b
    a.shutdown()
    b.shutdown()


def connect(a, b):
    a.connect(b.endpoint_info())
    b.connect(a.endpoint_info())


def remote(a, b, name):
    """a's handle for b's region `name`, from b's published endpoint_info."""
    return a.register_remote_memory_region(name, b.endpoint_info()["mr_info"][name])


CAPABILITY_OF = {"read": "read", "write": "write", "send": "send_recv", "recv": "send_recv",
                 "write_with_imm": "write_with_imm", "imm_recv": "imm_recv"}


def require(ep, *ops):
    """Skips the test, naming the capability, if the transport cannot do one of `ops`."""
    caps = ep.capabilities()
    for op in ops:
        if not caps[CAPABILITY_OF[op]]:
            pytest.skip(f"{caps['transport']} lacks the capability {CAPABILITY_OF[op]}")


def pattern(size, seed):
    return bytes((i * 131 + seed) & 0xFF for i in range(size))


# --- one-sided -------------------------------------------------------------------------


def test_write_and_read_are_byte_exact_with_offsets_on_both_sides(pair):
    a, b = pair
    require(a, "write", "read")
    src = Buffer(4096, pattern(4096, 7))
    dst, back = Buffer(8192), Buffer(4096)
    h_src = a.register_memory_region("src", src.addr, 0, 4096)
    h_back = a.register_memory_region("back", back.addr, 0, 4096)
    # A registration offset is part of the region: offsets below count from dst[1024].
    b.register_memory_region("dst", dst.addr, 1024, 4096)
    connect(a, b)
    h_dst = remote(a, b, "dst")
    # write: local[source_offset:+len] -> remote[target_offset:+len]
    fut = a.write([(h_src, h_dst, 1000, 7, 300)])
    assert fut.wait_for(DEADLINE) == OK, fut.message
    assert dst.bytes(2024, 2324) == src.bytes(7, 307)
    assert dst.bytes(0, 2024) == bytes(2024) and dst.bytes(2324) == bytes(8192 - 2324)
    # read: remote[target_offset:+len] -> local[source_offset:+len]
    dst.set(b"remote-bytes", 1024 + 2000)
    fut = a.read([(h_back, h_dst, 2000, 3000, 12)])
    assert fut.wait_for(DEADLINE) == OK, fut.message
    assert fut.nbytes == 12
    assert back.bytes(3000, 3012) == b"remote-bytes"
    assert back.bytes(0, 3000) == bytes(3000) and back.bytes(3012) == bytes(4096 - 3012)
    # The region ends where its registration said, not where the buffer does.
    before = dst.bytes()
    assert a.write([(h_src, h_dst, 1, 0, 4096)]).wait_for(DEADLINE) == OUT_OF_BOUNDS
    assert dst.bytes() == before


def test_batches_of_1000_items(pair):
    a, b = pair
    require(a, "write", "read")
    n, item = 1000, 64
    src = Buffer(n * item, pattern(n * item, 3))
    dst, back = Buffer(2 * n * item), Buffer(n * item)
    h_src = a.register_memory_region("src", src.addr, 0, src.size)
    h_back = a.register_memory_region("back", back.addr, 0, back.size)
    b.register_memory_region("dst", dst.addr, 0, dst.size)
    connect(a, b)
    h_dst = remote(a, b, "dst")
    # Strided: item i goes to remote offset 2*i*item, so every item's placement is checked.
    fut = a.write([(h_src, h_dst, 2 * i * item, i * item, item) for i in range(n)])
    assert fut.wait_for(DEADLINE) == OK, fut.message
    placed = dst.bytes()
    for i in range(n):
        assert placed[2 * i * item:(2 * i + 1) * item] == src.bytes(i * item, (i + 1) * item), i
        assert placed[(2 * i + 1) * item:(2 * i + 2) * item] == bytes(item), i
    fut = a.read([(h_back, h_dst, 2 * i * item, i * item, item) for i in range(n)])
    assert fut.wait_for(DEADLINE) == OK, fut.message
    assert fut.nbytes == n * item
    assert back.bytes() == src.bytes()


def test_bounds_and_unknown_handle_errors_fail_alone(pair):
    a, b = pair
    require(a, "write", "read")
    src, dst = Buffer(256, pattern(256, 1)), Buffer(256)
    h_src = a.register_memory_region("src", src.addr, 0, 256)
    b.register_memory_region("dst", dst.addr, 0, 256)
    connect(a, b)
    h_dst = remote(a, b, "dst")
    cases = [
        ((h_src + 100, h_dst, 0, 0, 8), UNKNOWN_HANDLE, "unknown local handle"),
        ((h_src, h_dst + 100, 0, 0, 8), UNKNOWN_HANDLE, "unknown remote handle"),
        ((h_src, h_dst, 250, 0, 8), OUT_OF_BOUNDS, "remote range past the end"),
        ((h_src, h_dst, 0, 250, 8), OUT_OF_BOUNDS, "local range past the end"),
        ((h_src, h_dst, 2**63, 0, 8), OUT_OF_BOUNDS, "offset + length overflows"),
    ]
    for item, code, what in cases:
        for op in (a.write, a.read):
            fut = op([item])
            assert fut.wait_for(DEADLINE) == code, (op.__name__, what, fut.message)
            assert fut.message, what
            # Fails alone: the next op on the same connection succeeds.
            ok = a.write([(h_src, h_dst, 0, 0, 4)])
            assert ok.wait_for(DEADLINE) == OK, (what, ok.message)
    assert dst.bytes(4) == bytes(252), "a refused op wrote bytes"
    fut = a.write([(h_src, h_dst, 0, 0, 256)])
    assert fut.wait_for(DEADLINE) == OK, fut.message
    assert dst.bytes() == src.bytes()


# --- two-sided -------------------------------------------------------------------------


def test_send_and_recv_are_byte_exact_with_offsets_on_both_sides(pair):
    a, b = pair
    require(a, "send", "recv")
    connect(a, b)
    out, inbox = Buffer(1000, pattern(1000, 9)), Buffer(2000, b"\xAA")
    rv = b.recv((inbox.addr, 100, 600))  # the receiver's bytes [100, 700)
    sd = a.send((out.addr, 5, 500))  # the sender's bytes [5, 505)
    assert sd.wait_for(DEADLINE) == OK, sd.message
    assert rv.wait_for(DEADLINE) == OK, rv.message
    assert rv.nbytes == 500
    assert inbox.bytes(100, 600) == out.bytes(5, 505)
    assert inbox.bytes(0, 100) == b"\xAA" * 100 and inbox.bytes(600) == b"\xAA" * 1400
    # The other way, several messages: they arrive in order.
    boxes = [Buffer(64) for _ in range(8)]
    recvs = [a.recv((box.addr, 0, 64)) for box in boxes]
    msgs = [Buffer(10 + i, pattern(10 + i, i)) for i in range(8)]
    sends = [b.send((m.addr, 0, m.size)) for m in msgs]
    for sd, rv, box, msg in zip(sends, recvs, boxes, msgs):
        assert sd.wait_for(DEADLINE) == OK, sd.message
        assert rv.wait_for(DEADLINE) == OK, rv.message
        assert rv.nbytes == msg.size and box.bytes(0, msg.size) == msg.bytes()


def test_message_shorter_than_the_posted_buffer_reports_its_length(pair):
    a, b = pair
    require(a, "send", "recv")
    connect(a, b)
    box, msg = Buffer(64, b"\xAA"), Buffer(10, b"0123456789")
    rv = b.recv((box.addr, 0, 64))
    assert a.send((msg.addr, 0, 10)).wait_for(DEADLINE) == OK
    assert rv.wait_for(DEADLINE) == OK, rv.message
    assert rv.nbytes == 10
    assert box.bytes(0, 10) == b"0123456789" and box.bytes(10) == b"\xAA" * 54


def test_message_longer_than_the_posted_buffer_fails_that_recv_alone(pair):
    a, b = pair
    require(a, "send", "recv")
    connect(a, b)
    box, msg = Buffer(64, b"\xAA"), Buffer(40, pattern(40, 5))
    rv = b.recv((box.addr, 8, 16))  # bytes [8, 24) only
    sd = a.send((msg.addr, 0, 40))
    assert rv.wait_for(DEADLINE) == TOO_LARGE, rv.message
    assert sd.wait_for(DEADLINE) == TOO_LARGE, sd.message
    assert box.bytes() == b"\xAA" * 64, "bytes were written into or past the too-small buffer"
    # The connection stays usable.
    rv = b.recv((box.addr, 0, 64))
    assert a.send((msg.addr, 0, 40)).wait_for(DEADLINE) == OK
    assert rv.wait_for(DEADLINE) == OK and rv.nbytes == 40
    assert box.bytes(0, 40) == msg.bytes()


@pytest.mark.parametrize("size", [64, 256 << 10])  # eager-sized and large (RDMA: rendezvous)
def test_exact_size_recv_fails_a_shorter_message_and_its_sender_learns(pair, size):
    a, b = pair
    require(a, "send", "recv")
    connect(a, b)
    box, short = Buffer(size), Buffer(size // 2, pattern(size // 2, 3))
    rv = b.recv((box.addr, 0, size), None, True)  # upstream's positional exact_size
    sd = a.send((short.addr, 0, size // 2))
    assert rv.wait_for(DEADLINE) == FAILED, rv.message
    assert "exact_size" in rv.message and rv.nbytes == 0
    assert sd.wait_for(DEADLINE) == FAILED, "the sender must learn the refusal"
    assert isinstance(rv, dlslime.SlimeTcpRecvFuture)
    # That message was consumed; the next one, filling the buffer, is delivered.
    exact = Buffer(size, pattern(size, 9))
    rv = b.recv((box.addr, 0, size), exact_size=True)
    assert a.send((exact.addr, 0, size)).wait_for(DEADLINE) == OK
    assert rv.wait_for(DEADLINE) == OK and rv.nbytes == size and rv.message == ""
    assert box.bytes() == exact.bytes()


# --- per-op deadlines (timeout_ms) -------------------------------------------------------


@contextlib.contextmanager
def refusing_pair(transport, op_timeout_ms):
    """A connected pair whose receiver never answers a send (no recv is posted): only a
    deadline can end the sender's op."""
    a = dlslime.make_endpoint(transport, **refusing_receiver_options(transport, op_timeout_ms))
    b = dlslime.make_endpoint(transport, **refusing_receiver_options(transport, op_timeout_ms))
    try:
        connect(a, b)
        require(a, "send")
        yield a, Buffer(4096, pattern(4096, op_timeout_ms))
    finally:
        a.shutdown()
        b.shutdown()


def test_timeout_ms_ends_an_op_long_before_the_endpoints_op_timeout(transport):
    with refusing_pair(transport, 20000) as (a, msg):
        t0 = time.monotonic()
        sd = a.send((msg.addr, 0, 4096), None, 200)
        assert sd.wait_for(DEADLINE) == TIMEOUT, sd.message
        took = time.monotonic() - t0
        assert 0.19 <= took < 10, f"{took:.3f} s: the endpoint's op_timeout (20 s) applied instead"
        assert "200 ms (its timeout)" in sd.message, sd.message


def test_timeout_ms_longer_than_the_endpoints_op_timeout_wins(transport):
    with refusing_pair(transport, 100) as (a, msg):
        t0 = time.monotonic()
        sd = a.send((msg.addr, 0, 4096), timeout_ms=1500)
        assert sd.wait_for(0.7) is None, f"op_timeout (100 ms) ended it: {sd.message}"
        assert sd.wait_for(DEADLINE) == TIMEOUT, sd.message
        assert time.monotonic() - t0 >= 1.4
        assert "1500 ms (its timeout)" in sd.message, sd.message
        # Without timeout_ms (or with 0) the endpoint's op_timeout applies.
        for sd in (a.send((msg.addr, 0, 4096)), a.send((msg.addr, 0, 4096), timeout_ms=0)):
            assert sd.wait_for(DEADLINE) == TIMEOUT, sd.message
            assert "100 ms (op_timeout)" in sd.message, sd.message


# --- waits and shutdown ----------------------------------------------------------------


def test_wait_for_on_an_op_that_cannot_complete_returns_none(pair):
    a, b = pair
    require(a, "recv")
    connect(a, b)
    box = Buffer(16)
    rv = b.recv((box.addr, 0, 16))  # nobody sends
    t0 = time.monotonic()
    assert rv.wait_for(0.05) is None
    waited = time.monotonic() - t0
    assert 0.04 <= waited < 5, waited
    assert not rv.done() and rv.status == PENDING
    assert rv.wait_for(0) is None  # a zero timeout polls


def test_shutdown_completes_pending_futures_with_cancelled(pair):
    a, b = pair
    require(a, "recv")
    connect(a, b)
    box = Buffer(16)
    pending = [a.recv((box.addr, 0, 16)) for _ in range(3)]
    peer_pending = b.recv((box.addr, 0, 16))
    a.shutdown()
    a.shutdown()  # idempotent
    assert [f.wait_for(10) for f in pending] == [CANCELLED] * 3
    assert a.recv((box.addr, 0, 16)).wait_for(10) == CANCELLED
    with pytest.raises(ConnectionError):
        a.connect(b.endpoint_info())
    # The peer learns: its posted recv fails instead of waiting forever.
    assert peer_pending.wait_for(DEADLINE) == PEER_CLOSED, peer_pending.message


def test_ops_the_capabilities_exclude_raise_not_implemented(pair, transport):
    a, b = pair
    connect(a, b)
    caps = a.capabilities()
    assert caps["transport"] == transport
    assert caps["host_memory"], "every transport moves host memory"
    box = Buffer(16)
    calls = {
        "read": lambda: a.read([(0, 0, 0, 0, 1)]),
        "write": lambda: a.write([(0, 0, 0, 0, 1)]),
        "write_with_imm": lambda: a.write_with_imm([(0, 0, 0, 0, 1)], 5),
        "send": lambda: a.send((box.addr, 0, 16)),
        "recv": lambda: a.recv((box.addr, 0, 16)),
        "imm_recv": lambda: a.imm_recv(),
    }
    for op, call in calls.items():
        if not caps[CAPABILITY_OF[op]]:
            with pytest.raises(NotImplementedError):
                call()


# --- unregister during traffic ---------------------------------------------------------


def test_no_byte_lands_in_a_region_after_unregister_returns(pair):
    a, b = pair
    require(a, "write")
    size, item = 8 << 20, 512
    src, dst = Buffer(size, b"\x5a"), Buffer(size)
    h_src = a.register_memory_region("src", src.addr, 0, size)
    b.register_memory_region("dst", dst.addr, 0, size)
    connect(a, b)
    h_dst = remote(a, b, "dst")
    futures = []
    for k in range(size >> 20):
        base = k << 20
        futures.append(a.write([(h_src, h_dst, base + i * item, base + i * item, item)
                                for i in range((1 << 20) // item)]))
    b.unregister_memory_region("dst")
    ctypes.memset(dst.addr, 0xEE, size)  # the canary: any later write would overwrite it
    statuses = [f.wait_for(DEADLINE) for f in futures]
    assert all(s in (OK, UNKNOWN_HANDLE) for s in statuses), statuses
    assert dst.bytes() == b"\xEE" * size, "bytes landed in the region after unregister returned"
    # The handle is gone at the owner; the connection still serves other regions.
    assert a.write([(h_src, h_dst, 0, 0, 8)]).wait_for(DEADLINE) == UNKNOWN_HANDLE
    other = Buffer(64)
    b.register_memory_region("other", other.addr, 0, 64)
    assert a.write([(h_src, remote(a, b, "other"), 0, 0, 64)]).wait_for(DEADLINE) == OK
    assert other.bytes() == b"\x5a" * 64


# --- a peer process killed mid-transfer ------------------------------------------------

PEER_REGION = 64 << 20


def serve_peer(conn, transport):
    """The peer process: registers "peer", sends its endpoint_info, receives ours,
    connects, says "connected", then serves until it is killed (or told to exit)."""
    buf = ctypes.create_string_buffer(PEER_REGION)
    ep = make(transport)
    ep.register_memory_region("peer", ctypes.addressof(buf), 0, PEER_REGION)
    conn.send(ep.endpoint_info())
    ep.connect(conn.recv())
    conn.send("connected")
    conn.recv()
    ep.shutdown()


def test_peer_process_killed_mid_transfer_fails_pending_futures(transport, spawn_ctx):
    ep = make(transport)
    require(ep, "write", "read", "recv")
    parent, child = spawn_ctx.Pipe()
    proc = spawn_ctx.Process(target=serve_peer, args=(child, transport), daemon=True)
    proc.start()
    other = None
    try:
        assert parent.poll(60), "the peer process did not start"
        peer_info = parent.recv()
        local = Buffer(PEER_REGION, b"\x01")
        h_local = ep.register_memory_region("local", local.addr, 0, PEER_REGION)
        ep.connect(peer_info)
        parent.send(ep.endpoint_info())
        assert parent.poll(30) and parent.recv() == "connected"
        h_peer = ep.register_remote_memory_region("peer", peer_info["mr_info"]["peer"])
        box = Buffer(64)
        futures = [ep.recv((box.addr, 0, 64))]  # can only fail
        for _ in range(4):
            futures.append(ep.write([(h_local, h_peer, 0, 0, PEER_REGION)]))
            futures.append(ep.read([(h_local, h_peer, 0, 0, PEER_REGION)]))
        os.kill(proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        statuses = [f.wait_for(15) for f in futures]
        assert None not in statuses, f"a future hung after the peer died: {statuses}"
        assert time.monotonic() - t0 < 15
        assert statuses[0] == PEER_CLOSED, futures[0].message
        # Submission may reach the transport after it has seen the loss: NOT_CONNECTED then.
        assert all(s in (OK, PEER_CLOSED, NOT_CONNECTED) for s in statuses), statuses
        assert any(s != OK for s in statuses[1:]), "every 64 MiB transfer finished before the kill"
        # The survivor notices, and connects to a new peer.
        wait_until(lambda: not ep.is_connected(), 10, what="the dead peer to be noticed")
        other = make(transport)
        dst = Buffer(16)
        other.register_memory_region("dst", dst.addr, 0, 16)
        connect(ep, other)
        assert ep.write([(h_local, remote(ep, other, "dst"), 0, 0, 16)]).wait_for(DEADLINE) == OK
        assert dst.bytes() == b"\x01" * 16
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(10)
        ep.shutdown()
        if other is not None:
            other.shutdown()
