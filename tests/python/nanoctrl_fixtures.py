"""Helpers for the NanoCtrl tests: throwaway redis-server processes on loopback, raw HTTP
requests (to send what the client library never would), and waiting with deadlines."""

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import wait_until  # noqa: F401 (re-exported for the NanoCtrl tests)

REDIS_SERVER = shutil.which("redis-server")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """redis-server on 127.0.0.1 without persistence; stop()/start() keep the port."""

    def __init__(self, port=None):
        if REDIS_SERVER is None:
            raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
        self.port = port or free_port()
        self.proc = None
        self.start()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def start(self):
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self.ping, timeout=10, what=f"redis-server on port {self.port}")

    def ping(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def http(url, path, body=None, method="POST", raw=None, headers=None, timeout=10.0):
    """One request; returns (status, parsed JSON body or text). `raw` sends bytes as is."""
    status, parsed, _ = http_with_headers(url, path, body, method, raw, headers, timeout)
    return status, parsed


def http_with_headers(url, path, body=None, method="POST", raw=None, headers=None, timeout=10.0):
    """Like http(), and the reply's headers as a third element (an email.message.Message)."""
    data = raw if raw is not None else (json.dumps(body if body is not None else {}).encode())
    if method == "GET" and raw is None and body is None:
        data = None
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text, reply_headers = r.status, r.read().decode(), r.headers
    except urllib.error.HTTPError as e:
        status, text, reply_headers = e.code, e.read().decode(), e.headers
    try:
        return status, json.loads(text), reply_headers
    except ValueError:
        return status, text, reply_headers


def is_error(status, body, code):
    return status == code and isinstance(body, dict) and body.get("status") == "error" and body.get("message")


def env_with_build():
    env = dict(os.environ)
    return env
