"""Launchers for the two-process examples.

run(target, initiator): raw endpoints; each side gets a Pipe over which it publishes its
endpoint_info and receives the other's, as two hosts would exchange it through any side
channel. run_agents(target, initiator): two PeerAgents that meet through NanoCtrl
(--ctrl-url / DLSLIME_CTRL_URL, else an embedded one started here); each side gets
(ctrl_url, its alias, the peer's alias)."""

import argparse
import contextlib
import multiprocessing
import os
import sys
import uuid

_ctx = multiprocessing.get_context("spawn")


def _finish(procs, timeout, relay=None):
    """Starts the processes, runs `relay` (if any), waits, and exits 1 unless both exit 0."""
    for p in procs:
        p.start()
    try:
        if relay:
            relay()
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


def run(target, initiator, timeout=120):
    t_parent, t_child = _ctx.Pipe()
    i_parent, i_child = _ctx.Pipe()

    def relay():
        if not (t_parent.poll(60) and i_parent.poll(60)):
            raise RuntimeError("a process did not publish its endpoint_info")
        info_t, info_i = t_parent.recv(), i_parent.recv()
        t_parent.send(info_i)
        i_parent.send(info_t)

    _finish([_ctx.Process(target=target, args=(t_child,)), _ctx.Process(target=initiator, args=(i_child,))],
            timeout, relay)


def run_agents(target, initiator, timeout=120):
    parser = argparse.ArgumentParser()
    parser.add_argument("--ctrl-url", default=os.environ.get("DLSLIME_CTRL_URL"),
                        help="NanoCtrl URL (default: start an embedded one)")
    args = parser.parse_args()
    from dlslime import nanoctrl

    suffix = uuid.uuid4().hex[:6]
    a, b = f"target-{suffix}", f"initiator-{suffix}"
    with (contextlib.nullcontext(args.ctrl_url) if args.ctrl_url else nanoctrl.serve(port=0)) as url:
        print(f"NanoCtrl at {url}")
        _finish([_ctx.Process(target=target, args=(url, a, b)), _ctx.Process(target=initiator, args=(url, b, a))],
                timeout)
