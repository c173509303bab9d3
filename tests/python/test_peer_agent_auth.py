"""PeerAgent with tokens: `token=` is the one secret for NanoCtrl's bearer check and for the
TCP handshake of every connection the agent makes; `ctrl_token=` and `tcp_token=` set one
alone; DLSLIME_NANOCTRL_TOKEN and DLSLIME_TCP_TOKEN are the defaults."""

import pytest

from dlslime import PeerAgent, nanoctrl
from conftest import Buffer

SECRET = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def secured_ctrl():
    with nanoctrl.serve(port=0, token=SECRET) as url:
        yield url


def connect(a, b):
    conn = a.connect_to(b.alias, transport="tcp", local_host="127.0.0.1")
    back = b.connect_to(a.alias, transport="tcp", local_host="127.0.0.1")
    return conn, back


def test_one_token_secures_both_planes(secured_ctrl, unique):
    a = PeerAgent(ctrl_url=secured_ctrl, alias=f"auth_a_{unique}", token=SECRET)
    b = PeerAgent(ctrl_url=secured_ctrl, alias=f"auth_b_{unique}", token=SECRET)
    try:
        src, dst = Buffer(4096, b"tok"), Buffer(4096)
        a.register_memory_region("src", src.addr, 0, 4096)
        b.register_memory_region("dst", dst.addr, 0, 4096)
        conn, back = connect(a, b)
        conn.wait(10)
        back.wait(10)
        assert conn.endpoint.options["authenticated"]
        assert a.write(b.alias, [("src", "dst", 0, 0, 4096)]).wait_for(10) == 0
        assert dst.bytes() == src.bytes()
    finally:
        a.shutdown()
        b.shutdown()


def test_agent_without_the_ctrl_token_is_refused(secured_ctrl, unique, monkeypatch):
    monkeypatch.delenv("DLSLIME_NANOCTRL_TOKEN", raising=False)
    with pytest.raises(PermissionError, match="bearer token"):
        PeerAgent(ctrl_url=secured_ctrl, alias=f"anon_{unique}")
    with pytest.raises(PermissionError, match="wrong"):
        PeerAgent(ctrl_url=secured_ctrl, alias=f"anon_{unique}", token="a-wrong-guess-of-the-token")


def test_different_tcp_tokens_fail_the_connection_on_both_sides(secured_ctrl, unique):
    a = PeerAgent(ctrl_url=secured_ctrl, alias=f"tcp_a_{unique}", ctrl_token=SECRET, tcp_token="the first tcp token")
    b = PeerAgent(ctrl_url=secured_ctrl, alias=f"tcp_b_{unique}", nanoctrl_token=SECRET, tcp_token="the second tcp token")
    try:
        dst = Buffer(64)
        b.register_memory_region("dst", dst.addr, 0, 64)
        conn, back = connect(a, b)
        for c in (conn, back):
            with pytest.raises(PermissionError, match="token"):
                c.wait(10)
            assert c.state == "failed"
        assert dst.bytes() == bytes(64)
    finally:
        a.shutdown()
        b.shutdown()


def test_tokens_from_the_environment(secured_ctrl, unique, monkeypatch):
    monkeypatch.setenv("DLSLIME_NANOCTRL_TOKEN", SECRET)
    monkeypatch.setenv("DLSLIME_TCP_TOKEN", "tcp token from the env")
    a = PeerAgent(ctrl_url=secured_ctrl, alias=f"env_a_{unique}")
    b = PeerAgent(ctrl_url=secured_ctrl, alias=f"env_b_{unique}")
    try:
        conn, back = connect(a, b)
        conn.wait(10)
        back.wait(10)
        assert conn.endpoint.options["authenticated"]
        msg, inbox = Buffer(32, b"e"), Buffer(32)
        r = b.recv(a.alias, (inbox.addr, 0, 32))
        assert a.send(b.alias, (msg.addr, 0, 32)).wait_for(10) == 0
        assert r.wait_for(10) == 0
        assert inbox.bytes() == msg.bytes()
    finally:
        a.shutdown()
        b.shutdown()


def test_empty_shared_token_is_refused(secured_ctrl, unique):
    for kw in ("token", "ctrl_token"):
        with pytest.raises(ValueError, match="empty"):
            PeerAgent(ctrl_url=secured_ctrl, alias=f"empty_{unique}", **{kw: ""})
