"""Runs an initiator and a target in two processes (multiprocessing, spawn) that exchange
endpoint_info over pipes, like two hosts exchanging it through any side channel.

Each example defines target(pipe) and initiator(pipe) and calls run(target, initiator)."""

import multiprocessing
import sys


def run(target, initiator, timeout=120):
    ctx = multiprocessing.get_context("spawn")
    t_parent, t_child = ctx.Pipe()
    i_parent, i_child = ctx.Pipe()
    procs = [ctx.Process(target=target, args=(t_child,)), ctx.Process(target=initiator, args=(i_child,))]
    for p in procs:
        p.start()
    # Relay: each side's endpoint_info to the other, then "go".
    try:
        if not (t_parent.poll(60) and i_parent.poll(60)):
            raise RuntimeError("a process did not publish its endpoint_info")
        info_t, info_i = t_parent.recv(), i_parent.recv()
        t_parent.send(info_i)
        i_parent.send(info_t)
        for p in procs:
            p.join(timeout)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    codes = [p.exitcode for p in procs]
    if codes != [0, 0]:
        print(f"FAILED: exit codes target={codes[0]} initiator={codes[1]}", file=sys.stderr)
        sys.exit(1)
    print("OK")
