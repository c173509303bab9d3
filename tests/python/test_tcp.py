"""The exhaustive raw TcpEndpoint reference (the seed guide's "Raw TcpEndpoint" section).

Every test asserts what a user relies on: the bytes that arrived, the status and message
of a failed op, and that futures complete instead of hanging."""

import ctypes
import os
import signal
import threading
import time

import numpy as np
import pytest

import dlslime
from dlslime import TcpEndpoint
from conftest import Buffer, connect_pair, wait_until

OK = 0
TIMEOUT = 402
OUT_OF_BOUNDS = 404
UNKNOWN_HANDLE = 405
CANCELLED = 406
PEER_CLOSED = 407
TOO_LARGE = 408
NOT_CONNECTED = 410


def test_status_codes_are_documented_values():
    assert int(dlslime.StatusCode.SUCCESS) == 0
    assert int(dlslime.StatusCode.TIMEOUT) == TIMEOUT
    assert int(dlslime.StatusCode.FAILED) == 403
    assert int(dlslime.StatusCode.OUT_OF_BOUNDS) == OUT_OF_BOUNDS
    assert int(dlslime.StatusCode.MESSAGE_TOO_LARGE) == TOO_LARGE


# --- the seed snippets, verbatim ------------------------------------------------------


def test_seed_snippet_send():
    import ctypes
    from dlslime import TcpEndpoint

    ep_a = TcpEndpoint(ip="0.0.0.0", port=0)   # 0 = OS-assigned
    ep_b = TcpEndpoint(ip="0.0.0.0", port=0)
    info_a = ep_a.endpoint_info()              # {"host", "port", "mr_info"}
    info_b = ep_b.endpoint_info()

    # Both sides bind a port and connect; the handshake is symmetric.
    ep_a.connect(info_b)
    ep_b.connect(info_a)

    buf = ctypes.create_string_buffer(64)
    fut = ep_a.send((ctypes.addressof(buf), 0, 5))
    assert fut.wait() == 0

    # Beyond the seed: the message is really there.
    inbox = ctypes.create_string_buffer(64)
    rv = ep_b.recv((ctypes.addressof(inbox), 0, 64))
    assert rv.wait_for(5) == 0 and rv.nbytes == 5
    for key in ("host", "port", "mr_info"):
        assert key in info_a
    ep_a.shutdown()
    ep_b.shutdown()


def test_seed_snippet_one_sided_write():
    ep_a = TcpEndpoint(ip="0.0.0.0", port=0)
    ep_b = TcpEndpoint(ip="0.0.0.0", port=0)
    src = ctypes.create_string_buffer(b"hello world!", 256)
    dst = ctypes.create_string_buffer(256)
    addr_a, addr_b = ctypes.addressof(src), ctypes.addressof(dst)

    h_local = ep_a.register_memory_region("a", addr_a, 0, 256)
    h_local_b = ep_b.register_memory_region("b", addr_b, 0, 256)
    info_b = ep_b.endpoint_info()                      # carries mr_info["b"]
    h_remote = ep_a.register_remote_memory_region("rb", info_b["mr_info"]["b"])
    ep_a.connect(info_b)
    ep_b.connect(ep_a.endpoint_info())
    ep_a.write([(h_local, h_remote, 0, 0, 12)]).wait()

    assert dst.raw[:12] == b"hello world!"
    assert dst.raw[12:] == bytes(244)
    assert isinstance(h_local_b, int)
    ep_a.shutdown()
    ep_b.shutdown()


def test_connect_through_advertised_address():
    a = TcpEndpoint(ip="0.0.0.0", port=0, advertise_host="127.0.0.1")
    b = TcpEndpoint(ip="0.0.0.0", port=0, advertise_host="127.0.0.1")
    connect_pair(a, b)
    assert a.is_connected() and b.is_connected()
    a.shutdown()
    b.shutdown()


# --- two-sided -------------------------------------------------------------------------

def test_messages_sent_before_recv_is_posted_are_held_in_order(endpoint_pair):
    a, b = endpoint_pair
    connect_pair(a, b)
    outs = [Buffer(100, bytes([i])) for i in range(5)]
    sends = [a.send((o.addr, 0, 100)) for o in outs]
    assert [s.wait_for(10) for s in sends] == [OK] * 5  # eager: completes without a recv
    for i in range(5):
        box = Buffer(100)
        fut = b.recv((box.addr, 0, 100))
        assert fut.wait_for(10) == OK
        assert box.bytes() == bytes([i]) * 100

def test_message_longer_than_posted_buffer_fails_without_overwriting(endpoint_pair):
    a, b = endpoint_pair
    connect_pair(a, b)
    box = Buffer(64, b"\xAA")
    rv = b.recv((box.addr, 8, 16))  # bytes [8, 24) only
    msg = Buffer(40, b"X")
    sd = a.send((msg.addr, 0, 40))
    assert rv.wait_for(10) == TOO_LARGE
    assert "40 bytes" in rv.message and "16 bytes" in rv.message
    assert sd.wait_for(10) == TOO_LARGE
    assert box.bytes() == b"\xAA" * 64  # nothing written, inside or past the buffer
    # The connection still works.
    rv2 = b.recv((box.addr, 0, 64))
    assert a.send((msg.addr, 0, 40)).wait_for(10) == OK
    assert rv2.wait_for(10) == OK and box.bytes(0, 40) == b"X" * 40


def test_held_message_too_large_for_later_recv(endpoint_pair):
    a, b = endpoint_pair
    connect_pair(a, b)
    msg = Buffer(50, b"Y")
    assert a.send((msg.addr, 0, 50)).wait_for(10) == OK  # held by b
    box = Buffer(32, b"\x01")
    rv = b.recv((box.addr, 0, 20))
    assert rv.wait_for(10) == TOO_LARGE
    assert box.bytes() == b"\x01" * 32


def test_large_message_and_zero_length_message(endpoint_pair):
    a, b = endpoint_pair
    connect_pair(a, b)
    size = 5 * 1024 * 1024 + 3  # several frames
    src = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    dst = np.zeros(size, dtype=np.uint8)
    rv = b.recv((dst.ctypes.data, 0, size))
    assert a.send((src.ctypes.data, 0, size)).wait_for(30) == OK
    assert rv.wait_for(30) == OK and rv.nbytes == size
    assert np.array_equal(src, dst)
    rv0 = b.recv((dst.ctypes.data, 0, 16))
    assert a.send((src.ctypes.data, 0, 0)).wait_for(10) == OK
    assert rv0.wait_for(10) == OK and rv0.nbytes == 0


def test_messages_held_before_the_peer_left_are_still_delivered(endpoint_pair):
    a, b = endpoint_pair
    connect_pair(a, b)
    for text in (b"first", b"second"):
        msg = Buffer(len(text), text)
        assert a.send((msg.addr, 0, len(text))).wait_for(10) == OK
    a.shutdown()
    wait_until(lambda: not b.is_connected(), 10, what="b notices a left")
    box = Buffer(16)
    for text in (b"first", b"second"):
        rv = b.recv((box.addr, 0, 16))
        assert rv.wait_for(10) == OK and box.bytes(0, rv.nbytes) == text
    assert b.recv((box.addr, 0, 16)).wait_for(10) == PEER_CLOSED

def test_recv_timeout_option():
    a = TcpEndpoint(ip="127.0.0.1", port=0, recv_timeout=0.2)
    b = TcpEndpoint(ip="127.0.0.1", port=0)
    connect_pair(a, b)
    box = Buffer(8)
    rv = a.recv((box.addr, 0, 8))
    assert rv.wait_for(10) == TIMEOUT
    assert "recv_timeout" in rv.message
    a.shutdown()
    b.shutdown()



def test_a_recvs_own_timeout_ends_it_alone_and_the_next_message_arrives():
    # review F11: recv(timeout_ms=) bounds the wait of a target that only waits.
    a = TcpEndpoint(ip="127.0.0.1", port=0)
    b = TcpEndpoint(ip="127.0.0.1", port=0)
    connect_pair(a, b)
    box = Buffer(32)
    early = a.recv((box.addr, 0, 32), timeout_ms=10000)
    rv = a.recv((box.addr, 0, 32), None, False, 150)
    assert rv.wait_for(10) == TIMEOUT
    assert "its timeout" in rv.message
    assert not early.done() and a.is_connected()
    msg = Buffer(32, b"after the timeout")
    assert b.send((msg.addr, 0, 17)).wait_for(10) == OK
    assert early.wait_for(10) == OK and box.bytes(0, early.nbytes) == b"after the timeout"
    with pytest.raises(ValueError, match="timeout"):
        a.recv((box.addr, 0, 32), timeout_ms=-1)
    a.shutdown()
    b.shutdown()

# --- one-sided -------------------------------------------------------------------------


def registered_pair(a, b, size_a, size_b, fill_a=None, fill_b=None):
    buf_a, buf_b = Buffer(size_a, fill_a), Buffer(size_b, fill_b)
    h_a = a.register_memory_region("a", buf_a.addr, 0, size_a)
    b.register_memory_region("b", buf_b.addr, 0, size_b)
    connect_pair(a, b)
    h_b = a.register_remote_memory_region("b", b.endpoint_info()["mr_info"]["b"])
    return buf_a, buf_b, h_a, h_b

def test_256_mib_transfer_byte_for_byte(endpoint_pair):
    a, b = endpoint_pair
    size = 256 * 1024 * 1024
    src = np.random.default_rng(2026).integers(0, 256, size, dtype=np.uint8)
    dst = np.zeros(size, dtype=np.uint8)
    back = np.zeros(size, dtype=np.uint8)
    h_src = a.register_memory_region("src", src.ctypes.data, 0, size)
    h_back = a.register_memory_region("back", back.ctypes.data, 0, size)
    b.register_memory_region("dst", dst.ctypes.data, 0, size)
    connect_pair(a, b)
    h_dst = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"])
    assert a.write([(h_src, h_dst, 0, 0, size)]).wait_for(120) == OK
    assert np.array_equal(src, dst)
    fut = a.read([(h_back, h_dst, 0, 0, size)])
    assert fut.wait_for(120) == OK and fut.nbytes == size
    assert np.array_equal(src, back)


def test_concurrent_operations_from_8_threads(endpoint_pair):
    a, b = endpoint_pair
    threads, per_thread, item = 8, 40, 4096
    src = np.random.default_rng(3).integers(0, 256, threads * per_thread * item, dtype=np.uint8)
    dst = np.zeros_like(src)
    back = np.zeros_like(src)
    h_src = a.register_memory_region("src", src.ctypes.data, 0, src.nbytes)
    h_back = a.register_memory_region("back", back.ctypes.data, 0, back.nbytes)
    b.register_memory_region("dst", dst.ctypes.data, 0, dst.nbytes)
    connect_pair(a, b)
    h_dst = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"])
    errors = []

    def worker(t):
        try:
            for k in range(per_thread):
                off = (t * per_thread + k) * item
                st = a.write([(h_src, h_dst, off, off, item)]).wait_for(30)
                if st != OK:
                    errors.append(("write", t, k, st))
                    return
                st = a.read([(h_back, h_dst, off, off, item)]).wait_for(30)
                if st != OK:
                    errors.append(("read", t, k, st))
                    return
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(60)
    assert not any(th.is_alive() for th in pool)
    assert errors == []
    assert np.array_equal(src, dst) and np.array_equal(src, back)


# --- errors ----------------------------------------------------------------------------


def test_unknown_handles_and_out_of_range_fail_alone(endpoint_pair):
    a, b = endpoint_pair
    buf_a, buf_b, h_a, h_b = registered_pair(a, b, 256, 256, fill_a=b"q")
    cases = [
        ([(h_a + 100, h_b, 0, 0, 8)], UNKNOWN_HANDLE, "handle"),       # local handle
        ([(h_a, h_b + 100, 0, 0, 8)], UNKNOWN_HANDLE, "handle"),       # remote handle
        ([(h_a, h_b, 250, 0, 8)], OUT_OF_BOUNDS, "outside"),          # remote range
        ([(h_a, h_b, 0, 250, 8)], OUT_OF_BOUNDS, "outside"),          # local range
        ([(h_a, h_b, 2**63, 0, 8)], OUT_OF_BOUNDS, "outside"),        # overflowing offset
    ]
    for batch, code, words in cases:
        for op in (a.write, a.read):
            fut = op(batch)
            assert fut.wait_for(10) == code, (batch, fut.message)
            assert words in fut.message
    assert buf_b.bytes() == bytes(256)
    # The connection still works.
    assert a.write([(h_a, h_b, 0, 0, 256)]).wait_for(10) == OK
    assert buf_b.bytes() == b"q" * 256


def test_owner_side_checks_catch_stale_region_info(endpoint_pair):
    """The peer's table is authoritative: a forged or stale mr_info cannot reach memory."""
    a, b = endpoint_pair
    buf_a, buf_b, h_a, h_b = registered_pair(a, b, 256, 64, fill_a=b"z")
    guard = Buffer(64)
    entry = dict(b.endpoint_info()["mr_info"]["b"])
    entry["length"] = 256  # claims more than the owner registered
    h_forged = a.register_remote_memory_region("forged", entry)
    fut = a.write([(h_a, h_forged, 0, 0, 128)])
    assert fut.wait_for(10) == OUT_OF_BOUNDS
    assert "peer reported" in fut.message
    fut = a.read([(h_a, h_forged, 32, 0, 64)])
    assert fut.wait_for(10) == OUT_OF_BOUNDS
    assert buf_b.bytes() == bytes(64)
    # Unregistered at the owner: the old handle is unknown there.
    b.unregister_memory_region("b")
    fut = a.write([(h_a, h_b, 0, 0, 8)])
    assert fut.wait_for(10) == UNKNOWN_HANDLE and "peer reported" in fut.message
    assert buf_b.bytes() == bytes(64) and guard.bytes() == bytes(64)
    # Still connected: a region registered now works.
    b.register_memory_region("b2", buf_b.addr, 0, 64)
    h_b2 = a.register_remote_memory_region("b2", b.endpoint_info()["mr_info"]["b2"])
    assert a.write([(h_a, h_b2, 0, 0, 64)]).wait_for(10) == OK
    assert buf_b.bytes() == b"z" * 64


def test_bad_arguments_raise(endpoint_pair):
    a, b = endpoint_pair
    connect_pair(a, b)
    with pytest.raises(TypeError):
        a.write([(0, 0, 0, 8)])  # 4 fields
    with pytest.raises(TypeError):
        a.write("nope")
    with pytest.raises(ValueError):
        a.write([(0, 0, -1, 0, 8)])
    with pytest.raises(ValueError):
        a.write([])
    with pytest.raises(TypeError):
        a.send((0, 0))
    with pytest.raises(ValueError):
        a.send((0, 0, 8))  # null address
    with pytest.raises(KeyError):
        a.unregister_memory_region("never-registered")
    with pytest.raises(ValueError):
        a.register_remote_memory_region("x", {"addr": 1})
    with pytest.raises(ValueError):
        a.register_memory_region("", 4096, 0, 8)
    with pytest.raises(TypeError):
        TcpEndpoint(ip="127.0.0.1", port=0, no_such_option=1)
    with pytest.raises(ValueError):
        TcpEndpoint(ip="127.0.0.1", port=0, lanes=0)
    with pytest.raises(ValueError):
        a.connect({"port": 1})
    with pytest.raises(ValueError):
        a.connect({"host": "127.0.0.1", "port": 70000})


def test_imm_operations_raise_not_implemented(endpoint_pair):
    a, b = endpoint_pair
    connect_pair(a, b)
    with pytest.raises(NotImplementedError):
        a.write_with_imm([(0, 0, 0, 0, 8)], 5)
    with pytest.raises(NotImplementedError):
        a.imm_recv()
    assert a.capabilities()["write_with_imm"] is False


def test_ops_before_connect_fail_with_not_connected(make_buffer):
    ep = TcpEndpoint(ip="127.0.0.1", port=0)
    buf = make_buffer(16)
    h = ep.register_memory_region("r", buf.addr, 0, 16)
    hr = ep.register_remote_memory_region("x", {"handle": 0, "length": 16})
    fut = ep.write([(h, hr, 0, 0, 8)])
    assert fut.wait_for(10) == NOT_CONNECTED and "connect" in fut.message
    assert ep.send((buf.addr, 0, 8)).wait_for(10) == NOT_CONNECTED
    ep.shutdown()


def test_connect_to_closed_port_raises_connection_error():
    dead = TcpEndpoint(ip="127.0.0.1", port=0)
    info = dead.endpoint_info()
    dead.shutdown()
    ep = TcpEndpoint(ip="127.0.0.1", port=0, connect_timeout=5)
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match="refused"):
        ep.connect(info)
    assert time.monotonic() - t0 < 5
    ep.shutdown()


def test_connect_to_wrong_endpoint_id_is_refused(endpoint_pair):
    a, b = endpoint_pair
    info = b.endpoint_info()
    info["endpoint_id"] = info["endpoint_id"] ^ 1
    with pytest.raises(ConnectionError, match="stale|different endpoint"):
        a.connect(info)


def test_connect_in_either_order_and_concurrently():
    for order in ("ab", "ba", "both"):
        a = TcpEndpoint(ip="127.0.0.1", port=0)
        b = TcpEndpoint(ip="127.0.0.1", port=0)
        ia, ib = a.endpoint_info(), b.endpoint_info()
        if order == "ab":
            a.connect(ib)
            b.connect(ia)
        elif order == "ba":
            b.connect(ia)
            a.connect(ib)
        else:
            t = threading.Thread(target=b.connect, args=(ia,))
            t.start()
            a.connect(ib)
            t.join(20)
        box, msg = Buffer(8), Buffer(3, b"abc")
        rv = b.recv((box.addr, 0, 8))
        assert a.send((msg.addr, 0, 3)).wait_for(10) == OK
        assert rv.wait_for(10) == OK and box.bytes(0, 3) == b"abc"
        rv = a.recv((box.addr, 0, 8))
        assert b.send((msg.addr, 0, 3)).wait_for(10) == OK
        assert rv.wait_for(10) == OK
        a.shutdown()
        b.shutdown()


def test_third_endpoint_is_refused_while_paired(endpoint_pair):
    a, b = endpoint_pair
    connect_pair(a, b)
    c = TcpEndpoint(ip="127.0.0.1", port=0)
    with pytest.raises(ConnectionError, match="already connected"):
        c.connect(b.endpoint_info())
    c.shutdown()


def test_shutdown_completes_pending_futures_and_is_idempotent(endpoint_pair):
    a, b = endpoint_pair
    connect_pair(a, b)
    box = Buffer(8)
    pending = [a.recv((box.addr, 0, 8)) for _ in range(3)]
    a.shutdown()
    a.shutdown()
    for fut in pending:
        assert fut.wait_for(5) == CANCELLED
    assert a.send((box.addr, 0, 8)).wait_for(5) == CANCELLED
    with pytest.raises(ConnectionError):
        a.connect(b.endpoint_info())
    # The peer notices: its pending recv fails promptly with PEER_CLOSED.
    rv = b.recv((box.addr, 0, 8))
    assert rv.wait_for(10) == PEER_CLOSED


def test_context_manager_shuts_down():
    with TcpEndpoint(ip="127.0.0.1", port=0) as a, TcpEndpoint(ip="127.0.0.1", port=0) as b:
        connect_pair(a, b)
        box = Buffer(8)
        rv = a.recv((box.addr, 0, 8))
    # b exits first (its goodbye may reach a before a's own shutdown): either way the
    # recv completes, and both endpoints are shut down.
    assert rv.wait_for(5) in (CANCELLED, PEER_CLOSED)
    assert a.send((box.addr, 0, 8)).wait_for(5) == CANCELLED
    assert b.send((box.addr, 0, 8)).wait_for(5) == CANCELLED


def test_options_are_reported(monkeypatch):
    ep = TcpEndpoint(ip="127.0.0.1", port=0, lanes=3, timeout=2.5, chunk_size=65536, sndbuf=1 << 20)
    opts = ep.options
    assert opts["lanes"] == 3 and opts["op_timeout_ms"] == 2500
    assert opts["chunk_size"] == 65536 and opts["sndbuf"] == 1 << 20
    assert ep.endpoint_info()["lanes"] == 3
    ep.shutdown()
    monkeypatch.setenv("DLSLIME_TCP_LANES", "5")
    ep = TcpEndpoint(ip="127.0.0.1", port=0)
    assert ep.options["lanes"] == 5
    ep.shutdown()
    monkeypatch.setenv("DLSLIME_TCP_LANES", "many")
    with pytest.raises(ValueError, match="DLSLIME_TCP_LANES"):
        TcpEndpoint(ip="127.0.0.1", port=0)


def test_log_level_can_be_set():
    old = dlslime.get_log_level()
    dlslime.set_log_level("debug")
    assert dlslime.get_log_level() == "debug"
    with pytest.raises(ValueError):
        dlslime.set_log_level("loud")
    dlslime.set_log_level(old)


def test_lanes_stripe_large_transfers():
    for lanes in (1, 4):
        a = TcpEndpoint(ip="127.0.0.1", port=0, lanes=lanes, chunk_size=65536)
        b = TcpEndpoint(ip="127.0.0.1", port=0, lanes=lanes, chunk_size=65536)
        size = 8 * 1024 * 1024 + 12345
        src = np.random.default_rng(lanes).integers(0, 256, size, dtype=np.uint8)
        dst = np.zeros(size, dtype=np.uint8)
        h_src = a.register_memory_region("src", src.ctypes.data, 0, size)
        h_dst_local = b.register_memory_region("dst", dst.ctypes.data, 0, size)
        connect_pair(a, b)
        h_dst = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"])
        assert a.write([(h_src, h_dst, 0, 0, size)]).wait_for(30) == OK
        assert np.array_equal(src, dst)
        assert isinstance(h_dst_local, int)
        a.shutdown()
        b.shutdown()


# --- other processes -------------------------------------------------------------------


def start_peer(spawn_ctx, size, seed):
    from tcp_peer import serve_region

    parent, child = spawn_ctx.Pipe()
    proc = spawn_ctx.Process(target=serve_region, args=(child, size, seed), daemon=True)
    proc.start()
    assert parent.poll(60), "peer process did not start"
    return proc, parent, parent.recv()


def connect_to_peer(ep, local, pipe, peer_info):
    """Registers `local` (a numpy array) as 'local', connects both ways with the peer
    process, and returns (local handle, handle of the peer's region 'peer')."""
    h_local = ep.register_memory_region("local", local.ctypes.data, 0, local.nbytes)
    ep.connect(peer_info)
    pipe.send(ep.endpoint_info())
    assert pipe.poll(30) and pipe.recv() == "connected"
    return h_local, ep.register_remote_memory_region("peer", peer_info["mr_info"]["peer"])


def test_endpoints_in_two_processes(spawn_ctx):
    size = 1 << 20
    proc, pipe, peer_info = start_peer(spawn_ctx, size, seed=5)
    try:
        ep = TcpEndpoint(ip="127.0.0.1", port=0)
        local = np.zeros(size, dtype=np.uint8)
        h_local, h_peer = connect_to_peer(ep, local, pipe, peer_info)
        # read the peer's pattern
        assert ep.read([(h_local, h_peer, 0, 0, size)]).wait_for(30) == OK
        pipe.send(("bytes", 0, size))
        assert pipe.poll(30)
        assert local.tobytes() == pipe.recv()
        # write new bytes, the peer sees them
        local[:] = np.arange(size, dtype=np.uint64).astype(np.uint8)[::-1]
        assert ep.write([(h_local, h_peer, 4096, 100, 10000)]).wait_for(30) == OK
        pipe.send(("bytes", 4096, 14096))
        assert pipe.poll(30) and pipe.recv() == local[100:10100].tobytes()
        # messages both ways
        pipe.send(("recv", 64))
        msg = Buffer(11, b"from parent")
        assert ep.send((msg.addr, 0, 11)).wait_for(30) == OK
        assert pipe.poll(30) and pipe.recv() == (OK, b"from parent")
        box = Buffer(64)
        rv = ep.recv((box.addr, 0, 64))
        pipe.send(("send", b"from child"))
        assert rv.wait_for(30) == OK and box.bytes(0, rv.nbytes) == b"from child"
        assert pipe.poll(30) and pipe.recv() == OK
        pipe.send(("exit",))
        assert pipe.poll(30) and pipe.recv() == "bye"
        # The peer shut down: our side learns promptly.
        wait_until(lambda: not ep.is_connected(), 10, what="peer shutdown noticed")
        ep.shutdown()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def test_peer_killed_mid_transfer_fails_pending_futures(spawn_ctx):
    size = 64 * 1024 * 1024
    proc, pipe, peer_info = start_peer(spawn_ctx, size, seed=9)
    try:
        ep = TcpEndpoint(ip="127.0.0.1", port=0, timeout=60)
        local = np.ones(size, dtype=np.uint8)
        h_local, h_peer = connect_to_peer(ep, local, pipe, peer_info)
        box = Buffer(64)
        futures = [ep.recv((box.addr, 0, 64))]
        for _ in range(4):
            futures.append(ep.write([(h_local, h_peer, 0, 0, size)]))
            futures.append(ep.read([(h_local, h_peer, 0, 0, size)]))
        futures.append(ep.send((box.addr, 0, 64)))
        os.kill(proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        statuses = [f.wait_for(15) for f in futures]
        assert None not in statuses, "a future hung after the peer died"
        assert time.monotonic() - t0 < 15
        assert statuses[0] == PEER_CLOSED  # the recv can only fail
        assert any(s != OK for s in statuses[1:])
        # Submission is handed to the I/O thread asynchronously: an op it takes up after it
        # has seen the loss fails NOT_CONNECTED (naming the loss) instead of PEER_CLOSED.
        assert all(s in (OK, PEER_CLOSED, NOT_CONNECTED) for s in statuses), statuses
        failed = [f for f in futures if f.status != OK]
        assert all("connection" in f.message for f in failed)
        # The survivor can connect to a new peer.
        wait_until(lambda: not ep.is_connected(), 10, what="disconnect noticed")
        other = TcpEndpoint(ip="127.0.0.1", port=0)
        dst = Buffer(16)
        other.register_memory_region("dst", dst.addr, 0, 16)
        ep.connect(other.endpoint_info())
        other.connect(ep.endpoint_info())
        h_dst = ep.register_remote_memory_region("dst", other.endpoint_info()["mr_info"]["dst"])
        assert ep.write([(h_local, h_dst, 0, 0, 16)]).wait_for(10) == OK
        assert dst.bytes() == b"\x01" * 16
        other.shutdown()
        ep.shutdown()
    finally:
        proc.join(10)


def test_stopped_peer_times_out_writes(spawn_ctx):
    size = 32 * 1024 * 1024
    proc, pipe, peer_info = start_peer(spawn_ctx, size, seed=3)
    try:
        ep = TcpEndpoint(ip="127.0.0.1", port=0, timeout=1.0)
        local = np.ones(size, dtype=np.uint8)
        h_local, h_peer = connect_to_peer(ep, local, pipe, peer_info)
        os.kill(proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        fut = ep.write([(h_local, h_peer, 0, 0, size)])
        assert fut.wait_for(10) == TIMEOUT
        assert "op_timeout" in fut.message
        assert time.monotonic() - t0 < 5
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
