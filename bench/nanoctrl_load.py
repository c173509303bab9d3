#!/usr/bin/env python3
"""NanoCtrl control-plane load: how many agents can long-poll their mailboxes on one NanoCtrl
while heartbeats stay answered, and how fast a posted message reaches its waiting agent.

For each agent count N it registers N agents, parks one blocking mailbox receive per agent
(each on its own HTTP connection, as PeerAgents do), and then, while all N receives are
held, heartbeats every agent repeatedly and posts messages to random agents. It reports
heartbeat latency and failures, mailbox delivery latency (post -> the waiting receive
returns, measured in this process) p50/p99, and whether the target holds (default:
p99 < 50 ms with every heartbeat answered).

The server runs in its own process (`python -m dlslime.nanoctrl server`), so the load
generator's threads do not share its CPU time slices in one interpreter.

  python bench/nanoctrl_load.py                       # memory store, 256 and 512 agents
  python bench/nanoctrl_load.py --agents 256,512,1024 --store redis --json out.json
"""

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

import dlslime.nanoctrl as nanoctrl


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def metric(url, name):
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def pct(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100.0 * (len(values) - 1))))]


def run_level(url, n_agents, messages, hb_rounds, hb_threads, scope):
    client = nanoctrl.NanoCtrlClient(url, scope=scope, timeout=30.0)
    aliases = [client.start_peer_agent(alias=f"load-{i}")["name"] for i in range(n_agents)]
    latencies, lock, stop = [], threading.Lock(), threading.Event()
    recv_errors = []

    def waiter(alias):
        while not stop.is_set():
            try:
                msgs = client.recv(alias, timeout=30.0, max_messages=16)
            except Exception as e:  # noqa: BLE001 - counted and reported
                recv_errors.append(repr(e))
                return
            now = time.perf_counter()
            with lock:
                for m in msgs:
                    body = m["message"]
                    if isinstance(body, dict) and "t0" in body:
                        latencies.append(now - body["t0"])

    threads = [threading.Thread(target=waiter, args=(a,), daemon=True) for a in aliases]
    for t in threads:
        t.start()
    def all_blocked():
        if recv_errors:
            raise RuntimeError(f"{len(recv_errors)} receives failed, e.g. {recv_errors[0]} "
                               "(more agents than --max-waiters? raise --max-threads)")
        return metric(url, "nanoctrl_mailbox_waiters") >= n_agents

    wait_for(all_blocked, 60, f"{n_agents} blocked receives")

    hb_lat, hb_fail = [], []

    def heartbeats(part):
        for _ in range(hb_rounds):
            for alias in part:
                t0 = time.perf_counter()
                try:
                    ok = client.heartbeat(alias) == "ok"
                except Exception as e:  # noqa: BLE001
                    ok = False
                    hb_fail.append(repr(e))
                if not ok and not hb_fail:
                    hb_fail.append(f"{alias}: not ok")
                with lock:
                    hb_lat.append(time.perf_counter() - t0)

    hb = [threading.Thread(target=heartbeats, args=(aliases[i::hb_threads],)) for i in range(hb_threads)]
    for t in hb:
        t.start()
    sender_client = nanoctrl.NanoCtrlClient(url, scope=scope, timeout=30.0)
    rng = random.Random(1)
    t_start = time.perf_counter()
    for i in range(messages):
        sender_client.post(rng.choice(aliases), {"t0": time.perf_counter(), "i": i}, sender="bench")
        time.sleep(0.001)  # a steady stream, not a burst that measures queueing
    elapsed = time.perf_counter() - t_start
    for t in hb:
        t.join()
    wait_for(lambda: len(latencies) >= messages, 60, "all messages to be received")
    held = metric(url, "nanoctrl_mailbox_waiters")
    threads_started = metric(url, "nanoctrl_http_threads")

    stop.set()
    for a in aliases:  # release the receives
        sender_client.post(a, "stop")
    for t in threads:
        t.join(10)
    for a in aliases:
        client.cleanup(a)
    ms = [x * 1000 for x in latencies]
    hb_ms = [x * 1000 for x in hb_lat]
    return {
        "agents": n_agents,
        "waiters_held": held,
        "http_threads": threads_started,
        "messages": messages,
        "post_rate_per_s": messages / elapsed,
        "mailbox_p50_ms": pct(ms, 50),
        "mailbox_p99_ms": pct(ms, 99),
        "mailbox_max_ms": max(ms) if ms else float("nan"),
        "heartbeats": len(hb_lat),
        "heartbeat_failures": len(hb_fail) + len(recv_errors),
        "heartbeat_p50_ms": pct(hb_ms, 50),
        "heartbeat_p99_ms": pct(hb_ms, 99),
        "heartbeat_max_ms": max(hb_ms) if hb_ms else float("nan"),
        "mean_ms": statistics.fmean(ms) if ms else float("nan"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", default="256,512", help="comma-separated agent counts (default 256,512)")
    ap.add_argument("--messages", type=int, default=1000, help="messages posted per level")
    ap.add_argument("--heartbeat-rounds", type=int, default=3, help="heartbeats per agent per level")
    ap.add_argument("--heartbeat-threads", type=int, default=8)
    ap.add_argument("--store", choices=["memory", "redis"], default="memory")
    ap.add_argument("--url", help="use a running NanoCtrl instead of starting one")
    ap.add_argument("--max-threads", type=int, default=1024)
    ap.add_argument("--target-p99-ms", type=float, default=50.0)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    procs = []
    try:
        url = args.url
        if not url:
            cmd = [sys.executable, "-m", "dlslime.nanoctrl", "server", "--port", str(free_port()),
                   "--max-threads", str(args.max_threads), "--log-level", "warn"]
            if args.store == "redis":
                rport = free_port()
                procs.append(subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(rport),
                                               "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                cmd += ["--redis-url", f"redis://127.0.0.1:{rport}"]
                time.sleep(0.3)
            url = "http://127.0.0.1:" + cmd[cmd.index("--port") + 1]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=os.environ))  # warnings go to stderr

            def healthy():
                try:
                    with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
                        return r.status == 200
                except OSError:
                    return False

            wait_for(healthy, 30, "NanoCtrl")
        results = []
        print(f"NanoCtrl {url} ({args.store} store), {os.cpu_count()} CPUs")
        print(f"{'agents':>7} {'held':>5} {'thr':>5} {'mbox p50':>9} {'mbox p99':>9} {'mbox max':>9} "
              f"{'hb p50':>8} {'hb p99':>8} {'hb max':>8} {'hb fail':>7}  target")
        for n in [int(x) for x in args.agents.split(",")]:
            r = run_level(url, n, args.messages, args.heartbeat_rounds, args.heartbeat_threads, f"bench{n}")
            r["store"] = args.store
            r["target_met"] = r["mailbox_p99_ms"] < args.target_p99_ms and r["heartbeat_failures"] == 0 \
                and r["waiters_held"] >= n
            results.append(r)
            print(f"{n:>7} {r['waiters_held']:>5.0f} {r['http_threads']:>5.0f} {r['mailbox_p50_ms']:>8.2f}m "
                  f"{r['mailbox_p99_ms']:>8.2f}m {r['mailbox_max_ms']:>8.2f}m {r['heartbeat_p50_ms']:>7.2f}m "
                  f"{r['heartbeat_p99_ms']:>7.2f}m {r['heartbeat_max_ms']:>7.2f}m {r['heartbeat_failures']:>7}  "
                  f"{'met' if r['target_met'] else 'MISSED'}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"url": url, "cpus": os.cpu_count(), "results": results}, f, indent=2)
        return 0 if all(r["target_met"] for r in results) else 1
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    sys.exit(main())
