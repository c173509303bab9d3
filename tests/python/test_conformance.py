"""What every transport owes (docs/conformance.md), run over each transport that
dlslime.available_transports() says is usable here. Endpoints come from
dlslime.make_endpoint() only, so nothing below names a transport except the per-transport
table at the top (transport_options() and its neighbours). A new transport passes this file
unchanged. Each test runs over the transports whose capabilities() include the ops it needs
(`over(...)`), so none is skipped for lacking one; memory comes from new_buffer(), host or
device memory as the side's capabilities() say.

Where a transport's pair cannot be two endpoints of one process (peer_in_another_process()),
`b` is a conformance_peer.PeerEndpoint: the same calls, answered by another process.

The C++ suite (tests/cpp/test_conformance.cpp) holds the same contract."""

import collections
import contextlib
import functools
import gc
import os
import random
import threading
import time

import pytest

import dlslime
from dlslime import testing
from conftest import wait_until
from conformance_peer import PeerEndpoint

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

# --- the only place a transport is named ------------------------------------------------


def transport_options(transport):
    """The options each transport's test endpoints are made with: loopback only, and
    deadlines short enough that a broken transport fails a test instead of stalling CI."""
    if transport == "tcp":
        return {"ip": "127.0.0.1", "port": 0, "connect_timeout_ms": 5000, "op_timeout_ms": 20000}
    if transport == "ascend":
        return {"host": "127.0.0.1", "connect_timeout_ms": 5000, "op_timeout_ms": 20000}
    return {}


def refusing_receiver_options(transport, op_timeout_ms):
    """transport_options() for a peer that takes no message while it has no recv posted (a
    send to it waits for its answer until a deadline ends it), with `op_timeout_ms`."""
    options = dict(transport_options(transport), op_timeout_ms=op_timeout_ms)
    if transport == "tcp":
        options["unexpected_buffer_bytes"] = 0  # holds nothing: the lane pauses
    return options  # rdma: a send waits for the receiver's DONE, which only a posted recv sends


def peer_in_another_process(transport):
    """Whether a pair's `b` runs in another process. nvlink: one process's two endpoints use
    each other's pointers (a process cannot open its own CUDA IPC handles), so only two
    processes test the IPC path users take. ascend and tcp: both ways, one run each
    (DLSLIME_TEST_PEER_PROCESS=1 for two processes; scripts/test.sh runs both). Two TCP
    processes on one host take the same-host path, unless DLSLIME_TCP_SAME_HOST=0."""
    return transport == "nvlink" or (transport in ("ascend", "tcp") and os.environ.get("DLSLIME_TEST_PEER_PROCESS") == "1")


def unregister_revokes_the_peers_access(transport):
    """Contract item 10. nvlink: CUDA IPC cannot revoke a mapping the peer opened, and the
    endpoints have no channel after connect (docs/nvlink.md, "The peer's lifetime")."""
    return transport != "nvlink"


def soak_variants(transport):
    """The configurations the concurrency soak runs `transport` in, as (id, options over
    transport_options(), device): one lane or QP and several, chunks smaller and larger than
    the items, and for TCP GPU memory on both sides (both staging, 1 slot and the default)
    where a GPU runtime is up. The GPU ids hold "staging" (scripts/test.sh selects them)."""
    if transport == "tcp":
        variants = [("1-lane", {"lanes": 1}, False),
                    ("3-lanes-64k-chunks", {"lanes": 3, "chunk_size": 65536}, False),
                    ("4-lanes-4m-chunks", {"lanes": 4, "chunk_size": 4 << 20}, False)]
        if not testing.gpu_unavailable_reason():
            variants += [("gpu-staging-1-slot", {"lanes": 2, "chunk_size": 65536, "gpu_staging_chunks": 1}, True),
                         ("gpu-staging-default", {"chunk_size": 65536}, True)]
        return variants
    if transport == "rdma":
        return [("1-qp-64k-chunks-16-wrs", {"num_qp": 1, "chunk_size": 65536, "max_send_wr": 16}, False),
                ("4-qps", {"num_qp": 4}, False)]
    return [("defaults", {}, False)]


# ------------------------------------------------------------------------------------------


def usable_transports():
    return [t["name"] for t in dlslime.available_transports() if t["available"]]


def make(transport):
    return dlslime.make_endpoint(transport, **transport_options(transport))


def make_peer(transport):
    """The `b` of a pair: an endpoint here, or a PeerEndpoint in another process."""
    if peer_in_another_process(transport):
        return PeerEndpoint.start(transport, transport_options(transport))
    return make(transport)


def close_peer(b):
    b.shutdown()
    if isinstance(b, PeerEndpoint):
        b.close()


@functools.lru_cache(maxsize=None)
def capabilities_of(transport):
    ep = make(transport)
    try:
        return ep.capabilities()
    finally:
        ep.shutdown()


CAPABILITY_OF = {"read": "read", "write": "write", "send": "send_recv", "recv": "send_recv",
                 "write_with_imm": "write_with_imm", "imm_recv": "imm_recv", "send_notify": "notify",
                 "recv_notify": "notify"}


def transports_with(*ops):
    """The usable transports whose capabilities() include every one of `ops`."""
    return [t for t in usable_transports() if all(capabilities_of(t)[CAPABILITY_OF[op]] for op in ops)]


def over(*ops, where=None):
    """Runs the test over the transports that can do `ops` (and satisfy `where`, a predicate
    on the name), instead of skipping it elsewhere: a skip in CI means missing hardware."""
    names = [t for t in transports_with(*ops) if where is None or where(t)]
    if not names:
        return lambda test: None  # not collected at all: an empty parametrization shows as a skip
    return pytest.mark.parametrize("transport", names)


@pytest.fixture(params=usable_transports())
def transport(request):
    return request.param


@pytest.fixture(autouse=True)
def no_verbs_object_left_behind(request):
    """On the simulated RDMA device: once a test's endpoints are shut down and released,
    every verbs object they made is destroyed, children before parents (a destroy the device
    refused, as verbs does with EBUSY, is counted in destroy_failures)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is None or callspec.params.get("transport") != "rdma" or not os.environ.get("DLSLIME_RDMA_SIM"):
        yield
        return
    before = testing.sim_rdma_objects()
    yield
    # The fixtures set up after this one (pair, ...) are torn down by now, but the item
    # still holds their values until its teardown ends: drop them, so the endpoints go.
    request.node.funcargs.clear()
    live = ("contexts", "pds", "mrs", "cqs", "qps", "comp_channels", "cqes", "recv_wrs")

    def back():
        gc.collect()  # endpoints a failed assertion's frame still held
        now = testing.sim_rdma_objects()
        return all(now[k] <= before[k] for k in live)

    wait_until(back, timeout=DEADLINE, what=f"the test's verbs objects to be destroyed (before: {before}, "
                                             f"now: {testing.sim_rdma_objects()})")
    after = testing.sim_rdma_objects()
    assert after["destroy_failures"] == before["destroy_failures"], (before, after)


def fill_bytes(size, fill):
    return (bytes(fill) * (size // len(fill) + 1))[:size]


def buffer_of(side, size, fill=b""):
    """Zeroed memory `side` registers (host or device memory, by its capabilities(); in the
    peer's process for a PeerEndpoint), then `fill` repeated over it. Read and write it with
    .read(offset, n) / .write(offset, data) only: device memory faults the host."""
    buf = side.buffer(size) if isinstance(side, PeerEndpoint) else testing.buffer_for(side.capabilities(), size)
    if fill:
        buf.write(0, fill_bytes(size, fill))
    return buf


def contents(buf, start=0, end=None):
    end = buf.nbytes if end is None else end
    return buf.read(start, end - start)


@pytest.fixture
def new_buffer():
    """buffer_of(), kept alive until the test's endpoints have shut down (pair depends on it)."""
    made = []

    def new(side, size, fill=b""):
        made.append(buffer_of(side, size, fill))
        return made[-1]

    yield new
    made.clear()


@pytest.fixture
def pair(transport, new_buffer):
    """Two endpoints of `transport`, not yet connected; shut down afterwards."""
    a = make(transport)
    try:
        b = make_peer(transport)
    except BaseException:
        a.shutdown()
        raise
    yield a, b
    a.shutdown()
    close_peer(b)


def connect(a, b):
    a.connect(b.endpoint_info())
    b.connect(a.endpoint_info())


def remote(a, b, name):
    """a's handle for b's region `name`, from b's published endpoint_info."""
    return a.register_remote_memory_region(name, b.endpoint_info()["mr_info"][name])


def pattern(size, seed):
    return bytes((i * 131 + seed) & 0xFF for i in range(size))


# --- one-sided -------------------------------------------------------------------------


@over("write", "read")
def test_write_and_read_are_byte_exact_with_offsets_on_both_sides(pair, new_buffer):
    a, b = pair
    src = new_buffer(a, 4096, pattern(4096, 7))
    dst, back = new_buffer(b, 8192), new_buffer(a, 4096)
    h_src = a.register_memory_region("src", src.ptr, 0, 4096)
    h_back = a.register_memory_region("back", back.ptr, 0, 4096)
    # A registration offset is part of the region: offsets below count from dst[1024].
    b.register_memory_region("dst", dst.ptr, 1024, 4096)
    connect(a, b)
    h_dst = remote(a, b, "dst")
    # write: local[source_offset:+len] -> remote[target_offset:+len]
    fut = a.write([(h_src, h_dst, 1000, 7, 300)])
    assert fut.wait_for(DEADLINE) == OK, fut.message
    assert contents(dst, 2024, 2324) == contents(src, 7, 307)
    assert contents(dst, 0, 2024) == bytes(2024) and contents(dst, 2324) == bytes(8192 - 2324)
    # read: remote[target_offset:+len] -> local[source_offset:+len]
    dst.write(1024 + 2000, b"remote-bytes")
    fut = a.read([(h_back, h_dst, 2000, 3000, 12)])
    assert fut.wait_for(DEADLINE) == OK, fut.message
    assert fut.nbytes == 12
    assert contents(back, 3000, 3012) == b"remote-bytes"
    assert contents(back, 0, 3000) == bytes(3000) and contents(back, 3012) == bytes(4096 - 3012)
    # The region ends where its registration said, not where the buffer does.
    before = contents(dst)
    assert a.write([(h_src, h_dst, 1, 0, 4096)]).wait_for(DEADLINE) == OUT_OF_BOUNDS
    assert contents(dst) == before


@over("write", "read")
def test_batches_of_1000_items(pair, new_buffer):
    a, b = pair
    n, item = 1000, 64
    src = new_buffer(a, n * item, pattern(n * item, 3))
    dst, back = new_buffer(b, 2 * n * item), new_buffer(a, n * item)
    h_src = a.register_memory_region("src", src.ptr, 0, src.nbytes)
    h_back = a.register_memory_region("back", back.ptr, 0, back.nbytes)
    b.register_memory_region("dst", dst.ptr, 0, dst.nbytes)
    connect(a, b)
    h_dst = remote(a, b, "dst")
    # Strided: item i goes to remote offset 2*i*item, so every item's placement is checked.
    fut = a.write([(h_src, h_dst, 2 * i * item, i * item, item) for i in range(n)])
    assert fut.wait_for(DEADLINE) == OK, fut.message
    placed, sent = contents(dst), contents(src)
    for i in range(n):
        assert placed[2 * i * item:(2 * i + 1) * item] == sent[i * item:(i + 1) * item], i
        assert placed[(2 * i + 1) * item:(2 * i + 2) * item] == bytes(item), i
    fut = a.read([(h_back, h_dst, 2 * i * item, i * item, item) for i in range(n)])
    assert fut.wait_for(DEADLINE) == OK, fut.message
    assert fut.nbytes == n * item
    assert contents(back) == sent


@over("write", "read")
def test_bounds_and_unknown_handle_errors_fail_alone(pair, new_buffer):
    a, b = pair
    src, dst = new_buffer(a, 256, pattern(256, 1)), new_buffer(b, 256)
    h_src = a.register_memory_region("src", src.ptr, 0, 256)
    b.register_memory_region("dst", dst.ptr, 0, 256)
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
    assert contents(dst, 4) == bytes(252), "a refused op wrote bytes"
    # A good item in the same batch as a bad one: the batch fails, with the bad item's status.
    mixed = a.write([(h_src, h_dst, 0, 0, 8), (h_src, h_dst, 250, 0, 8)])
    assert mixed.wait_for(DEADLINE) == OUT_OF_BOUNDS, mixed.message
    assert contents(dst, 8) == bytes(248), "a refused item wrote bytes"
    fut = a.write([(h_src, h_dst, 0, 0, 256)])
    assert fut.wait_for(DEADLINE) == OK, fut.message
    assert contents(dst) == contents(src)


# --- two-sided -------------------------------------------------------------------------


@over("send", "recv")
def test_send_and_recv_are_byte_exact_with_offsets_on_both_sides(pair, new_buffer):
    a, b = pair
    connect(a, b)
    out, inbox = new_buffer(a, 1000, pattern(1000, 9)), new_buffer(b, 2000, b"\xAA")
    rv = b.recv((inbox.ptr, 100, 600))  # the receiver's bytes [100, 700)
    sd = a.send((out.ptr, 5, 500))  # the sender's bytes [5, 505)
    assert sd.wait_for(DEADLINE) == OK, sd.message
    assert rv.wait_for(DEADLINE) == OK, rv.message
    assert rv.nbytes == 500
    assert contents(inbox, 100, 600) == contents(out, 5, 505)
    assert contents(inbox, 0, 100) == b"\xAA" * 100 and contents(inbox, 600) == b"\xAA" * 1400
    # The other way, several messages: they arrive in order.
    boxes = [new_buffer(a, 64) for _ in range(8)]
    recvs = [a.recv((box.ptr, 0, 64)) for box in boxes]
    msgs = [new_buffer(b, 10 + i, pattern(10 + i, i)) for i in range(8)]
    sends = [b.send((m.ptr, 0, m.nbytes)) for m in msgs]
    for sd, rv, box, msg in zip(sends, recvs, boxes, msgs):
        assert sd.wait_for(DEADLINE) == OK, sd.message
        assert rv.wait_for(DEADLINE) == OK, rv.message
        assert rv.nbytes == msg.nbytes and contents(box, 0, msg.nbytes) == contents(msg)


@over("send", "recv")
def test_message_shorter_than_the_posted_buffer_reports_its_length(pair, new_buffer):
    a, b = pair
    connect(a, b)
    box, msg = new_buffer(b, 64, b"\xAA"), new_buffer(a, 10, b"0123456789")
    rv = b.recv((box.ptr, 0, 64))
    assert a.send((msg.ptr, 0, 10)).wait_for(DEADLINE) == OK
    assert rv.wait_for(DEADLINE) == OK, rv.message
    assert rv.nbytes == 10
    assert contents(box, 0, 10) == b"0123456789" and contents(box, 10) == b"\xAA" * 54


@over("send", "recv")
def test_message_longer_than_the_posted_buffer_fails_that_recv_alone(pair, new_buffer):
    a, b = pair
    connect(a, b)
    box, msg = new_buffer(b, 64, b"\xAA"), new_buffer(a, 40, pattern(40, 5))
    rv = b.recv((box.ptr, 8, 16))  # bytes [8, 24) only
    sd = a.send((msg.ptr, 0, 40))
    assert rv.wait_for(DEADLINE) == TOO_LARGE, rv.message
    assert sd.wait_for(DEADLINE) == TOO_LARGE, sd.message
    assert contents(box) == b"\xAA" * 64, "bytes were written into or past the too-small buffer"
    # The connection stays usable.
    rv = b.recv((box.ptr, 0, 64))
    assert a.send((msg.ptr, 0, 40)).wait_for(DEADLINE) == OK
    assert rv.wait_for(DEADLINE) == OK and rv.nbytes == 40
    assert contents(box, 0, 40) == contents(msg)


@over("send", "recv")
@pytest.mark.parametrize("size", [64, 256 << 10])  # eager-sized and large (RDMA: rendezvous)
def test_exact_size_recv_fails_a_shorter_message_and_its_sender_learns(pair, new_buffer, size):
    a, b = pair
    connect(a, b)
    box, short = new_buffer(b, size), new_buffer(a, size // 2, pattern(size // 2, 3))
    rv = b.recv((box.ptr, 0, size), None, True)  # upstream's positional exact_size
    sd = a.send((short.ptr, 0, size // 2))
    assert rv.wait_for(DEADLINE) == FAILED, rv.message
    assert "exact_size" in rv.message and rv.nbytes == 0
    assert sd.wait_for(DEADLINE) == FAILED, "the sender must learn the refusal"
    if not isinstance(b, PeerEndpoint):  # a future of this process (not a proxy of the peer's)
        assert isinstance(rv, dlslime.SlimeTcpRecvFuture)
    # That message was consumed; the next one, filling the buffer, is delivered.
    exact = new_buffer(a, size, pattern(size, 9))
    rv = b.recv((box.ptr, 0, size), exact_size=True)
    assert a.send((exact.ptr, 0, size)).wait_for(DEADLINE) == OK
    assert rv.wait_for(DEADLINE) == OK and rv.nbytes == size and rv.message == ""
    assert contents(box) == contents(exact)


# --- per-op deadlines (timeout_ms) -------------------------------------------------------


@contextlib.contextmanager
def refusing_pair(transport, op_timeout_ms):
    """A connected pair whose receiver never answers a send (no recv is posted): only a
    deadline can end the sender's op."""
    a = dlslime.make_endpoint(transport, **refusing_receiver_options(transport, op_timeout_ms))
    b = dlslime.make_endpoint(transport, **refusing_receiver_options(transport, op_timeout_ms))
    try:
        connect(a, b)
        yield a, buffer_of(a, 4096, pattern(4096, op_timeout_ms))
    finally:
        a.shutdown()
        b.shutdown()


@over("send")
def test_timeout_ms_ends_an_op_long_before_the_endpoints_op_timeout(transport):
    with refusing_pair(transport, 20000) as (a, msg):
        t0 = time.monotonic()
        sd = a.send((msg.ptr, 0, 4096), None, 200)
        assert sd.wait_for(DEADLINE) == TIMEOUT, sd.message
        took = time.monotonic() - t0
        assert 0.19 <= took < 10, f"{took:.3f} s: the endpoint's op_timeout (20 s) applied instead"
        assert "200 ms (its timeout)" in sd.message, sd.message


@over("send")
def test_timeout_ms_longer_than_the_endpoints_op_timeout_wins(transport):
    with refusing_pair(transport, 100) as (a, msg):
        t0 = time.monotonic()
        sd = a.send((msg.ptr, 0, 4096), timeout_ms=1500)
        assert sd.wait_for(0.7) is None, f"op_timeout (100 ms) ended it: {sd.message}"
        assert sd.wait_for(DEADLINE) == TIMEOUT, sd.message
        assert time.monotonic() - t0 >= 1.4
        assert "1500 ms (its timeout)" in sd.message, sd.message
        # Without timeout_ms (or with 0) the endpoint's op_timeout applies.
        for sd in (a.send((msg.ptr, 0, 4096)), a.send((msg.ptr, 0, 4096), timeout_ms=0)):
            assert sd.wait_for(DEADLINE) == TIMEOUT, sd.message
            assert "100 ms (op_timeout)" in sd.message, sd.message


# --- waits and shutdown ----------------------------------------------------------------


@over("recv")
def test_wait_for_on_an_op_that_cannot_complete_returns_none(pair, new_buffer):
    a, b = pair
    connect(a, b)
    box = new_buffer(b, 16)
    rv = b.recv((box.ptr, 0, 16))  # nobody sends
    t0 = time.monotonic()
    assert rv.wait_for(0.05) is None
    waited = time.monotonic() - t0
    assert 0.04 <= waited < 5, waited
    assert not rv.done() and rv.status == PENDING
    assert rv.wait_for(0) is None  # a zero timeout polls


@over("recv")
def test_shutdown_completes_pending_futures_with_cancelled(pair, new_buffer):
    a, b = pair
    connect(a, b)
    box, peer_box = new_buffer(a, 16), new_buffer(b, 16)
    pending = [a.recv((box.ptr, 0, 16)) for _ in range(3)]
    peer_pending = b.recv((peer_box.ptr, 0, 16))
    a.shutdown()
    a.shutdown()  # idempotent
    assert [f.wait_for(10) for f in pending] == [CANCELLED] * 3
    assert a.recv((box.ptr, 0, 16)).wait_for(10) == CANCELLED
    with pytest.raises(ConnectionError):
        a.connect(b.endpoint_info())
    # The peer learns: its posted recv fails instead of waiting forever.
    assert peer_pending.wait_for(DEADLINE) == PEER_CLOSED, peer_pending.message


@over("write_with_imm", "imm_recv")
def test_an_imm_recv_fails_when_the_peer_shuts_down_and_on_a_failed_connection_at_once(pair):
    """imm_recv tells a target that a write landed: with the peer gone it fails as recv does."""
    a, b = pair
    connect(a, b)
    pending = a.imm_recv()
    b.shutdown()
    assert pending.wait_for(DEADLINE) == PEER_CLOSED, pending.message
    wait_until(lambda: not a.is_connected(), timeout=DEADLINE, what="a to notice its peer's shutdown")
    later = a.imm_recv()
    assert later.wait_for(DEADLINE) in (PEER_CLOSED, NOT_CONNECTED), later.message


@over("write_with_imm", "imm_recv", where=lambda t: not peer_in_another_process(t))
def test_a_zero_length_write_with_imm_delivers_its_immediate_and_keeps_the_connection(pair, new_buffer):
    a, b = pair
    src, dst = new_buffer(a, 64, b"\x07"), new_buffer(b, 64)
    h_src = a.register_memory_region("src", src.ptr, 0, 64)
    b.register_memory_region("dst", dst.ptr, 0, 64)
    connect(a, b)
    h_dst = remote(a, b, "dst")
    for imm in (0, 0xC0FFEE):
        got = b.imm_recv()
        w = a.write_with_imm([(h_src, h_dst, 0, 0, 0)], imm)
        assert w.wait_for(DEADLINE) == OK, w.message
        assert got.wait_for(DEADLINE) == OK, got.message
        assert got.imm_data() == imm
    assert a.is_connected()
    assert contents(dst) == bytes(64), "a zero-length write wrote"
    w = a.write([(h_src, h_dst, 0, 0, 64)])
    assert w.wait_for(DEADLINE) == OK, w.message
    assert contents(dst) == b"\x07" * 64


def test_ops_the_capabilities_exclude_raise_not_implemented(pair, transport, new_buffer):
    a, b = pair
    connect(a, b)
    caps = a.capabilities()
    assert caps["transport"] == transport
    assert caps["host_memory"] or caps["device_memory"], "a transport moves host or device memory"
    if not caps["host_memory"]:  # the capability is the truth: host memory is refused clearly
        with testing.HostBuffer(16) as host, pytest.raises(ValueError):
            a.register_memory_region("host", host.ptr, 0, 16)
    box = new_buffer(a, 16)
    calls = {
        "read": lambda: a.read([(0, 0, 0, 0, 1)]),
        "write": lambda: a.write([(0, 0, 0, 0, 1)]),
        "write_with_imm": lambda: a.write_with_imm([(0, 0, 0, 0, 1)], 5),
        "send": lambda: a.send((box.ptr, 0, 16)),
        "recv": lambda: a.recv((box.ptr, 0, 16)),
        "imm_recv": lambda: a.imm_recv(),
        "send_notify": lambda: a.send_notify(b"x"),
        "recv_notify": lambda: a.recv_notify(),
    }
    for op, call in calls.items():
        if not caps[CAPABILITY_OF[op]]:
            with pytest.raises(NotImplementedError):
                call()


# --- notifications (docs/api.md "Notifications") ---------------------------------------


# The check runs in the receiver's continuation, so the receiver is in this process (the C++
# suite checks nvlink's peer process the same way, in that process).
@over("write", "send_notify", where=lambda t: not peer_in_another_process(t))
@pytest.mark.parametrize("size", [1, 4096, 1 << 20, 64 << 20])
def test_a_notification_arrives_only_once_its_writes_bytes_are_in_place(pair, new_buffer, size):
    """Checked at the moment recv_notify completes (its continuation runs before anything
    else can), for writes from 1 B to 64 MiB."""
    a, b = pair
    data = os.urandom(size)
    src, dst = new_buffer(a, size, data), new_buffer(b, size)
    h_src = a.register_memory_region("src", src.ptr, 0, size)
    b.register_memory_region("dst", dst.ptr, 0, size)
    connect(a, b)
    h_dst = remote(a, b, "dst")
    in_place = []
    got = b.recv_notify(timeout_ms=60_000)
    got.on_complete(lambda f: in_place.append(contents(dst) == data))
    w = a.write([(h_src, h_dst, 0, 0, size)], notify=f"wrote {size}".encode())
    assert w.wait_for(60) == OK, w.message
    assert got.wait_for(60) == OK, got.message
    assert got.notification() == f"wrote {size}".encode()
    wait_until(lambda: in_place, what="the recv_notify continuation")
    assert in_place == [True], f"the notification of a {size}-byte write arrived before its bytes"


@over("write", "send_notify")
def test_notifications_arrive_exactly_once_in_order(pair, new_buffer):
    a, b = pair
    src, dst = new_buffer(a, 100 * 64, b"\x05"), new_buffer(b, 100 * 64)
    h_src = a.register_memory_region("src", src.ptr, 0, 100 * 64)
    b.register_memory_region("dst", dst.ptr, 0, 100 * 64)
    connect(a, b)
    h_dst = remote(a, b, "dst")
    early = [b.recv_notify(timeout_ms=30_000) for _ in range(10)]  # posted before any arrived
    order, sent = [], []
    for i in range(100):
        sent.append(a.write([(h_src, h_dst, i * 64, i * 64, 64)], notify=b"w%d" % i))
        order.append(b"w%d" % i)
        if i % 10 == 9:
            sent.append(a.send_notify(b"n%d" % i))
            order.append(b"n%d" % i)
    for f in sent:
        assert f.wait_for(DEADLINE) == OK, f.message
    got = []
    for f in early:
        assert f.wait_for(DEADLINE) == OK, f.message
        got.append(f.notification())
    while len(got) < len(order):
        f = b.recv_notify(timeout_ms=10_000)
        assert f.wait_for(DEADLINE) == OK, f.message
        got.append(f.notification())
    assert got == order
    assert contents(dst) == contents(src)
    extra = b.recv_notify(timeout_ms=200)
    assert extra.wait_for(DEADLINE) == TIMEOUT, "a notification was delivered twice"


@over("send_notify")
def test_a_timed_out_recv_notify_takes_nothing(pair):
    a, b = pair
    connect(a, b)
    late = b.recv_notify(timeout_ms=150)
    assert late.wait_for(DEADLINE) == TIMEOUT, late.message
    assert late.notification() == b""
    assert a.send_notify(bytearray(b"after the timeout")).wait_for(DEADLINE) == OK
    nxt = b.recv_notify(timeout_ms=10_000)
    assert nxt.wait_for(DEADLINE) == OK, nxt.message
    assert nxt.notification() == b"after the timeout"


@over("write", "send_notify")
def test_on_complete_wait_any_and_wait_all_hold_on_every_transport(pair, new_buffer):
    a, b = pair
    src, dst = new_buffer(a, 4096, b"\x09"), new_buffer(b, 4096)
    h_src = a.register_memory_region("src", src.ptr, 0, 4096)
    b.register_memory_region("dst", dst.ptr, 0, 4096)
    connect(a, b)
    h_dst = remote(a, b, "dst")
    never = a.recv_notify(timeout_ms=30_000)  # nothing is sent to a: it waits
    calls = []
    writes = [a.write([(h_src, h_dst, i * 512, i * 512, 512)]) for i in range(8)]
    for w in writes:
        w.on_complete(lambda f: calls.append(f.status))
    assert dlslime.wait_any([never, writes[3]], timeout=DEADLINE) == 1
    assert dlslime.wait_all(writes, timeout=DEADLINE)
    assert all(w.status == OK for w in writes)
    wait_until(lambda: len(calls) == 8, timeout=DEADLINE, what="the on_complete callbacks")
    assert calls == [OK] * 8
    assert dlslime.wait_any([never], timeout=0.05) is None
    assert contents(dst) == contents(src)


@over("send_notify")
def test_a_cancelled_recv_notify_takes_nothing(pair):
    a, b = pair
    connect(a, b)
    waiting = a.recv_notify(timeout_ms=10_000)
    assert waiting.cancel() is True
    assert waiting.status == CANCELLED, waiting.message
    assert waiting.cancel() is False
    assert b.send_notify(b"after the cancel").wait_for(DEADLINE) == OK
    nxt = a.recv_notify(timeout_ms=10_000)
    assert nxt.wait_for(DEADLINE) == OK and nxt.notification() == b"after the cancel"


@over("write", "send_notify")
def test_notification_arguments_are_checked(pair, new_buffer):
    a, b = pair
    src, dst = new_buffer(a, 64), new_buffer(b, 64)
    h_src = a.register_memory_region("src", src.ptr, 0, 64)
    b.register_memory_region("dst", dst.ptr, 0, 64)
    connect(a, b)
    h_dst = remote(a, b, "dst")
    with pytest.raises(ValueError, match="4096"):
        a.send_notify(bytes(4097))
    with pytest.raises(ValueError, match="4096"):
        a.write([(h_src, h_dst, 0, 0, 64)], notify=bytes(4097))
    with pytest.raises(TypeError, match="notify"):
        a.write([(h_src, h_dst, 0, 0, 64)], notify="a str")
    with pytest.raises(TypeError, match="data"):
        a.send_notify(None)
    with pytest.raises(TypeError, match="notify"):
        a.read([(h_src, h_dst, 0, 0, 64)], notify=b"x")
    limit = bytes(range(256)) * 16
    assert a.write([(h_src, h_dst, 0, 0, 64)], notify=memoryview(limit)).wait_for(DEADLINE) == OK
    got = b.recv_notify(timeout_ms=10_000)
    assert got.wait_for(DEADLINE) == OK and got.notification() == limit


# --- unregister during traffic ---------------------------------------------------------


@over("write", where=unregister_revokes_the_peers_access)
def test_no_byte_lands_in_a_region_after_unregister_returns(pair, new_buffer):
    a, b = pair
    size, item = 8 << 20, 512
    src, dst = new_buffer(a, size, b"\x5a"), new_buffer(b, size)
    h_src = a.register_memory_region("src", src.ptr, 0, size)
    b.register_memory_region("dst", dst.ptr, 0, size)
    connect(a, b)
    h_dst = remote(a, b, "dst")
    futures = []
    for k in range(size >> 20):
        base = k << 20
        futures.append(a.write([(h_src, h_dst, base + i * item, base + i * item, item)
                                for i in range((1 << 20) // item)]))
    b.unregister_memory_region("dst")
    dst.write(0, b"\xEE" * size)  # the canary: any later write would overwrite it
    statuses = [f.wait_for(DEADLINE) for f in futures]
    assert all(s in (OK, UNKNOWN_HANDLE) for s in statuses), statuses
    assert contents(dst) == b"\xEE" * size, "bytes landed in the region after unregister returned"
    # The handle is gone at the owner; the connection still serves other regions.
    assert a.write([(h_src, h_dst, 0, 0, 8)]).wait_for(DEADLINE) == UNKNOWN_HANDLE
    other = new_buffer(b, 64)
    b.register_memory_region("other", other.ptr, 0, 64)
    assert a.write([(h_src, remote(a, b, "other"), 0, 0, 64)]).wait_for(DEADLINE) == OK
    assert contents(other) == b"\x5a" * 64


# --- cancellation (Future.cancel, docs/api.md "Cancellation") ---------------------------


def queueing_options(transport):
    """transport_options() under which a send submitted behind a large message to a receiver
    with no recv posted stays queued in the sender, never on the wire: tcp, one lane of
    4 KiB frames (the large message alone fills one vectored write) and a receiver that
    holds no message; rdma, a credit of two messages (max_recv_wr / 4)."""
    options = dict(transport_options(transport))
    if transport == "tcp":
        options.update(lanes=1, chunk_size=4096, unexpected_buffer_bytes=0)
    if transport == "rdma":
        options["max_recv_wr"] = 8
    return options


def withdraws_queued_sends(transport):
    """Whether a send queued so is withdrawn by Future.cancel()."""
    return transport in ("tcp", "rdma")


def cancels_reads_in_flight(transport):
    """Whether cancel() ends a read whose request may be out already (tcp drains its answer)."""
    return transport == "tcp"


@over("send", "recv")
def test_a_cancelled_recv_is_withdrawn_and_the_next_message_goes_to_the_next_recv(pair, new_buffer):
    a, b = pair
    connect(a, b)
    box1, box2 = new_buffer(b, 64, b"\xAA"), new_buffer(b, 64)
    r1 = b.recv((box1.ptr, 0, 64))
    r2 = b.recv((box2.ptr, 0, 64))
    assert r1.cancel() is True, "a posted recv that no message has reached must be withdrawn"
    assert r1.done() and r1.status == CANCELLED, r1.message
    assert "cancelled by the user" in r1.message
    assert r1.cancel() is False  # once
    msg = new_buffer(a, 48, pattern(48, 3))
    sd = a.send((msg.ptr, 0, 48))
    assert sd.wait_for(DEADLINE) == OK, sd.message
    assert r2.wait_for(DEADLINE) == OK, r2.message
    assert r2.nbytes == 48 and contents(box2, 0, 48) == contents(msg)
    assert contents(box1) == b"\xAA" * 64, "the withdrawn recv's buffer was written"
    # An op that has ended is not cancelled: its status stays.
    assert r2.cancel() is False and sd.cancel() is False
    assert r2.status == OK and sd.status == OK


@over("send", "recv", where=withdraws_queued_sends)
def test_a_queued_send_that_is_cancelled_is_never_received(transport):
    a = dlslime.make_endpoint(transport, **queueing_options(transport))
    b = dlslime.make_endpoint(transport, **queueing_options(transport))
    try:
        connect(a, b)
        big, small = 32 << 20, 64
        m1 = buffer_of(a, big, pattern(4096, 1))
        f1 = a.send((m1.ptr, 0, big))  # b takes none of it until it posts a recv
        fillers = [buffer_of(a, small, pattern(small, 10 + i)) for i in range(2)]
        filler_sends = [a.send((f.ptr, 0, small)) for f in fillers]
        victim = buffer_of(a, small, pattern(small, 99))
        v = a.send((victim.ptr, 0, small))
        assert v.cancel() is True, "a send queued behind others must be withdrawn"
        assert v.status == CANCELLED, v.message
        victim.write(0, b"\xEE" * small)  # were it sent after all, its receiver would get these
        after = buffer_of(a, small, pattern(small, 77))
        fa = a.send((after.ptr, 0, small))
        # b takes messages in order now: the big one, the fillers, then the next one.
        box_big = buffer_of(b, big)
        r_big = b.recv((box_big.ptr, 0, big))
        boxes = [buffer_of(b, small) for _ in range(3)]
        recvs = [b.recv((box.ptr, 0, small)) for box in boxes]
        assert r_big.wait_for(DEADLINE) == OK, r_big.message
        assert contents(box_big) == contents(m1)
        assert f1.wait_for(DEADLINE) == OK, f1.message
        for i in range(2):
            assert recvs[i].wait_for(DEADLINE) == OK, recvs[i].message
            assert contents(boxes[i]) == pattern(small, 10 + i)
            assert filler_sends[i].wait_for(DEADLINE) == OK
        assert recvs[2].wait_for(DEADLINE) == OK, recvs[2].message
        assert contents(boxes[2]) == pattern(small, 77), "the cancelled send was received"
        assert fa.wait_for(DEADLINE) == OK, fa.message
    finally:
        a.shutdown()
        b.shutdown()


@over("read")
def test_a_read_cancelled_in_flight_never_writes_its_buffer_again(pair, new_buffer, transport):
    """Whatever cancel() answers, its promise holds: True, the op ended CANCELLED and its
    buffer is never written again (later reads on every lane have completed, so a late
    answer has arrived); False, the op ends as usual."""
    a, b = pair
    size = 4 << 20
    src = new_buffer(b, size, pattern(4096, 5))
    dst, other = new_buffer(a, size), new_buffer(a, size)
    b.register_memory_region("src", src.ptr, 0, size)
    h_dst = a.register_memory_region("dst", dst.ptr, 0, size)
    h_other = a.register_memory_region("other", other.ptr, 0, size)
    connect(a, b)
    h_src = remote(a, b, "src")
    expected = contents(src)
    withdrawn = 0
    for _ in range(10):
        dst.write(0, bytes(size))
        rd = a.read([(h_dst, h_src, 0, 0, size)])
        if rd.cancel():
            withdrawn += 1
            assert rd.done() and rd.status == CANCELLED, rd.message
            dst.write(0, b"\xEE" * size)  # from here on, no byte of the read may land
            later = [a.read([(h_other, h_src, 0, 0, size)]) for _ in range(4)]
            assert [f.wait_for(DEADLINE) for f in later] == [OK] * 4
            assert contents(dst) == b"\xEE" * size, "the read wrote its buffer after cancel() returned True"
        else:
            assert rd.wait_for(DEADLINE) == OK, rd.message
            assert contents(dst) == expected
            assert rd.cancel() is False
    if cancels_reads_in_flight(transport):
        assert withdrawn > 0, "no read was cancelled in 10 tries"


@over("send", "recv")
def test_cancel_from_an_on_complete_callback_returns(pair, new_buffer):
    """The callback runs on the transport's own thread: cancel() there must not wait for it.
    `a` receives: its futures and callbacks are this process's (`b` may be another one)."""
    b, a = pair
    connect(a, b)
    box1, box2, box3 = new_buffer(b, 64), new_buffer(b, 64), new_buffer(b, 64)
    r1 = b.recv((box1.ptr, 0, 64))
    r2 = b.recv((box2.ptr, 0, 64))
    answer = []
    answered = threading.Event()

    def on_first(_):
        answer.append((r2.cancel(), r2.done()))
        answered.set()

    r1.on_complete(on_first)
    msg = new_buffer(a, 64, pattern(64, 8))
    sd = a.send((msg.ptr, 0, 64))
    assert answered.wait(DEADLINE), "cancel() from a callback did not return"
    assert answer == [(True, True)]
    assert r2.status == CANCELLED, r2.message
    r3 = b.recv((box3.ptr, 0, 64))
    sd2 = a.send((msg.ptr, 0, 64))
    assert r3.wait_for(DEADLINE) == OK, r3.message
    assert contents(box3) == contents(msg)
    assert sd.wait_for(DEADLINE) == OK and sd2.wait_for(DEADLINE) == OK


# --- a peer process killed mid-transfer ------------------------------------------------

PEER_REGION = 64 << 20


@over("write", "read")
def test_peer_process_killed_mid_transfer_fails_pending_futures(transport, new_buffer):
    ep = make(transport)
    peer = other = None
    try:
        peer = PeerEndpoint.start(transport, transport_options(transport))
        region = new_buffer(peer, PEER_REGION, b"\x33")
        peer.register_memory_region("peer", region.ptr, 0, PEER_REGION)
        local = new_buffer(ep, PEER_REGION, b"\x01")
        h_local = ep.register_memory_region("local", local.ptr, 0, PEER_REGION)
        sink = new_buffer(ep, PEER_REGION)  # the reads' own: `local` keeps its 0x01 for the write after
        h_sink = ep.register_memory_region("sink", sink.ptr, 0, PEER_REGION)
        connect(ep, peer)
        h_peer = remote(ep, peer, "peer")
        futures = []
        if ep.capabilities()["send_recv"]:
            box = new_buffer(ep, 64)
            futures.append(ep.recv((box.ptr, 0, 64)))  # can only fail
        recvs = len(futures)
        quarter = PEER_REGION // 4  # each op its own: ops in flight at once never overlap
        for i in range(4):
            futures.append(ep.write([(h_local, h_peer, i * quarter, i * quarter, quarter)]))
            futures.append(ep.read([(h_sink, h_peer, i * quarter, i * quarter, quarter)]))
        # 128 MiB queued: the kill comes mid-transfer. Whether a transfer already running is
        # cut is the transport's (a GPU copy, once queued, runs): every one must complete.
        pending_at_kill = [not f.done() for f in futures[recvs:]]
        peer.kill()
        t0 = time.monotonic()
        statuses = [f.wait_for(15) for f in futures]
        assert None not in statuses, f"a future hung after the peer died: {statuses}"
        assert time.monotonic() - t0 < 15
        assert any(pending_at_kill), "every 16 MiB transfer finished before the kill"
        if recvs:
            assert statuses[0] == PEER_CLOSED, futures[0].message
        # Submission may reach the transport after it has seen the loss: NOT_CONNECTED then.
        assert all(s in (OK, PEER_CLOSED, NOT_CONNECTED) for s in statuses), statuses
        # The survivor notices: new ops fail; and it connects to a new peer.
        wait_until(lambda: not ep.is_connected(), 10, what="the dead peer to be noticed")
        after = ep.write([(h_local, h_peer, 0, 0, 16)])
        assert after.wait_for(DEADLINE) in (PEER_CLOSED, NOT_CONNECTED), after.message
        other = make_peer(transport)
        dst = new_buffer(other, 16)
        other.register_memory_region("dst", dst.ptr, 0, 16)
        connect(ep, other)
        assert ep.write([(h_local, remote(ep, other, "dst"), 0, 0, 16)]).wait_for(DEADLINE) == OK
        assert contents(dst) == b"\x01" * 16
    finally:
        ep.shutdown()
        if peer is not None:
            peer.close()
        if other is not None:
            close_peer(other)


# --- many ops in flight at once (issue 21) -------------------------------------------------

SOAK_SECONDS = float(os.environ.get("DLSLIME_CONFORMANCE_SOAK_SECONDS", "10"))  # per transport; scripts/soak.sh sets more
SOAK_REGION = 16 << 20


def soak_params():
    params = []
    for t in transports_with("write", "read"):
        variants = soak_variants(t)
        params += [pytest.param(t, v, len(variants), id=f"{t}-{v[0]}") for v in variants]
    return params


@pytest.mark.parametrize("transport,variant,nvariants", soak_params())
def test_many_ops_in_flight_in_both_directions_are_byte_exact(transport, variant, nvariants):
    """Rounds of dozens of ops posted at once before any is waited for: writes, reads, sends
    and write_with_imm (as the transport can), from both sides, sizes from 1 B to several
    chunks at odd offsets. Every future succeeds, every byte is where it belongs, the
    connection survives (issue 21: bursts closed healthy TCP lanes; GPU staging deadlocked
    when both sides staged). The C++ suite runs the same workload."""
    name, overrides, device = variant
    options = dict(transport_options(transport), **overrides)
    chunk = overrides.get("chunk_size", 1 << 20)
    a = dlslime.make_endpoint(transport, **options)
    b = (PeerEndpoint.start(transport, options) if peer_in_another_process(transport)
         else dlslime.make_endpoint(transport, **options))
    caps = a.capabilities()
    keep = []

    def memory(side, n):
        buf = (side.buffer(n) if isinstance(side, PeerEndpoint)
               else testing.device_buffer(n) if device else testing.buffer_for(side.capabilities(), n))
        keep.append(buf)
        return buf

    try:
        sides = {}
        for tag, ep, seed in (("a", a, 1), ("b", b, 2)):
            src, dst = memory(ep, SOAK_REGION), memory(ep, SOAK_REGION)
            data = random.Random(seed).randbytes(SOAK_REGION)
            src.write(0, data)
            sides[tag] = {"ep": ep, "src": src, "dst": dst, "bytes": data,
                          "h_src": ep.register_memory_region("src", src.ptr, 0, SOAK_REGION),
                          "h_dst": ep.register_memory_region("dst", dst.ptr, 0, SOAK_REGION)}
        connect(a, b)
        for x, y in (("a", "b"), ("b", "a")):
            sides[x]["peer_src"] = remote(sides[x]["ep"], sides[y]["ep"], "src")
            sides[x]["peer_dst"] = remote(sides[x]["ep"], sides[y]["ep"], "dst")
        kinds = ["write", "read"] + (["send"] if caps["send_recv"] else []) + \
            (["write_with_imm"] if caps["write_with_imm"] and caps["imm_recv"] else [])
        sizes = [1, 100, 4095, 65537, chunk - 1, chunk + 1, 2 * chunk + 7]
        rnd = random.Random(name)
        end = time.monotonic() + SOAK_SECONDS / nvariants
        ops = rounds = 0
        while True:
            rounds += 1
            futures, expect, imms_sent, imm_recvs = [], [], [], []
            used = {"a": 0, "b": 0}
            for k in range(48):
                x, y = rnd.choice((("a", "b"), ("b", "a")))
                X, Y = sides[x], sides[y]
                kind, n = rnd.choice(kinds), rnd.choice(sizes)
                src_at = rnd.randrange(SOAK_REGION - n)
                into, frm = (x, y) if kind == "read" else (y, x)
                at = used[into] + rnd.randrange(8)
                if at + n > SOAK_REGION:
                    break
                used[into] = at + n
                expect.append((into, at, frm, src_at, n))
                if kind == "write":
                    futures.append((kind, n, X["ep"].write([(X["h_src"], X["peer_dst"], at, src_at, n)])))
                elif kind == "read":
                    futures.append((kind, n, X["ep"].read([(X["h_dst"], X["peer_src"], src_at, at, n)])))
                elif kind == "send":
                    futures.append(("recv", n, Y["ep"].recv((Y["dst"].ptr, at, n))))
                    futures.append((kind, n, X["ep"].send((X["src"].ptr, src_at, n))))
                else:
                    imm = rounds * 1000 + k
                    imm_recvs.append(Y["ep"].imm_recv())
                    imms_sent.append(imm)
                    futures.append((kind, n, X["ep"].write_with_imm([(X["h_src"], X["peer_dst"], at, src_at, n)],
                                                                   imm)))
            ops += len(futures) + len(imm_recvs)
            for kind, n, f in futures:
                assert f.wait_for(60) == OK, f"{name}, round {rounds}, {kind} of {n} B: {f.status} {f.message}"
            for f in imm_recvs:
                assert f.wait_for(60) == OK, f"{name}, imm_recv: {f.message}"
            got_imms = collections.Counter(f.imm_data() for f in imm_recvs)
            assert got_imms == collections.Counter(imms_sent), f"{name}: each immediate exactly once"
            got = {tag: sides[tag]["dst"].read(0, used[tag]) for tag in used}
            for into, at, frm, src_at, n in expect:
                assert got[into][at:at + n] == sides[frm]["bytes"][src_at:src_at + n], \
                    f"{name}, round {rounds}: {n} B at {at} in {into} are not {frm}'s bytes at {src_at}"
            assert a.is_connected() and b.is_connected(), f"{name}: the connection was lost"
            if time.monotonic() >= end:
                break
        print(f"soak {transport} {name}: {ops} ops in {rounds} rounds, every byte checked")
    finally:
        a.shutdown()
        close_peer(b)
        keep.clear()
