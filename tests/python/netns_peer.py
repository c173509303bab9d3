"""A TcpEndpoint in its own network namespace, driven by test_link_death.py over stdin and
stdout (one JSON object per line). Run as `ip netns exec NS python3 netns_peer.py IP`.

Commands: {"peer": info} connects and answers {"connected": true}; {"write": n} writes n
bytes to the peer's region and answers {"status": code}; {"bytes": n} answers the first n
bytes of this side's region as hex; {"arm": seconds} posts a recv and a write to the peer
(neither can complete once the link is down), waits at most that long, and answers with
how each future ended and after how long: {"recv": [status, seconds, message], "write":
[...]}; {"exit": true} shuts down."""

import ctypes
import json
import sys
import time

import dlslime

KEEPALIVE = dict(keepalive_idle=2, keepalive_interval=1, keepalive_count=2)
REGION = 8 << 20


def say(**msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def main(ip):
    buf = ctypes.create_string_buffer(REGION)
    ctypes.memset(buf, ord(ip[-1]), REGION)
    # No op deadline: the only thing that may end the futures below is the link check.
    ep = dlslime.TcpEndpoint(ip=ip, port=0, timeout=0, recv_timeout=0, lanes=1, **KEEPALIVE)
    h_local = ep.register_memory_region("r", ctypes.addressof(buf), 0, REGION)
    say(info=ep.endpoint_info())
    h_remote = None
    for line in sys.stdin:
        cmd = json.loads(line)
        if "peer" in cmd:
            ep.connect(cmd["peer"])
            h_remote = ep.register_remote_memory_region("r", cmd["peer"]["mr_info"]["r"])
            say(connected=True)
        elif "write" in cmd:
            status = ep.write([(h_local, h_remote, 0, 0, cmd["write"])]).wait_for(30)
            say(status=None if status is None else int(status))
        elif "bytes" in cmd:
            say(bytes=buf.raw[: cmd["bytes"]].hex())
        elif "arm" in cmd:
            inbox = ctypes.create_string_buffer(64)
            t0 = time.monotonic()
            recv = ep.recv((ctypes.addressof(inbox), 0, 64))
            write = ep.write([(h_local, h_remote, 0, 0, REGION)])
            ended = {}
            deadline = t0 + cmd["arm"]
            while len(ended) < 2 and time.monotonic() < deadline:
                for name, fut in (("recv", recv), ("write", write)):
                    if name not in ended and fut.wait_for(0.05) is not None:
                        ended[name] = [int(fut.status), round(time.monotonic() - t0, 2), fut.message]
            say(**ended)
        elif "exit" in cmd:
            break
    ep.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
