"""An agent that connects, writes and leaves at once does not break its peer (issue 23).

Both sides dial each other. The writer's connection used to count as up once its own dial
was, so it could write and shut down while the reader's dial to it was still in flight: the
reader's connect_to().wait() then failed ("Connection refused", "the peer agent shut down")
though the bytes had arrived, in about 1 run of 10 under CPU load. A connection is now up
once both directions are (each side posts "dialed" when its connect() returns). Here: 50
writer/reader pairs of processes, five at a time, beside busy loops that keep both cores
loaded; every reader's wait() succeeds and every byte arrives.
"""

import os
import subprocess
import sys
import textwrap

SIDE = textwrap.dedent(
    """
    import ctypes, sys, time
    from dlslime import PeerAgent
    ctrl, me, peer, role = sys.argv[1:5]
    N = 1 << 20
    want = bytes((i * 7) & 0xFF for i in range(N))
    buf = ctypes.create_string_buffer(want if role == "writer" else b"", N)
    agent = PeerAgent(ctrl_url=ctrl, alias=me)
    agent.register_memory_region("buf", ctypes.addressof(buf), 0, N)
    conn = agent.connect_to(peer, transport="tcp")
    try:
        conn.wait(30)
    except Exception as e:
        print(f"{role}: wait failed: {type(e).__name__}: {e}", flush=True)
        agent.shutdown()
        sys.exit(2)
    if role == "writer":
        st = agent.write(peer, [("buf", "buf", 0, 0, N)]).wait_for(30)
        agent.shutdown()  # at once: nothing tells the reader it is done
        print("OK" if st == 0 else f"writer: write status {st}", flush=True)
        sys.exit(0 if st == 0 else 3)
    deadline = time.monotonic() + 30  # a condition with a deadline: the bytes
    while buf.raw != want and time.monotonic() < deadline:
        time.sleep(0.01)
    agent.shutdown()
    print("OK" if buf.raw == want else "reader: the bytes did not arrive", flush=True)
    sys.exit(0 if buf.raw == want else 4)
    """
)

RUNS = 50
AT_ONCE = 5


def test_an_agent_that_writes_and_leaves_at_once_never_fails_its_peer(tmp_path, ctrl_url, unique):
    side = tmp_path / "side.py"
    side.write_text(SIDE)
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    failures = []
    try:
        for first in range(0, RUNS, AT_ONCE):
            pairs = []
            for i in range(first, first + AT_ONCE):
                w, r = f"lw{i}_{unique}", f"lr{i}_{unique}"
                args = [sys.executable, str(side), ctrl_url]
                pairs.append((i,
                              subprocess.Popen([*args, w, r, "writer"], stdout=subprocess.PIPE,
                                               stderr=subprocess.STDOUT, text=True),
                              subprocess.Popen([*args, r, w, "reader"], stdout=subprocess.PIPE,
                                               stderr=subprocess.STDOUT, text=True)))
            for i, writer, reader in pairs:
                for role, proc in (("writer", writer), ("reader", reader)):
                    out, _ = proc.communicate(timeout=120)
                    if proc.returncode != 0:
                        lines = [line for line in out.splitlines() if not line.startswith("[")]
                        failures.append(f"run {i} {role} rc {proc.returncode}: {lines[-3:]}")
    finally:
        for p in load:
            p.kill()
            p.wait()
    assert not failures, f"{len(failures)} failures in {RUNS} runs:\n" + "\n".join(failures)
