"""NanoCtrl over Redis: replicas share state, restarts lose nothing, outages give 503 and
heal by themselves."""

import os
import signal
import threading
import time

import pytest

import dlslime.nanoctrl as nanoctrl
from nanoctrl_fixtures import RedisServer, http, is_error, wait_until


@pytest.fixture
def redis_server():
    with RedisServer() as r:
        yield r


def test_two_replicas_serve_the_same_agents(redis_server):
    with nanoctrl.serve(port=0, redis_url=redis_server.url) as u1, \
            nanoctrl.serve(port=0, redis_url=redis_server.url) as u2:
        c1, c2 = nanoctrl.NanoCtrlClient(u1, scope="job"), nanoctrl.NanoCtrlClient(u2, scope="job")
        c1.start_peer_agent(alias="a", address="host-a")
        c2.start_peer_agent(alias="b", address="host-b")
        assert [x["name"] for x in c1.query()] == ["a", "b"]
        assert c2.get_peer_agent("a")["address"] == "host-a"
        with pytest.raises(RuntimeError, match="409"):
            c2.start_peer_agent(alias="a")
        assert c2.heartbeat("a") == "ok"
        c1.register_mr("a", "kv", {"addr": 1, "length": 2})
        assert c2.get_mr_info("a", "kv") == {"addr": 1, "length": 2}

        # A message posted through replica 1 reaches an agent long-polling on replica 2.
        got = []
        waiter = threading.Thread(target=lambda: got.append((c2.recv("b", timeout=10), time.monotonic())))
        waiter.start()
        wait_until(lambda: "nanoctrl_mailbox_waiters 1" in http(u2, "/metrics", method="GET")[1],
                   what="the receive to block on replica 2")
        sent = time.monotonic()
        c1.post("b", {"handshake": "hello"}, sender="a")
        waiter.join(10)
        msgs, at = got[0]
        assert msgs[0]["message"] == {"handshake": "hello"} and msgs[0]["from"] == "a"
        assert at - sent < 0.5

        # Cleanup through replica 2 notifies the peer waiting on replica 1.
        c1.recv("b", timeout=0, max_messages=100)
        assert c2.cleanup("a")["notified"] == ["b"]
        assert [m["message"] for m in c1.recv("b", timeout=2)] == [{"type": "cleanup", "peer": "a"}]
        assert c1.get_peer_agent("a") is None


def test_restart_loses_nothing(redis_server):
    with nanoctrl.serve(port=0, redis_url=redis_server.url) as u:
        c = nanoctrl.NanoCtrlClient(u)
        c.start_peer_agent(alias="survivor")
        c.register_mr("survivor", "kv", {"addr": 5, "length": 6})
        c.register("svc", kind="cache")
        c.post("survivor", "queued before the restart")
        c.set_desired_topology("survivor", ["x"])
        port = int(u.rsplit(":", 1)[1])
    # Same port, new process state: everything comes back from Redis.
    with nanoctrl.serve(port=port, redis_url=redis_server.url) as u:
        c = nanoctrl.NanoCtrlClient(u)
        assert [a["name"] for a in c.query()] == ["survivor"]
        assert c.get_mr_info("survivor", "kv") == {"addr": 5, "length": 6}
        assert c.get_entity_info("svc")["kind"] == "cache"
        assert c.get_desired_topology("survivor")["target_peers"] == ["x"]
        assert [m["message"] for m in c.recv("survivor")] == ["queued before the restart"]
        assert c.start_peer_agent()["name"] == "agent-1"  # the auto-alias counter survived too
        assert c.start_peer_agent()["name"] == "agent-2"


def test_redis_outage_gives_503_then_recovers(redis_server):
    with nanoctrl.serve(port=0, redis_url=redis_server.url, redis_timeout=0.5) as u:
        c = nanoctrl.NanoCtrlClient(u)
        c.start_peer_agent(alias="a")
        blocked = []
        waiter = threading.Thread(target=lambda: blocked.append(_outcome(lambda: c.recv("a", timeout=20))))
        waiter.start()
        wait_until(lambda: "nanoctrl_mailbox_waiters 1" in http(u, "/metrics", method="GET")[1])
        redis_server.stop()

        status, body = http(u, "/query", {})
        assert is_error(status, body, 503) and "Redis" in body["message"] and "unavailable" in body["message"]
        status, body = http(u, "/healthz", method="GET")
        assert status == 503 and body["status"] == "error"
        status, text = http(u, "/metrics", method="GET")
        assert status == 200 and "nanoctrl_store_up 0" in text
        with pytest.raises(ConnectionError, match="503"):
            c.heartbeat("a")
        waiter.join(10)
        assert not waiter.is_alive() and blocked[0] == "ConnectionError"  # the waiter fails, not hangs

        redis_server.start()  # same port, empty data
        wait_until(lambda: http(u, "/healthz", method="GET")[0] == 200, what="recovery after Redis came back")
        assert c.start_peer_agent(alias="a")["name"] == "a"
        c.post("a", "after")
        assert [m["message"] for m in c.recv("a", timeout=1)] == ["after"]


def test_a_long_poll_on_a_stopped_redis_fails_after_one_wait_not_two(redis_server):
    # Hostile review 16k: with Redis stopped (SIGSTOP) under a 30 s mailbox poll, the answer
    # came after 65 s: the timed-out BLPOP was retried as if its pooled connection were
    # stale. It now fails once the poll and the Redis timeout have passed.
    poll, redis_timeout = 2.0, 0.5
    with nanoctrl.serve(port=0, redis_url=redis_server.url, redis_timeout=redis_timeout) as u:
        c = nanoctrl.NanoCtrlClient(u, timeout=30)
        c.start_peer_agent(alias="a")
        result = []

        def poll_mailbox():
            started = time.monotonic()
            outcome = _outcome(lambda: c.recv("a", timeout=poll))
            result.append((outcome, time.monotonic() - started))

        waiter = threading.Thread(target=poll_mailbox)
        waiter.start()
        try:
            wait_until(lambda: "nanoctrl_mailbox_waiters 1" in http(u, "/metrics", method="GET")[1])
            os.kill(redis_server.proc.pid, signal.SIGSTOP)
            waiter.join(3 * (poll + redis_timeout) + 10)
        finally:
            os.kill(redis_server.proc.pid, signal.SIGCONT)
        assert not waiter.is_alive()
        outcome, elapsed = result[0]
        assert outcome == "ConnectionError"  # 503: Redis did not answer
        # One wait (poll + redis_timeout = 2.5 s), not two (5 s); the rest is slack for load.
        assert elapsed < 2 * (poll + redis_timeout) - 0.5, elapsed


def _outcome(fn):
    try:
        fn()
        return "ok"
    except Exception as e:  # noqa: BLE001 - the test looks at which exception it was
        return type(e).__name__


def test_server_refuses_to_start_without_redis():
    dead = RedisServer()
    url = dead.url
    dead.stop()
    with pytest.raises(ConnectionError, match="Redis"):
        with nanoctrl.serve(port=0, redis_url=url):
            pass
    with pytest.raises(ValueError, match="redis://"):
        nanoctrl.NanoCtrlServer(port=0, redis_url="localhost:6379")


def test_redis_database_and_password_in_url(redis_server):
    with nanoctrl.serve(port=0, redis_url=redis_server.url + "/2") as u2, \
            nanoctrl.serve(port=0, redis_url=redis_server.url + "/3") as u3:
        nanoctrl.NanoCtrlClient(u2).start_peer_agent(alias="in-db-2")
        assert nanoctrl.NanoCtrlClient(u3).query() == []
        assert [a["name"] for a in nanoctrl.NanoCtrlClient(u2).query()] == ["in-db-2"]
    # A password Redis does not expect is refused with a clear message.
    with pytest.raises(ConnectionError, match="AUTH"):
        with nanoctrl.serve(port=0, redis_url=f"redis://:wrong@127.0.0.1:{redis_server.port}"):
            pass
