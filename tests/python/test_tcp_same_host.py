"""The TCP same-host path (docs/tcp.md, "Same-host path"): between two processes on one
host, the target copies a write's bytes out of the writer's memory itself
(process_vm_readv), and the TCP connection only carries the requests and answers. These
tests run the target in another process, as users do, and check the bytes that arrived,
the path each side reports and why, and every way the path is refused or fails."""

import hashlib
import os
import threading

import numpy as np
import pytest

import dlslime
from conftest import wait_until

OK = 0
OUT_OF_BOUNDS = 404
PEER_CLOSED = 407
NOT_CONNECTED = 410
DEADLINE = 60


def start_target(spawn_ctx, size, options=None, env=None):
    from tcp_peer import serve_target

    parent, child = spawn_ctx.Pipe()
    proc = spawn_ctx.Process(target=serve_target, args=(child, size, options or {}, env or {}), daemon=True)
    proc.start()
    assert parent.poll(60), "target process did not start"
    return proc, parent, parent.recv()


def ask(pipe, *cmd):
    pipe.send(cmd)
    assert pipe.poll(DEADLINE), f"the target did not answer {cmd[0]}"
    return pipe.recv()


class Pair:
    """This process writes; the target process owns 'peer'."""

    def __init__(self, spawn_ctx, size, local_size=None, options=None, target_options=None, target_env=None):
        self.proc, self.pipe, info = start_target(spawn_ctx, size, target_options, target_env)
        self.ep = dlslime.TcpEndpoint(ip="127.0.0.1", port=0, **(options or {}))
        self.local = np.zeros(local_size or size, dtype=np.uint8)
        self.h_local = self.ep.register_memory_region("local", self.local.ctypes.data, 0, self.local.nbytes)
        self.ep.connect(info)
        self.pipe.send(self.ep.endpoint_info())
        assert self.pipe.poll(30) and self.pipe.recv() == "connected"
        self.info = info
        self.h_peer = self.ep.register_remote_memory_region("peer", info["mr_info"]["peer"])

    def close(self):
        try:
            if self.proc.is_alive():
                self.pipe.send(("exit",))
                self.pipe.poll(10)
        finally:
            self.ep.shutdown()
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()


@pytest.fixture
def pairs(spawn_ctx):
    made = []

    def make(*args, **kwargs):
        p = Pair(spawn_ctx, *args, **kwargs)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def fill(arr, seed):
    rng = np.random.default_rng(seed)
    arr[:] = rng.integers(0, 256, arr.size, dtype=np.uint8)


def test_writes_take_the_path_and_arrive_byte_exact_from_1_byte_to_256_mib(pairs):
    size = 256 << 20
    p = pairs(size)
    assert p.ep.same_host["path"] == "cma", p.ep.same_host
    assert "probe" in p.ep.same_host["reason"]
    assert p.ep.endpoint_info()["same_host"]["path"] == "cma"
    fill(p.local, 1)
    # Single items of every kind of size (one byte, a page, around the 1 MiB chunk, huge),
    # at odd offsets on both sides.
    offset = 0
    for n in [1, 7, 4096, 65537, (1 << 20) - 1, 1 << 20, (3 << 20) + 5, 64 << 20]:
        src, dst = (offset * 7 + 3) % 4096, offset + 11
        assert p.ep.write([(p.h_local, p.h_peer, dst, src, n)]).wait_for(DEADLINE) == OK
        assert ask(p.pipe, "digest", dst, dst + n) == hashlib.sha256(p.local[src:src + n].tobytes()).hexdigest(), n
        offset += n + 4096
    # The whole region in one item.
    assert p.ep.write([(p.h_local, p.h_peer, 0, 0, size)]).wait_for(DEADLINE) == OK
    assert ask(p.pipe, "digest", 0, size) == hashlib.sha256(p.local.tobytes()).hexdigest()


def test_small_items_go_as_frames_and_large_ones_are_pulled_in_one_batch_of_each(pairs):
    """Writes whose items average under 8 KiB go as frames (pinning many tiny remote pieces
    costs more than their bytes through the sockets); both kinds arrive byte exact."""
    p = pairs(1 << 20)
    fill(p.local, 10)
    small = [(p.h_local, p.h_peer, 1024 * i + 1, 8 * i, 8) for i in range(256)]  # below 256 KiB
    large = [(p.h_local, p.h_peer, 262144 + 16384 * i, 16384 * i + 3, 16384) for i in range(32)]  # to 768 KiB
    mixed = [(p.h_local, p.h_peer, 800000, 9, 3), (p.h_local, p.h_peer, 810000, 11, 200000)]
    for batch in (small, large, mixed):
        assert p.ep.write(batch).wait_for(DEADLINE) == OK
    remote = np.frombuffer(ask(p.pipe, "bytes", 0, 1 << 20), dtype=np.uint8)
    for _, _, dst, src, n in small + large + mixed:
        assert np.array_equal(remote[dst:dst + n], p.local[src:src + n]), (dst, n)


def test_a_batch_of_256_items_at_scattered_offsets_arrives_whole(pairs):
    p = pairs(16 << 20)
    fill(p.local, 2)
    rng = np.random.default_rng(3)
    slots = rng.permutation(256)
    items = [(p.h_local, p.h_peer, int(slots[i]) * 65536 + 5, i * 65536 + 1, 40000 + i) for i in range(256)]
    assert p.ep.write(items).wait_for(DEADLINE) == OK
    remote = np.frombuffer(ask(p.pipe, "bytes", 0, 16 << 20), dtype=np.uint8)
    for _, _, dst, src, n in items:
        assert np.array_equal(remote[dst:dst + n], p.local[src:src + n])
    # Zero-length items beside real ones, and reads still go over TCP beside the writes.
    assert p.ep.write([(p.h_local, p.h_peer, 0, 0, 0), (p.h_local, p.h_peer, 9, 9, 3)]).wait_for(DEADLINE) == OK
    back = np.zeros(4096, dtype=np.uint8)
    h_back = p.ep.register_memory_region("back", back.ctypes.data, 0, back.nbytes)
    assert p.ep.read([(h_back, p.h_peer, 5, 0, 4096)]).wait_for(DEADLINE) == OK
    assert back.tobytes() == ask(p.pipe, "bytes", 5, 4101)


@pytest.mark.parametrize("where", ["initiator option", "target option", "target environment", "initiator environment"])
def test_turning_the_path_off_keeps_writes_on_tcp_and_says_why(pairs, where, monkeypatch):
    if where == "initiator environment":
        monkeypatch.setenv("DLSLIME_TCP_SAME_HOST", "0")
    p = pairs(1 << 20, options={"same_host": False} if where == "initiator option" else None,
              target_options={"same_host": False} if where == "target option" else None,
              target_env={"DLSLIME_TCP_SAME_HOST": "0"} if where == "target environment" else None)
    state = p.ep.same_host
    assert state["path"] == "tcp", state
    expected = "turned off on this endpoint" if where.startswith("initiator") else "turned off on the peer"
    assert expected in state["reason"], state
    if where == "initiator option":
        assert p.ep.options["same_host"] is False
    fill(p.local, 4)
    assert p.ep.write([(p.h_local, p.h_peer, 0, 0, 1 << 20)]).wait_for(DEADLINE) == OK
    assert ask(p.pipe, "digest", 0, 1 << 20) == hashlib.sha256(p.local.tobytes()).hexdigest()


def test_a_refused_probe_falls_back_to_tcp_and_names_the_cause(pairs):
    p = pairs(1 << 20, target_env={"DLSLIME_TCP_SAME_HOST_FAULT": "probe"})
    state = p.ep.same_host
    assert state["path"] == "tcp" and "probe failed: EPERM" in state["reason"], state
    fill(p.local, 5)
    assert p.ep.write([(p.h_local, p.h_peer, 0, 0, 1 << 20)]).wait_for(DEADLINE) == OK
    assert ask(p.pipe, "digest", 0, 1 << 20) == hashlib.sha256(p.local.tobytes()).hexdigest()


def test_two_endpoints_of_one_process_stay_on_tcp():
    a = dlslime.TcpEndpoint(ip="127.0.0.1", port=0)
    b = dlslime.TcpEndpoint(ip="127.0.0.1", port=0)
    try:
        a.connect(b.endpoint_info())
        assert a.same_host["path"] == "tcp" and "this process" in a.same_host["reason"], a.same_host
    finally:
        a.shutdown()
        b.shutdown()
    assert a.same_host["path"] == "tcp"


def test_bad_options_are_refused():
    with pytest.raises(TypeError, match="same_host must be a bool"):
        dlslime.TcpEndpoint(ip="127.0.0.1", port=0, same_host=1)


def test_out_of_bounds_and_forged_records_are_refused_by_the_target(pairs):
    p = pairs(1 << 20, local_size=4 << 20)
    fill(p.local, 6)
    # Past the region by the local table: refused before anything is sent.
    assert p.ep.write([(p.h_local, p.h_peer, (1 << 20) - 10, 0, 11)]).wait_for(DEADLINE) == OUT_OF_BOUNDS
    # A forged record that claims the region is 4 MiB: the target's own table refuses it.
    forged = dict(p.info["mr_info"]["peer"], length=4 << 20)
    h_forged = p.ep.register_remote_memory_region("forged", forged)
    f = p.ep.write([(p.h_local, h_forged, (1 << 20) - 10, 0, 16384)])
    assert f.wait_for(DEADLINE) == OUT_OF_BOUNDS
    assert "the peer reported" in f.message and "piece 0" in f.message, f.message
    # Another handle of the owner (its 'spare'), at a forged offset: refused too.
    spare = dict(p.info["mr_info"]["spare"], length=1 << 20)
    f = p.ep.write([(p.h_local, p.ep.register_remote_memory_region("spare", spare), 8192, 0, 16384)])
    assert f.wait_for(DEADLINE) != OK
    assert ask(p.pipe, "spare") == bytes(4096), "no byte of a refused request is placed"
    # The connection is unharmed.
    assert p.ep.write([(p.h_local, p.h_peer, 0, 0, 1 << 20)]).wait_for(DEADLINE) == OK
    assert ask(p.pipe, "digest", 0, 1 << 20) == hashlib.sha256(p.local[:1 << 20].tobytes()).hexdigest()


def test_a_region_the_target_unmapped_fails_that_write_alone_with_efault(pairs):
    p = pairs(1 << 20)
    fill(p.local, 7)
    assert ask(p.pipe, "munmap") == "done"
    f = p.ep.write([(p.h_local, p.h_peer, 0, 0, 65536)])
    assert f.wait_for(DEADLINE) != OK and "EFAULT" in f.message, f.message
    h_spare = p.ep.register_remote_memory_region("spare", p.info["mr_info"]["spare"])
    assert p.ep.write([(p.h_local, h_spare, 0, 0, 4096)]).wait_for(DEADLINE) == OK
    assert ask(p.pipe, "spare") == p.local[:4096].tobytes()


def test_no_byte_lands_after_the_target_unregisters_during_traffic(pairs):
    size = 8 << 20
    p = pairs(size)
    fill(p.local, 8)
    stop = threading.Event()
    outcomes = []

    def writer():
        while not stop.is_set():
            outcomes.append(p.ep.write([(p.h_local, p.h_peer, 0, 0, size)]).wait_for(DEADLINE))

    t = threading.Thread(target=writer)
    t.start()
    try:
        wait_until(lambda: len(outcomes) >= 3, timeout=DEADLINE, what="writes before the unregister")
        assert ask(p.pipe, "unregister") == "done"
        after = ask(p.pipe, "digest", 0, size)
        p.local[:] = 0xEE  # what any later copy would bring
        n = len(outcomes)
        wait_until(lambda: len(outcomes) >= n + 3, timeout=DEADLINE, what="writes after the unregister")
    finally:
        stop.set()
        t.join(DEADLINE)
    assert ask(p.pipe, "digest", 0, size) == after, "bytes landed after unregister returned"
    assert all(s != OK for s in outcomes[n + 1:]), "writes to an unregistered region must fail"


def test_a_target_killed_mid_copy_fails_every_pending_write(pairs):
    size = 64 << 20
    p = pairs(size)
    fill(p.local, 9)
    futures = [p.ep.write([(p.h_local, p.h_peer, 0, 0, size)]) for _ in range(16)]
    p.proc.kill()
    p.proc.join(10)
    statuses = [f.wait_for(DEADLINE) for f in futures]
    assert all(f.done() for f in futures), "a write hung after its target died"
    failed = [f for f in futures if f.status != OK]
    assert failed, "the target died before 16 writes of 64 MiB finished"
    assert all(f.status in (PEER_CLOSED, NOT_CONNECTED) for f in failed), [(f.status, f.message) for f in failed]
    wait_until(lambda: p.ep.same_host["path"] == "tcp", timeout=DEADLINE, what="the path to end with the peer")
    assert statuses


def test_a_target_that_sees_the_bytes_and_shuts_down_at_once_still_answers_the_write(pairs):
    # The bytes are in place when the copy ends, before its answer is queued: a target that
    # polls for them and shuts down at once must still answer (CI saw "write status 407"
    # from an agent pair doing this). The fault makes each copy report 300 ms late.
    size = 1 << 20
    p = pairs(size, target_env={"DLSLIME_TCP_SAME_HOST_FAULT": "slow_report"})
    assert p.ep.same_host["path"] == "cma", p.ep.same_host
    fill(p.local, 21)
    want = hashlib.sha256(p.local.tobytes()).hexdigest()
    f = p.ep.write([(p.h_local, p.h_peer, 0, 0, size)])
    assert ask(p.pipe, "shutdown_when", 0, size, want, DEADLINE) == "seen"
    assert f.wait_for(DEADLINE) == OK, (f.status, f.message)


# --- refusals by the kernel itself, and fork() --------------------------------------------

TARGET_SCRIPT = r"""
import ctypes, hashlib, json, sys
import dlslime
size = 1 << 20
buf = ctypes.create_string_buffer(size)
ep = dlslime.TcpEndpoint(ip="127.0.0.1", port=0)
ep.register_memory_region("peer", ctypes.addressof(buf), 0, size)
print(json.dumps(ep.endpoint_info()), flush=True)
for line in sys.stdin:
    if line.strip() == "digest":
        print(hashlib.sha256(buf.raw).hexdigest(), flush=True)
    elif line.strip() == "exit":
        break
ep.shutdown()
"""

UNDUMPABLE_WRITER_SCRIPT = r"""
import ctypes, hashlib, json, os, sys
import dlslime
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE 0: only CAP_SYS_PTRACE may read this process now
info = json.loads(sys.argv[1])
size = 1 << 20
data = os.urandom(size)
buf = ctypes.create_string_buffer(data, size)
ep = dlslime.TcpEndpoint(ip="127.0.0.1", port=0)
h = ep.register_memory_region("local", ctypes.addressof(buf), 0, size)
ep.connect(info)
peer = ep.register_remote_memory_region("peer", info["mr_info"]["peer"])
status = ep.write([(h, peer, 0, 0, size)]).wait_for(60)
print(json.dumps({"same_host": ep.same_host, "status": status, "digest": hashlib.sha256(data).hexdigest()}), flush=True)
ep.shutdown()
"""


def test_a_probe_the_kernel_refuses_falls_back_to_tcp_and_names_eperm():
    """For real: the target runs without CAP_SYS_PTRACE (setpriv) and the writer makes itself
    undumpable (prctl), so the kernel's ptrace check refuses the target's probe."""
    import json
    import shutil
    import subprocess
    import sys

    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to drop CAP_SYS_PTRACE; scripts/install_deps.sh installs it")
    target = subprocess.Popen(["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace", sys.executable, "-c",
                               TARGET_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        info = target.stdout.readline()
        assert info, "the target did not start"
        writer = subprocess.run([sys.executable, "-c", UNDUMPABLE_WRITER_SCRIPT, info], capture_output=True, text=True,
                                timeout=120)
        assert writer.returncode == 0, writer.stderr
        out = json.loads(writer.stdout)
        assert out["same_host"]["path"] == "tcp", out
        assert "probe failed" in out["same_host"]["reason"] and "EPERM" in out["same_host"]["reason"], out
        assert out["status"] == OK
        target.stdin.write("digest\n")
        target.stdin.flush()
        assert target.stdout.readline().strip() == out["digest"]
    finally:
        try:
            target.stdin.write("exit\n")
            target.stdin.flush()
        except OSError:
            pass
        try:
            target.wait(20)
        except subprocess.TimeoutExpired:
            target.kill()


def test_a_fork_child_does_not_inherit_the_path(pairs):
    p = pairs(1 << 20)
    assert p.ep.same_host["path"] == "cma"
    fill(p.local, 11)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave at once (os._exit: no teardown of inherited state)
        try:
            state = p.ep.same_host
            try:
                refused = p.ep.write([(p.h_local, p.h_peer, 0, 0, 65536)]).wait_for(5) != OK
            except Exception:  # noqa: BLE001 - an inherited endpoint may also raise
                refused = True
            ok = state["path"] == "tcp" and "fork" in state["reason"] and refused
            os.write(w, b"ok" if ok else repr(state).encode())
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 4096)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"ok", got
    # The parent's path is untouched.
    assert p.ep.same_host["path"] == "cma"
    assert p.ep.write([(p.h_local, p.h_peer, 0, 0, 1 << 20)]).wait_for(DEADLINE) == OK
    assert ask(p.pipe, "digest", 0, 1 << 20) == hashlib.sha256(p.local.tobytes()).hexdigest()


def test_a_forged_lane_with_the_peers_id_cannot_make_the_target_pull(pairs):
    """Anyone who can reach the port can open a lane claiming the paired peer's id (without a
    token). The target trusts pull requests only on the connection its probe ran on: a pull
    request on any other lane is answered NOT_CONNECTED and nothing is copied."""
    import struct

    from test_hostile import Raw, frame, parse_frame

    p = pairs(1 << 20)
    assert p.ep.same_host["path"] == "cma"
    secret = np.full(65536, 0x5A, dtype=np.uint8)  # what the forger wants copied out of us
    raw = Raw(p.info["port"])
    status, reason, _ = raw.hello(p.ep.endpoint_info()["endpoint_id"], lane=1, lanes=2)
    assert status == 0, reason
    piece = struct.pack("<iIQQ", p.info["mr_info"]["peer"]["handle"], 0, 0, 65536)
    body = piece + struct.pack("<Q", secret.ctypes.data)
    raw.send(frame(11, flags=0, op_id=77, offset=1, length=len(body)) + body)  # PULL_WRITE
    h = parse_frame(raw.recv_exact(40))
    text = raw.recv_exact(h["length"])
    assert h["type"] == 12 and h["op_id"] == 77 and h["status"] == NOT_CONNECTED, (h, text)
    assert ask(p.pipe, "bytes", 0, 65536) == bytes(65536), "a forged lane made the target copy"
    # The real lane still pulls. (Closing the forged lane afterwards ends the pairing, as
    # any lane of it closing does: a token keeps strangers off the port, docs/tcp.md.)
    fill(p.local, 12)
    assert p.ep.write([(p.h_local, p.h_peer, 0, 0, 65536)]).wait_for(DEADLINE) == OK
    assert ask(p.pipe, "bytes", 0, 65536) == p.local[:65536].tobytes()
    raw.sock.close()


# --- reads: this side copies out of the target, which grants its pieces -----------------


def test_reads_are_pulled_when_both_sides_proved_each_other_and_arrive_byte_exact(pairs):
    size = 64 << 20
    p = pairs(size)
    state = p.ep.same_host
    assert state["reads"] == "cma", state
    fill(p.local, 13)
    assert p.ep.write([(p.h_local, p.h_peer, 0, 0, size)]).wait_for(DEADLINE) == OK
    back = np.zeros(size, dtype=np.uint8)
    h_back = p.ep.register_memory_region("back", back.ctypes.data, 0, size)
    offset = 0
    for n in [1, 4097, 65537, (1 << 20) + 3, 5 << 20]:
        src, dst = offset + 5, (offset * 3 + 1) % (size - n)
        f = p.ep.read([(h_back, p.h_peer, src, dst, n)])
        assert f.wait_for(DEADLINE) == OK and f.nbytes == n, (n, f.message)
        assert np.array_equal(back[dst:dst + n], p.local[src:src + n]), n
        offset += n
    items = [(h_back, p.h_peer, 65536 * i + 7, 65536 * ((i * 37) % 256), 50000) for i in range(256)]
    f = p.ep.read(items)
    assert f.wait_for(DEADLINE) == OK and f.nbytes == 256 * 50000, f.message
    for _, _, src, dst, n in items:
        assert np.array_equal(back[dst:dst + n], p.local[src:src + n])
    assert p.ep.read([(h_back, p.h_peer, 0, 0, size)]).wait_for(DEADLINE) == OK
    assert np.array_equal(back, p.local)


def test_reads_stay_on_frames_when_the_peer_was_not_probed(spawn_ctx):
    """A target that does not connect back was never probed by this side: its writes are
    pulled by it, but this side's reads go as frames, and say why."""
    from tcp_peer import serve_region

    parent, child = spawn_ctx.Pipe()
    proc = spawn_ctx.Process(target=serve_region, args=(child, 1 << 20, 3), daemon=True)
    proc.start()
    try:
        assert parent.poll(60)
        info = parent.recv()
        ep = dlslime.TcpEndpoint(ip="127.0.0.1", port=0)
        local = np.zeros(1 << 20, dtype=np.uint8)
        h = ep.register_memory_region("local", local.ctypes.data, 0, local.nbytes)
        ep.connect(info)
        peer = ep.register_remote_memory_region("peer", info["mr_info"]["peer"])
        before = ep.same_host  # serve_region connects back only once it has our info
        assert before["path"] == "cma" and before["reads"] == "tcp" and "did not connect back" in before["reads_reason"]
        assert ep.read([(h, peer, 0, 0, 1 << 20)]).wait_for(DEADLINE) == OK
        # Now it connects back: its offer passes this side's probe, and reads are pulled too.
        parent.send(ep.endpoint_info())
        assert parent.poll(30) and parent.recv() == "connected"
        wait_until(lambda: ep.same_host["reads"] == "cma", timeout=DEADLINE, what="this side's probe of the peer")
        again = np.zeros(1 << 20, dtype=np.uint8)
        h2 = ep.register_memory_region("again", again.ctypes.data, 0, again.nbytes)
        assert ep.read([(h2, peer, 0, 0, 1 << 20)]).wait_for(DEADLINE) == OK
        parent.send(("bytes", 0, 1 << 20))
        assert parent.poll(30)
        expected = parent.recv()
        assert local.tobytes() == expected and again.tobytes() == expected
        parent.send(("exit",))
        parent.poll(10)
        ep.shutdown()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def test_no_byte_is_read_after_the_target_unregisters_during_reads(pairs):
    size = 8 << 20
    p = pairs(size)
    assert p.ep.same_host["reads"] == "cma"
    assert ask(p.pipe, "fill", 0xAA) == "done"
    back = np.zeros(size, dtype=np.uint8)
    h_back = p.ep.register_memory_region("back", back.ctypes.data, 0, size)
    stop = threading.Event()
    seen = []

    def reader():
        while not stop.is_set():
            back[:] = 0
            status = p.ep.read([(h_back, p.h_peer, 0, 0, size)]).wait_for(DEADLINE)
            seen.append((status, status == OK and bool((back == 0xBB).any())))

    t = threading.Thread(target=reader)
    t.start()
    try:
        wait_until(lambda: len(seen) >= 3, timeout=DEADLINE, what="reads before the unregister")
        assert ask(p.pipe, "unregister") == "done"
        assert ask(p.pipe, "fill", 0xBB) == "done"  # what a read after the unregister would bring
        n = len(seen)
        wait_until(lambda: len(seen) >= n + 3, timeout=DEADLINE, what="reads after the unregister")
    finally:
        stop.set()
        t.join(DEADLINE)
    assert not any(late for _, late in seen), "a read completed with bytes written after unregister returned"
    assert all(s != OK for s, _ in seen[n + 1:]), "reads of an unregistered region must fail"


def test_a_target_killed_mid_read_fails_every_pending_read(pairs):
    size = 64 << 20
    p = pairs(size)
    assert p.ep.same_host["reads"] == "cma"
    back = np.zeros(size, dtype=np.uint8)
    h_back = p.ep.register_memory_region("back", back.ctypes.data, 0, size)
    futures = [p.ep.read([(h_back, p.h_peer, 0, 0, size)]) for _ in range(16)]
    p.proc.kill()
    p.proc.join(10)
    for f in futures:
        f.wait_for(DEADLINE)
    assert all(f.done() for f in futures), "a read hung after its target died"
    failed = [f for f in futures if f.status != OK]
    assert failed, "the target died before 16 reads of 64 MiB finished"
    assert all(f.status in (PEER_CLOSED, NOT_CONNECTED) for f in failed), [(f.status, f.message) for f in failed]


# --- messages: the receiver copies them out of the sender ----------------------------------

MESSAGE_TOO_LARGE = 408
CANCELLED = 406
TIMEOUT = 402


def copied_messages(info):
    return info["copied_bytes"]["messages"]


@pytest.mark.parametrize("order", ["recv_first", "send_first"])
def test_messages_are_pulled_in_both_posting_orders_and_arrive_byte_exact(pairs, order):
    # The third message is larger than the receiver's 16 MiB budget for held messages: sent
    # first, its bytes wait in the sender until its recv is posted (its send waits too).
    sizes = [64 << 10, (1 << 20) + 3, (16 << 20) + 5]
    p = pairs(64 << 20)
    fill(p.local, 31)
    places, off = [], 0
    for n in sizes:
        places.append((off + 7, n))
        off += n + 4096
    before = copied_messages(ask(p.pipe, "same_host"))
    if order == "recv_first":
        assert ask(p.pipe, "post", places) == "posted"
    sends = [p.ep.send((p.local.ctypes.data, src, n)) for src, n in zip([0, 100, 3 << 20], sizes)]
    if order == "send_first":
        assert not sends[2].done(), "a message larger than the held budget completed with no recv posted"
        assert ask(p.pipe, "post", places) == "posted"
    assert [f.wait_for(DEADLINE) for f in sends] == [OK] * 3, [f.message for f in sends]
    outcomes = ask(p.pipe, "wait", DEADLINE)
    assert [(st, nb) for st, nb, _ in outcomes] == [(OK, n) for n in sizes], outcomes
    for (dst, n), src in zip(places, [0, 100, 3 << 20]):
        assert ask(p.pipe, "digest", dst, dst + n) == hashlib.sha256(p.local[src:src + n].tobytes()).hexdigest(), n
    assert copied_messages(ask(p.pipe, "same_host")) - before == sum(sizes)


def test_the_peer_pulls_our_recv_buffer_full_in_the_other_direction(pairs):
    p = pairs(4 << 20)
    assert ask(p.pipe, "fill", 0x5A) == "done"
    before = copied_messages(p.ep.same_host)
    f = p.ep.recv((p.local.ctypes.data, 0, 4 << 20))
    assert ask(p.pipe, "send", 0, 3 << 20, DEADLINE) == (OK, "")
    assert f.wait_for(DEADLINE) == OK and f.nbytes == 3 << 20, f.message
    assert np.all(p.local[:3 << 20] == 0x5A)
    assert copied_messages(p.ep.same_host) - before == 3 << 20


def test_small_messages_go_as_frames_and_keep_their_order_among_pulled_ones(pairs):
    sizes = [100, 256 << 10, 1, 300 << 10, 65535, 65536, 0, 128 << 10]
    p = pairs(4 << 20)
    fill(p.local, 32)
    places, off = [], 0
    for n in sizes:
        places.append((off, max(n, 1)))
        off += n + 1024
    assert ask(p.pipe, "post", places) == "posted"
    sends = [p.ep.send((p.local.ctypes.data, 11 * i, n)) for i, n in enumerate(sizes)]
    assert [f.wait_for(DEADLINE) for f in sends] == [OK] * len(sizes), [f.message for f in sends]
    outcomes = ask(p.pipe, "wait", DEADLINE)
    assert [(st, nb) for st, nb, _ in outcomes] == [(OK, n) for n in sizes], outcomes
    for i, ((dst, _), n) in enumerate(zip(places, sizes)):
        assert ask(p.pipe, "digest", dst, dst + n) == hashlib.sha256(p.local[11 * i:11 * i + n].tobytes()).hexdigest()
    assert copied_messages(ask(p.pipe, "same_host")) == sum(n for n in sizes if n >= 64 << 10)


def test_a_pulled_message_too_large_for_its_recv_fails_both_sides_and_moves_nothing(pairs):
    p = pairs(4 << 20)
    fill(p.local, 33)
    assert ask(p.pipe, "post", [(0, 64 << 10)]) == "posted"
    f = p.ep.send((p.local.ctypes.data, 0, 1 << 20))
    assert f.wait_for(DEADLINE) == MESSAGE_TOO_LARGE, f.message
    [(st, nbytes, message)] = ask(p.pipe, "wait", DEADLINE)
    assert (st, nbytes) == (MESSAGE_TOO_LARGE, 0) and "does not fit" in message, message
    assert ask(p.pipe, "bytes", 0, 64 << 10) == bytes(64 << 10)
    assert copied_messages(ask(p.pipe, "same_host")) == 0


def test_a_send_that_ends_while_its_bytes_are_copied_fails_the_recv_instead_of_delivering(pairs):
    # The receiver's copy reports 300 ms late; the sender's send times out at 50 ms and its
    # buffer is the owner's again. The receiver must not deliver what it copied: the
    # sender's lease ended, so the recv fails, and nothing is counted as received.
    p = pairs(1 << 20, target_env={"DLSLIME_TCP_SAME_HOST_FAULT": "slow_report"})
    fill(p.local, 34)
    assert ask(p.pipe, "post", [(0, 1 << 20)]) == "posted"
    f = p.ep.send((p.local.ctypes.data, 0, 1 << 20), timeout_ms=50)
    assert f.wait_for(DEADLINE) == TIMEOUT, f.message
    [(st, _, message)] = ask(p.pipe, "wait", DEADLINE)
    assert st == CANCELLED and "ended" in message, (st, message)
    assert copied_messages(ask(p.pipe, "same_host")) == 0
    # The pair still works: the next message arrives whole.
    assert ask(p.pipe, "post", [(0, 1 << 20)]) == "posted"
    assert p.ep.send((p.local.ctypes.data, 0, 1 << 20)).wait_for(DEADLINE) == OK
    assert [st for st, _, _ in ask(p.pipe, "wait", DEADLINE)] == [OK]


def test_a_sender_killed_mid_message_fails_the_recv_and_nothing_hangs(pairs):
    p = pairs(64 << 20)
    f = p.ep.recv((p.local.ctypes.data, 0, 64 << 20))
    p.pipe.send(("send", 0, 64 << 20, DEADLINE))  # killed at once: before, during or after the copy
    p.proc.kill()
    p.proc.join(10)
    st = f.wait_for(DEADLINE)
    assert f.done(), "a recv hung after its sender died"
    assert st in (OK, PEER_CLOSED, NOT_CONNECTED, CANCELLED) or "ESRCH" in f.message, (st, f.message)


def test_a_message_whose_send_ended_while_it_waited_in_the_sender_never_takes_a_recv(pairs):
    # A 1 MiB budget: the 4 MiB message is held without its bytes; its send times out; the
    # next message (as frames, and a pulled one) takes the recv posted afterwards.
    p = pairs(8 << 20, target_options={"unexpected_buffer_bytes": 1 << 20})
    fill(p.local, 35)
    stale = p.ep.send((p.local.ctypes.data, 0, 4 << 20), timeout_ms=100)
    assert stale.wait_for(DEADLINE) == TIMEOUT, stale.message
    small = p.ep.send((p.local.ctypes.data, 5, 100))
    big = p.ep.send((p.local.ctypes.data, 1000, 3 << 20))
    assert ask(p.pipe, "post", [(0, 4 << 20), (4 << 20, 4 << 20)]) == "posted"
    assert small.wait_for(DEADLINE) == OK and big.wait_for(DEADLINE) == OK, (small.message, big.message)
    outcomes = ask(p.pipe, "wait", DEADLINE)
    assert [(st, nb) for st, nb, _ in outcomes] == [(OK, 100), (OK, 3 << 20)], outcomes
    assert ask(p.pipe, "bytes", 0, 100) == p.local[5:105].tobytes()
    assert ask(p.pipe, "digest", 4 << 20, (4 << 20) + (3 << 20)) == \
        hashlib.sha256(p.local[1000:1000 + (3 << 20)].tobytes()).hexdigest()


def test_with_no_budget_for_held_messages_a_pulled_send_waits_for_its_recv(pairs):
    p = pairs(2 << 20, target_options={"unexpected_buffer_bytes": 0})
    fill(p.local, 36)
    f = p.ep.send((p.local.ctypes.data, 0, 1 << 20))
    g = p.ep.send((p.local.ctypes.data, 7, 1 << 20))
    assert not f.done() and not g.done(), "a message completed with no recv posted and no budget to hold it"
    assert ask(p.pipe, "post", [(0, 1 << 20), (1 << 20, 1 << 20)]) == "posted"
    assert f.wait_for(DEADLINE) == OK and g.wait_for(DEADLINE) == OK, (f.message, g.message)
    assert [st for st, _, _ in ask(p.pipe, "wait", DEADLINE)] == [OK, OK]
    assert ask(p.pipe, "digest", 1 << 20, 2 << 20) == hashlib.sha256(p.local[7:7 + (1 << 20)].tobytes()).hexdigest()


GPU_RECV_SCENARIO = r"""
import ctypes, json, subprocess, sys, textwrap
import dlslime
from dlslime import testing

SENDER = textwrap.dedent('''
    import ctypes, json, sys
    import dlslime
    n = int(sys.argv[1])
    buf = ctypes.create_string_buffer(bytes((i * 13 + 1) & 0xFF for i in range(n)), n)
    ep = dlslime.TcpEndpoint("127.0.0.1", 0, chunk_size=1 << 20)
    ep.connect(json.loads(sys.stdin.readline()))
    print(json.dumps(ep.same_host), flush=True)
    sys.stdin.readline()  # the receiver has posted its first recv
    st = [ep.send((ctypes.addressof(buf), 0, n)).wait_for(60) for _ in range(2)]
    print(json.dumps(st), flush=True)
    sys.stdin.readline()
    ep.shutdown()
''')

n = (3 << 20) + 5  # pulled (>= 64 KiB), four chunks, into simulated device memory
want = bytes((i * 13 + 1) & 0xFF for i in range(n))
ep = dlslime.TcpEndpoint("127.0.0.1", 0, chunk_size=1 << 20)
gpu = [testing.device_buffer(n + 64) for _ in range(2)]
sender = subprocess.Popen([sys.executable, "-c", SENDER, str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True)
sender.stdin.write(json.dumps(ep.endpoint_info()) + "\n")
sender.stdin.flush()
path = json.loads(sender.stdout.readline())
assert path["path"] == "cma", path
first = ep.recv((gpu[0].ptr, 0, n + 64))           # posted first: matched, chunks staged to the device
sender.stdin.write("go\n")
sender.stdin.flush()
statuses = json.loads(sender.stdout.readline())  # the second send completes held (host buffer)
assert statuses == [0, 0], statuses
second = ep.recv((gpu[1].ptr, 64, n))             # the held message's bytes go to the device
assert first.wait_for(60) == 0 and first.nbytes == n, first.message
assert second.wait_for(60) == 0 and second.nbytes == n, second.message
assert gpu[0].read(0, n) == want and gpu[1].read(64, n) == want
assert ep.same_host["copied_bytes"]["messages"] == 2 * n, ep.same_host
sender.stdin.write("bye\n")
sender.stdin.flush()
assert sender.wait(60) == 0
ep.shutdown()
print("OK")
"""


def test_pulled_messages_reach_gpu_recvs_through_the_staging(tmp_path):
    # The simulated GPU's memory is PROT_NONE to host code: a pull straight into it (or any
    # host touch of it) would fail the scenario with EFAULT or SIGSEGV.
    from conftest import run_script

    run_script(tmp_path, GPU_RECV_SCENARIO, env={"DLSLIME_GPU_SIM": "1"})
