"""PeerAgent over NVLink (docs/peer-agent.md): connect_to(transport="nvlink") and "auto"
preferring it, between two agent processes on the simulated GPU (a process cannot open its
own IPC handles, so NVLink needs two). Each agent runs in a child (AGENT below) driven over
its stdin/stdout, with DLSLIME_GPU_SIM=1 set before the library looks for a GPU, so this
process's transports stay as they are; the NanoCtrl is the suite's (ctrl_url)."""

import json
import os
import select
import subprocess
import sys
import textwrap
import time

import pytest

import dlslime
from conftest import REPO

OK, INVALID_ARGUMENT = 0, 409
SIZE = 256 * 1024

NVLINK = next((t for t in dlslime.available_transports() if t["name"] == "nvlink"), {"built": False})

# One agent: registers SIZE bytes called "kv" (device memory on GPU `device`, or host memory)
# filled with pattern(seed), then answers one JSON command a line: connect, write/read by
# name, bytes, host_write (a named write from a host-memory region), exit.
AGENT = textwrap.dedent(
    """
    import ctypes, json, sys
    from dlslime import PeerAgent, testing
    ctrl, me, peer, device, memory, seed = sys.argv[1:7]
    device, seed, SIZE = int(device), int(seed), int(sys.argv[7])

    def pattern(n, seed):
        return bytes(((i * 131 + seed) ^ (i >> 9)) & 0xFF for i in range(n))

    def say(**kw):
        print(json.dumps(kw), flush=True)

    if memory == "device":
        buf = testing.device_buffer(SIZE, device=device)
        buf.write(0, pattern(SIZE, seed))
        addr, read = buf.ptr, buf.read
    else:
        host = ctypes.create_string_buffer(pattern(SIZE, seed), SIZE)
        addr, read = ctypes.addressof(host), lambda off, n: host.raw[off:off + n]
    agent = PeerAgent(ctrl_url=ctrl, alias=me, nvlink_device=device)
    agent.register_memory_region("kv", addr, 0, SIZE)
    say(event="ready")
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "connect":
            conn = agent.connect_to(peer, transport=cmd["transport"])
            try:
                conn.wait(30)
                say(transport=conn.transport, reason=conn.selection_reason, endpoint=type(conn.endpoint).__name__)
            except Exception as e:
                say(error=type(e).__name__, message=str(e), state=conn.state)
        elif op in ("write", "read"):
            f = getattr(agent, op)(peer, [("kv", "kv", cmd["local"], cmd["remote"], cmd["n"])])
            say(status=f.wait(), message=f.message)
        elif op == "bytes":
            say(hex=read(cmd["off"], cmd["n"]).hex())
        elif op == "register_late":  # a GPU region registered after the handshake
            late = testing.device_buffer(SIZE, device=device)
            agent.register_memory_region("late", late.ptr, 0, SIZE)
            say(event="registered")
        elif op == "late_bytes":
            say(hex=late.read(cmd["off"], cmd["n"]).hex())
        elif op == "write_late":
            f = agent.write(peer, [("kv", "late", cmd["local"], cmd["remote"], cmd["n"])])
            say(status=f.wait(), message=f.message)
        elif op == "host_write":
            h = ctypes.create_string_buffer(4096)
            agent.register_memory_region("host", ctypes.addressof(h), 0, 4096)
            f = agent.write(peer, [("host", "kv", 0, 0, 4096)])
            say(status=f.wait(), message=f.message)
        elif op == "exit":
            agent.shutdown()
            say(event="bye")
            break
    """
)


def pattern(n, seed):
    return bytes(((i * 131 + seed) ^ (i >> 9)) & 0xFF for i in range(n))


class Agent:
    """A child process running AGENT; ask() sends a command and returns its JSON answer."""

    def __init__(self, ctrl_url, me, peer, device=0, memory="device", seed=1, gpu_sim=True):
        env = dict(os.environ)
        env.pop("DLSLIME_GPU_SIM", None)
        if gpu_sim:
            env["DLSLIME_GPU_SIM"] = "1"
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU at all, also on a host that has one
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", AGENT, ctrl_url, me, peer, str(device), memory, str(seed), str(SIZE)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
        assert self.answer()["event"] == "ready"

    def answer(self, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(left, 0))
            if not ready:
                self.proc.kill()
                raise AssertionError(f"the agent did not answer within {timeout} s: {self.proc.stderr.read()}")
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"the agent exited ({self.proc.wait()}): {self.proc.stderr.read()}")
            if line.startswith("{"):
                return json.loads(line)

    def send(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def ask(self, **cmd):
        self.send(**cmd)
        return self.answer()

    def close(self):
        if self.proc.poll() is None:
            try:
                assert self.ask(op="exit")["event"] == "bye"
                assert self.proc.wait(30) == 0, self.proc.stderr.read()
            finally:
                if self.proc.poll() is None:
                    self.proc.kill()
                    self.proc.wait()


@pytest.fixture
def agents():
    made = []

    def make(*args, **kw):
        made.append(Agent(*args, **kw))
        return made[-1]

    yield make
    for a in made:
        a.close()


def connect_pair(a, b, transport):
    """Both sides call connect_to at once (as a job's two agents do); what each got."""
    a.send(op="connect", transport=transport)
    b.send(op="connect", transport=transport)
    return a.answer(), b.answer()


def check_bytes_move(a, b):
    """a writes into b's GPU region and reads from it, by name, at offsets on both sides."""
    assert a.ask(op="write", local=100, remote=7000, n=5000) == {"status": OK, "message": ""}
    assert bytes.fromhex(b.ask(op="bytes", off=7000, n=5000)["hex"]) == pattern(SIZE, 1)[100:5100]
    assert a.ask(op="read", local=50000, remote=20000, n=4096) == {"status": OK, "message": ""}
    assert bytes.fromhex(a.ask(op="bytes", off=50000, n=4096)["hex"]) == pattern(SIZE, 2)[20000:24096]


@pytest.mark.skipif(not NVLINK["built"], reason="NVLink transport not built (configure with -DBUILD_NVLINK=ON)")
def test_explicit_nvlink_moves_bytes_between_gpu_regions_of_two_agents(agents, ctrl_url, unique):
    a = agents(ctrl_url, f"nv_a_{unique}", f"nv_b_{unique}", device=0, seed=1)
    b = agents(ctrl_url, f"nv_b_{unique}", f"nv_a_{unique}", device=1, seed=2)
    ca, cb = connect_pair(a, b, "nvlink")
    # Whichever handshake arrived first made the other side's connection.
    for got, peer in ((ca, f"nv_b_{unique}"), (cb, f"nv_a_{unique}")):
        assert got["transport"] == "nvlink" and got["endpoint"] == "NVLinkEndpoint", got
        assert got["reason"] in ("nvlink: requested", f"nvlink: the peer agent '{peer}' connected over it"), got
    check_bytes_move(a, b)


@pytest.mark.skipif(not NVLINK["built"], reason="NVLink transport not built (configure with -DBUILD_NVLINK=ON)")
def test_auto_prefers_nvlink_on_one_host_and_host_regions_fail_clearly(agents, ctrl_url, unique):
    a = agents(ctrl_url, f"na_a_{unique}", f"na_b_{unique}", device=0, seed=1)
    b = agents(ctrl_url, f"na_b_{unique}", f"na_a_{unique}", device=1, seed=2)
    # a chooses (b answers its handshake without calling connect_to); b's connect_to then
    # finds the connection a's handshake made on its side.
    ca = a.ask(op="connect", transport="auto")
    assert ca["transport"] == "nvlink" and ca["endpoint"] == "NVLinkEndpoint", ca
    assert ca["reason"].startswith("nvlink: both agents on host ") and ca["reason"].endswith(
        ", GPU 0 -> GPU 1 via the simulated GPU's IPC"), ca
    cb = b.ask(op="connect", transport="auto")
    assert cb == {"transport": "nvlink", "reason": f"nvlink: the peer agent 'na_a_{unique}' connected over it",
                  "endpoint": "NVLinkEndpoint"}, cb
    check_bytes_move(a, b)
    # A region registered after the handshake: a resolves it from b's NanoCtrl record, whose
    # entry for b's NVLink endpoint carries the IPC handle.
    assert b.ask(op="register_late") == {"event": "registered"}
    assert a.ask(op="write_late", local=300, remote=1000, n=9000) == {"status": OK, "message": ""}
    assert bytes.fromhex(b.ask(op="late_bytes", off=1000, n=9000)["hex"]) == pattern(SIZE, 1)[300:9300]
    # Host memory cannot move over NVLink: the op fails, saying so; the connection stays.
    failed = a.ask(op="host_write")
    assert failed["status"] == INVALID_ARGUMENT and "host memory: NVLink moves GPU memory only" in failed["message"]
    assert a.ask(op="write", local=0, remote=0, n=64)["status"] == OK


def test_auto_falls_back_when_the_peer_does_not_serve_nvlink_and_explicit_nvlink_fails(agents, ctrl_url, unique):
    # b has no GPU (no DLSLIME_GPU_SIM): it serves tcp only. Both use host memory.
    a = agents(ctrl_url, f"nf_a_{unique}", f"nf_b_{unique}", memory="host", seed=1)
    b = agents(ctrl_url, f"nf_b_{unique}", f"nf_a_{unique}", memory="host", seed=2, gpu_sim=False)
    if NVLINK["built"]:
        # Fails at once with the reason (a peer that does not serve it never answers).
        refused = a.ask(op="connect", transport="nvlink")
        assert refused["error"] == "ConnectionError" and refused["state"] == "failed", refused
        assert f"the peer agent 'nf_b_{unique}' does not serve transport \"nvlink\" (it serves: tcp" in refused["message"]
    ca = a.ask(op="connect", transport="auto")
    assert ca["transport"] == "tcp", ca
    if NVLINK["built"]:
        assert f" (nvlink: the peer agent 'nf_b_{unique}' does not serve it)" in ca["reason"], ca
    cb = b.ask(op="connect", transport="auto")  # the connection a's handshake made here
    assert cb["transport"] == "tcp" and "nvlink" not in cb["reason"], cb
    assert a.ask(op="write", local=100, remote=7000, n=5000)["status"] == OK
    assert bytes.fromhex(b.ask(op="bytes", off=7000, n=5000)["hex"]) == pattern(SIZE, 1)[100:5100]
