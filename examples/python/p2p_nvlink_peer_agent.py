"""One-sided NVLink (CUDA IPC) writes and reads between two PeerAgents in two processes on
one host, by region name, with transport="auto": both agents serve NVLink on this host, so
auto takes it (conn.selection_reason says why). Without a GPU, run it on the simulated one:

    DLSLIME_GPU_SIM=1 python examples/python/p2p_nvlink_peer_agent.py [--ctrl-url URL]

NVLink has no messages: the target learns the initiator is done through its own GPU
memory (a flag the initiator writes last). The initiator leaves at once after it: a
connection is up only once both agents' sides are, so its leaving cannot fail the target
(docs/peer-agent.md).
"""

import sys
import time

from _two_process import run_agents as run

SIZE = 1 << 20
FLAG = SIZE - 8  # the last 8 bytes of each side's region
DONE = b"finished"


def content(seed):
    return bytes((i * 7 + seed) & 0xFF for i in range(256)) * (SIZE // 256)


def wait_for_flag(buf, flag, who):
    """Polls this side's own GPU memory until the peer's flag is there (60 s at most)."""
    deadline = time.monotonic() + 60
    while buf.read(FLAG, 8) != flag:
        if time.monotonic() > deadline:
            print(f"[{who}] the peer's flag {flag!r} never came", file=sys.stderr)
            sys.exit(1)
        time.sleep(0.001)


def target(ctrl_url, me, peer):
    from dlslime import PeerAgent, testing

    kv = testing.device_buffer(SIZE, device=0)  # or a torch CUDA tensor's data_ptr()
    kv.write(0, content(1)[:FLAG] + bytes(8))
    with PeerAgent(ctrl_url=ctrl_url, alias=me, nvlink_device=0) as agent:
        agent.register_memory_region("kv", kv.ptr, 0, SIZE)
        conn = agent.connect_to(peer, transport="auto").wait()
        print(f"[{me}] connected over {conn.transport}: {conn.selection_reason}")
        wait_for_flag(kv, DONE, me)
        ok = kv.read(4096, 65536) == content(2)[:65536]
        print(f"[{me}] kv holds the initiator's write: {ok}")
    sys.exit(0 if ok and conn.transport == "nvlink" else 1)


def initiator(ctrl_url, me, peer):
    from dlslime import PeerAgent, testing

    out = testing.device_buffer(SIZE, device=1)
    out.write(0, content(2)[:FLAG] + bytes(8))
    with PeerAgent(ctrl_url=ctrl_url, alias=me, nvlink_device=1) as agent:
        agent.register_memory_region("out", out.ptr, 0, SIZE)
        conn = agent.connect_to(peer, transport="auto").wait()
        print(f"[{me}] connected over {conn.transport}: {conn.selection_reason}")
        # Named: (local_name, remote_name, local_offset, remote_offset, length).
        status = agent.read(peer, [("out", "kv", 131072, 0, 8192)]).wait()
        ok = status == 0 and out.read(131072, 8192) == content(1)[:8192]
        print(f"[{me}] read 8192 B status={status} bytes match: {ok}")
        ok = agent.write(peer, [("out", "kv", 0, 4096, 65536)]).wait() == 0 and ok
        out.write(0, DONE)  # the flag, after the bytes it announces
        ok = agent.write(peer, [("out", "kv", 0, FLAG, 8)]).wait() == 0 and ok
    sys.exit(0 if ok and conn.transport == "nvlink" else 1)


if __name__ == "__main__":
    run(target, initiator)
