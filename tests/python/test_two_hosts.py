"""Two hosts for real (issue 27): network namespaces that behave like separate hosts, and
DLSlime between them.

- Hosts A and B are network namespaces joined by a veth pair (10.77.0.1 and 10.77.0.2 on
  10.77.0.0/24); each sees only its own interfaces. For the control plane a third host C
  holds a bridge (10.77.3.1/24), the "management LAN", that A (10.77.3.11) and B
  (10.77.3.12) reach over two more veth pairs; redis-server and NanoCtrl run in C.
- The host-name trap of stock Debian/Ubuntu is built in: each host process runs in its own
  UTS namespace with its own host name, and `ip netns exec` bind-mounts a private
  /etc/netns/NS/hosts over /etc/hosts that maps that name to 127.0.1.1. Every host checks
  that its name really resolves to 127.0.1.1, so an endpoint that advertised "what the host
  name resolves to" would publish an address nobody else can dial.
- Firewalls are nftables rules inside the namespaces (this kernel enforces them; each test
  that relies on a DROP rule first checks that it drops).
- A dead link: `tc qdisc ... netem loss 100%` is not available here ("Specified qdisc kind
  is unknown": the kernel has no sch_netem), so the substitute is an nftables rule on each
  side that drops everything arriving from the veth, which is what 100% loss does to TCP.

All traffic stays on these private links; nothing is sent to any other address. Network
namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN); without them the tests skip and say
so. Everything the tests make (namespaces, /etc/netns/* files, processes) is removed at the
end, also when a test fails."""

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import assert_every_future_failed_within

from two_host_peer import pattern

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "two_host_peer.py")
TAG = os.getpid() % 100000

# Short keepalive, as test_link_death.py: a silent peer is dead after IDLE + INTERVAL x COUNT.
IDLE, INTERVAL, COUNT = 2, 1, 2
KEEPALIVE = dict(keepalive_idle=IDLE, keepalive_interval=INTERVAL, keepalive_count=COUNT)
BOUND = IDLE + INTERVAL * COUNT
SLACK = 4  # retransmission-timer granularity and a loaded 2-core machine
CONNECT_TIMEOUT = 2
OK, PEER_CLOSED = 0, 407

A_ADDR, B_ADDR = "10.77.0.1", "10.77.0.2"  # the A-B link
C_ADDR, A_CTL, B_CTL = "10.77.3.1", "10.77.3.11", "10.77.3.12"  # the management LAN in C
TRAP = "127.0.1.1"
RANGE_LO, RANGE_HI = 20100, 20120
PORT_RANGE = f"{RANGE_LO}-{RANGE_HI}"
REDIS_PORT, CTRL_PORT = 6379, 4479  # inside C, a network stack of its own: always free
# Variables that would change what an endpoint advertises or where it listens; the suite's
# conftest may set some of them for loopback tests. Each host process starts without them.
TCP_ENV = ("DLSLIME_TCP_ADVERTISE_INTERFACE", "DLSLIME_TCP_ADVERTISE_HOST", "DLSLIME_TCP_PORT_RANGE")
TOOLS = ("ip", "unshare", "hostname", "nft", "redis-server", "redis-cli")  # scripts/install_deps.sh


def host_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in TCP_ENV}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def in_host(ns, hostname, *command):
    """The argv that runs `command` on host `ns`: in its network namespace, with its
    /etc/hosts (`ip netns exec` mounts /etc/netns/NS/hosts there) and in a UTS namespace
    of its own whose host name is `hostname`."""
    return ["ip", "netns", "exec", ns, "unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"',
            hostname, *command]


def run(*args, check=True, timeout=30, stdin=None, env=None):
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, input=stdin, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class Host:
    """A process of two_host_peer.py in namespace `ns` with host name `hostname`."""

    def __init__(self, net, ns, hostname, name, env=None):
        self.name = name
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(in_host(ns, hostname, sys.executable, PEER, name), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, env=host_env(**(env or {})))
        net.hosts.append(self)
        self.pending = b""
        self.hello = self.hear(30)["hello"]

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode(errors="replace")[-4000:]

    def tell(self, cmd, **args):
        self.proc.stdin.write((json.dumps(dict(cmd=cmd, **args)) + "\n").encode())
        self.proc.stdin.flush()

    def hear(self, timeout=30):
        """The next reply; fails after `timeout` seconds instead of hanging."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                pytest.fail(f"host {self.name} answered nothing for {timeout} s; its stderr:\n{self.stderr()}")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                pytest.fail(f"host {self.name} exited (rc={self.proc.wait(10)}); its stderr:\n{self.stderr()}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def ask(self, cmd, wait=30, **args):
        """Sends a command and returns the reply (which may be an error) within `wait` s."""
        self.tell(cmd, **args)
        return self.hear(wait)

    def do(self, cmd, wait=30, **args):
        """Sends a command and returns the reply, failing the test if it raised."""
        reply = self.ask(cmd, wait, **args)
        assert "error" not in reply, f"host {self.name}: {cmd} raised {reply['error']}; stderr:\n{self.stderr()}"
        return reply

    def close(self):
        if self.proc.poll() is None:
            try:
                self.tell("exit")
                self.proc.wait(10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)


class Network:
    """Namespaces, links and processes of one test; `teardown()` removes all of them."""

    def __init__(self):
        self.namespaces, self.hosts, self.children, self.etc_dirs = [], [], [], []

    def namespace(self, role, hostname=None):
        """A new network namespace; with `hostname`, a private /etc/hosts in which that
        name resolves to 127.0.1.1, as on a stock Debian/Ubuntu host."""
        ns = f"dls2h_{role}{TAG}"
        made = run("ip", "netns", "add", ns, check=False)
        if made.returncode != 0:
            if "permitted" in made.stderr or "Permission denied" in made.stderr:
                pytest.skip(f"network namespaces need CAP_NET_ADMIN/CAP_SYS_ADMIN: {made.stderr.strip()}")
            raise AssertionError(f"ip netns add {ns} failed: {made.stderr}")
        self.namespaces.append(ns)
        run("ip", "-n", ns, "link", "set", "lo", "up")
        if hostname:
            etc = f"/etc/netns/{ns}"
            os.makedirs(etc, exist_ok=True)
            self.etc_dirs.append(etc)
            with open(f"{etc}/hosts", "w") as f:
                f.write(f"127.0.0.1\tlocalhost\n{TRAP}\t{hostname}\n")
        return ns

    def veth(self, ns1, dev1, ns2, dev2):
        run("ip", "link", "add", dev1, "netns", ns1, "type", "veth", "peer", "name", dev2, "netns", ns2)
        for ns, dev in ((ns1, dev1), (ns2, dev2)):
            run("ip", "-n", ns, "link", "set", dev, "up")

    def host(self, ns, hostname, name, env=None):
        h = Host(self, ns, hostname, name, env)
        assert h.hello["hostname"] == hostname
        # The trap is really there: the host name resolves to 127.0.1.1 inside this host.
        assert h.hello["resolves"] == TRAP, f"{hostname} resolves to {h.hello['resolves']} inside {ns}"
        return h

    def teardown(self):
        """Ends every process, removes every namespace and file; goes on past a failed step
        and reports the failures at the end."""
        problems = []
        for h in self.hosts:
            try:
                h.close()
            except Exception as e:
                problems.append(f"host {h.name}: {e!r}")
        for child in self.children:  # redis-server: end it and reap it
            child.kill()
            child.wait(10)
        left = []
        for ns in self.namespaces:
            # Whatever still runs inside (a NanoCtrl daemon, a stuck host) was started by this
            # test: end it by its pid before the namespace goes.
            for pid in run("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), 9)
                    left.append(pid)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        while left and time.monotonic() < deadline:
            left = [pid for pid in left if running(pid)]
            time.sleep(0.05)
        if left:
            problems.append(f"processes {left} did not end")
        for ns in self.namespaces:
            gone = run("ip", "netns", "del", ns, check=False)
            if gone.returncode != 0:
                problems.append(f"ip netns del {ns}: {gone.stderr.strip()}")
        for etc in self.etc_dirs:
            shutil.rmtree(etc, ignore_errors=True)
        try:
            os.rmdir("/etc/netns")  # only when no one else has files there
        except OSError:
            pass
        assert not problems, f"teardown: {problems}"


def running(pid):
    """Whether `pid` still runs (a zombie, waiting for a parent that is not this process, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def net():
    missing = [tool for tool in TOOLS if not shutil.which(tool)]
    assert not missing, f"{missing} missing: scripts/install_deps.sh installs them"
    network = Network()
    try:
        yield network
    finally:
        network.teardown()


def two_hosts(net, default_route=True):
    """Namespaces A and B joined by a veth pair; with `default_route`, each one's default
    route goes over the veth to the other."""
    ns_a, ns_b = net.namespace("a", "host-a"), net.namespace("b", "host-b")
    dev_a, dev_b = f"dls2ha{TAG}", f"dls2hb{TAG}"
    net.veth(ns_a, dev_a, ns_b, dev_b)
    run("ip", "-n", ns_a, "addr", "add", f"{A_ADDR}/24", "dev", dev_a)
    run("ip", "-n", ns_b, "addr", "add", f"{B_ADDR}/24", "dev", dev_b)
    if default_route:
        run("ip", "-n", ns_a, "route", "add", "default", "via", B_ADDR)
        run("ip", "-n", ns_b, "route", "add", "default", "via", A_ADDR)
    return (ns_a, dev_a), (ns_b, dev_b)


def three_hosts(net, tmp_path, default_via, nanoctrl_args=()):
    """two_hosts() plus host C: a bridge that A and B reach over veth pairs, redis-server
    and NanoCtrl (Redis store, bound to 0.0.0.0) in C. A's and B's default routes go over
    the A-B link (`default_via="peer"`) or through C (`"ctrl"`). Returns (ns_a, dev_a),
    (ns_b, dev_b) and NanoCtrl's URL as A and B dial it."""
    (ns_a, dev_a), (ns_b, dev_b) = two_hosts(net, default_route=False)
    ns_c = net.namespace("c", "host-c")
    bridge = f"dls2hbr{TAG}"
    run("ip", "-n", ns_c, "link", "add", bridge, "type", "bridge")
    run("ip", "-n", ns_c, "addr", "add", f"{C_ADDR}/24", "dev", bridge)
    run("ip", "-n", ns_c, "link", "set", bridge, "up")
    for ns, side, addr, peer_addr in ((ns_a, "a", A_CTL, B_ADDR), (ns_b, "b", B_CTL, A_ADDR)):
        dev, port = f"dls2hc{side}{TAG}", f"dls2hp{side}{TAG}"
        net.veth(ns, dev, ns_c, port)
        run("ip", "-n", ns_c, "link", "set", port, "master", bridge)
        run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
        run("ip", "-n", ns, "route", "add", "default", "via", C_ADDR if default_via == "ctrl" else peer_addr)
    # redis-server on C's loopback only; NanoCtrl, in C too, is the one reachable service.
    redis = subprocess.Popen(
        in_host(ns_c, "host-c", "redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--loglevel", "warning"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    net.children.append(redis)
    wait_for(lambda: redis.poll() is not None or run(
        "ip", "netns", "exec", ns_c, "redis-cli", "-p", str(REDIS_PORT), "ping", check=False).stdout.strip() == "PONG",
        15, "redis-server in C")
    assert redis.poll() is None, f"redis-server in C exited ({redis.returncode})"
    pid_file = tmp_path / "nanoctrl.pid"
    started = run(*in_host(ns_c, "host-c", sys.executable, "-m", "dlslime.nanoctrl", "start",
                           "--host", "0.0.0.0", "--port", str(CTRL_PORT),
                           "--redis-url", f"redis://127.0.0.1:{REDIS_PORT}", "--pid-file", str(pid_file),
                           *nanoctrl_args), check=False, timeout=40, env=host_env())
    assert started.returncode == 0, f"nanoctrl start in C failed:\n{started.stdout}\n{started.stderr}"
    meta = json.loads((tmp_path / "nanoctrl.pid.json").read_text())
    return (ns_a, dev_a), (ns_b, dev_b), f"http://{C_ADDR}:{CTRL_PORT}", meta


def firewall(ns, *rules):
    """An nftables input chain in `ns` with these rules, policy accept."""
    body = "\n".join(rules)
    run("ip", "netns", "exec", ns, "nft", "-f", "-", stdin=(
        "table inet dls2h {\n chain input {\n  type filter hook input priority 0; policy accept;\n"
        f"{body}\n }}\n}}\n"))


def only_the_port_range(dev):
    """Accepts on `dev` only TCP to the port range (and replies to what this host dialed:
    the control plane, its own connections); drops every other TCP connection."""
    return (f'iifname "{dev}" ct state established,related accept',
            f'iifname "{dev}" tcp dport {RANGE_LO}-{RANGE_HI} accept',
            f'iifname "{dev}" meta l4proto tcp drop')


def in_range(port):
    return RANGE_LO <= port <= RANGE_HI


def move_bytes(a, b, info_a, info_b):
    """Connects a and b both ways, then writes, reads and sends, and checks what arrived."""
    a.tell("connect", peer=info_b)
    b.tell("connect", peer=info_a)
    assert "error" not in (ra := a.hear()), ra
    assert "error" not in (rb := b.hear()), rb
    n = 64 << 10
    # A writes its first n bytes into B's region at 1 MiB.
    assert a.do("write", n=n, at=1 << 20)["status"] == [OK, ""]
    assert bytes.fromhex(b.do("bytes", start=1 << 20, end=(1 << 20) + n)["bytes"]) == pattern("A", n)
    # B reads A's first n bytes into its region at 2 MiB.
    assert b.do("read", n=n, at=2 << 20)["status"] == [OK, ""]
    assert bytes.fromhex(b.do("bytes", start=2 << 20, end=(2 << 20) + n)["bytes"]) == pattern("A", n)
    # B sends its first 1000 bytes to a receive A posted.
    a.do("post_recv", n=1000)
    assert b.do("send", n=1000)["status"] == [OK, ""]
    got = a.do("recv_wait")
    assert got["status"] == [OK, ""] and bytes.fromhex(got["bytes"]) == pattern("B", 1000)
    # The region around what was written is untouched.
    assert bytes.fromhex(b.do("bytes", start=(1 << 20) - 16, end=1 << 20)["bytes"]) == \
        pattern("B", 1 << 20)[-16:]


def test_namespaces_are_hosts_with_their_own_stack_and_the_host_name_trap(net):
    (ns_a, dev_a), (ns_b, dev_b) = two_hosts(net)
    a = net.host(ns_a, "host-a", "A")  # net.host() asserts that host-a resolves to 127.0.1.1
    b = net.host(ns_b, "host-b", "B")
    assert a.hello["interfaces"] == sorted(["lo", dev_a])
    assert b.hello["interfaces"] == sorted(["lo", dev_b])
    # Each host has its own host name; the machine's own name is not touched.
    assert a.hello["hostname"] != b.hello["hostname"]
    # A service on B is reachable from A on the link, and not on B's loopback from A.
    port = b.do("listen", port=0)["listening"]
    assert a.do("dial", host=B_ADDR, port=port, timeout=5)["dialed"]
    refused = a.ask("dial", host="127.0.0.1", port=port, timeout=5)
    assert refused.get("error", [""])[0] == "ConnectionRefusedError", refused


@pytest.mark.parametrize("default_route", [True, False], ids=["default-route", "no-default-route"])
def test_wildcard_endpoints_advertise_their_link_address_and_move_bytes(net, default_route):
    """No advertise option: each side publishes its veth address (the interface of the
    default route, or else the first up interface with an IPv4 address), never what its
    host name resolves to (127.0.1.1)."""
    (ns_a, _), (ns_b, _) = two_hosts(net, default_route)
    a, b = net.host(ns_a, "host-a", "A"), net.host(ns_b, "host-b", "B")
    info_a = a.do("endpoint", options=KEEPALIVE)["info"]
    info_b = b.do("endpoint", options=KEEPALIVE)["info"]
    assert info_a["host"] == A_ADDR, f"A advertises {info_a['host']}, B cannot dial that"
    assert info_b["host"] == B_ADDR, f"B advertises {info_b['host']}, A cannot dial that"
    move_bytes(a, b, info_a, info_b)


def test_a_host_with_only_loopback_advertises_127_0_0_1_and_warns(net):
    ns = net.namespace("l", "host-l")
    h = net.host(ns, "host-l", "L")
    assert h.hello["interfaces"] == ["lo"]
    assert h.do("endpoint", options={})["info"]["host"] == "127.0.0.1"
    h.close()  # the warning is on its stderr, flushed by the time it exits
    assert "127.0.0.1" in h.stderr() and "warn" in h.stderr().lower(), h.stderr()


def test_advertise_interface_and_port_range_through_a_firewall(net):
    """A gets advertise_interface and port_range as keywords, B from the environment; both
    hosts drop every TCP connection outside the range, and the transfer still works. A
    range whose one port is taken fails with an error that names port_range."""
    (ns_a, dev_a), (ns_b, dev_b) = two_hosts(net)
    a = net.host(ns_a, "host-a", "A")
    b = net.host(ns_b, "host-b", "B", env={"DLSLIME_TCP_ADVERTISE_INTERFACE": dev_b,
                                          "DLSLIME_TCP_PORT_RANGE": PORT_RANGE})
    firewall(ns_a, *only_the_port_range(dev_a))
    firewall(ns_b, *only_the_port_range(dev_b))
    # The firewall really drops: a listener outside the range cannot be dialed, one inside can.
    outside, inside = 20200, RANGE_HI
    b.do("listen", port=outside)
    b.do("listen", port=inside)
    assert a.do("dial", host=B_ADDR, port=inside, timeout=5)["dialed"]
    dropped = a.ask("dial", host=B_ADDR, port=outside, timeout=1)
    assert dropped.get("error", [""])[0] in ("TimeoutError", "timeout"), (
        f"the firewall in B did not drop a connection to port {outside}: {dropped}")

    info_a = a.do("endpoint", options=dict(advertise_interface=dev_a, port_range=PORT_RANGE, **KEEPALIVE))["info"]
    info_b = b.do("endpoint", options=KEEPALIVE)["info"]
    assert info_a["host"] == A_ADDR and in_range(info_a["port"]), info_a
    assert info_b["host"] == B_ADDR and in_range(info_b["port"]), info_b
    move_bytes(a, b, info_a, info_b)

    # A range of one port that is taken: a clear error, not an endpoint on another port.
    taken = a.do("listen", port=RANGE_HI + 30)["listening"]
    failed = a.ask("probe_endpoint", options={"port_range": f"{taken}-{taken}"})
    assert "error" in failed, f"an endpoint listened outside its full range: {failed}"
    kind, message = failed["error"]
    assert kind == "ConnectionError" and "port_range" in message, failed


def test_agents_on_two_hosts_with_nanoctrl_on_redis_on_a_third(net, tmp_path):
    """PeerAgents in A and B, NanoCtrl (Redis store) in C: with no TCP options each agent
    publishes its address on the A-B link (its default route's interface), not its host
    name or 127.0.1.1, and the agents connect by alias and move bytes."""
    (ns_a, _), (ns_b, _), url, meta = three_hosts(net, tmp_path, default_via="peer")
    # C has no default route: NanoCtrl advertises its first up interface, the bridge.
    assert meta.get("advertised_url") == url, f"NanoCtrl in C advertises {meta}"
    a, b = net.host(ns_a, "host-a", "A"), net.host(ns_b, "host-b", "B")
    agents_move_bytes(a, b, meta["advertised_url"], options=KEEPALIVE)


def test_agents_with_advertise_interface_and_port_range_behind_firewalls(net, tmp_path):
    """The default routes go to the management LAN (C), the data goes over the A-B link:
    the agents name that link's interface (A as a keyword, B in the environment) and a port
    range, and A and B drop every TCP connection to another port on that link. NanoCtrl in
    C advertises its URL on its bridge, and the agents use that URL."""
    (ns_a, dev_a), (ns_b, dev_b), url, meta = three_hosts(
        net, tmp_path, default_via="ctrl", nanoctrl_args=("--advertise-interface", f"dls2hbr{TAG}"))
    assert meta.get("advertised_url") == url, f"NanoCtrl in C advertises {meta}"
    firewall(ns_a, *only_the_port_range(dev_a))
    firewall(ns_b, *only_the_port_range(dev_b))
    a = net.host(ns_a, "host-a", "A")
    b = net.host(ns_b, "host-b", "B", env={"DLSLIME_TCP_ADVERTISE_INTERFACE": dev_b,
                                          "DLSLIME_TCP_PORT_RANGE": PORT_RANGE})
    options = dict(advertise_interface=dev_a, port_range=PORT_RANGE, **KEEPALIVE)
    agents_move_bytes(a, b, meta["advertised_url"], options=options, in_port_range=True)


def agents_move_bytes(a, b, url, options, in_port_range=False):
    alias_a, alias_b = f"a{TAG}", f"b{TAG}"
    assert a.do("agent", ctrl_url=url, alias=alias_a, options=options)["alias"] == alias_a
    assert b.do("agent", ctrl_url=url, alias=alias_b, options=KEEPALIVE)["alias"] == alias_b
    a.tell("connect_to", peer=alias_b, timeout=20)
    b.tell("connect_to", peer=alias_a, timeout=20)
    assert (ra := a.hear()).get("state") == "connected", ra
    assert (rb := b.hear()).get("state") == "connected", rb
    seen_by_a, seen_by_b = a.do("agent_info", peer=alias_b), b.do("agent_info", peer=alias_a)
    assert seen_by_b["published"] == A_ADDR and seen_by_a["published"] == B_ADDR, (seen_by_a, seen_by_b)
    assert seen_by_a["mine"]["host"] == A_ADDR and seen_by_a["peer"]["host"] == B_ADDR, seen_by_a
    assert seen_by_b["mine"]["host"] == B_ADDR and seen_by_b["peer"]["host"] == A_ADDR, seen_by_b
    if in_port_range:
        assert in_range(seen_by_a["mine"]["port"]) and in_range(seen_by_b["mine"]["port"]), (seen_by_a, seen_by_b)
    n = 256 << 10
    assert a.do("agent_write", peer=alias_b, n=n, at=3 << 20)["status"] == [OK, ""]
    assert bytes.fromhex(b.do("bytes", start=3 << 20, end=(3 << 20) + n)["bytes"]) == pattern("A", n)
    assert a.do("agent_read", peer=alias_b, n=n, at=4 << 20)["status"] == [OK, ""]
    assert bytes.fromhex(a.do("bytes", start=4 << 20, end=(4 << 20) + n)["bytes"]) == pattern("B", n)


def test_a_link_that_drops_everything_fails_pending_ops_and_connect_within_their_deadlines(net):
    """netem is missing on this kernel (see the module's docstring): the dead link is an
    nftables rule on each side that drops everything arriving from the veth. Pending futures
    fail with PEER_CLOSED within the keepalive bound (test_link_death.py's), and connect()
    to the peer behind the link raises TimeoutError after connect_timeout, not later."""
    (ns_a, dev_a), (ns_b, dev_b) = two_hosts(net)
    a, b = net.host(ns_a, "host-a", "A"), net.host(ns_b, "host-b", "B")
    options = dict(timeout=0, recv_timeout=0, lanes=1, connect_timeout=CONNECT_TIMEOUT, **KEEPALIVE)
    info_a = a.do("endpoint", options=options)["info"]
    info_b = b.do("endpoint", options=options)["info"]
    a.tell("connect", peer=info_b)
    b.tell("connect", peer=info_a)
    assert "error" not in (ra := a.hear()) and "error" not in (rb := b.hear()), (ra, rb)
    assert a.do("write", n=4096, at=0)["status"] == [OK, ""]
    assert bytes.fromhex(b.do("bytes", start=0, end=4096)["bytes"]) == pattern("A", 4096)

    firewall(ns_a, f'iifname "{dev_a}" drop')
    firewall(ns_b, f'iifname "{dev_b}" drop')
    cut = time.monotonic()
    wait = BOUND + SLACK + 10  # the hosts stop waiting here and report what is left
    a.tell("arm", seconds=wait)
    b.tell("arm", seconds=wait)
    ended = {"A": a.hear(wait + 10), "B": b.hear(wait + 10)}
    elapsed = time.monotonic() - cut
    assert_every_future_failed_within(ended, wait, BOUND, SLACK, PEER_CLOSED)
    assert elapsed <= BOUND + SLACK + 5

    # Connecting again to the peer behind the dead link: TimeoutError after connect_timeout.
    again = a.ask("connect", wait=CONNECT_TIMEOUT + SLACK + 10, peer=info_b)
    assert "error" in again, f"connect() through a link that drops everything succeeded: {again}"
    assert again["error"][0] == "TimeoutError", again
    assert CONNECT_TIMEOUT * 0.9 <= again["seconds"] <= CONNECT_TIMEOUT + SLACK, again
