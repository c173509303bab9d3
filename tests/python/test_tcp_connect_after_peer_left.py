"""connect() to a peer that already connected to us, finished and shut down (issue 27).

In a symmetric pair each side connects to the other. A sender that writes, sends and shuts
down before the receiver's connect() has dialed back used to fail that connect() with
"Connection refused", though everything it sent had arrived (the quickstart failed 6 runs in
10 this way). Now a dial refused by a peer that was connected to us and left in order (a
goodbye on every lane) returns normally: the endpoint is not connected, and the peer's
messages held here can still be received. A peer that died (no goodbye), or one that never
connected to us, still fails connect().
"""

import ctypes

import pytest

from dlslime import TcpEndpoint

OK = 0
NOT_CONNECTED = 410


def endpoint():
    ep = TcpEndpoint(ip="127.0.0.1", port=0)
    buf = ctypes.create_string_buffer(1 << 16)
    h = ep.register_memory_region("buf", ctypes.addressof(buf), 0, len(buf))
    return ep, buf, h


@pytest.mark.parametrize("round_", range(20))
def test_connect_back_to_a_sender_that_already_left_in_order_returns_and_its_message_arrives(round_):
    sender, sbuf, hs = endpoint()
    receiver, rbuf, _ = endpoint()
    try:
        sender.connect(receiver.endpoint_info())
        h_remote = sender.register_remote_memory_region("buf", receiver.endpoint_info()["mr_info"]["buf"])
        sbuf.raw = bytes((i * 5 + round_) & 0xFF for i in range(len(sbuf)))
        assert sender.write([(hs, h_remote, 0, 0, 4096)]).wait_for(10) == OK
        assert sender.send((ctypes.addressof(sbuf), 100, 64)).wait_for(10) == OK  # held by the receiver
        sender_info = sender.endpoint_info()
        sender.shutdown()  # at once: the receiver has not connected back yet
        receiver.connect(sender_info)  # must not raise
        assert rbuf.raw[:4096] == sbuf.raw[:4096]
        inbox = ctypes.create_string_buffer(64)
        r = receiver.recv((ctypes.addressof(inbox), 0, 64))
        assert r.wait_for(10) == OK and inbox.raw == sbuf.raw[100:164]
        f = receiver.send((ctypes.addressof(inbox), 0, 8))  # the peer is gone: nothing to send to
        assert f.wait_for(10) == NOT_CONNECTED, (f.status, f.message)
    finally:
        sender.shutdown()
        receiver.shutdown()


def test_connect_to_a_peer_that_never_connected_to_us_still_fails():
    gone, _, _ = endpoint()
    me, _, _ = endpoint()
    try:
        info = gone.endpoint_info()
        gone.shutdown()
        with pytest.raises(ConnectionError):
            me.connect(info)
    finally:
        me.shutdown()


def test_connect_to_a_peer_that_died_without_a_goodbye_still_fails(spawn_ctx):
    from tcp_peer import connect_then_die

    me, _, _ = endpoint()
    parent, child = spawn_ctx.Pipe()
    proc = spawn_ctx.Process(target=connect_then_die, args=(child, me.endpoint_info()), daemon=True)
    proc.start()
    try:
        assert parent.poll(60), "the peer process did not connect"
        info = parent.recv()
        parent.send(("die",))
        proc.join(30)
        assert proc.exitcode is not None and proc.exitcode < 0, proc.exitcode
        with pytest.raises(ConnectionError):
            me.connect(info)
    finally:
        if proc.is_alive():
            proc.kill()
        me.shutdown()
