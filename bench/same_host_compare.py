#!/usr/bin/env python3
"""bench/same_host_compare.py: the TCP same-host path against its baselines, in one session.

For each of --runs rounds, interleaved so that drift hits every measurement alike:
  cma_loop           the raw process_vm_readv loop (bench/cma_loop.cpp): two processes, the
                     same sizes, batch and strided slots, no protocol: the memory-copy limit
  same-host on       dlslime-bench --op OP --same-host on (OP: --op, write by default; read
                     and send as well: the path pulls all three)
  same-host off      dlslime-bench --op OP --same-host off (the TCP path)
  and, with --one-slot, the same three with every item on the first slot (cache-resident, the
  working set of ucx_perftest), plus ucx_perftest tag_bw at 1 MiB with UCX_TLS=sm,self and
  UCX_TLS=cma,tcp,self where ucx_perftest is installed (Debian: ucx-utils).
Prints every run, the medians and the ratios the issue sets (>= 0.9x cma_loop at 1 MiB x 256,
no slower than the TCP path at 8 B x 256). Loopback and this host only.

usage: bench/same_host_compare.py [-b BUILD_DIR] [--op write|read|send] [--runs N] [--one-slot]
                                  [--iters-big N] [--iters-small N]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BIG, SMALL = 1 << 20, 8


def dlslime(build, op, size, iters, same_host, one_slot):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [os.path.join(build, "bench", "dlslime-bench"), "--op", op, "--sizes", str(size), "--batch", "256",
               "--iters", str(iters), "--same-host", same_host, "--json", out.name, "--quiet", "--progress", "none"]
        if one_slot:
            cmd.append("--one-slot")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        row = json.load(open(out.name))["rows"][0]
    return row["avg_bw_gbps"], row["avg_lat_us"]


def cma_loop(build, size, iters, one_slot):
    cmd = [os.path.join(build, "bench", "cma_loop"), "--sizes", str(size), "--batch", "256", "--iters", str(iters),
           "--json"] + (["--one-slot"] if one_slot else [])
    row = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout)[0]
    return row["avg_gbps"], row["avg_lat_us"]


def ucx(tls, port):
    env = dict(os.environ, UCX_TLS=tls)
    server = subprocess.Popen(["ucx_perftest", "-p", str(port)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):  # the server listens within a second
            time.sleep(0.1)
            r = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", "tag_bw", "-s", str(BIG), "-n",
                                "1000", "-w", "50"], env=env, capture_output=True, text=True, timeout=120)
            final = [line for line in r.stdout.splitlines() if line.startswith("Final:")]
            if final:
                return float(final[0].split()[5]) * (1 << 20) / 1e9, None  # MB/s (2^20) -> GB/s
        return None, None
    finally:
        server.kill()
        server.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-b", "--build", default="build/test")
    ap.add_argument("--op", choices=["write", "read", "send"], default="write")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--one-slot", action="store_true")
    ap.add_argument("--iters-big", type=int, default=20)
    ap.add_argument("--iters-small", type=int, default=300)
    args = ap.parse_args()
    have_ucx = args.one_slot and shutil.which("ucx_perftest") is not None
    results = {}
    for run in range(args.runs):
        for size, iters in ((BIG, args.iters_big), (SMALL, args.iters_small)):
            tag = f"{size} B x 256"
            results.setdefault((tag, "cma_loop"), []).append(cma_loop(args.build, size, iters, args.one_slot))
            for mode in ("on", "off"):
                results.setdefault((tag, f"same-host {mode}"), []).append(
                    dlslime(args.build, args.op, size, iters, mode, args.one_slot))
        if have_ucx:
            for tls in ("sm,self", "cma,tcp,self"):
                results.setdefault((f"{BIG} B (one buffer)", f"ucx tag_bw {tls}"), []).append(ucx(tls, 13400 + run))
        print(f"run {run + 1}: " + "; ".join(f"{t} {m}: {v[-1][0]:.2f} GB/s" for (t, m), v in results.items()),
              flush=True)
    print(f"\n{args.op}: medians of {args.runs} interleaved runs ({'one slot' if args.one_slot else 'strided slots'}):")
    med = {}
    for (tag, mode), values in results.items():
        bw = statistics.median(v[0] for v in values if v[0] is not None) if any(v[0] for v in values) else None
        lats = [v[1] for v in values if v[1] is not None]
        lat = statistics.median(lats) if lats else None
        med[(tag, mode)] = (bw, lat)
        print(f"  {tag:>22}  {mode:<24} {bw or 0:7.2f} GB/s" + (f"  {lat:10.1f} us/batch" if lat else ""))
    big, small = f"{BIG} B x 256", f"{SMALL} B x 256"
    print(f"\n  1 MiB x 256: same-host on / cma_loop = {med[(big, 'same-host on')][0] / med[(big, 'cma_loop')][0]:.2f}x"
          f" (target >= 0.90), / same-host off = {med[(big, 'same-host on')][0] / med[(big, 'same-host off')][0]:.2f}x")
    print(f"  8 B x 256: latency same-host on / off = "
          f"{med[(small, 'same-host on')][1] / med[(small, 'same-host off')][1]:.2f}x (target <= 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
