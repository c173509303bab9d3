"""Nothing a client sends crashes or wedges NanoCtrl: every bad request gets a 4xx JSON error."""

import socket

import pytest

import dlslime.nanoctrl as nanoctrl
from nanoctrl_fixtures import http, is_error


@pytest.fixture(scope="module")
def url():
    with nanoctrl.serve(port=0, max_body=64 * 1024) as u:
        yield u


@pytest.mark.parametrize("raw", [b"{bad", b"[1, 2]", b"\"str\"", b"42", b"null", b"{\"a\": 1,}", b"\xff\xfe{}",
                                 b"[" * 10000, b"{\"a\":" * 100 + b"1" + b"}" * 100])
def test_malformed_json_is_400(url, raw):
    status, body = http(url, "/start_peer_agent", raw=raw)
    assert is_error(status, body, 400), (status, body)


@pytest.mark.parametrize("path,body", [
    ("/start_peer_agent", {"alias": 5}),
    ("/start_peer_agent", {"alias": "has space"}),
    ("/start_peer_agent", {"alias": "a:b"}),
    ("/start_peer_agent", {"alias": "x" * 200}),
    ("/start_peer_agent", {"ib_port": "one"}),
    ("/start_peer_agent", {"metadata": [1]}),
    ("/start_peer_agent", {"scope": 7}),
    ("/heartbeat", {}),
    ("/heartbeat", {"entity_id": None}),
    ("/heartbeat", {"entity_id": ["x"]}),
    ("/cleanup", {}),
    ("/register_mr", {"agent_name": "a"}),
    ("/register_mr", {"agent_name": "a", "mr_name": "m", "addr": -1, "length": 1}),
    ("/register_mr", {"agent_name": "a", "mr_name": "m", "mr_info": "blob"}),
    ("/get_mr_info", {"dst": "a"}),
    ("/register", {"kind": "x"}),
    ("/register", {"entity_id": "with space"}),
    ("/unregister", {}),
    ("/get_entity_info", {"entity_id": 1}),
    ("/list_entities", {"kind": 3}),
    ("/mailbox/post", {"message": 1}),
    ("/mailbox/recv", {}),
    ("/mailbox/recv", {"alias": "a", "timeout": "soon"}),
    ("/mailbox/recv", {"alias": "a", "max": 100000}),
    ("/v1/desired_topology/a", {}),
    ("/v1/desired_topology/a", {"target_peers": [1]}),
    ("/v1/desired_topology/a", {"target_peers": ["b"], "symmetric": "yes"}),
])
def test_missing_or_mistyped_fields_are_400(url, path, body):
    status, reply = http(url, path, body)
    assert is_error(status, reply, 400), (path, body, status, reply)


def test_unknown_routes_and_methods(url):
    status, body = http(url, "/no/such/route", {})
    assert is_error(status, body, 404)
    status, body = http(url, "/get_redis_address", {})
    assert is_error(status, body, 404)
    status, body = http(url, "/nope", method="GET")
    assert is_error(status, body, 404)
    status, body = http(url, "/query", method="GET")
    assert is_error(status, body, 405)
    status, body = http(url, "/healthz", {}, method="POST")
    assert is_error(status, body, 405)
    status, body = http(url, "/query", {}, method="DELETE")
    assert is_error(status, body, 405)


def test_oversized_body_is_413(url):
    status, body = http(url, "/start_peer_agent", raw=b'{"metadata": "' + b"x" * (128 * 1024) + b'"}')
    assert is_error(status, body, 413) and "65536" in body["message"]
    status, body = http(url, "/start_peer_agent", raw=b"x" * 20000,
                        headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert is_error(status, body, 413)


def test_garbage_and_half_requests_do_not_wedge_the_server(url):
    host, port = url[len("http://"):].split(":")
    for junk in (b"\x00\x01\x02garbage\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
                 b"POST /query HTTP/1.1\r\nContent-Length: 999999999999999999999\r\n\r\n",
                 b"POST /query HTTP/1.1\r\nContent-Length: 10\r\n\r\n{}"):  # body never completes
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            try:
                s.recv(4096)
            except OSError:
                pass
    # Silent connections that never send a byte hold no request slot forever.
    idle = [socket.create_connection((host, int(port)), timeout=5) for _ in range(20)]
    try:
        status, body = http(url, "/healthz", method="GET")
        assert status == 200 and body["status"] == "ok"
    finally:
        for s in idle:
            s.close()
    c = nanoctrl.NanoCtrlClient(url)
    assert c.start_peer_agent(alias="still-works")["name"] == "still-works"


def test_binary_and_unicode_values_round_trip(url):
    c = nanoctrl.NanoCtrlClient(url)
    c.start_peer_agent(alias="u", metadata={"name": "héllo ✓", "nul": "a\u0000b"})
    assert c.get_peer_agent("u")["metadata"] == {"name": "héllo ✓", "nul": "a\u0000b"}
    c.post("u", {"k": "∑"})
    assert c.recv("u")[0]["message"] == {"k": "∑"}


def test_client_errors_map_to_python_exceptions(url):
    c = nanoctrl.NanoCtrlClient(url)
    with pytest.raises(ValueError):
        c.call("/heartbeat", {"entity_id": 1})
    with pytest.raises(KeyError):
        c.post("nobody", 1)
    with pytest.raises(ValueError):
        nanoctrl.NanoCtrlClient("ftp://x")
    dead = nanoctrl.NanoCtrlClient("http://127.0.0.1:1", timeout=0.5)
    with pytest.raises(ConnectionError):
        dead.query()
