"""What a notification costs on top of its write (docs/performance.md, "Notifications").

Two endpoints of one transport in this process (TCP over loopback by default), one write of
SIZE bytes at a time. For each round it measures, in microseconds:
  write          the write's future completing (its round trip)
  write+notify   the same write carrying notify=: the future completes once the peer holds
                 the notification (the write's round trip, then the notification's)
  received       from submitting the write+notify to the peer's recv_notify completing
Medians over ROUNDS, after WARMUP. Usage:
  python3 bench/notify_latency.py [--transport tcp] [--size 4096] [--rounds 2000]
"""

import argparse
import statistics
import time

import dlslime
from dlslime import testing


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--transport", default="tcp")
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    args = p.parse_args()
    opts = {"ip": "127.0.0.1", "port": 0} if args.transport == "tcp" else {}
    a = dlslime.make_endpoint(args.transport, **opts)
    b = dlslime.make_endpoint(args.transport, **opts)
    src = testing.buffer_for(a.capabilities(), args.size)
    dst = testing.buffer_for(b.capabilities(), args.size)
    try:
        h_src = a.register_memory_region("src", src.ptr, 0, args.size)
        b.register_memory_region("dst", dst.ptr, 0, args.size)
        a.connect(b.endpoint_info())
        b.connect(a.endpoint_info())
        h_dst = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"])
        item = [(h_src, h_dst, 0, 0, args.size)]
        plain, carried, received = [], [], []
        for i in range(args.warmup + args.rounds):
            t0 = time.perf_counter()
            assert a.write(item).wait() == 0
            t1 = time.perf_counter()
            got = b.recv_notify()
            t2 = time.perf_counter()
            w = a.write(item, notify=b"n")
            assert w.wait() == 0
            t3 = time.perf_counter()
            assert got.wait() == 0
            t4 = time.perf_counter()
            if i >= args.warmup:
                plain.append((t1 - t0) * 1e6)
                carried.append((t3 - t2) * 1e6)
                received.append((t4 - t2) * 1e6)
        med = statistics.median
        print(f"{args.transport}, {args.size} B, {args.rounds} rounds (medians, us): write {med(plain):.1f}, "
              f"write+notify {med(carried):.1f} ({med(carried) / med(plain):.2f}x), "
              f"notification received {med(received):.1f}")
    finally:
        a.shutdown()
        b.shutdown()


if __name__ == "__main__":
    main()
