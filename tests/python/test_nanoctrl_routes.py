"""Every NanoCtrl route, against the memory store and the Redis store."""

import threading
import time

import pytest

import dlslime.nanoctrl as nanoctrl
from nanoctrl_fixtures import RedisServer, http, is_error, wait_until


@pytest.fixture(scope="module")
def redis_server():
    with RedisServer() as r:
        yield r


@pytest.fixture(params=["memory", "redis"])
def url(request, redis_server):
    # A fresh key prefix per test keeps tests on the shared Redis apart.
    redis_url = redis_server.url if request.param == "redis" else None
    prefix = f"t{time.monotonic_ns()}:"
    with nanoctrl.serve(port=0, redis_url=redis_url, ttl=1.0, key_prefix=prefix) as u:
        yield u


def client(url, scope=None):
    return nanoctrl.NanoCtrlClient(url, scope=scope)


def test_root_healthz_metrics(url):
    assert http(url, "/", method="GET") == (200, "NanoCtrl Server Running")
    status, body = http(url, "/healthz", method="GET")
    assert status == 200 and body["status"] == "ok" and body["store"] in ("memory", "redis")
    c = client(url)
    c.start_peer_agent(alias="a")
    c.post("a", "hi")
    status, text = http(url, "/metrics", method="GET")
    assert status == 200
    assert "nanoctrl_agents 1" in text
    assert "nanoctrl_mailbox_depth 1" in text
    assert 'nanoctrl_requests_total{route="/start_peer_agent",code="200"} 1' in text
    assert 'nanoctrl_errors_total{kind="conflict"} 0' in text


def test_start_peer_agent_aliases_and_conflict(url):
    c = client(url)
    r = c.start_peer_agent(alias="prefill-0", address="10.0.0.7", device="mlx5_0", ib_port=1, link_type="RoCE",
                           resource={"nics": 2}, metadata={"role": "prefill"}, endpoint_info={"host": "h"})
    assert r["status"] == "ok" and r["name"] == "prefill-0" and r["ttl_ms"] == 1000
    auto1 = c.start_peer_agent()["name"]
    auto2 = c.start_peer_agent(name_prefix="decode")["name"]
    assert auto1.startswith("agent-") and auto2.startswith("decode-") and auto1 != auto2
    status, body = http(url, "/start_peer_agent", {"alias": "prefill-0"})
    assert is_error(status, body, 409) and "already registered" in body["message"]
    with pytest.raises(RuntimeError, match="409"):
        c.start_peer_agent(alias="prefill-0")
    rec = c.get_peer_agent("prefill-0")
    assert rec["address"] == "10.0.0.7" and rec["device"] == "mlx5_0" and rec["ib_port"] == 1
    assert rec["resource"] == {"nics": 2} and rec["metadata"] == {"role": "prefill"}
    assert c.get_peer_agent("nobody") is None


def test_heartbeat_keeps_alive_and_ttl_expires(url):
    c = client(url)
    c.start_peer_agent(alias="hb")
    c.start_peer_agent(alias="quiet")
    assert c.heartbeat("hb") == "ok"
    assert http(url, "/heartbeat", {"entity_type": "agent", "entity_id": "hb"})[1]["status"] == "ok"
    # "quiet" sends no heartbeats and expires after the 1 s TTL; "hb" keeps beating.
    deadline = time.monotonic() + 10
    while c.get_peer_agent("quiet") is not None:
        assert c.heartbeat("hb") == "ok"
        assert time.monotonic() < deadline, "agent did not expire"
        time.sleep(0.1)
    assert c.heartbeat("quiet") == "not_found"
    assert c.get_peer_agent("hb") is not None
    assert [a["name"] for a in c.query()] == ["hb"]
    # A heartbeat for a generic entity refreshes it too.
    c.register("svc", kind="k")
    assert c.heartbeat("svc", entity_type="service") == "ok"


def test_query_lists_agents_with_memory_keys(url):
    c = client(url)
    for n in ("b", "a"):
        c.start_peer_agent(alias=n, address=f"host-{n}")
    c.register_mr("a", "kv", {"addr": 4096, "length": 128, "rkey": 7})
    c.register_mr("a", "weights", {"addr": 8192, "length": 64})
    agents = c.query()
    assert [a["name"] for a in agents] == ["a", "b"]
    assert agents[0]["memory_keys"] == ["kv", "weights"] and agents[1]["memory_keys"] == []
    status, body = http(url, "/query", {})
    assert status == 200 and isinstance(body, list) and len(body) == 2  # upstream shape: a bare list


def test_memory_region_records(url):
    c = client(url)
    c.start_peer_agent(alias="owner")
    # Upstream's flat fields ...
    status, body = http(url, "/register_mr", {"agent_name": "owner", "mr_name": "kv", "addr": 1, "length": 2,
                                              "rkey": 3})
    assert status == 200 and body["status"] == "ok"
    status, body = http(url, "/get_mr_info", {"src": "x", "dst": "owner", "mr_name": "kv"})
    assert body["mr_info"] == {"addr": 1, "length": 2, "rkey": 3, "lkey": 0}
    # ... or a transport's blob, kept as is.
    blob = {"handle": 4, "addr": 2**63 + 5, "length": 10, "extra": ["x"]}
    c.register_mr("owner", "tcp:buf/0", blob)
    assert c.get_mr_info("owner", "tcp:buf/0") == blob
    assert c.get_mr_info("owner", "missing") is None
    assert c.unregister_mr("owner", "kv") is True
    assert c.unregister_mr("owner", "kv") is False
    assert c.get_mr_info("owner", "kv") is None
    status, body = http(url, "/register_mr", {"agent_name": "ghost", "mr_name": "kv", "mr_info": {}})
    assert is_error(status, body, 404)
    status, body = http(url, "/register_mr", {"agent_name": "owner", "mr_name": "kv"})
    assert is_error(status, body, 400)


def test_desired_topology_and_connect_intents(url):
    c = client(url)
    for n in ("a", "b", "c"):
        c.start_peer_agent(alias=n)
    r = c.set_desired_topology("a", ["b", "zz"], symmetric=True, min_bw=10.0)
    assert r["status"] == "ok" and r["missing"] == ["zz"]
    assert c.get_desired_topology("a")["target_peers"] == ["b", "zz"]
    assert c.get_desired_topology("a")["min_bw"] == 10.0
    assert c.get_desired_topology("b")["target_peers"] == ["a"]  # symmetric merge
    assert c.get_desired_topology("c") is None
    got_a = [m["message"] for m in c.recv("a", timeout=1, max_messages=10)]
    got_b = [m["message"] for m in c.recv("b", timeout=1, max_messages=10)]
    assert got_a == [{"type": "connect_peer", "peer": "b"}]
    assert got_b == [{"type": "connect_peer", "peer": "a"}]
    # An agent that has not registered yet may be given its spec first (upstream's server
    # allows it): it is kept "pending" and queues no connect intent.
    status, body = http(url, "/v1/desired_topology/ghost", {"target_peers": ["a"]})
    assert status == 200 and body["spec"]["pending"] is True, (status, body)
    status, body = http(url, "/v1/desired_topology/a", {"target_peers": "b"})
    assert is_error(status, body, 400)
    status, body = http(url, "/v1/desired_topology/a", {"target_peers": ["b"]}, method="PUT")
    assert is_error(status, body, 405)


def test_cleanup_notifies_peers(url):
    c = client(url)
    for n in ("leaver", "topo_peer", "msg_peer", "targets_leaver", "bystander"):
        c.start_peer_agent(alias=n)
    c.set_desired_topology("leaver", ["topo_peer"])
    c.set_desired_topology("targets_leaver", ["leaver"])
    c.post("msg_peer", {"hello": 1}, sender="leaver")
    c.register_mr("leaver", "kv", {"addr": 1, "length": 1})
    for n in ("leaver", "topo_peer", "msg_peer", "targets_leaver"):
        c.recv(n, timeout=0, max_messages=100)  # drain connect intents and the hello
    r = c.cleanup("leaver")
    assert r["existed"] is True
    assert sorted(r["notified"]) == ["msg_peer", "targets_leaver", "topo_peer"]
    for n in ("topo_peer", "msg_peer", "targets_leaver"):
        msgs = c.recv(n, timeout=1)
        assert [m["message"] for m in msgs] == [{"type": "cleanup", "peer": "leaver"}]
        assert msgs[0]["from"] == "nanoctrl"
    assert c.recv("bystander", timeout=0) == []
    assert c.get_peer_agent("leaver") is None
    assert c.get_mr_info("leaver", "kv") is None
    assert c.cleanup("leaver")["existed"] is False
    # The alias is free again, with a clean slate.
    c.start_peer_agent(alias="leaver")
    assert c.recv("leaver", timeout=0) == []


def test_entity_registry(url):
    c = client(url)
    r1 = c.register("cache:0", kind="cache", endpoint="10.0.0.1:80", metadata={"gb": 8}, resource={"x": 1})
    r2 = c.register("cache:1", kind="cache")
    c.register("router", kind="router", entity_type="gateway")
    assert r1["status"] == "ok" and r2["revision"] == r1["revision"] + 1
    info = c.get_entity_info("cache:0")
    assert info["kind"] == "cache" and info["endpoint"] == "10.0.0.1:80" and info["metadata"] == {"gb": 8}
    assert info["id"] == info["entity_id"] == "cache:0" and info["entity_type"] == "service"
    assert [e["entity_id"] for e in c.list_entities(entity_type="service")] == ["cache:0", "cache:1"]
    assert [e["entity_id"] for e in c.list_entities(kind="router")] == ["router"]
    assert len(c.list_entities()) == 3
    status, body = http(url, "/get_entity_info", {"entity_id": "nope"})
    assert status == 200 and body == {"status": "not_found", "entity_info": None}
    assert c.unregister("cache:0") is True
    assert c.unregister("cache:0") is False  # still a success, as upstream
    assert c.get_entity_info("cache:0") is None
    status, body = http(url, "/register", {"entity_type": "agent", "entity_id": "x"})
    assert is_error(status, body, 400)
    # Entities expire like agents without heartbeats (ttl 1 s).
    wait_until(lambda: c.get_entity_info("cache:1") is None, timeout=10, what="entity expiry")


def test_mailbox_post_and_blocking_receive(url):
    c = client(url)
    c.start_peer_agent(alias="rx")
    c.start_peer_agent(alias="tx")
    assert c.recv("rx", timeout=0) == []
    t0 = time.monotonic()
    assert c.recv("rx", timeout=0.2) == []
    assert 0.15 < time.monotonic() - t0 < 5
    results = []
    waiter = threading.Thread(target=lambda: results.append((c.recv("rx", timeout=10), time.monotonic())))
    waiter.start()
    wait_until(lambda: "nanoctrl_mailbox_waiters 1" in http(url, "/metrics", method="GET")[1],
               what="the receive to block")
    sent = time.monotonic()
    assert c.post("rx", {"qp": [1, 2]}, sender="tx") == 1
    waiter.join(10)
    msgs, got_at = results[0]
    assert msgs[0]["message"] == {"qp": [1, 2]} and msgs[0]["from"] == "tx" and msgs[0]["ts_ms"] > 0
    assert got_at - sent < 0.5, "a posted message reaches a blocked receiver within milliseconds"
    # FIFO, batches, any JSON value.
    for v in (1, "two", [3], {"four": 4}, True):
        c.post("rx", v)
    assert [m["message"] for m in c.recv("rx", max_messages=3)] == [1, "two", [3]]
    assert [m["message"] for m in c.recv("rx", max_messages=10)] == [{"four": 4}, True]
    status, body = http(url, "/mailbox/post", {"to": "nobody", "message": 1})
    assert is_error(status, body, 404)
    status, body = http(url, "/mailbox/post", {"to": "rx"})
    assert is_error(status, body, 400)
    status, body = http(url, "/mailbox/recv", {"alias": "rx", "max": 0})
    assert is_error(status, body, 400)
    status, body = http(url, "/mailbox/recv", {"alias": "rx", "timeout": -1})
    assert is_error(status, body, 400)


def test_mailbox_full_gets_429(redis_server):
    for redis_url in (None, redis_server.url):
        with nanoctrl.serve(port=0, redis_url=redis_url, mailbox_max=3, key_prefix=f"f{time.monotonic_ns()}:") as u:
            c = client(u)
            c.start_peer_agent(alias="slow")
            for i in range(3):
                c.post("slow", i)
            status, body = http(u, "/mailbox/post", {"to": "slow", "message": 3})
            assert is_error(status, body, 429) and "full" in body["message"]
            assert len(c.recv("slow", max_messages=10)) == 3


def test_waiter_limit_gets_429():
    with nanoctrl.serve(port=0, max_threads=8, max_waiters=2) as u:
        c = client(u)
        c.start_peer_agent(alias="w")
        threads = [threading.Thread(target=c.recv, args=("w", 5.0)) for _ in range(2)]
        for t in threads:
            t.start()
        wait_until(lambda: "nanoctrl_mailbox_waiters 2" in http(u, "/metrics", method="GET")[1])
        status, body = http(u, "/mailbox/recv", {"alias": "w", "timeout": 1})
        assert is_error(status, body, 429) and "max_waiters" in body["message"]
        # Heartbeats still get through while the waiters hold their threads.
        assert c.heartbeat("w") == "ok"
        c.post("w", 1)
        c.post("w", 2)
        for t in threads:
            t.join(10)
            assert not t.is_alive()


def test_scopes_are_isolated(url):
    s1, s2, none = client(url, "team1"), client(url, "team2"), client(url)
    s1.start_peer_agent(alias="same")
    s2.start_peer_agent(alias="same")  # no 409 across scopes
    none.start_peer_agent(alias="same")
    s1.start_peer_agent(alias="only1")
    s1.register_mr("only1", "kv", {"addr": 1, "length": 1})
    s1.register("svc", kind="k")
    assert [a["name"] for a in s1.query()] == ["only1", "same"]
    assert [a["name"] for a in s2.query()] == ["same"]
    assert [a["name"] for a in none.query()] == ["same"]
    assert s2.get_peer_agent("only1") is None
    assert s2.get_mr_info("only1", "kv") is None
    assert s2.list_entities() == [] and none.list_entities() == []
    with pytest.raises(KeyError):
        s2.post("only1", "hi")
    s1.post("same", "for team1")
    assert s2.recv("same", timeout=0) == [] and none.recv("same", timeout=0) == []
    assert [m["message"] for m in s1.recv("same", timeout=0)] == ["for team1"]
    status, body = http(url, "/query", {"scope": "bad:scope"})
    assert is_error(status, body, 400)
