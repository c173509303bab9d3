"""A link that dies silently: no FIN, no RST, packets just stop. Two endpoints run in two
network namespaces joined by a veth pair; the test takes the link down and checks that
every pending future on both sides fails within the keepalive bound that docs/reliability.md
documents (idle + interval x count; TCP_USER_TIMEOUT for unacknowledged data is the same).

Network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN); the test command runs as
root. All traffic stays on the veth pair between the two namespaces."""

import json
import os
import select
import shutil
import subprocess
import sys
import time

import pytest

from conftest import assert_every_future_failed_within

HERE = os.path.dirname(os.path.abspath(__file__))
IDLE, INTERVAL, COUNT = 2, 1, 2  # netns_peer.KEEPALIVE
BOUND = IDLE + INTERVAL * COUNT
SLACK = 4  # retransmission-timer granularity and a loaded 2-core machine
OK, PEER_CLOSED = 0, 407


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


@pytest.fixture
def veth_pair():
    assert shutil.which("ip"), "the ip command (iproute2) is missing: scripts/install_deps.sh installs it"
    tag = f"{os.getpid() % 100000}"
    ns_a, ns_b, dev_a, dev_b = f"dls_a{tag}", f"dls_b{tag}", f"dlsa{tag}", f"dlsb{tag}"
    made = ip("netns", "add", ns_a, check=False)
    if made.returncode != 0:
        if "permitted" in made.stderr:
            pytest.skip(f"network namespaces need CAP_NET_ADMIN/CAP_SYS_ADMIN: {made.stderr.strip()}")
        raise AssertionError(f"ip netns add failed: {made.stderr}")
    try:
        ip("netns", "add", ns_b)
        ip("link", "add", dev_a, "netns", ns_a, "type", "veth", "peer", "name", dev_b, "netns", ns_b)
        for ns, dev, addr in ((ns_a, dev_a, "10.213.0.1/30"), (ns_b, dev_b, "10.213.0.2/30")):
            ip("-n", ns, "addr", "add", addr, "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield (ns_a, dev_a, "10.213.0.1"), (ns_b, dev_b, "10.213.0.2")
    finally:
        ip("netns", "del", ns_a, check=False)
        ip("netns", "del", ns_b, check=False)


class NetnsPeer:
    def __init__(self, ns, addr):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, os.path.join(HERE, "netns_peer.py"), addr],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def tell(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def hear(self, timeout=60.0):
        """The peer's next reply; fails after `timeout` seconds instead of hanging."""
        ready = select.select([self.proc.stdout], [], [], timeout)[0]
        assert ready, f"the peer sent nothing for {timeout} s"
        line = self.proc.stdout.readline()  # the peer writes whole lines
        assert line, f"the peer process exited (rc={self.proc.poll()})"
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.tell(exit=True)
                self.proc.wait(10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def test_silent_link_death_fails_every_pending_future_within_the_keepalive_bound(veth_pair):
    (ns_a, dev_a, addr_a), (ns_b, _, addr_b) = veth_pair
    a, b = NetnsPeer(ns_a, addr_a), NetnsPeer(ns_b, addr_b)
    try:
        info_a, info_b = a.hear()["info"], b.hear()["info"]
        assert info_a["host"] == addr_a and info_b["host"] == addr_b
        a.tell(peer=info_b)
        b.tell(peer=info_a)
        assert a.hear() == {"connected": True} and b.hear() == {"connected": True}
        # The link works: bytes cross it both ways.
        a.tell(write=4096)
        assert a.hear() == {"status": OK}
        b.tell(bytes=4096)
        assert bytes.fromhex(b.hear()["bytes"]) == addr_a[-1].encode() * 4096

        ip("-n", ns_a, "link", "set", dev_a, "down")  # silently: nothing is sent to b
        cut = time.monotonic()
        wait = BOUND + SLACK + 10  # the peers stop waiting here and report what is left
        a.tell(arm=wait)
        b.tell(arm=wait)
        ended = {"a": a.hear(), "b": b.hear()}
        elapsed = time.monotonic() - cut
        assert_every_future_failed_within(ended, wait, BOUND, SLACK, PEER_CLOSED)
        assert elapsed <= BOUND + SLACK + 5
    finally:
        a.close()
        b.close()
