"""What a wildcard bind advertises, and the port range listeners use (issue 27,
docs/deploy.md): TcpEndpoint, PeerAgent (its endpoints and its published address) and
NanoCtrl's URL for other hosts.

No test here sends anything to a non-loopback address: the default rule is checked by
reading endpoint_info() only. tests/python/test_two_hosts.py dials it between network
namespaces."""

import json
import socket
import subprocess
import sys

import pytest

from dlslime import PeerAgent, TcpEndpoint, nanoctrl
from conftest import Buffer
from nanoctrl_fixtures import free_port

OK = 0
ADVERTISE_ENV = ("DLSLIME_TCP_ADVERTISE_HOST", "DLSLIME_TCP_ADVERTISE_INTERFACE")


def interfaces():
    """{name: (ipv4, up)} from `ip -o -4 addr` and `ip -o link` (independent of the library)."""
    out = {}
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    up = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if "LOWER_UP" in line}
    for line in subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=True).stdout.splitlines():
        fields = line.split()
        name, addr = fields[1], fields[3].split("/")[0]
        out.setdefault(name, (addr, name in up))
    return out


def default_route_interface():
    with open("/proc/net/route") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    defaults = [(int(r[6]), r[0]) for r in rows if r[1] == "00000000" and r[7] == "00000000" and int(r[3], 16) & 1]
    return min(defaults)[1] if defaults else ""


def expected_default_address():
    """The documented rule, computed here from iproute2's view of the host."""
    ifs = interfaces()
    route = default_route_interface()
    if route in ifs and ifs[route][1] and route != "lo":
        return ifs[route][0]
    for name, (addr, up) in ifs.items():
        if up and name != "lo" and not addr.startswith("127."):
            return addr
    return "127.0.0.1"


@pytest.fixture
def no_advertise_env(monkeypatch):
    for name in ADVERTISE_ENV + ("DLSLIME_TCP_PORT_RANGE",):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def free_range(n):
    """`n` consecutive loopback ports that are free now, as (first, last)."""
    for _ in range(200):
        first = free_port()
        if first + n - 1 > 65535:
            continue
        socks = []
        try:
            for p in range(first, first + n):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return first, first + n - 1
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no {n} consecutive free ports found")


# --- The advertise address --------------------------------------------------------------------------------------

def test_a_wildcard_bind_advertises_the_default_route_interface_not_the_host_name(no_advertise_env):
    ep = TcpEndpoint(ip="0.0.0.0", port=0)
    try:
        host = ep.endpoint_info()["host"]
        assert host == expected_default_address()
        assert host not in ("0.0.0.0", "127.0.1.1")
    finally:
        ep.shutdown()


def test_advertise_interface_names_the_address(no_advertise_env):
    ep = TcpEndpoint(ip="0.0.0.0", port=0, advertise_interface="lo")
    assert ep.endpoint_info()["host"] == "127.0.0.1"
    ep.shutdown()
    no_advertise_env.setenv("DLSLIME_TCP_ADVERTISE_INTERFACE", "lo")
    ep = TcpEndpoint(ip="0.0.0.0", port=0)
    assert ep.endpoint_info()["host"] == "127.0.0.1"
    ep.shutdown()


def test_a_specific_bind_address_is_advertised_as_is(no_advertise_env):
    ep = TcpEndpoint(ip="127.0.0.1", port=0, advertise_interface="lo")
    assert ep.endpoint_info()["host"] == "127.0.0.1"
    ep.shutdown()


def test_an_explicit_option_beats_the_environment_of_the_other(no_advertise_env):
    no_advertise_env.setenv("DLSLIME_TCP_ADVERTISE_HOST", "10.9.9.9")
    ep = TcpEndpoint(ip="0.0.0.0", port=0, advertise_interface="lo")
    assert ep.endpoint_info()["host"] == "127.0.0.1"
    ep.shutdown()
    no_advertise_env.delenv("DLSLIME_TCP_ADVERTISE_HOST")
    no_advertise_env.setenv("DLSLIME_TCP_ADVERTISE_INTERFACE", "lo")
    ep = TcpEndpoint(ip="0.0.0.0", port=0, advertise_host="127.0.0.2")
    assert ep.endpoint_info()["host"] == "127.0.0.2"
    ep.shutdown()


def test_both_advertise_options_are_a_value_error(no_advertise_env):
    with pytest.raises(ValueError, match="advertise_host .* and advertise_interface .* are both set"):
        TcpEndpoint(ip="0.0.0.0", port=0, advertise_host="127.0.0.1", advertise_interface="lo")
    no_advertise_env.setenv("DLSLIME_TCP_ADVERTISE_HOST", "127.0.0.1")
    no_advertise_env.setenv("DLSLIME_TCP_ADVERTISE_INTERFACE", "lo")
    with pytest.raises(ValueError, match="DLSLIME_TCP_ADVERTISE_INTERFACE"):
        TcpEndpoint(ip="0.0.0.0", port=0)


def test_a_missing_interface_is_a_value_error_that_lists_the_interfaces(no_advertise_env):
    with pytest.raises(ValueError, match=r"advertise_interface 'nosuchif0' does not exist.*lo 127\.0\.0\.1"):
        TcpEndpoint(ip="0.0.0.0", port=0, advertise_interface="nosuchif0")
    for bad in ("eth 0", "a" * 16, "../lo", ""):
        if bad == "":
            continue  # "" means "not set", like None
        with pytest.raises(ValueError, match="advertise_interface"):
            TcpEndpoint(ip="0.0.0.0", port=0, advertise_interface=bad)
    with pytest.raises(TypeError, match="advertise_interface"):
        TcpEndpoint(ip="0.0.0.0", port=0, advertise_interface=5)


def test_connect_through_an_advertised_interface(no_advertise_env):
    a = TcpEndpoint(ip="0.0.0.0", port=0, advertise_interface="lo")
    b = TcpEndpoint(ip="0.0.0.0", port=0, advertise_interface="lo")
    try:
        src, dst = Buffer(4096, b"advertised"), Buffer(4096)
        ha = a.register_memory_region("m", src.addr, 0, 4096)
        b.register_memory_region("m", dst.addr, 0, 4096)
        a.connect(b.endpoint_info())
        b.connect(a.endpoint_info())
        hb = a.register_remote_memory_region("m", b.endpoint_info()["mr_info"]["m"])
        assert a.write([(ha, hb, 0, 0, 4096)]).wait_for(30) == OK
        assert dst.bytes() == src.bytes()
    finally:
        a.shutdown()
        b.shutdown()


# --- Port ranges ------------------------------------------------------------------------------------------------

def test_endpoints_listen_in_the_port_range_until_it_is_exhausted(no_advertise_env):
    first, last = free_range(4)
    taken = socket.socket()
    taken.bind(("127.0.0.1", first))  # someone else's: skipped, not an error
    taken.listen(1)
    eps = []
    try:
        for _ in range(3):
            eps.append(TcpEndpoint(ip="127.0.0.1", port=0, port_range=f"{first}-{last}"))
        assert sorted(ep.port for ep in eps) == [first + 1, first + 2, first + 3]
        with pytest.raises(ConnectionError, match=rf"no free port in the TcpEndpoint option port_range {first}-{last}"):
            TcpEndpoint(ip="127.0.0.1", port=0, port_range=f"{first}-{last}")
        # A port comes back when its endpoint shuts down.
        freed = eps.pop(0)
        port = freed.port
        freed.shutdown()
        again = TcpEndpoint(ip="127.0.0.1", port=0, port_range=f"{first}-{last}")
        eps.append(again)
        assert again.port == port
    finally:
        taken.close()
        for ep in eps:
            ep.shutdown()


def test_port_range_from_the_environment_and_transfers_through_it(no_advertise_env):
    first, last = free_range(2)
    no_advertise_env.setenv("DLSLIME_TCP_PORT_RANGE", f"{first}-{last}")
    a = TcpEndpoint(ip="127.0.0.1", port=0)
    b = TcpEndpoint(ip="127.0.0.1", port=0)
    try:
        assert {a.port, b.port} == {first, last}
        src, dst = Buffer(1 << 16, b"in range"), Buffer(1 << 16)
        ha = a.register_memory_region("m", src.addr, 0, src.size)
        b.register_memory_region("m", dst.addr, 0, dst.size)
        a.connect(b.endpoint_info())
        b.connect(a.endpoint_info())
        hb = a.register_remote_memory_region("m", b.endpoint_info()["mr_info"]["m"])
        assert a.write([(ha, hb, 0, 0, src.size)]).wait_for(30) == OK
        assert dst.bytes() == src.bytes()
    finally:
        a.shutdown()
        b.shutdown()


@pytest.mark.parametrize("bad", ["0-10", "20-10", "1-65536", "abc", "10-", "-10", "10-20-30"])
def test_a_malformed_port_range_is_a_value_error(no_advertise_env, bad):
    with pytest.raises(ValueError, match="port_range"):
        TcpEndpoint(ip="127.0.0.1", port=0, port_range=bad)


def test_an_explicit_port_must_lie_in_the_range(no_advertise_env):
    first, last = free_range(2)
    with pytest.raises(ValueError, match=f"port {last + 1} is outside the TcpEndpoint option port_range"):
        TcpEndpoint(ip="127.0.0.1", port=last + 1, port_range=f"{first}-{last}")
    ep = TcpEndpoint(ip="127.0.0.1", port=last, port_range=f"{first}-{last}")
    assert ep.port == last
    ep.shutdown()


# --- PeerAgent --------------------------------------------------------------------------------------------------

def test_peer_agent_endpoints_listen_in_its_port_range_and_publish_the_interface(ctrl_url, unique, no_advertise_env):
    first, last = free_range(4)
    kw = dict(advertise_interface="lo", port_range=f"{first}-{last}")
    a = PeerAgent(ctrl_url=ctrl_url, alias=f"range_a_{unique}", **kw)
    b = PeerAgent(ctrl_url=ctrl_url, alias=f"range_b_{unique}", **kw)
    try:
        client = nanoctrl.NanoCtrlClient(ctrl_url)
        assert client.get_peer_agent(f"range_a_{unique}")["address"] == "127.0.0.1"
        src, dst = Buffer(8192, b"agent range"), Buffer(8192)
        a.register_memory_region("kv", src.addr, 0, 8192)
        b.register_memory_region("kv", dst.addr, 0, 8192)
        conn_a = a.connect_to(f"range_b_{unique}", transport="tcp")
        conn_b = b.connect_to(f"range_a_{unique}", transport="tcp")
        conn_a.wait(30)
        conn_b.wait(30)
        for conn in (conn_a, conn_b):
            info = conn.endpoint.endpoint_info()
            assert info["host"] == "127.0.0.1" and first <= info["port"] <= last, info
            assert first <= conn.peer_endpoint_info["port"] <= last
        assert a.write(f"range_b_{unique}", [("kv", 0, 0, 8192)]).wait_for(30) == OK
        assert dst.bytes() == src.bytes()
    finally:
        a.shutdown()
        b.shutdown()


def test_peer_agent_publishes_what_its_endpoints_advertise(ctrl_url, unique, no_advertise_env):
    a = PeerAgent(ctrl_url=ctrl_url, alias=f"adv_a_{unique}", advertise_host="10.20.30.40")
    try:
        assert nanoctrl.NanoCtrlClient(ctrl_url).get_peer_agent(f"adv_a_{unique}")["address"] == "10.20.30.40"
    finally:
        a.shutdown()
    a = PeerAgent(ctrl_url=ctrl_url, alias=f"adv_b_{unique}")
    try:
        assert nanoctrl.NanoCtrlClient(ctrl_url).get_peer_agent(f"adv_b_{unique}")["address"] == expected_default_address()
    finally:
        a.shutdown()
    with pytest.raises(ValueError, match="advertise_interface 'nosuchif0'"):
        PeerAgent(ctrl_url=ctrl_url, alias=f"adv_c_{unique}", advertise_interface="nosuchif0")


def test_peer_agent_with_an_exhausted_port_range_fails_the_connection_naming_it(ctrl_url, unique, no_advertise_env):
    first, _ = free_range(1)
    taken = socket.socket()
    taken.bind(("0.0.0.0", first))
    taken.listen(1)
    a = PeerAgent(ctrl_url=ctrl_url, alias=f"full_a_{unique}", advertise_interface="lo", port_range=str(first))
    b = PeerAgent(ctrl_url=ctrl_url, alias=f"full_b_{unique}", advertise_interface="lo")
    try:
        # The endpoint is made (and its port taken) in connect_to: the error is raised there.
        with pytest.raises(ConnectionError, match=f"no free port in the TcpEndpoint option port_range {first} "):
            a.connect_to(f"full_b_{unique}", transport="tcp")
        # The agent is still usable: another connection attempt fails the same way, nothing leaked.
        with pytest.raises(ConnectionError, match="port_range"):
            a.connect_to(f"full_b_{unique}", transport="tcp")
    finally:
        a.shutdown()
        b.shutdown()
        taken.close()


def test_a_peer_whose_port_range_is_full_refuses_the_connection_and_says_why(ctrl_url, unique, no_advertise_env):
    first, _ = free_range(1)
    taken = socket.socket()
    taken.bind(("0.0.0.0", first))
    taken.listen(1)
    a = PeerAgent(ctrl_url=ctrl_url, alias=f"pfull_a_{unique}", advertise_interface="lo")
    b = PeerAgent(ctrl_url=ctrl_url, alias=f"pfull_b_{unique}", advertise_interface="lo", port_range=str(first))
    try:
        conn = a.connect_to(f"pfull_b_{unique}", transport="tcp")
        # b cannot make its endpoint when a's connect message arrives: it answers with why,
        # and a fails with that reason instead of timing out on a handshake that never comes.
        with pytest.raises(ConnectionError, match=f"cannot make a tcp endpoint: no free port in the TcpEndpoint "
                                                  f"option port_range {first} "):
            conn.wait(8)
        assert conn.state == "failed"
    finally:
        a.shutdown()
        b.shutdown()
        taken.close()


# --- NanoCtrl ---------------------------------------------------------------------------------------------------

def test_nanoctrl_advertises_a_url_for_other_hosts(no_advertise_env):
    with nanoctrl.NanoCtrlServer(host="0.0.0.0", port=0) as s:
        assert s.url == f"http://127.0.0.1:{s.port}"
        assert s.advertised_url == f"http://{expected_default_address()}:{s.port}"
    with nanoctrl.NanoCtrlServer(host="0.0.0.0", port=0, advertise_interface="lo") as s:
        assert s.advertised_url == f"http://127.0.0.1:{s.port}"
    with nanoctrl.NanoCtrlServer(host="0.0.0.0", port=0, advertise_host="ctrl.example") as s:
        assert s.advertised_url == f"http://ctrl.example:{s.port}"
    with nanoctrl.NanoCtrlServer(host="127.0.0.1", port=0, advertise_host="ctrl.example") as s:
        assert s.advertised_url == s.url  # a specific bind is advertised as is
    with pytest.raises(ValueError, match="advertise_interface 'nosuchif0'"):
        nanoctrl.NanoCtrlServer(host="0.0.0.0", port=0, advertise_interface="nosuchif0").start()
    with pytest.raises(ValueError, match="both set"):
        nanoctrl.NanoCtrlServer(host="0.0.0.0", port=0, advertise_interface="lo", advertise_host="x")


def test_nanoctrl_start_prints_and_records_the_url_for_other_hosts(tmp_path):
    pid_file = str(tmp_path / "nc.pid")
    port = free_port()
    cmd = [sys.executable, "-m", "dlslime.nanoctrl"]
    r = subprocess.run(cmd + ["start", "--host", "0.0.0.0", "--port", str(port), "--advertise-host", "10.1.2.3",
                              "--pid-file", pid_file], capture_output=True, text=True, timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        assert f"at http://127.0.0.1:{port}, other hosts: http://10.1.2.3:{port}" in r.stdout
        meta = json.loads(open(pid_file + ".json").read())
        assert meta["advertised_url"] == f"http://10.1.2.3:{port}" and meta["url"] == f"http://127.0.0.1:{port}"
    finally:
        subprocess.run(cmd + ["stop", "--pid-file", pid_file], capture_output=True, timeout=60)
    r = subprocess.run(cmd + ["server", "--host", "0.0.0.0", "--port", "0", "--advertise-interface", "nosuchif0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "advertise_interface 'nosuchif0'" in r.stderr.strip().splitlines()[-1], r.stderr
    # `start` shows the tail of the daemon's output: the reason is in it, not only the usage.
    r = subprocess.run(cmd + ["start", "--host", "0.0.0.0", "--port", "0", "--advertise-interface", "nosuchif0",
                              "--pid-file", str(tmp_path / "bad.pid")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "advertise_interface 'nosuchif0' does not exist" in r.stderr, (r.stdout, r.stderr)
