"""One "host" of test_two_hosts.py: a process inside a network namespace (and its own UTS
namespace, so its own host name), driven over stdin and stdout, one JSON object per line.
Run as `ip netns exec NS unshare --uts sh -c 'hostname H && exec python3 two_host_peer.py NAME'`
(test_two_hosts.in_host). Every reply also carries "seconds": how long the command took.

On start it answers {"hello": {"hostname", "resolves", "interfaces"}}: its host name, what
that name resolves to (127.0.1.1 on a stock Debian/Ubuntu host: the trap), and the network
interfaces it sees. Then each command is one object with a "cmd" key, answered by one object;
a command that raises answers {"error": [exception class, message], "seconds": s}.

Endpoint commands (one TcpEndpoint, bound to 0.0.0.0, region "r" filled with pattern(NAME)):
  endpoint {options}       make it; answers {"info": endpoint_info()}
  probe_endpoint {options} make another one, answer its info (or the error), shut it down
  connect {peer}           connect(peer) and register the peer's "r"; {"connected": true, "seconds"}
  write {n, at}            write this side's r[0:n] to the peer's r[at:at+n]; {"status"}
  read {n, at}             read the peer's r[0:n] into this side's r[at:at+n]; {"status"}
  post_recv {n}            post a recv of n bytes (answered at once: {"posted": true})
  recv_wait {}             wait for it; {"status", "bytes"}
  send {n}                 send this side's r[0:n]; {"status"}
  bytes {start, end}       this side's r[start:end] as hex
  arm {seconds}            post a recv and an 8 MiB write to the peer (neither can complete
                           on a dead link), wait at most that long; {"recv": [status, seconds,
                           message], "write": [...]} for the futures that ended
Agent commands (one PeerAgent, region "r" as above):
  agent {ctrl_url, alias, options}          make it; {"alias"}
  connect_to {peer, timeout}                connect_to(peer) from this side, waits at most
                                            timeout s for the connection; {"state"}
  agent_write {peer, n, at} / agent_read    the endpoint commands' write/read, by region name
  agent_info {peer}                         this side's endpoint_info, the peer's, and the
                                            peer's published address (get_resource)
Socket commands (to check the firewall and hold ports):
  listen {port}            a plain listening socket on 0.0.0.0:port; {"listening": port}
  dial {host, port, timeout}  a plain TCP connect; {"dialed": true} or an error
  exit {}"""

import ctypes
import json
import socket
import sys
import time

import dlslime

REGION = 8 << 20


def pattern(name, n):
    """The first n bytes of a host's region: different per host and per offset (period 251)."""
    seed = sum(name.encode())
    period = bytes((i * 7 + seed) % 251 for i in range(251))
    return (period * (n // 251 + 1))[:n]


def say(**msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


class Host:
    def __init__(self, name):
        self.name = name
        self.buf = ctypes.create_string_buffer(pattern(name, REGION), REGION)
        self.addr = ctypes.addressof(self.buf)
        self.ep = self.agent = self.conn = self.h_local = self.h_remote = self.pending_recv = None
        self.inbox = ctypes.create_string_buffer(1 << 20)
        self.sockets = []

    # endpoint
    def endpoint(self, options):
        self.ep = dlslime.TcpEndpoint(ip="0.0.0.0", port=0, **options)
        self.h_local = self.ep.register_memory_region("r", self.addr, 0, REGION)
        return {"info": self.ep.endpoint_info()}

    def probe_endpoint(self, options):
        ep = dlslime.TcpEndpoint(ip="0.0.0.0", port=0, **options)
        try:
            return {"info": ep.endpoint_info()}
        finally:
            ep.shutdown()

    def connect(self, peer):
        self.ep.connect(peer)
        self.h_remote = self.ep.register_remote_memory_region("r", peer["mr_info"]["r"])
        return {"connected": True}

    def write(self, n, at):
        return {"status": status(self.ep.write([(self.h_local, self.h_remote, at, 0, n)]))}

    def read(self, n, at):
        return {"status": status(self.ep.read([(self.h_local, self.h_remote, 0, at, n)]))}

    def post_recv(self, n):
        self.pending_recv = self.ep.recv((ctypes.addressof(self.inbox), 0, n)), n
        return {"posted": True}

    def recv_wait(self):
        fut, n = self.pending_recv
        return {"status": status(fut), "bytes": self.inbox.raw[:n].hex()}

    def send(self, n):
        return {"status": status(self.ep.send((self.addr, 0, n)))}

    def bytes(self, start, end):
        return {"bytes": self.buf.raw[start:end].hex()}

    def arm(self, seconds):
        t0 = time.monotonic()
        recv = self.ep.recv((ctypes.addressof(self.inbox), 0, 64))
        write = self.ep.write([(self.h_local, self.h_remote, 0, 0, REGION)])
        ended = {}
        deadline = t0 + seconds
        while len(ended) < 2 and time.monotonic() < deadline:
            for name, fut in (("recv", recv), ("write", write)):
                if name not in ended and fut.wait_for(0.05) is not None:
                    ended[name] = [int(fut.status), round(time.monotonic() - t0, 2), fut.message]
        return ended

    # agent
    def agent_(self, ctrl_url, alias, options):
        self.agent = dlslime.PeerAgent(ctrl_url=ctrl_url, alias=alias, **options)
        self.agent.register_memory_region("r", self.addr, 0, REGION)
        return {"alias": self.agent.alias}

    def connect_to(self, peer, timeout):
        self.conn = self.agent.connect_to(peer, transport="tcp")
        self.conn.wait(timeout)
        return {"state": self.conn.state}

    def agent_write(self, peer, n, at):
        return {"status": status(self.agent.write(peer, [("r", 0, at, n)]))}

    def agent_read(self, peer, n, at):
        return {"status": status(self.agent.read(peer, [("r", at, 0, n)]))}

    def agent_info(self, peer):
        resource = self.agent.get_resource(peer)
        return {"mine": self.conn.endpoint.endpoint_info(), "peer": self.conn.peer_endpoint_info,
                "published": resource["host"]["address"] if resource else None}

    # sockets
    def listen(self, port):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.listen(8)
        self.sockets.append(s)
        return {"listening": s.getsockname()[1]}

    def dial(self, host, port, timeout):
        socket.create_connection((host, port), timeout=timeout).close()
        return {"dialed": True}


def status(fut, timeout=30):
    code = fut.wait_for(timeout)
    return None if code is None else [int(code), fut.message]


def hello():
    name = socket.gethostname()
    try:
        resolves = socket.gethostbyname(name)
    except OSError as e:
        resolves = f"unresolvable: {e}"
    return {"hostname": name, "resolves": resolves, "interfaces": sorted(n for _, n in socket.if_nameindex())}


def main(name):
    host = Host(name)
    say(hello=hello())
    handlers = {name: getattr(host, name) for name in (
        "endpoint", "probe_endpoint", "connect", "write", "read", "post_recv", "recv_wait", "send", "bytes", "arm",
        "connect_to", "agent_write", "agent_read", "agent_info", "listen", "dial")}
    handlers["agent"] = host.agent_
    for line in sys.stdin:
        cmd = json.loads(line)
        what = cmd.pop("cmd")
        if what == "exit":
            break
        t0 = time.monotonic()
        try:
            reply = handlers[what](**cmd)
        except Exception as e:  # reported to the test, which asserts on it
            reply = {"error": [type(e).__name__, str(e)]}
        reply["seconds"] = round(time.monotonic() - t0, 2)
        say(**reply)
    for s in host.sockets:
        s.close()
    if host.agent is not None:
        host.agent.shutdown()
    if host.ep is not None:
        host.ep.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
