"""The TCP runtime at the process level: environment values are range-checked (a clear
ValueError at construction, never an abort), and a fork() child gets a working engine of
its own while the parent's endpoints keep working."""

import multiprocessing
import os
import subprocess
import sys
import textwrap

import pytest

from dlslime import TcpEndpoint
from conftest import Buffer, connect_pair

OK = 0
CHILD_DEADLINE = 30  # seconds; a healthy child takes well under one


def run_python(code, env_overrides=None, timeout=CHILD_DEADLINE):
    env = dict(os.environ)
    env.update(env_overrides or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize(
    "name,value,allowed",
    [
        ("DLSLIME_IO_THREADS", "-1", "1..256"),  # used to abort the process after 5 s
        ("DLSLIME_IO_THREADS", "0", "1..256"),
        ("DLSLIME_IO_THREADS", "lots", "1..256"),
        ("DLSLIME_TCP_LANES", "4294967298", "1..64"),  # used to wrap to 2
        ("DLSLIME_TCP_MAX_INFLIGHT_OPS", "-1", "1..16777216"),  # used to become 4294967295
        ("DLSLIME_TCP_KEEPALIVE_IDLE_S", "100000", "1..32767"),  # past the kernel's TCP_KEEPIDLE limit
        ("DLSLIME_TCP_KEEPALIVE_COUNT", "128", "1..127"),
    ],
)
def test_bad_environment_value_raises_value_error(name, value, allowed):
    r = run_python(
        """
        import dlslime
        try:
            dlslime.TcpEndpoint(ip="127.0.0.1", port=0)
        except ValueError as e:
            print(e)
            raise SystemExit(3)
        raise SystemExit(0)
        """,
        {name: value},
    )
    assert r.returncode == 3, f"rc={r.returncode}, expected a ValueError\n{r.stdout}\n{r.stderr}"
    assert f"{name}='{value}'" in r.stdout, r.stdout
    assert allowed in r.stdout, r.stdout


def test_keepalive_keyword_beyond_the_kernel_limit_raises_value_error():
    with pytest.raises(ValueError, match=r"keepalive_idle=100000 is out of range \(allowed: 1\.\.32767\)"):
        TcpEndpoint(ip="127.0.0.1", port=0, keepalive_idle=100000)
    with pytest.raises(ValueError, match="keepalive_count"):
        TcpEndpoint(ip="127.0.0.1", port=0, keepalive_count=1000)


def transfer(a, b, payload):
    """Writes `payload` from a to b through fresh regions and returns what arrived."""
    tag = os.urandom(4).hex()
    src, dst = Buffer(len(payload)), Buffer(len(payload))
    src.set(payload)
    h_src = a.register_memory_region(f"src{tag}", src.addr, 0, src.size)
    b.register_memory_region(f"dst{tag}", dst.addr, 0, dst.size)
    h_dst = a.register_remote_memory_region(f"dst{tag}", b.endpoint_info()["mr_info"][f"dst{tag}"])
    status = a.write([(h_src, h_dst, 0, 0, len(payload))]).wait_for(10)
    assert status == OK, status
    return dst.bytes()


def child_with_own_pair():
    # Runs in the fork() child (multiprocessing's fork start method). The parent's pair
    # is inherited and left alone; a failed assert makes the exit code non-zero.
    c = TcpEndpoint(ip="127.0.0.1", port=0)
    d = TcpEndpoint(ip="127.0.0.1", port=0)
    connect_pair(c, d)
    payload = b"child-" * 1000
    assert transfer(c, d, payload) == payload
    c.shutdown()
    d.shutdown()


def child_shuts_down_inherited(a, b):
    # The inherited endpoints belong to the parent's I/O threads, which do not exist
    # here: shutting them down must return at once and leave the parent's sockets alone.
    a.shutdown()
    b.shutdown()
    del a, b
    child_with_own_pair()


def run_forked(target, *args):
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=target, args=args)
    p.start()
    p.join(CHILD_DEADLINE)
    if p.is_alive():
        p.kill()
        p.join()
        pytest.fail(f"the forked child hung for {CHILD_DEADLINE} s")
    assert p.exitcode == 0, f"the forked child failed (exit code {p.exitcode})"


def test_forked_child_gets_its_own_engine_and_the_parent_is_unaffected(endpoint_pair):
    a, b = endpoint_pair
    connect_pair(a, b)
    assert transfer(a, b, b"before") == b"before"
    run_forked(child_with_own_pair)
    assert transfer(a, b, b"after the fork" * 100) == b"after the fork" * 100


def test_forked_child_shuts_down_inherited_endpoints_at_once(endpoint_pair):
    a, b = endpoint_pair
    connect_pair(a, b)
    assert transfer(a, b, b"before") == b"before"
    run_forked(child_shuts_down_inherited, a, b)
    assert a.is_connected() and b.is_connected()
    assert transfer(a, b, b"after the child's shutdown" * 100) == b"after the child's shutdown" * 100


def test_forked_child_exits_normally_with_inherited_endpoints():
    # A plain os.fork() child that returns through interpreter exit, so the inherited
    # endpoints are destroyed by the interpreter's teardown (multiprocessing's children
    # leave with os._exit and never run it).
    r = run_python(
        """
        import os, sys, time
        sys.path.insert(0, %r)
        from conftest import connect_pair
        from test_tcp_runtime import transfer
        from dlslime import TcpEndpoint

        a = TcpEndpoint(ip="127.0.0.1", port=0)
        b = TcpEndpoint(ip="127.0.0.1", port=0)
        connect_pair(a, b)
        assert transfer(a, b, b"before") == b"before"
        pid = os.fork()
        if pid == 0:
            c = TcpEndpoint(ip="127.0.0.1", port=0)
            d = TcpEndpoint(ip="127.0.0.1", port=0)
            connect_pair(c, d)
            assert transfer(c, d, b"child") == b"child"
            sys.exit(0)  # a, b, c, d are destroyed at interpreter exit
        deadline = time.monotonic() + %d
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                print("the child hung at exit")
                sys.exit(5)
            time.sleep(0.01)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert transfer(a, b, b"after") == b"after"
        print("parent ok")
        """
        % (os.path.dirname(__file__), CHILD_DEADLINE - 5),
        timeout=CHILD_DEADLINE + 10,
    )
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "parent ok" in r.stdout
