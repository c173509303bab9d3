"""NanoCtrl against hostile HTTP clients, through the Python entry points (issue 10, items 13,
14 and 20): chunked bodies are capped, unauthenticated bodies are never read, slow clients do
not starve health checks, and a cleanup removes only the registration that made it."""

import json
import socket
import subprocess
import sys
import threading
import time

import pytest

import dlslime.nanoctrl as nanoctrl
from nanoctrl_fixtures import free_port, http, wait_until

TOKEN = "limits-token-0123456789abcdef"


def _connect(url, timeout=5.0):
    host, port = url[len("http://"):].split(":")
    s = socket.create_connection((host, int(port)), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _read_reply(s):
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except OSError:
        pass
    return out


def test_chunked_body_over_max_body_is_413_and_not_stored():
    with nanoctrl.serve(port=0, max_body=64 * 1024) as url:
        c = nanoctrl.NanoCtrlClient(url)
        c.start_peer_agent(alias="a")
        body = json.dumps({"to": "a", "message": "x" * (256 * 1024)}).encode()
        with _connect(url) as s:
            s.sendall(b"POST /mailbox/post HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n")
            for i in range(0, len(body), 8192):
                piece = body[i:i + 8192]
                s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            s.sendall(b"0\r\n\r\n")
            reply = _read_reply(s)
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
        assert b"65536" in reply
        assert c.recv("a", timeout=0.0) == []


def test_unauthenticated_chunked_body_is_answered_without_being_read():
    with nanoctrl.serve(port=0, token=TOKEN) as url:
        sent = 0
        with _connect(url) as s:
            s.sendall(b"POST /query HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"10000\r\n" + b"x" * 0x10000 + b"\r\n"
            try:
                while sent < (256 << 20):
                    s.sendall(chunk)
                    sent += len(chunk)
            except OSError:
                pass  # the server answered 401 and closed
        assert sent < (32 << 20), sent
        c = nanoctrl.NanoCtrlClient(url, token=TOKEN)
        assert c.healthz()["status"] == "ok"


def test_slow_clients_do_not_starve_healthz(tmp_path):
    port = free_port()
    pid_file = tmp_path / "nanoctrl.pid"
    # A handful of workers and a short request deadline, through the command line.
    server = subprocess.Popen([sys.executable, "-m", "dlslime.nanoctrl", "server", "--port", str(port),
                               "--max-threads", "4", "--request-timeout", "0.6", "--pid-file", str(pid_file),
                               "--log-level", "warn"])
    url = f"http://127.0.0.1:{port}"
    try:
        def healthy():
            try:
                return http(url, "/healthz", method="GET", timeout=1.0)[0] == 200
            except OSError:
                return False

        wait_until(healthy, timeout=15, what="nanoctrl up")
        c = nanoctrl.NanoCtrlClient(url, timeout=2.0)
        c.start_peer_agent(alias="hb")
        slow = [_connect(url) for _ in range(40)]
        head = b"POST /heartbeat HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 200 + b"\r\n"
        stop = threading.Event()

        def trickle():
            for i in range(len(head)):  # the attack's pace: a byte per client every 50 ms
                if stop.is_set():
                    return
                for s in slow:
                    try:
                        s.send(head[i:i + 1])
                    except OSError:
                        pass
                time.sleep(0.05)

        t = threading.Thread(target=trickle)
        t.start()
        try:
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                t0 = time.monotonic()
                assert c.healthz()["status"] == "ok"
                assert c.heartbeat("hb") == "ok"
                assert time.monotonic() - t0 < 0.5
        finally:
            stop.set()
            t.join()
        assert _read_reply(slow[0]).startswith(b"HTTP/1.1 408")
        for s in slow:
            s.close()
    finally:
        server.terminate()
        server.wait(timeout=15)


def test_cleanup_with_another_incarnation_is_refused():
    with nanoctrl.serve(port=0) as url:
        c = nanoctrl.NanoCtrlClient(url)
        reply = c.start_peer_agent(alias="x")
        assert len(reply["incarnation"]) == 32
        status, body = http(url, "/cleanup", {"agent_name": "x", "incarnation": "f" * 32})
        assert status == 409 and "cleanup refused" in body["message"], (status, body)
        assert c.get_peer_agent("x")["incarnation"] == reply["incarnation"]
        status, body = http(url, "/cleanup", {"agent_name": "x", "incarnation": reply["incarnation"]})
        assert status == 200 and body["existed"] is True
        assert c.get_peer_agent("x") is None
