"""Runs two PeerAgents in two processes against one NanoCtrl.

The control plane is --ctrl-url / DLSLIME_CTRL_URL when given, else an embedded NanoCtrl
started here (in memory, on a free port). Each example defines target(ctrl_url, me, peer)
and initiator(ctrl_url, me, peer) and calls run(target, initiator)."""

import argparse
import contextlib
import multiprocessing
import os
import sys
import uuid


def run(target, initiator, timeout=120):
    parser = argparse.ArgumentParser()
    parser.add_argument("--ctrl-url", default=os.environ.get("DLSLIME_CTRL_URL"),
                        help="NanoCtrl URL (default: start an embedded one)")
    args = parser.parse_args()
    from dlslime import nanoctrl

    suffix = uuid.uuid4().hex[:6]
    a, b = f"target-{suffix}", f"initiator-{suffix}"
    ctx = multiprocessing.get_context("spawn")
    with (contextlib.nullcontext(args.ctrl_url) if args.ctrl_url else nanoctrl.serve(port=0)) as url:
        print(f"NanoCtrl at {url}")
        procs = [ctx.Process(target=target, args=(url, a, b)), ctx.Process(target=initiator, args=(url, b, a))]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    codes = [p.exitcode for p in procs]
    if codes != [0, 0]:
        print(f"FAILED: exit codes target={codes[0]} initiator={codes[1]}", file=sys.stderr)
        sys.exit(1)
    print("OK")
