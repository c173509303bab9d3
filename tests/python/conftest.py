"""Shared fixtures for the Python suite: connected endpoint pairs, buffers, peers in
other processes, and waiting on conditions with deadlines (never bare sleeps)."""

import ctypes
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import dlslime  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# A wildcard bind advertises the default route's interface (docs/deploy.md), and this
# suite's traffic must stay on loopback: every endpoint made here, and in the processes
# the tests start, advertises lo unless a test says otherwise (scripts/test.sh sets it too).
os.environ.setdefault("DLSLIME_TCP_ADVERTISE_INTERFACE", "lo")

# Process resources, for the bounded-memory tests. Under scripts/sanitize.sh the allocator keeps freed memory in quarantine and shadow
# memory grows with use: RSS bounds only mean something in a plain build.
SANITIZED = any(name in os.environ.get("LD_PRELOAD", "") for name in ("libasan", "libtsan"))
RSS_SLACK = (1 << 30) if SANITIZED else 0


def run_script(tmp_path, script, *args, env=None, timeout=120, path=()):
    """Runs `script` (dedented) from a file in a child Python and asserts that it exited 0
    and that its last line of output begins with OK. `env` is added to this process's
    environment (None removes a variable): the simulations' variables (DLSLIME_RDMA_SIM,
    DLSLIME_GPU_SIM) must be set before the library first looks for devices, so tests that
    need them run their scenario here. From a file, not -c: a scenario may spawn children
    that import it. `path` is put in front of PYTHONPATH. Returns the CompletedProcess."""
    file = tmp_path / "scenario.py"
    file.write_text(textwrap.dedent(script))
    child_env = dict(os.environ)
    for name, value in (env or {}).items():
        if value is None:
            child_env.pop(name, None)
        else:
            child_env[name] = value
    if path:
        child_env["PYTHONPATH"] = os.pathsep.join([*path, child_env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(file), *args], env=child_env, capture_output=True, text=True,
                          timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines and lines[-1].startswith("OK"), (
        f"rc {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def fd_count():
    return len(os.listdir("/proc/self/fd"))


def wait_until(predicate, timeout=10.0, interval=0.01, what="condition"):
    """Polls `predicate` until it is true; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class Buffer:
    """A zero-filled ctypes buffer with its address."""

    def __init__(self, size, fill=None):
        self.size = size
        self.raw = ctypes.create_string_buffer(size)
        if fill:
            ctypes.memmove(self.raw, (bytes(fill) * (size // len(fill) + 1))[:size], size)
        self.addr = ctypes.addressof(self.raw)

    def bytes(self, start=0, end=None):
        return self.raw.raw[start:end]

    def set(self, data, at=0):
        ctypes.memmove(self.addr + at, data, len(data))


@pytest.fixture
def make_buffer():
    return Buffer


@pytest.fixture
def endpoint_pair():
    """Two connected endpoints on loopback; shut down afterwards."""
    a = dlslime.TcpEndpoint(ip="127.0.0.1", port=0)
    b = dlslime.TcpEndpoint(ip="127.0.0.1", port=0)
    yield a, b
    a.shutdown()
    b.shutdown()


def connect_pair(a, b):
    a.connect(b.endpoint_info())
    b.connect(a.endpoint_info())


@pytest.fixture
def spawn_ctx():
    return multiprocessing.get_context("spawn")


@pytest.fixture(scope="session")
def ctrl_url():
    """A NanoCtrl URL: DLSLIME_TEST_CTRL_URL when set (the test command may start one),
    else an in-process server on a free port for the whole session."""
    url = os.environ.get("DLSLIME_TEST_CTRL_URL")
    if url:
        yield url
        return
    from dlslime import nanoctrl

    with nanoctrl.serve(port=0) as url:
        yield url


@pytest.fixture
def unique():
    """A fresh name prefix, so tests sharing one NanoCtrl never collide."""
    import uuid

    return uuid.uuid4().hex[:8]


def assert_every_future_failed_within(ended, wait, bound, slack, status=407):
    """For the link tests (test_link_death.py, test_two_hosts.py): `ended` maps each side to
    its report {"recv": [status, seconds, message], "write": [...]}; each future must have
    ended with `status` (PEER_CLOSED) within `bound` (+`slack`) seconds of the cut."""
    for side, report in ended.items():
        for fut in ("recv", "write"):
            assert fut in report, f"{side}'s {fut} did not complete within {wait} s: {report}"
            got, seconds, message = report[fut]
            assert got == status, f"{side} {fut}: {got} {message}"
            assert seconds <= bound + slack, (
                f"{side} {fut} took {seconds} s; the documented bound is {bound} s (+{slack} s slack)")
