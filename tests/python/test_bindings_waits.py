"""Blocking calls from Python (docs/api.md, "Waiting"): Ctrl-C interrupts them, timeouts
saturate instead of overflowing, a daemon thread still waiting at interpreter exit does not
abort the process, and destroying an endpoint or agent does not hold the GIL."""

import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import dlslime
from dlslime import PeerAgent, StatusCode, TcpEndpoint
from conftest import Buffer, connect_pair, wait_until

PYTHONPATH = os.path.dirname(os.path.dirname(os.path.abspath(dlslime.__file__)))
TIMEOUT = StatusCode.TIMEOUT.value


def thread_sleeping(pid, tid):
    """True once the thread is blocked in the kernel (state S): inside the wait, not before it."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "S"
    except FileNotFoundError:
        return False


def spawn(script):
    env = dict(os.environ, PYTHONPATH=PYTHONPATH + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def read_line(proc, timeout=30.0):
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        pytest.fail(f"no line from the child within {timeout}s; stderr: {proc.communicate()[1]}")
    return proc.stdout.readline().strip()


# --- Ctrl-C (item 9) ---------------------------------------------------------------------

ENDPOINT = """
    import dlslime, ctypes
    ep = dlslime.TcpEndpoint("127.0.0.1", 0)
    buf = ctypes.create_string_buffer(8)
    fut = ep.recv((ctypes.addressof(buf), 0, 8))  # nobody sends
"""
AGENT = """
    import dlslime, uuid
    server = dlslime.NanoCtrlServer(port=0)
    server.start()
    agent = dlslime.PeerAgent(ctrl_url=server.url)
    conn = agent.connect_to("ghost_" + uuid.uuid4().hex[:8], transport="tcp")  # never registers
    client = dlslime.NanoCtrlClient(server.url)
    box = client.start_peer_agent(alias="box_" + uuid.uuid4().hex[:8])["name"]  # nothing is posted to it
"""
BLOCKING_CALLS = [
    ("future_wait", ENDPOINT, "fut.wait()"),
    ("future_wait_for_3600", ENDPOINT, "fut.wait_for(3600)"),
    ("future_wait_for_inf", ENDPOINT, "fut.wait_for(float('inf'))"),
    ("future_wait_for_none", ENDPOINT, "fut.wait_for(None)"),
    ("wait_any_none", ENDPOINT, "dlslime.wait_any([fut])"),
    ("wait_all_3600", ENDPOINT, "dlslime.wait_all([fut], timeout=3600)"),
    ("connection_wait_3600", AGENT, "conn.wait(3600)"),
    ("connection_wait_inf", AGENT, "conn.wait(float('inf'))"),
    ("client_recv_3600", AGENT, "client.recv(box, timeout=3600)"),
]


@pytest.mark.parametrize("setup,call", [b[1:] for b in BLOCKING_CALLS], ids=[b[0] for b in BLOCKING_CALLS])
def test_ctrl_c_interrupts_a_blocking_call(setup, call):
    # `setup` and this tail share one indentation, which spawn() dedents.
    proc = spawn(setup + f"""
    print("ready", flush=True)
    try:
        {call}
        print("returned", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
""")
    try:
        assert read_line(proc) == "ready"
        wait_until(lambda: thread_sleeping(proc.pid, proc.pid), timeout=10, what="the child to block")
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert out.startswith("interrupted"), (out, err)
    assert time.monotonic() - sent < 5
    assert proc.returncode == 0, err


# --- Timeouts (item 11) --------------------------------------------------------------------

@pytest.fixture
def short_recv():
    """An endpoint whose recvs fail with TIMEOUT after 0.3 s: a future that completes later."""
    ep = TcpEndpoint("127.0.0.1", 0, recv_timeout=0.3)
    peer = TcpEndpoint("127.0.0.1", 0)
    connect_pair(ep, peer)
    buf = Buffer(8)
    yield lambda: ep.recv((buf.addr, 0, 8))
    ep.shutdown()
    peer.shutdown()


@pytest.mark.parametrize("seconds", [float("inf"), 1e10, 9.3e9, 2**70, 10**400, None],
                         ids=["inf", "1e10", "9.3e9", "2**70", "10**400", "None"])
def test_huge_wait_for_waits_instead_of_returning_none(short_recv, seconds):
    fut = short_recv()
    # It used to overflow into a deadline in the past and return None at once.
    assert fut.wait_for(seconds) == TIMEOUT
    assert fut.done()


def test_zero_wait_for_polls(short_recv):
    fut = short_recv()
    assert fut.wait_for(0) is None
    assert fut.wait_for(0.0) is None
    assert fut.status == int(StatusCode.PENDING)


@pytest.mark.parametrize("seconds", [float("nan"), -1, -0.001, float("-inf")])
def test_nan_and_negative_wait_for_raise_value_error(short_recv, seconds):
    with pytest.raises(ValueError, match="seconds"):
        short_recv().wait_for(seconds)


@pytest.mark.parametrize("timeout", [float("inf"), 1e10, 2**70], ids=["inf", "1e10", "2**70"])
def test_connection_wait_with_huge_timeout_waits_for_the_handshake(ctrl_url, unique, timeout):
    a = PeerAgent(ctrl_url=ctrl_url, alias=f"wa_{unique}")
    b = PeerAgent(ctrl_url=ctrl_url, alias=f"wb_{unique}")
    try:
        # It used to raise TimeoutError("... within -9223372036854775808 ms") at once.
        conn = a.connect_to(f"wb_{unique}", transport="tcp")
        assert conn.wait(timeout) is not None
        assert conn.is_connected()
    finally:
        a.shutdown()
        b.shutdown()


def test_connection_wait_timeout_names_the_whole_timeout(ctrl_url, unique):
    a = PeerAgent(ctrl_url=ctrl_url, alias=f"wt_{unique}")
    try:
        conn = a.connect_to(f"ghost_{unique}", transport="tcp")
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"within 0\.3 s: no agent 'ghost_.*' has registered"):
            conn.wait(0.3)
        assert time.monotonic() - t0 >= 0.29
    finally:
        a.shutdown()


@pytest.mark.parametrize("option", ["connect_timeout", "timeout", "recv_timeout"])
def test_huge_option_timeouts_are_refused_by_the_option_range(option):
    # Saturated, not wrapped into a negative number: the option's own range check answers.
    for value in (float("inf"), 1e300, 2**70):
        with pytest.raises(ValueError, match=option):
            TcpEndpoint("127.0.0.1", 0, **{option: value})


# --- Interpreter exit (item 6) ------------------------------------------------------------

def test_daemon_thread_waiting_at_exit_does_not_abort():
    proc = spawn("""
        import ctypes, threading, dlslime
        ep = dlslime.TcpEndpoint("127.0.0.1", 0)
        peer = dlslime.TcpEndpoint("127.0.0.1", 0)
        ep.connect(peer.endpoint_info()); peer.connect(ep.endpoint_info())
        bufs = [ctypes.create_string_buffer(8) for _ in range(4)]
        futs = [ep.recv((ctypes.addressof(b), 0, 8)) for b in bufs]  # nobody sends
        waits = [futs[0].wait, futs[1].wait, lambda: futs[2].wait_for(3600), lambda: futs[3].wait_for(None)]
        threads = [threading.Thread(target=w, daemon=True) for w in waits]
        for t in threads:
            t.start()
        print(" ".join(str(t.native_id) for t in threads), flush=True)
        input()  # the parent says when every thread is blocked
        # The main thread ends here: finalization destroys the endpoints, which cancels the
        # futures and wakes the threads while the interpreter is finalizing.
    """)
    try:
        tids = read_line(proc).split()
        wait_until(lambda: all(thread_sleeping(proc.pid, t) for t in tids), timeout=10,
                   what="the daemon threads to block in wait()")
        out, err = proc.communicate("go\n", timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "terminate" not in err, err
    assert proc.returncode == 0, (proc.returncode, err)


# --- Destruction without the GIL (item 24) -------------------------------------------------

class Ticker:
    """A Python thread that ticks every millisecond while it can get the GIL."""

    def __init__(self):
        self.ticks = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        wait_until(lambda: len(self.ticks) > 5, what="the ticker to tick")

    def run(self):
        while not self.stop.is_set():
            self.ticks.append(time.monotonic())
            time.sleep(0.001)

    def longest_gap(self, t0, t1):
        """The longest time without a tick across [t0, t1]."""
        ticks = self.ticks[:]
        before = max(t for t in ticks if t <= t0)
        inside = [t for t in ticks if t0 < t < t1]
        after = [t for t in ticks if t >= t1][:1] or [t1]
        points = [before] + inside + after
        return max(b - a for a, b in zip(points, points[1:]))

    def close(self):
        self.stop.set()
        self.thread.join()


def test_deleting_an_agent_releases_the_gil(ctrl_url, unique):
    a = PeerAgent(ctrl_url=ctrl_url, alias=f"da_{unique}")
    b = PeerAgent(ctrl_url=ctrl_url, alias=f"db_{unique}")
    a.connect_to(f"db_{unique}", transport="tcp").wait(10)
    ticker = Ticker()
    try:
        t0 = time.monotonic()
        del a  # unregisters from NanoCtrl over HTTP, closes its endpoint and connection
        t1 = time.monotonic()
        wait_until(lambda: ticker.ticks[-1] > t1, what="a tick after the delete")
        # Holding the GIL through the destructor froze the ticker for the whole delete.
        gap = ticker.longest_gap(t0, t1)
        assert gap < max(0.5 * (t1 - t0), 0.02), f"the ticker stalled {1000 * gap:.1f} ms of a " \
                                                  f"{1000 * (t1 - t0):.1f} ms delete"
    finally:
        ticker.close()
        b.shutdown()
