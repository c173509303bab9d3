"""The main job: an embedded NanoCtrl, two PeerAgents in two processes, and a TCP transfer
table (one-sided write and read through the agents, every batch checked byte for byte).

    python -m dlslime.demo [--sizes 4096,65536,1048576,8388608] [--batch 16] [--iters 20]
                           [--ctrl-url URL]

For the full MORI-IO-style sweep of the raw transport, run ``dlslime-bench``. Both agents
run on this host, so they advertise loopback; docs/deploy.md puts them on two hosts.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import multiprocessing
import statistics
import sys
import time
import uuid

TARGET_READY = "ready"


def _pattern(size: int, salt: int) -> bytes:
    block = bytes((i * 37 + salt) & 0xFF for i in range(256))
    return (block * (size // 256 + 1))[:size]


def _target(url: str, me: str, peer: str, capacity: int, pipe) -> None:
    from dlslime import PeerAgent

    region = ctypes.create_string_buffer(capacity)
    with PeerAgent(ctrl_url=url, alias=me, advertise_interface="lo") as agent:
        agent.register_memory_region("kv", ctypes.addressof(region), 0, capacity)
        agent.connect_to(peer, transport="tcp").wait(30)
        pipe.send(TARGET_READY)
        # Serve until the initiator says it is done.
        done = ctypes.create_string_buffer(8)
        agent.recv(peer, (ctypes.addressof(done), 0, 8)).wait()


def _initiator(url: str, me: str, peer: str, sizes, batch: int, iters: int, pipe) -> None:
    from dlslime import PeerAgent

    capacity = max(sizes) * batch
    src = ctypes.create_string_buffer(_pattern(capacity, 1), capacity)
    back = ctypes.create_string_buffer(capacity)
    rows = []
    with PeerAgent(ctrl_url=url, alias=me, advertise_interface="lo") as agent:
        agent.register_memory_region("src", ctypes.addressof(src), 0, capacity)
        agent.register_memory_region("back", ctypes.addressof(back), 0, capacity)
        conn = agent.connect_to(peer, transport="tcp")
        conn.wait(30)
        pipe.send(("connected", conn.conn_id))
        for size in sizes:
            total = size * batch
            for op, items in (("write", [("src", "kv", i * size, i * size, size) for i in range(batch)]),
                              ("read", [("back", "kv", i * size, i * size, size) for i in range(batch)])):
                call = agent.write if op == "write" else agent.read
                ctypes.memset(back, 0, total)
                lat = []
                for _ in range(iters):
                    t0 = time.perf_counter()
                    fut = call(peer, items)
                    status = fut.wait()
                    lat.append(time.perf_counter() - t0)
                    if status != 0:
                        raise RuntimeError(f"{op} of {batch} x {size} B failed: {fut.message}")
                # Write: the target holds src; read: back holds what the target holds.
                verified = back.raw[:total] == src.raw[:total] if op == "read" else None
                rows.append((op, size, batch, total, statistics.median(lat), min(lat), verified))
        # The target serves until told; nothing else to wait for: a connection is up once
        # both agents' dials are, so leaving now cannot fail the target's connect_to().
        note = ctypes.create_string_buffer(b"done", 8)
        agent.send(peer, (ctypes.addressof(note), 0, 8)).wait()
    pipe.send(("rows", rows))


def _poll(pipe, child, seconds: float) -> bool:
    """Whether the child sent something within the time; False at once if it died first."""
    deadline = time.monotonic() + seconds
    while not pipe.poll(0.1):
        if not child.is_alive() and not pipe.poll(0):
            return False
        if time.monotonic() > deadline:
            return False
    return True


def _print_table(rows) -> bool:
    header = ("Op", "MsgSize (B)", "Batch", "Total (MB)", "Median BW (GB/s)", "Median Lat (us)", "Min Lat (us)",
              "Bytes")
    lines = []
    ok = True
    for op, size, batch, total, med, best, verified in rows:
        check = "verified" if verified else ("FAILED" if verified is False else "(read back)")
        ok &= verified is not False
        lines.append((op, str(size), str(batch), f"{total / 1e6:.2f}", f"{total / med / 1e9:.2f}", f"{med * 1e6:.1f}",
                      f"{best * 1e6:.1f}", check))
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    sep = "+-" + "-+-".join("-" * w for w in widths) + "-+"
    print(sep)
    print("| " + " | ".join(h.center(w) for h, w in zip(header, widths)) + " |")
    print(sep)
    for line in lines:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(line, widths)) + " |")
    print(sep)
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlslime.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4096,65536,1048576,8388608",
                        help="comma-separated message sizes in bytes")
    parser.add_argument("--batch", type=int, default=16, help="items per batch")
    parser.add_argument("--iters", type=int, default=20, help="batches per size and op")
    parser.add_argument("--ctrl-url", default=None, help="use this NanoCtrl instead of an embedded one")
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s]
    except ValueError:
        parser.error("--sizes takes integers, e.g. 4096,1048576")
    if not sizes or min(sizes) <= 0 or args.batch <= 0 or args.iters <= 0:
        parser.error("sizes, --batch and --iters must be positive")

    from dlslime import nanoctrl

    suffix = uuid.uuid4().hex[:6]
    target_alias, initiator_alias = f"demo-target-{suffix}", f"demo-initiator-{suffix}"
    ctx = multiprocessing.get_context("spawn")
    server = contextlib.nullcontext(args.ctrl_url) if args.ctrl_url else nanoctrl.serve(port=0)
    with server as url:
        print(f"NanoCtrl: {url} ({'given' if args.ctrl_url else 'embedded, in-memory store'})")
        t_pipe, t_child = ctx.Pipe()
        i_pipe, i_child = ctx.Pipe()
        target = ctx.Process(target=_target,
                             args=(url, target_alias, initiator_alias, max(sizes) * args.batch, t_child))
        initiator = ctx.Process(target=_initiator,
                                args=(url, initiator_alias, target_alias, sizes, args.batch, args.iters, i_child))
        target.start()
        initiator.start()
        rows = None
        try:
            if not _poll(t_pipe, target, 60):
                raise RuntimeError("the target agent did not connect within 60 s")
            t_pipe.recv()
            if not _poll(i_pipe, initiator, 60):
                raise RuntimeError("the initiator agent did not connect within 60 s")
            _, conn_id = i_pipe.recv()
            print(f"agents: {target_alias} (pid {target.pid}) <-> {initiator_alias} (pid {initiator.pid}), "
                  f"connection {conn_id} over tcp")
            if _poll(i_pipe, initiator, 600):
                _, rows = i_pipe.recv()
        finally:
            for p in (initiator, target):
                p.join(60)
                if p.is_alive():
                    p.kill()
                    p.join()
    if rows is None or initiator.exitcode != 0 or target.exitcode != 0:
        print(f"FAILED: initiator exit {initiator.exitcode}, target exit {target.exitcode}", file=sys.stderr)
        return 1
    ok = _print_table(rows)
    print("all transfers verified" if ok else "BYTE MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
