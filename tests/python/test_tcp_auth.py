"""Shared-secret authentication of TCP connections (docs/reliability.md, "Security model").

With a token, the handshake is a mutual HMAC-SHA256 challenge and response: the token never
crosses the wire, and a peer without it can neither pair nor touch registered memory. The
raw-socket tests speak the handshake by hand, which also pins the wire format that
docs/tcp.md describes."""

import hashlib
import hmac
import os
import socket
import struct
import threading
import time

import pytest

from dlslime import TcpEndpoint
from conftest import Buffer, connect_pair, wait_until
from test_hostile import Raw, hello, read_request, write_frame

OK = 0
AUTHENTICATION_FAILED = 414
AUTH_FLAG = 1
TOKEN = "correct horse battery staple"


def mac(token, role, hello_raw, nonce, acceptor_id):
    label = b"dlslime-tcp-auth-v1 " + role + b"\0"
    msg = label + hello_raw + nonce + struct.pack("<Q", acceptor_id)
    return hmac.new(token.encode(), msg, hashlib.sha256).digest()


class AuthClient(Raw):
    """A raw client that runs the authenticated handshake with a token of its choice."""

    def start(self, sender, target=0, nonce=None):
        """Sends an authenticated hello; returns the acceptor's challenge fields."""
        self.nonce = nonce if nonce is not None else os.urandom(16)
        self.hello_raw = hello(sender, flags=AUTH_FLAG, target=target, nonce=self.nonce)
        self.send(self.hello_raw)
        raw = self.recv_exact(64)
        assert len(raw) == 64 and raw[:8] == b"DLSLIMEC", f"expected a challenge, got {raw[:8]!r}"
        acceptor_nonce, acceptor_id = raw[8:24], struct.unpack_from("<Q", raw, 24)[0]
        return acceptor_nonce, acceptor_id, raw[32:64]

    def prove(self, mac_d):
        self.send(b"DLSLIMEP" + mac_d + bytes(24))
        return self.reply()

    def rest_until_closed(self, timeout=10.0):
        """Everything the endpoint sends until it closes the connection (EOF or reset)."""
        deadline = time.monotonic() + timeout
        data = b""
        self.sock.settimeout(0.2)
        while time.monotonic() < deadline:
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            except (ConnectionResetError, BrokenPipeError):
                return data
            if not chunk:
                return data
            data += chunk
        raise AssertionError(f"the endpoint did not close the connection within {timeout} s")


def endpoints(token_a, token_b):
    return TcpEndpoint(ip="127.0.0.1", port=0, token=token_a), TcpEndpoint(ip="127.0.0.1", port=0, token=token_b)


def test_same_token_connects_and_moves_bytes():
    a, b = endpoints(TOKEN, TOKEN)
    try:
        src, dst = Buffer(4096, b"auth"), Buffer(4096)
        h_src = a.register_memory_region("src", src.addr, 0, 4096)
        b.register_memory_region("dst", dst.addr, 0, 4096)
        connect_pair(a, b)
        h_dst = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"])
        assert a.write([(h_src, h_dst, 0, 0, 4096)]).wait_for(10) == OK
        assert dst.bytes() == src.bytes()
        msg, inbox = Buffer(64, b"m"), Buffer(64)
        r = b.recv((inbox.addr, 0, 64))
        assert a.send((msg.addr, 0, 64)).wait_for(10) == OK
        assert r.wait_for(10) == OK and inbox.bytes() == msg.bytes()
        # The options say a token is set; they never show it.
        assert a.options["authenticated"] is True
        assert TOKEN not in repr(a.options) and TOKEN not in repr(a.endpoint_info())
    finally:
        a.shutdown()
        b.shutdown()


@pytest.mark.parametrize("token_a, token_b, reason", [
    (TOKEN, "another secret, as long", "tokens differ|wrong token"),
    (TOKEN, "", "no token"),
    ("", TOKEN, "requires a token"),
], ids=["different", "only_dialer", "only_acceptor"])
def test_mismatched_tokens_are_refused_and_the_acceptor_keeps_serving(token_a, token_b, reason):
    a, b = endpoints(token_a, token_b)
    good = TcpEndpoint(ip="127.0.0.1", port=0, token=token_b)
    try:
        dst = Buffer(64)
        b.register_memory_region("dst", dst.addr, 0, 64)
        with pytest.raises(PermissionError, match=reason):
            a.connect(b.endpoint_info())
        assert not b.is_connected() and not a.is_connected()
        assert dst.bytes() == bytes(64)
        # b was not paired by the failed attempt: a peer with the right token still can.
        src = Buffer(64, b"g")
        h_src = good.register_memory_region("src", src.addr, 0, 64)
        connect_pair(good, b)
        h_dst = good.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"])
        assert good.write([(h_src, h_dst, 0, 0, 64)]).wait_for(10) == OK
        assert dst.bytes() == b"g" * 64
    finally:
        for ep in (a, b, good):
            ep.shutdown()


def test_token_from_the_environment(monkeypatch):
    monkeypatch.setenv("DLSLIME_TCP_TOKEN", TOKEN)
    a = TcpEndpoint(ip="127.0.0.1", port=0)  # token from DLSLIME_TCP_TOKEN
    b = TcpEndpoint(ip="127.0.0.1", port=0, token=TOKEN)
    c = TcpEndpoint(ip="127.0.0.1", port=0, token="")  # "" turns it off despite the variable
    try:
        assert a.options["authenticated"] and not c.options["authenticated"]
        connect_pair(a, b)
        assert a.is_connected() and b.is_connected()
        with pytest.raises(PermissionError):
            c.connect(b.endpoint_info())
    finally:
        for ep in (a, b, c):
            ep.shutdown()


def test_intruder_with_the_paired_peers_id_cannot_read():
    """An endpoint id is public (endpoint_info). Without authentication a raw client that
    presented a paired peer's id was taken as one more lane of that peer and could read its
    registered memory. With a token it is refused before anything else is looked at."""
    a, b = endpoints(TOKEN, TOKEN)
    try:
        secret = Buffer(64, b"s")
        b.register_memory_region("secret", secret.addr, 0, 64)
        connect_pair(a, b)
        a_id = a.endpoint_info()["endpoint_id"]
        intruder = Raw(b.endpoint_info()["port"])
        status, reason, endpoint_id = intruder.hello(a_id)
        assert status == AUTHENTICATION_FAILED and "requires a token" in reason
        assert endpoint_id == b.endpoint_info()["endpoint_id"]
        assert intruder.closed_by_peer()
        intruder.close()
        # A guessed token fails the proof; the requests that follow are never served.
        guesser = AuthClient(b.endpoint_info()["port"])
        nonce_a, id_b, _ = guesser.start(a_id)
        status, reason, _ = guesser.prove(mac("guess", b"dialer", guesser.hello_raw, nonce_a, id_b))
        assert status == AUTHENTICATION_FAILED and "wrong token" in reason
        h = b.endpoint_info()["mr_info"]["secret"]["handle"]
        try:
            guesser.send(write_frame([(h, 0, 64)], data=b"w" * 64, op_id=4) + read_request([(h, 0, 64)], op_id=5))
        except OSError:
            pass  # already closed: just as good
        assert guesser.rest_until_closed() == b"", "the endpoint answered after a failed proof"
        assert secret.bytes() == b"s" * 64, "a write after a failed proof was placed"
        guesser.close()
        # The real pairing was never disturbed.
        assert a.is_connected() and b.is_connected()
    finally:
        a.shutdown()
        b.shutdown()


def test_handshake_by_hand_with_the_token_and_a_replayed_proof():
    """The documented exchange works when spoken by hand, the acceptor proves itself too,
    and a proof recorded from one connection is worthless on the next (fresh nonce)."""
    b = TcpEndpoint(ip="127.0.0.1", port=0, token=TOKEN)
    try:
        region = Buffer(64, b"r")
        h = b.register_memory_region("r", region.addr, 0, 64)
        port, b_id = b.endpoint_info()["port"], b.endpoint_info()["endpoint_id"]
        me = 0x1234
        first = AuthClient(port)
        fixed_nonce = bytes(range(16))
        nonce_a, id_b, mac_a = first.start(me, nonce=fixed_nonce)
        assert id_b == b_id
        assert hmac.compare_digest(mac_a, mac(TOKEN, b"acceptor", first.hello_raw, nonce_a, id_b))
        assert TOKEN.encode() not in first.hello_raw + nonce_a + mac_a
        proof = mac(TOKEN, b"dialer", first.hello_raw, nonce_a, id_b)
        status, reason, _ = first.prove(proof)
        assert status == OK, reason
        first.send(read_request([(h, 0, 64)], op_id=9))
        resp, data = first.recv_frame()
        assert resp["op_id"] == 9 and resp["status"] == OK and data == b"r" * 64
        first.close()
        wait_until(lambda: not b.is_connected(), 10, what="b to see the first connection go")
        # Same hello, same dialer nonce: a new acceptor nonce, so the old proof fails.
        second = AuthClient(port)
        nonce_a2, _, _ = second.start(me, nonce=fixed_nonce)
        assert nonce_a2 != nonce_a
        status, reason, _ = second.prove(proof)
        assert status == AUTHENTICATION_FAILED and "wrong token" in reason
        second.close()
    finally:
        b.shutdown()


class FakeAcceptor:
    """A one-connection listener that answers the dialer's hello with `answer` and records
    the hello and what the dialer sent next (b"" once the dialer gave up)."""

    def __init__(self, answer):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.peer_info = {"host": "127.0.0.1", "port": self.listener.getsockname()[1], "endpoint_id": 0,
                          "mr_info": {}}
        self.seen = []
        self.thread = threading.Thread(target=self._serve, args=(answer,), daemon=True)
        self.thread.start()

    def _serve(self, answer):
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(10)
            self.seen.append(conn.recv(64))
            conn.sendall(answer)
            self.seen.append(conn.recv(64))

    def finished(self):
        self.thread.join(10)
        return not self.thread.is_alive()

    def close(self):
        self.listener.close()


def test_acceptor_that_cannot_prove_itself_is_not_trusted():
    """A listener that answers the challenge with a wrong MAC (an impostor on the peer's
    address) is refused by the dialer before it sends anything."""
    impostor = FakeAcceptor(b"DLSLIMEC" + os.urandom(16) + struct.pack("<Q", 77) + os.urandom(32))
    a = TcpEndpoint(ip="127.0.0.1", port=0, token=TOKEN, lanes=1)
    try:
        with pytest.raises(PermissionError, match="could not prove"):
            a.connect(impostor.peer_info)
        assert impostor.finished()
        seen = impostor.seen
        assert seen[0][:8] == b"DLSLIMEH" and struct.unpack_from("<H", seen[0], 10)[0] == AUTH_FLAG
        assert seen[1] == b"", "the dialer sent a proof to an acceptor that failed its own"
    finally:
        a.shutdown()
        impostor.close()


def test_too_short_or_mistyped_tokens_are_refused():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        TcpEndpoint(ip="127.0.0.1", port=0, token="short")
    with pytest.raises(TypeError, match="token must be"):
        TcpEndpoint(ip="127.0.0.1", port=0, token=12345678901234567)
    ep = TcpEndpoint(ip="127.0.0.1", port=0, token=TOKEN.encode())  # bytes work too
    assert ep.options["authenticated"]
    ep.shutdown()


def test_another_holder_of_the_token_is_not_taken_for_the_dialed_peer():
    """Whatever answers at the dialed address must prove it is the endpoint in peer_info,
    not merely that it holds the token (a relay or a reused port would otherwise pair the
    dialer with the wrong endpoint)."""
    a, b, c = (TcpEndpoint(ip="127.0.0.1", port=0, token=TOKEN) for _ in range(3))
    try:
        spoofed = dict(c.endpoint_info(), endpoint_id=b.endpoint_info()["endpoint_id"])  # c's address, b's id
        with pytest.raises(PermissionError, match="holds the token but is endpoint"):
            a.connect(spoofed)
        assert not a.is_connected() and not c.is_connected()
    finally:
        for ep in (a, b, c):
            ep.shutdown()


def test_listener_that_accepts_without_a_challenge_is_not_trusted():
    """A tokened dialer refuses a listener that answers 'accepted' without proving the
    token (an old or tokenless server, or an impostor that skips the challenge)."""
    pushover = FakeAcceptor(b"DLSLIMER" + struct.pack("<HHIQ", 2, 0, 0, 99) + bytes(8))  # version 2, accepted
    a = TcpEndpoint(ip="127.0.0.1", port=0, token=TOKEN, lanes=1)
    try:
        with pytest.raises(PermissionError, match="without authenticating itself"):
            a.connect(pushover.peer_info)
        assert pushover.finished()
        assert not a.is_connected()
    finally:
        a.shutdown()
        pushover.close()
