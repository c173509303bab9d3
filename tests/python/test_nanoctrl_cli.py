"""The `nanoctrl` command (here as `python -m dlslime.nanoctrl`): server, start, stop, status."""

import json
import os
import signal
import subprocess
import sys

import dlslime.nanoctrl as nanoctrl
from nanoctrl_fixtures import RedisServer, free_port, http, wait_until

CMD = [sys.executable, "-m", "dlslime.nanoctrl"]


def run(*args, timeout=60):
    return subprocess.run(CMD + list(args), capture_output=True, text=True, timeout=timeout)


def test_start_status_stop_daemon(tmp_path):
    pid_file = str(tmp_path / "nanoctrl.pid")
    port = free_port()
    r = run("start", "--port", str(port), "--pid-file", pid_file, "--ttl", "5")
    assert r.returncode == 0, r.stderr
    assert f"http://127.0.0.1:{port}" in r.stdout
    try:
        # start returned only once healthy: no waiting needed here.
        status, body = http(f"http://127.0.0.1:{port}", "/healthz", method="GET")
        assert status == 200 and body["status"] == "ok"
        meta = json.loads(open(pid_file + ".json").read())
        assert meta["url"] == f"http://127.0.0.1:{port}" and meta["config"]["ttl_ms"] == 5000
        pid = int(open(pid_file).read())
        assert meta["pid"] == pid

        r = run("status", "--pid-file", pid_file)
        assert r.returncode == 0 and "healthy" in r.stdout
        r = run("start", "--port", str(free_port()), "--pid-file", pid_file)
        assert r.returncode == 1 and "already running" in r.stderr
    finally:
        r = run("stop", "--pid-file", pid_file)
    assert r.returncode == 0 and "stopped" in r.stdout
    assert not os.path.exists(pid_file) and not os.path.exists(pid_file + ".json")
    r = run("status", "--pid-file", pid_file)
    assert r.returncode == 3 and "not running" in r.stdout
    assert run("stop", "--pid-file", pid_file).returncode == 0  # idempotent


def test_daemon_with_redis_and_any_port(tmp_path):
    with RedisServer() as redis:
        pid_file = str(tmp_path / "run" / "nc.pid")
        log_file = str(tmp_path / "nc.log")
        r = run("start", "--port", "0", "--redis-url", redis.url, "--pid-file", pid_file, "--log-file", log_file)
        assert r.returncode == 0, r.stderr
        try:
            url = json.loads(open(pid_file + ".json").read())["url"]
            c = nanoctrl.NanoCtrlClient(url)
            c.start_peer_agent(alias="via-daemon")
            assert http(url, "/healthz", method="GET")[1]["store"] == "redis"
            r = run("status", "--url", url)
            assert r.returncode == 0 and "redis://127.0.0.1" in r.stdout
        finally:
            assert run("stop", "--pid-file", pid_file).returncode == 0
        assert "nanoctrl serving" in open(log_file).read()


def test_start_reports_a_server_that_cannot_start(tmp_path):
    dead = RedisServer()
    url = dead.url
    dead.stop()
    r = run("start", "--port", "0", "--redis-url", url, "--pid-file", str(tmp_path / "x.pid"), "--wait", "20")
    assert r.returncode == 1
    assert "exited" in r.stderr and "Redis" in r.stderr  # the daemon's log tail says why


def test_foreground_server_stops_on_sigterm():
    port = free_port()
    proc = subprocess.Popen(CMD + ["server", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_until(lambda: _healthy(port), timeout=30, what="nanoctrl server")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
        assert proc.returncode == 0 and f"serving http://127.0.0.1:{port}" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _healthy(port):
    try:
        return http(f"http://127.0.0.1:{port}", "/healthz", method="GET", timeout=1)[0] == 200
    except OSError:
        return False


def test_bad_arguments_exit_2():
    for args in (["bogus"], ["server", "--port", "x"], ["server", "--nope", "1"], ["stop", "--host", "h"],
                 ["server", "--redis-url", "localhost"], ["server", "--ttl", "-1"]):
        r = run(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "usage: nanoctrl" in r.stderr
    r = run("--help")
    assert r.returncode == 0 and "usage: nanoctrl" in r.stdout


def test_port_in_use_fails_cleanly():
    with nanoctrl.serve(port=0) as url:
        port = url.rsplit(":", 1)[1]
        r = run("server", "--port", port)
        assert r.returncode == 1 and "cannot listen" in r.stderr
