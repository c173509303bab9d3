"""NanoCtrl's optional bearer token: 401s on every route but /healthz, the client's token
(argument or DLSLIME_NANOCTRL_TOKEN) and PermissionError, the `nanoctrl` command's --token,
--token-file and NANOCTRL_TOKEN, and the token staying out of replies, metrics, logs and
command lines. Against the memory store and the Redis store."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

import dlslime
import dlslime.nanoctrl as nanoctrl
from nanoctrl_fixtures import RedisServer, free_port, http, http_with_headers, is_error

TOKEN = "tok-5c2e8f1a9b3d47e6a0c1f2e3d4b5a697"
WRONG = "tok-ffffffffffffffffffffffffffffffff"
CMD = [sys.executable, "-m", "dlslime.nanoctrl"]

# Every kind of route: (method, path, body). All need the token when the server has one.
ROUTES = [
    ("POST", "/start_peer_agent", {"alias": "x"}),
    ("POST", "/heartbeat", {"entity_id": "x"}),
    ("POST", "/query", {}),
    ("POST", "/get_peer_agent", {"name": "x"}),
    ("POST", "/register_mr", {"agent_name": "x", "mr_name": "m", "mr_info": {}}),
    ("POST", "/get_mr_info", {"dst": "x", "mr_name": "m"}),
    ("POST", "/register", {"entity_id": "e"}),
    ("POST", "/list_entities", {}),
    ("POST", "/mailbox/post", {"to": "x", "message": "hi"}),
    ("POST", "/mailbox/recv", {"alias": "x"}),
    ("POST", "/cleanup", {"agent_name": "x"}),
    ("POST", "/v1/desired_topology/x", {"target_peers": []}),
    ("GET", "/v1/desired_topology/x", None),
    ("GET", "/metrics", None),
    ("GET", "/", None),
    ("POST", "/no_such_route", {}),  # unauthenticated clients do not learn which paths exist
]


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def redis_server():
    with RedisServer() as r:
        yield r


@pytest.fixture(params=["memory", "redis"])
def store_options(request, redis_server):
    # A fresh key prefix per test keeps tests on the shared Redis apart.
    redis_url = redis_server.url if request.param == "redis" else None
    return {"redis_url": redis_url, "key_prefix": f"t{time.monotonic_ns()}:"}


@pytest.fixture
def url(store_options):
    """A NanoCtrl that requires TOKEN."""
    with nanoctrl.serve(port=0, token=TOKEN, **store_options) as u:
        yield u


@pytest.fixture(autouse=True)
def no_token_in_environment(monkeypatch):
    monkeypatch.delenv("DLSLIME_NANOCTRL_TOKEN", raising=False)
    monkeypatch.delenv("NANOCTRL_TOKEN", raising=False)


def metric(text, name):
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_without_a_token_nothing_changes(store_options):
    with nanoctrl.serve(port=0, **store_options) as u:
        assert http(u, "/query") == (200, [])
        assert http(u, "/query", headers=bearer(WRONG))[0] == 200  # a header is ignored
        status, body = http(u, "/healthz", method="GET")
        assert status == 200 and body["auth"] == "none"
        c = nanoctrl.NanoCtrlClient(u)
        assert not c.has_token
        c.start_peer_agent(alias="a")
        assert nanoctrl.NanoCtrlClient(u, token=TOKEN).get_peer_agent("a") is not None
        status, text = http(u, "/metrics", method="GET")
        assert status == 200 and metric(text, 'nanoctrl_auth_failures_total{reason="missing"}') == 0


def test_requests_without_the_token_get_401(url):
    for method, path, body in ROUTES:
        status, reply, headers = http_with_headers(url, path, body, method=method)
        assert is_error(status, reply, 401), (method, path, status, reply)
        assert "requires a bearer token" in reply["message"], reply
        assert headers.get("WWW-Authenticate", "").startswith("Bearer"), (path, dict(headers))
    # Another scheme, or the scheme without credentials, is no bearer token either.
    for header in (f"Basic {TOKEN}", "Bearer", TOKEN):
        status, reply = http(url, "/query", headers={"Authorization": header})
        assert is_error(status, reply, 401) and "requires a bearer token" in reply["message"], header


def test_wrong_token_gets_401_and_is_not_echoed(url):
    for method, path, body in ROUTES:
        status, reply, headers = http_with_headers(url, path, body, method=method, headers=bearer(WRONG))
        assert is_error(status, reply, 401), (method, path, status, reply)
        assert "token is wrong" in reply["message"]
        assert WRONG not in json.dumps(reply) and TOKEN not in json.dumps(reply)
        assert headers.get("WWW-Authenticate", "").startswith("Bearer")
    # Close is not enough: a prefix of the token, the token with a suffix, another case.
    for near in (TOKEN[:-1], TOKEN + "0", TOKEN.upper()):
        assert http(url, "/query", headers=bearer(near))[0] == 401


def test_healthz_stays_open(url):
    status, body = http(url, "/healthz", method="GET")
    assert status == 200 and body["status"] == "ok" and body["auth"] == "bearer"
    assert http(url, "/healthz", method="GET", headers=bearer(WRONG))[0] == 200


def test_right_token_works_on_every_route(url):
    ok = bearer(TOKEN)
    assert http(url, "/start_peer_agent", {"alias": "rx"}, headers=ok)[0] == 200
    assert http(url, "/start_peer_agent", {"alias": "tx"}, headers={"Authorization": f"bearer  {TOKEN} "})[0] == 200
    assert http(url, "/heartbeat", {"entity_id": "rx"}, headers=ok)[1]["status"] == "ok"
    assert http(url, "/register_mr", {"agent_name": "tx", "mr_name": "kv", "mr_info": {"n": 1}}, headers=ok)[0] == 200
    assert http(url, "/get_mr_info", {"dst": "tx", "mr_name": "kv"}, headers=ok)[1]["mr_info"] == {"n": 1}
    assert http(url, "/mailbox/post", {"to": "rx", "message": {"hello": 1}, "from": "tx"}, headers=ok) == (
        200, {"status": "ok", "depth": 1})
    status, body = http(url, "/mailbox/recv", {"alias": "rx", "timeout": 0}, headers=ok)
    assert status == 200 and [m["message"] for m in body["messages"]] == [{"hello": 1}]
    assert http(url, "/v1/desired_topology/tx", {"target_peers": ["rx"]}, headers=ok)[0] == 200
    assert http(url, "/v1/desired_topology/tx", method="GET", headers=ok)[1]["spec"]["target_peers"] == ["rx"]
    assert http(url, "/register", {"entity_id": "svc"}, headers=ok)[0] == 200
    assert len(http(url, "/list_entities", headers=ok)[1]["entities"]) == 1
    assert sorted(a["name"] for a in http(url, "/query", headers=ok)[1]) == ["rx", "tx"]
    assert http(url, "/", method="GET", headers=ok) == (200, "NanoCtrl Server Running")
    assert http(url, "/no_such_route", headers=ok)[0] == 404  # routing happens once authenticated
    assert http(url, "/healthz", headers=ok)[0] == 405
    status, text = http(url, "/metrics", method="GET", headers=ok)
    assert status == 200 and metric(text, "nanoctrl_agents") == 2
    assert http(url, "/cleanup", {"agent_name": "tx"}, headers=ok)[1]["notified"] == ["rx"]


def test_client_with_the_token(url):
    c = nanoctrl.NanoCtrlClient(url, scope="job", token=TOKEN)
    assert c.has_token
    assert c.start_peer_agent(alias="rx")["name"] == "rx"
    c.start_peer_agent(alias="tx")
    assert c.heartbeat("rx") == "ok"
    c.register_mr("tx", "kv", {"addr": 1, "length": 2})
    assert c.get_mr_info("tx", "kv") == {"addr": 1, "length": 2}
    assert c.set_desired_topology("tx", ["rx"])["status"] == "ok"
    assert c.get_desired_topology("tx")["target_peers"] == ["rx"]
    assert c.post("rx", {"n": 1}, sender="tx") >= 1
    got = c.recv("rx", timeout=5.0, max_messages=10)
    assert {"n": 1} in [m["message"] for m in got]
    c.register("svc", kind="k")
    assert [e["entity_id"] for e in c.list_entities()] == ["svc"]
    assert len(c.query()) == 2


def test_client_without_or_with_a_wrong_token_raises_permission_error(url):
    none = nanoctrl.NanoCtrlClient(url)
    assert not none.has_token
    assert none.healthz()["status"] == "ok"
    with pytest.raises(PermissionError, match="401.*requires a bearer token"):
        none.query()
    wrong = nanoctrl.NanoCtrlClient(url, token=WRONG)
    with pytest.raises(PermissionError, match="token is wrong") as e:
        wrong.start_peer_agent(alias="x")
    assert WRONG not in str(e.value) and TOKEN not in str(e.value)
    with pytest.raises(PermissionError):
        wrong.post("x", "hi")
    with pytest.raises(PermissionError):
        wrong.recv("x", timeout=0.0)
    with pytest.raises(PermissionError):
        wrong.call("/query")
    with pytest.raises(ValueError, match="token"):
        nanoctrl.NanoCtrlClient(url, token="two words")


def test_client_takes_the_token_from_the_environment(url, monkeypatch):
    monkeypatch.setenv("DLSLIME_NANOCTRL_TOKEN", TOKEN)
    c = nanoctrl.NanoCtrlClient(url)
    assert c.has_token
    assert c.start_peer_agent(alias="e")["name"] == "e"
    with pytest.raises(PermissionError):
        nanoctrl.NanoCtrlClient(url, token=WRONG).query()  # the argument wins
    monkeypatch.setenv("DLSLIME_NANOCTRL_TOKEN", "")
    assert not nanoctrl.NanoCtrlClient(url).has_token


def test_metrics_count_failures_and_never_show_the_token(url):
    http(url, "/query")
    http(url, "/query", headers={"Authorization": "Basic abc"})
    http(url, "/metrics", method="GET")
    http(url, "/query", headers=bearer(WRONG))
    status, text = http(url, "/metrics", method="GET", headers=bearer(TOKEN))
    assert status == 200
    assert metric(text, 'nanoctrl_auth_failures_total{reason="missing"}') == 3
    assert metric(text, 'nanoctrl_auth_failures_total{reason="wrong"}') == 1
    assert metric(text, 'nanoctrl_errors_total{kind="unauthorized"}') == 4
    assert metric(text, 'nanoctrl_requests_total{route="/query",code="401"}') == 3
    assert metric(text, 'nanoctrl_requests_total{route="/metrics",code="401"}') == 1
    assert TOKEN not in text and WRONG not in text


def test_token_never_in_config_or_logs(store_options, capfd):
    level = dlslime.get_log_level()
    dlslime.set_log_level("debug")
    try:
        server = nanoctrl.NanoCtrlServer(port=0, token=TOKEN, **store_options)
        assert server.config["token"] == "set"
        assert TOKEN not in json.dumps(server.config)
        assert nanoctrl.NanoCtrlServer(port=0).config["token"] == "none"
        with server:
            http(server.url, "/query", headers=bearer(WRONG))
            http(server.url, "/query", headers=bearer(TOKEN))
    finally:
        dlslime.set_log_level(level)
    out, err = capfd.readouterr()
    assert '"token":"set"' in err, err  # the start-up line says a token is set...
    assert TOKEN not in out + err and WRONG not in out + err  # ...and never which


def test_bad_tokens_are_refused():
    for bad in ("two words", "line\nbreak", "x" * 4097):
        with pytest.raises(ValueError, match="token") as e:
            nanoctrl.NanoCtrlServer(port=0, token=bad)
        assert bad not in str(e.value)


# ------------------------------------------------------------------------ the command line


def run(*args, env=None, timeout=60):
    return subprocess.run(CMD + list(args), capture_output=True, text=True, timeout=timeout, env=env)


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("NANOCTRL_TOKEN", "DLSLIME_NANOCTRL_TOKEN")}
    env.update(extra)
    return env


def test_cli_start_with_token_file(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(f"  {TOKEN}\t\nnot part of the token\n")
    wrong_file = tmp_path / "wrong"
    wrong_file.write_text(WRONG + "\n")
    pid_file, log_file = str(tmp_path / "nc.pid"), str(tmp_path / "nc.log")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = clean_env()
    r = run("start", "--port", str(port), "--pid-file", pid_file, "--log-file", log_file, "--token-file",
            str(token_file), env=env)
    assert r.returncode == 0, r.stderr
    try:
        # start returned once healthy: no waiting needed.
        r = run("status", "--pid-file", pid_file, env=env)  # /healthz needs no token
        assert r.returncode == 0 and "bearer token required" in r.stdout, r.stdout
        r = run("status", "--pid-file", pid_file, "--token-file", str(token_file), env=env)
        assert r.returncode == 0 and "healthy" in r.stdout, r.stdout
        r = run("status", "--pid-file", pid_file, "--token-file", str(wrong_file), env=env)
        assert r.returncode == 1 and "refuses the token" in r.stdout and WRONG not in r.stdout, r.stdout
        r = run("status", "--url", url, env=clean_env(NANOCTRL_TOKEN=TOKEN))
        assert r.returncode == 0, r.stdout

        c = nanoctrl.NanoCtrlClient(url, token=TOKEN)
        assert c.start_peer_agent(alias="via-daemon")["name"] == "via-daemon"
        with pytest.raises(PermissionError):
            nanoctrl.NanoCtrlClient(url).query()

        # The token is in none of: the daemon's command line, the metadata file.
        pid = int(open(pid_file).read())
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read().decode()
        assert "server" in cmdline and TOKEN not in cmdline
        meta_text = open(pid_file + ".json").read()
        assert json.loads(meta_text)["config"]["token"] == "set" and TOKEN not in meta_text
    finally:
        r = run("stop", "--pid-file", pid_file, env=env)
    assert r.returncode == 0 and "stopped" in r.stdout
    log = open(log_file).read()
    assert "bearer token required" in log and TOKEN not in log


def test_cli_token_from_environment(tmp_path):
    pid_file = str(tmp_path / "nc.pid")
    env = clean_env(NANOCTRL_TOKEN=TOKEN)
    r = run("start", "--port", "0", "--pid-file", pid_file, env=env)
    assert r.returncode == 0, r.stderr
    try:
        url = json.loads(open(pid_file + ".json").read())["url"]
        assert http(url, "/query")[0] == 401
        assert http(url, "/query", headers=bearer(TOKEN))[0] == 200
        r = run("status", "--pid-file", pid_file, env=env)
        assert r.returncode == 0, r.stdout
    finally:
        assert run("stop", "--pid-file", pid_file, "--token", "ignored-by-stop", env=env).returncode == 0


def test_cli_token_errors(tmp_path):
    env = clean_env()
    empty = tmp_path / "empty"
    empty.write_text("\n")
    r = run("server", "--port", "0", "--token-file", str(empty), env=env)
    assert r.returncode == 1 and "empty" in r.stderr
    r = run("server", "--port", "0", "--token-file", str(tmp_path / "absent"), env=env)
    assert r.returncode == 1 and "cannot read" in r.stderr
    r = run("server", "--port", "0", "--token", "a", "--token-file", str(empty), env=env)
    assert r.returncode == 2 and "not both" in r.stderr
    r = run("server", "--port", "0", "--token", "two words", env=env)
    assert r.returncode == 2 and "token" in r.stderr and "two words" not in r.stderr
    r = run("--help", env=env)
    assert r.returncode == 0 and "--token-file" in r.stdout and "NANOCTRL_TOKEN" in r.stdout
