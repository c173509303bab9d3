"""One-sided RDMA write between two PeerAgents in two processes, by region name, with
write_with_imm to tell the target the bytes are there. Without an RDMA NIC, run it on the
simulated device:

    DLSLIME_RDMA_SIM=1 python examples/python/p2p_rdma_rc_write_peer_agent.py [--ctrl-url URL]
"""

import ctypes
import sys

from _two_process import run_agents as run

SIZE = 4 * 1024 * 1024
DONE = 0x600D


def pattern():
    return bytes((i * 5 + 1) & 0xFF for i in range(256)) * (SIZE // 256)


def target(ctrl_url, me, peer):
    from dlslime import PeerAgent

    kv = ctypes.create_string_buffer(SIZE)
    with PeerAgent(ctrl_url=ctrl_url, alias=me) as agent:
        agent.register_memory_region("kv", ctypes.addressof(kv), 0, SIZE)  # before connect_to
        conn = agent.connect_to(peer, transport="rdma").wait()
        print(f"[{me}] connected over {conn.transport} on {conn.local_nic} <-> {conn.remote_nic}")
        imm = agent.imm_recv(peer)  # completes when the initiator's write_with_imm has landed
        ok = imm.wait() == 0 and imm.imm_data() == DONE
        ok = ok and kv.raw[1024:1024 + SIZE // 2] == pattern()[: SIZE // 2] and kv.raw[:1024] == bytes(1024)
        print(f"[{me}] kv holds the written bytes: {ok}")
    sys.exit(0 if ok else 1)


def initiator(ctrl_url, me, peer):
    from dlslime import PeerAgent

    src = ctypes.create_string_buffer(pattern(), SIZE)
    with PeerAgent(ctrl_url=ctrl_url, alias=me) as agent:
        agent.register_memory_region("src", ctypes.addressof(src), 0, SIZE)
        conn = agent.connect_to(peer, transport="rdma").wait()
        head, tail = SIZE // 2 - 4096, 4096
        # Named: (local_name, remote_name, local_offset, remote_offset, length).
        status = agent.write(peer, [("src", "kv", 0, 1024, head)]).wait()
        print(f"[{me}] write {head} B status={status}")
        # The last 4 KiB carry the immediate, which the target's imm_recv gets once they
        # have landed. write_with_imm takes handles, in endpoint order:
        # (local_handle, remote_handle, target_offset=REMOTE, source_offset=LOCAL, length).
        handle = conn.endpoint.mr_info()["src"]["handle"]
        remote = conn.endpoint.register_remote_memory_region("kv", conn.peer_endpoint_info["mr_info"]["kv"])
        imm = agent.write_with_imm(peer, [(handle, remote, 1024 + head, head, tail)], DONE, None)
        ok = status == 0 and imm.wait() == 0
        print(f"[{me}] write_with_imm {tail} B imm={DONE:#x} ok={ok}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    run(target, initiator)
