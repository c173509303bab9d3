"""Region and op lifetimes (issue 10, items 1, 2, 10, 12, 19): once unregister returns,
nothing in flight touches the region; once a future completes, nothing touches the op's
memory; a peer's answer that contradicts its op fails the connection, never completes the
op early. Hostile peers are raw sockets speaking docs/tcp.md by hand (test_hostile.py)."""

import ctypes
import socket
import struct
import threading
import time

import pytest

from dlslime import TcpEndpoint
from conftest import RSS_SLACK, Buffer, connect_pair, rss_bytes, wait_until
from test_hostile import (ACCESS_DENIED, HEADER, LAST, READ_DATA, READ_REQUEST, SAME_HOST, SEND_ACK, SEND_DATA,
                          WRITE_ACK, WRITE_DATA, frame, paired_raw, parse_frame, read_request, unread_bytes)

OK = 0
UNKNOWN_HANDLE = 405
PROTOCOL_ERROR = 411
BATCH_OVERFLOW = 400
CANARY = 0xEE


def canary_fill(buf):
    ctypes.memset(buf.addr, CANARY, buf.size)


class _Target:
    def __init__(self, ep):
        self.ep = ep
        self.port = ep.endpoint_info()["port"]


def raw_peer(ep):
    """A raw client paired with `ep` (test_hostile.paired_raw)."""
    return paired_raw(_Target(ep))


# --- item 1: unregister fences the data path ---------------------------------------------


def test_writes_in_flight_never_land_after_unregister_returns():
    """8 batched 1 MiB writes of 512 B items in flight to a region that the target
    unregisters: after unregister returns, not one more byte lands there (the canary
    written then survives), and every write completes (placed before, or refused)."""
    a = TcpEndpoint(ip="127.0.0.1", port=0)
    b = TcpEndpoint(ip="127.0.0.1", port=0)
    size = 8 << 20
    src = Buffer(size, b"\x5a")
    dst = Buffer(size)
    try:
        h_src = a.register_memory_region("src", src.addr, 0, size)
        b.register_memory_region("dst", dst.addr, 0, size)
        connect_pair(a, b)
        h_dst = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"])
        item = 512
        futures = []
        for k in range(8):
            base = k << 20
            futures.append(a.write([(h_src, h_dst, base + i * item, base + i * item, item)
                                    for i in range(1 << 20 // item)]))
        b.unregister_memory_region("dst")
        canary_fill(dst)
        statuses = [f.wait_for(30) for f in futures]
        assert all(s in (OK, UNKNOWN_HANDLE) for s in statuses), statuses
        assert dst.bytes() == bytes([CANARY]) * size, "bytes landed in the region after unregister returned"
    finally:
        a.shutdown()
        b.shutdown()


def test_queued_read_answer_is_not_sent_from_an_unregistered_region():
    """A peer asks for 16 MiB and does not read the answer: unregister cannot return while
    the answer still points into the region. It waits for its deadline, then closes that
    lane; nothing the peer receives afterwards comes from the region's memory (the canary
    written once unregister returned never reaches the wire)."""
    ep = TcpEndpoint(ip="127.0.0.1", port=0)
    size = 16 << 20
    buf = Buffer(size, b"\x11")
    handle = ep.register_memory_region("big", buf.addr, 0, size)
    c = raw_peer(ep)
    try:
        c.send(read_request([(handle, i << 20, 1 << 20) for i in range(16)], op_id=9))
        # Once the endpoint has read the request, its answer is queued (the socket takes a
        # few MiB of it; the peer reads nothing).
        port, client_port = ep.endpoint_info()["port"], c.sock.getsockname()[1]
        wait_until(lambda: unread_bytes(port, client_port) == 0, 10, what="the endpoint to read the request")
        t0 = time.monotonic()
        ep.unregister_memory_region("big")
        waited = time.monotonic() - t0
        canary_fill(buf)
        received = bytearray()
        c.sock.settimeout(10)
        while True:
            try:
                chunk = c.sock.recv(1 << 20)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
        assert len(received) < HEADER + size, "the whole answer was sent although the peer never read it"
        assert bytes([CANARY]) not in received[HEADER:], "answer bytes were sent from the region after unregister"
        assert waited >= 1.0, f"unregister returned after {waited:.2f} s with the answer still queued"
    finally:
        c.close()
        ep.shutdown()


def test_unregister_without_transfers_returns_at_once_and_the_handle_is_gone():
    ep = TcpEndpoint(ip="127.0.0.1", port=0)
    buf = Buffer(4096)
    try:
        h = ep.register_memory_region("r", buf.addr, 0, 4096)
        t0 = time.monotonic()
        ep.unregister_memory_region(h)
        assert time.monotonic() - t0 < 0.5
        with pytest.raises(KeyError):
            ep.unregister_memory_region(h)
    finally:
        ep.shutdown()


# --- item 2: answers that contradict their op --------------------------------------------


class HostileTarget:
    """A listener that completes the dialer's hello (one lane) and then answers the
    dialer's requests as the test says."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.peer_info = {"host": "127.0.0.1", "port": self.listener.getsockname()[1], "endpoint_id": 0x7777,
                          "mr_info": {"r": {"handle": 3, "addr": 0, "length": 1 << 20}}}
        self.conn = None
        self.ready = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        conn, _ = self.listener.accept()
        conn.settimeout(10)
        hello = b""
        while len(hello) < 64:
            hello += conn.recv(64 - len(hello))
        reply = (b"DLSLIMER" + struct.pack("<HHIQ", 2, 0, 0, 0x7777)).ljust(32, b"\0")
        conn.sendall(reply)
        self.conn = conn
        self.ready.set()

    def recv_frame(self):
        while True:
            raw = b""
            while len(raw) < HEADER:
                raw += self.conn.recv(HEADER - len(raw))
            h = parse_frame(raw)
            payload = b""
            while len(payload) < h["length"]:
                payload += self.conn.recv(h["length"] - len(payload))
            if h["type"] != SAME_HOST:
                return h, payload
            why = b"a raw test peer"  # refuses the same-host offer, as a peer on another host would
            self.conn.sendall(frame(SAME_HOST, flags=0, status=ACCESS_DENIED, index=4, length=len(why)) + why)

    def close(self):
        if self.conn:
            self.conn.close()
        self.listener.close()


@pytest.fixture
def hostile():
    t = HostileTarget()
    ep = TcpEndpoint(ip="127.0.0.1", port=0, lanes=1)
    ep.connect(t.peer_info)
    assert t.ready.wait(10)
    yield ep, t
    ep.shutdown()
    t.close()


def test_write_ack_for_a_read_fails_the_read_instead_of_completing_it(hostile):
    ep, t = hostile
    dst = Buffer(4096)
    h = ep.register_memory_region("dst", dst.addr, 0, 4096)
    r = ep.register_remote_memory_region("r", t.peer_info["mr_info"]["r"])
    fut = ep.read([(h, r, 0, 0, 4096)])
    req, _ = t.recv_frame()
    assert req["type"] == READ_REQUEST
    t.conn.sendall(frame(WRITE_ACK, op_id=req["op_id"]))
    status = fut.wait_for(10)
    assert status not in (None, OK), "a write acknowledgement completed a read"
    assert status == PROTOCOL_ERROR or not ep.is_connected()


def test_late_duplicate_read_answer_places_nothing(hostile):
    """The first answer completes the read; a second one for the same pieces arrives once
    the buffer is the user's again and must not be placed (it is dropped, as a late
    answer to an expired op is)."""
    ep, t = hostile
    dst = Buffer(4096)
    h = ep.register_memory_region("dst", dst.addr, 0, 4096)
    r = ep.register_remote_memory_region("r", t.peer_info["mr_info"]["r"])
    fut = ep.read([(h, r, 0, 0, 4096)])
    req, _ = t.recv_frame()
    answer = frame(READ_DATA, flags=0, op_id=req["op_id"], index=req["index"], offset=1, length=4096)
    t.conn.sendall(answer + b"\x01" * 4096)
    assert fut.wait_for(10) == OK and dst.bytes() == b"\x01" * 4096
    canary_fill(dst)
    t.conn.sendall(answer + b"\x02" * 4096)
    # A write round trip on the same lane: the duplicate was handled before its ack.
    src = Buffer(64, b"s")
    hs = ep.register_memory_region("src", src.addr, 0, 64)
    w = ep.write([(hs, r, 0, 0, 64)])
    wreq, _ = t.recv_frame()
    t.conn.sendall(frame(WRITE_ACK, op_id=wreq["op_id"]))
    assert w.wait_for(10) == OK
    assert dst.bytes() == bytes([CANARY]) * 4096


def test_read_answered_twice_while_pending_fails_with_a_protocol_error(hostile):
    """A read of 1025 pieces goes out as two requests; answering the first one twice
    (before the second is answered) closes the connection and fails the read: it never
    reports success with pieces missing."""
    ep, t = hostile
    n = 1025
    dst = Buffer(4 * n)
    h = ep.register_memory_region("dst", dst.addr, 0, 4 * n)
    r = ep.register_remote_memory_region("r", t.peer_info["mr_info"]["r"])
    fut = ep.read([(h, r, 4 * i, 4 * i, 4) for i in range(n)])
    req, _ = t.recv_frame()
    assert req["type"] == READ_REQUEST and req["index"] == 0 and req["length"] == 24 * 1024
    answer = frame(READ_DATA, flags=0, op_id=req["op_id"], index=0, offset=1024, length=4096) + b"\x03" * 4096
    t.conn.sendall(answer + answer)
    assert fut.wait_for(10) == PROTOCOL_ERROR
    wait_until(lambda: not ep.is_connected(), 10, what="the connection to close")


def hostile_write_source(ep, t):
    """A 4 KiB source region and the hostile target's region: (buffer, local, remote)."""
    src = Buffer(4096, b"w")
    return (src, ep.register_memory_region("src", src.addr, 0, 4096),
            ep.register_remote_memory_region("r", t.peer_info["mr_info"]["r"]))


def write_to_hostile(ep, t, h, r):
    """Starts a 4 KiB write; returns its future and the request header the target got."""
    fut = ep.write([(h, r, 0, 0, 4096)])
    req, _ = t.recv_frame()
    assert req["type"] == WRITE_DATA
    return fut, req


def test_send_ack_for_a_write_is_a_protocol_error(hostile):
    ep, t = hostile
    src, h, r = hostile_write_source(ep, t)
    fut, req = write_to_hostile(ep, t, h, r)
    t.conn.sendall(frame(SEND_ACK, flags=0, op_id=req["op_id"]))
    status = fut.wait_for(10)
    assert status not in (None, OK)
    wait_until(lambda: not ep.is_connected(), 10, what="the connection to close")


def test_second_write_ack_on_the_same_lane_is_refused(hostile):
    ep, t = hostile
    src, h, r = hostile_write_source(ep, t)
    first, req = write_to_hostile(ep, t, h, r)
    t.conn.sendall(frame(WRITE_ACK, op_id=req["op_id"]))
    assert first.wait_for(10) == OK
    second, req2 = write_to_hostile(ep, t, h, r)
    # An ack for the first (finished) op is stale and ignored; the second op completes on
    # its own ack; a repeated ack for it afterwards is stale too.
    t.conn.sendall(frame(WRITE_ACK, op_id=req["op_id"]) + frame(WRITE_ACK, op_id=req2["op_id"]))
    assert second.wait_for(10) == OK
    assert ep.is_connected()


# --- item 12: empty messages are bounded too ---------------------------------------------


def test_flood_of_empty_messages_is_bounded_by_the_held_message_budget():
    """With a 1 MiB budget for held messages, a peer sending 1M empty messages without a
    posted recv is paused by flow control (each held message costs an overhead), so memory
    stays bounded; posting recvs drains them in order."""
    ep = TcpEndpoint(ip="127.0.0.1", port=0, unexpected_buffer_bytes=1 << 20)
    try:
        c = raw_peer(ep)
        msg = b"".join(frame(SEND_DATA, flags=LAST, op_id=i + 1, length=0) for i in range(1000))
        rss0 = rss_bytes()
        c.sock.settimeout(3.0)
        sent = 0
        try:
            for _ in range(1000):
                c.sock.sendall(msg)
                sent += 1000
        except (socket.timeout, TimeoutError):
            pass
        grown = rss_bytes() - rss0
        assert sent < 1_000_000, "the endpoint held a million empty messages"
        assert grown <= (64 << 20) + RSS_SLACK, f"RSS grew by {grown >> 20} MiB"
        box = Buffer(16)
        rv = ep.recv((box.addr, 0, 16))
        assert rv.wait_for(10) == OK and rv.nbytes == 0
        c.close()
    finally:
        ep.shutdown()


# --- item 19: the in-flight bound holds at submission --------------------------------------


def test_inflight_limit_is_enforced_at_submit():
    """Ops beyond max_inflight_ops fail at once with BATCH_OVERFLOW, even before the I/O
    thread has seen any of them (the hand-off queue is bounded too)."""
    a = TcpEndpoint(ip="127.0.0.1", port=0, max_inflight_ops=4)
    b = TcpEndpoint(ip="127.0.0.1", port=0)
    src, dst = Buffer(4096, b"s"), Buffer(4096)
    try:
        h = a.register_memory_region("src", src.addr, 0, 4096)
        b.register_memory_region("dst", dst.addr, 0, 4096)
        connect_pair(a, b)
        r = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"])
        futures = [a.write([(h, r, 0, 0, 4096)]) for _ in range(200)]
        statuses = [f.wait_for(10) for f in futures]
        assert None not in statuses
        assert statuses.count(BATCH_OVERFLOW) >= 200 - 4 * 50  # at most 4 at a time were admitted
        assert OK in statuses
        # The slots come back: once everything finished, 4 more fit.
        assert all(f.wait_for(10) == OK for f in [a.write([(h, r, 0, 0, 4096)]) for _ in range(4)])
    finally:
        a.shutdown()
        b.shutdown()


# --- item 10: shutdown interrupts connect ------------------------------------------------


def test_shutdown_interrupts_a_connect_in_progress():
    """A peer that accepts and never answers the hello holds connect() for connect_timeout;
    shutdown() from another thread ends it at once with ConnectionError."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    ep = TcpEndpoint(ip="127.0.0.1", port=0, connect_timeout=60)
    info = {"host": "127.0.0.1", "port": silent.getsockname()[1]}
    outcome = {}

    def dial():
        t0 = time.monotonic()
        try:
            ep.connect(info)
            outcome["error"] = None
        except Exception as e:  # noqa: BLE001 - the type is asserted below
            outcome["error"] = e
        outcome["seconds"] = time.monotonic() - t0

    t = threading.Thread(target=dial, daemon=True)
    t.start()
    accepted, _ = silent.accept()  # the dial reached the peer: connect() is waiting now
    ep.shutdown()
    t.join(10)
    try:
        assert not t.is_alive(), "connect() did not return after shutdown()"
        assert isinstance(outcome["error"], ConnectionError), outcome
        assert outcome["seconds"] < 10
    finally:
        accepted.close()
        silent.close()


# --- item 19: the answer budget is per peer, not per lane ---------------------------------


def test_unread_answers_are_bounded_per_peer_across_lanes():
    """A peer opens 16 lanes and sends read requests on each without reading a byte: the
    answers queued for it stay within one peer's budget (8 MiB), not 8 MiB per lane."""
    from test_hostile import Raw

    ep = TcpEndpoint(ip="127.0.0.1", port=0)
    size = 64 << 10
    buf = Buffer(size, b"\x42")
    handle = ep.register_memory_region("r", buf.addr, 0, size)
    port = ep.endpoint_info()["port"]
    lanes = []
    try:
        sender = 0xB0B0
        for lane in range(16):
            c = Raw(port)
            status, reason, _ = c.hello(sender, lane=lane, lanes=16)
            assert status == OK, reason
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            lanes.append(c)
        # 2 KiB answers are copied into the queue: 16 lanes x 8 MiB would be 128 MiB.
        req = read_request([(handle, 0, 2048)]) * 512
        rss0 = rss_bytes()
        for c in lanes:
            c.sock.settimeout(2.0)
            try:
                for _ in range(10):  # 5120 requests, 10 MiB of answers per lane
                    c.sock.sendall(req)
            except (socket.timeout, TimeoutError):
                pass  # the endpoint stopped reading this peer: the bound at work
        for c in lanes:
            client_port = c.sock.getsockname()[1]
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and unread_bytes(port, client_port) not in (0, None):
                time.sleep(0.02)  # polling a condition with a deadline (a stalled lane never empties)
        grown = rss_bytes() - rss0
        assert grown <= (40 << 20) + RSS_SLACK, f"RSS grew by {grown >> 20} MiB for 16 lanes of unread answers"
    finally:
        for c in lanes:
            c.close()
        ep.shutdown()
