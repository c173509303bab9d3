"""The bindings' argument and error contract (docs/api.md, "Arguments" and "Exceptions"):
a wrong type raises TypeError, a value out of range ValueError, each naming the argument;
nesting is bounded in both JSON directions; library errors map to one Python class per
status code."""

import ctypes
import http.server
import mmap
import threading

import pytest

import dlslime
from dlslime import NanoCtrlClient, NanoCtrlServer, PeerAgent, StatusCode, TcpEndpoint
from conftest import Buffer, connect_pair

BIG = 2**70


class Ctx:
    """What the bad-argument table needs, made on first use."""

    def __init__(self, ctrl_url, unique):
        self.ctrl_url, self.unique = ctrl_url, unique
        self.buf = Buffer(64)
        self._ep = self._agent = self._conn = None

    @property
    def ep(self):
        if self._ep is None:
            self._ep = TcpEndpoint("127.0.0.1", 0)
        return self._ep

    @property
    def addr(self):
        return self.buf.addr

    @property
    def client(self):
        return NanoCtrlClient(self.ctrl_url)

    @property
    def agent(self):
        if self._agent is None:
            self._agent = PeerAgent(ctrl_url=self.ctrl_url, alias=f"errs_{self.unique}")
        return self._agent

    @property
    def conn(self):
        if self._conn is None:
            self._conn = self.agent.connect_to(f"ghost_{self.unique}", transport="tcp")
        return self._conn

    def close(self):
        if self._ep is not None:
            self._ep.shutdown()
        if self._agent is not None:
            self._agent.shutdown()


@pytest.fixture
def ctx(ctrl_url, unique):
    c = Ctx(ctrl_url, unique)
    yield c
    c.close()


ITEM = (0, 0, 0, 0, 8)

# (id, call, exception class, text the message must contain: the argument's name)
BAD_ARGUMENTS = [
    # TcpEndpoint construction and its keyword options
    ("ep_port_huge", lambda c: TcpEndpoint("127.0.0.1", BIG), ValueError, "port"),
    ("ep_port_65536", lambda c: TcpEndpoint("127.0.0.1", 65536), ValueError, "port"),
    ("ep_port_str", lambda c: TcpEndpoint("127.0.0.1", "1"), TypeError, "port"),
    ("ep_ip_none", lambda c: TcpEndpoint(None, 0), TypeError, "ip"),
    ("lanes_negative", lambda c: TcpEndpoint("127.0.0.1", 0, lanes=-1), ValueError, "lanes"),
    ("lanes_str", lambda c: TcpEndpoint("127.0.0.1", 0, lanes="2"), TypeError, "lanes"),
    ("lanes_float", lambda c: TcpEndpoint("127.0.0.1", 0, lanes=2.0), TypeError, "lanes"),
    ("chunk_size_huge", lambda c: TcpEndpoint("127.0.0.1", 0, chunk_size=BIG), ValueError, "chunk_size"),
    ("timeout_str", lambda c: TcpEndpoint("127.0.0.1", 0, timeout="5"), TypeError, "timeout"),
    ("timeout_nan", lambda c: TcpEndpoint("127.0.0.1", 0, timeout=float("nan")), ValueError, "timeout"),
    ("connect_timeout_negative", lambda c: TcpEndpoint("127.0.0.1", 0, connect_timeout=-1), ValueError,
     "connect_timeout"),
    ("recv_timeout_none", lambda c: TcpEndpoint("127.0.0.1", 0, recv_timeout=None), TypeError, "recv_timeout"),
    ("sndbuf_huge", lambda c: TcpEndpoint("127.0.0.1", 0, sndbuf=2**40), ValueError, "sndbuf"),
    ("keepalive_idle_str", lambda c: TcpEndpoint("127.0.0.1", 0, keepalive_idle="5"), TypeError, "keepalive_idle"),
    ("max_inflight_negative", lambda c: TcpEndpoint("127.0.0.1", 0, max_inflight_ops=-1), ValueError,
     "max_inflight_ops"),
    ("max_batch_huge", lambda c: TcpEndpoint("127.0.0.1", 0, max_batch_items=2**32), ValueError, "max_batch_items"),
    ("unexpected_buffer_huge", lambda c: TcpEndpoint("127.0.0.1", 0, unexpected_buffer_bytes=2**64), ValueError,
     "unexpected_buffer_bytes"),
    ("advertise_host_int", lambda c: TcpEndpoint("127.0.0.1", 0, advertise_host=5), TypeError, "advertise_host"),
    ("token_int", lambda c: TcpEndpoint("127.0.0.1", 0, token=5), TypeError, "token"),
    # Host text with a NUL: the resolver would read "127.0.0.1" (hostile review 16i)
    ("ep_ip_nul", lambda c: TcpEndpoint("127.0.0.1\x00x", 0), ValueError, "0x00"),
    ("advertise_host_nul", lambda c: TcpEndpoint("0.0.0.0", 0, advertise_host="not a host \x00"), ValueError,
     "advertise_host"),
    ("connect_host_nul", lambda c: c.ep.connect({"host": "127.0.0.1\x00x", "port": 1}), ValueError, "'host'"),
    ("unknown_option", lambda c: TcpEndpoint("127.0.0.1", 0, lanez=2), TypeError, "lanez"),
    # Regions
    ("register_name_none", lambda c: c.ep.register_memory_region(None, c.addr, 0, 8), TypeError, "name"),
    ("register_addr_huge", lambda c: c.ep.register_memory_region("r", 2**64, 0, 8), ValueError, "addr"),
    ("register_addr_negative", lambda c: c.ep.register_memory_region("r", -1, 0, 8), ValueError, "addr"),
    ("register_offset_str", lambda c: c.ep.register_memory_region("r", c.addr, "0", 8), TypeError, "offset"),
    ("register_length_huge", lambda c: c.ep.register_memory_region("r", c.addr, 0, 2**64), ValueError, "length"),
    # bool is an int subclass; True is never a handle or an address (hostile review 16h)
    ("register_addr_bool", lambda c: c.ep.register_memory_region("r", True, 0, 8), TypeError, "addr"),
    ("register_length_bool", lambda c: c.ep.register_memory_region("r", c.addr, 0, True), TypeError, "length"),
    ("write_handle_bool", lambda c: c.ep.write([(True, 0, 0, 0, 8)]), TypeError, "local_handle"),
    ("send_addr_bool", lambda c: c.ep.send((True, 0, 8)), TypeError, "addr"),
    ("unregister_handle_bool", lambda c: c.ep.unregister_memory_region(True), TypeError, "name_or_handle"),
    ("remote_name_none", lambda c: c.ep.register_remote_memory_region(None, {}), TypeError, "name"),
    ("remote_info_object", lambda c: c.ep.register_remote_memory_region("r", object()), TypeError, "mr_info"),
    ("unregister_none", lambda c: c.ep.unregister_memory_region(None), TypeError, "name_or_handle"),
    ("unregister_handle_huge", lambda c: c.ep.unregister_memory_region(2**40), ValueError, "name_or_handle"),
    # connect's peer_info
    ("connect_port_huge", lambda c: c.ep.connect({"port": BIG}), ValueError, 'peer_info["port"]'),
    ("connect_int_key", lambda c: c.ep.connect({1: 2}), TypeError, "peer_info"),
    ("connect_object", lambda c: c.ep.connect({"host": object()}), TypeError, 'peer_info["host"]'),
    # Chunks and assignments
    ("send_length_huge", lambda c: c.ep.send((c.addr, 0, 2**64)), ValueError, "length"),
    ("send_two_fields", lambda c: c.ep.send((c.addr, 0)), TypeError, "3 fields"),
    ("recv_addr_huge", lambda c: c.ep.recv((2**64, 0, 8)), ValueError, "addr"),
    ("recv_not_a_tuple", lambda c: c.ep.recv(5), TypeError, "chunk"),
    ("write_length_huge", lambda c: c.ep.write([(0, 0, 0, 0, 2**64)]), ValueError, "length"),
    ("write_handle_huge", lambda c: c.ep.write([(2**31, 0, 0, 0, 8)]), ValueError, "local_handle"),
    ("write_handle_str", lambda c: c.ep.write([(0, "0", 0, 0, 8)]), TypeError, "remote_handle"),
    ("read_offset_negative", lambda c: c.ep.read([(0, 0, -1, 0, 8)]), ValueError, "target_offset"),
    ("read_offset_float", lambda c: c.ep.read([(0, 0, 0, 1.5, 8)]), TypeError, "source_offset"),
    ("write_not_a_list", lambda c: c.ep.write(5), TypeError, "assignments"),
    # A chunk whose range wraps around the address space (hostile review N12)
    ("send_chunk_wraps", lambda c: c.ep.send((c.addr, 2**64 - 1, 2)), ValueError, "overflows"),
    ("recv_chunk_wraps", lambda c: c.ep.recv((c.addr, 8, 2**64 - 8)), ValueError, "overflows"),
    # `stream`: None, a CUDA stream handle or a stream object; it is unused, never ignored
    ("write_stream_str", lambda c: c.ep.write([ITEM], stream="x"), TypeError, "stream"),
    ("send_stream_bool", lambda c: c.ep.send((c.addr, 0, 8), True), TypeError, "stream"),
    ("recv_stream_float", lambda c: c.ep.recv((c.addr, 0, 8), 1.5), TypeError, "stream"),
    ("imm_recv_stream_negative", lambda c: c.ep.imm_recv(-1), ValueError, "stream"),
    ("agent_stream_str", lambda c: c.agent.send("p", (c.addr, 0, 8), "x"), TypeError, "stream"),
    ("imm_data_huge", lambda c: c.ep.write_with_imm([ITEM], imm_data=2**32), ValueError, "imm_data"),
    # Futures
    ("wait_for_str", lambda c: c.ep.recv((c.addr, 0, 8)).wait_for("5"), TypeError, "seconds"),
    ("wait_for_nan", lambda c: c.ep.recv((c.addr, 0, 8)).wait_for(float("nan")), ValueError, "seconds"),
    ("wait_for_negative", lambda c: c.ep.recv((c.addr, 0, 8)).wait_for(-1), ValueError, "seconds"),
    # NanoCtrl server and client
    ("server_port_huge", lambda c: NanoCtrlServer(port=70000), ValueError, "port"),
    ("server_threads_negative", lambda c: NanoCtrlServer(max_threads=-1), ValueError, "max_threads"),
    ("server_ttl_nan", lambda c: NanoCtrlServer(ttl=float("nan")), ValueError, "ttl"),
    ("server_max_body_str", lambda c: NanoCtrlServer(max_body="1"), TypeError, "max_body"),
    ("client_timeout_str", lambda c: NanoCtrlClient(c.ctrl_url, timeout="5"), TypeError, "timeout"),
    ("client_timeout_negative", lambda c: NanoCtrlClient(c.ctrl_url, timeout=-1), ValueError, "timeout"),
    ("client_recv_timeout_nan", lambda c: c.client.recv("x", timeout=float("nan")), ValueError, "timeout"),
    ("client_recv_max_negative", lambda c: c.client.recv("x", max_messages=-1), ValueError, "max_messages"),
    ("topology_targets_str", lambda c: c.client.set_desired_topology("a", "b"), TypeError, "target_peers"),
    ("topology_symmetric_int", lambda c: c.client.set_desired_topology("a", ["b"], 1), TypeError, "symmetric"),
    ("client_post_object", lambda c: c.client.post("x", {"a": object()}), TypeError, 'message["a"]'),
    # PeerAgent and its connections
    ("agent_heartbeat_str", lambda c: PeerAgent(ctrl_url=c.ctrl_url, heartbeat_interval="1"), TypeError,
     "heartbeat_interval"),
    ("agent_lanes_negative", lambda c: PeerAgent(ctrl_url=c.ctrl_url, lanes=-1), ValueError, "lanes"),
    ("agent_alias_int", lambda c: PeerAgent(ctrl_url=c.ctrl_url, alias=5), TypeError, "alias"),
    ("agent_register_addr_huge", lambda c: c.agent.register_memory_region("r", 2**64, 0, 8), ValueError, "addr"),
    ("agent_register_name_none", lambda c: c.agent.register_memory_region(None, c.addr, 0, 8), TypeError, "name"),
    ("agent_unregister_none", lambda c: c.agent.unregister_memory_region(None), TypeError, "name"),
    ("agent_local_port_huge", lambda c: c.agent.connect_to("p", transport="tcp", local_port=70000), ValueError,
     "local_port"),
    ("agent_ib_port_str", lambda c: c.agent.connect_to("p", transport="tcp", ib_port="1"), TypeError, "ib_port"),
    ("agent_transport_none", lambda c: c.agent.connect_to("p", transport=None), TypeError, "transport"),
    ("agent_peer_none", lambda c: c.agent.send(None, (c.addr, 0, 8)), TypeError, "peer"),
    ("agent_named_offset_negative", lambda c: c.agent.write("p", [("kv", -1, 0, 8)]), ValueError, "local_offset"),
    ("agent_named_length_huge", lambda c: c.agent.read("p", ("kv", 0, 0, 2**64)), ValueError, "length"),
    ("agent_imm_data_negative", lambda c: c.agent.write_with_imm("p", [ITEM], imm_data=-1), ValueError,
     "imm_data"),
    ("conn_wait_nan", lambda c: c.conn.wait(float("nan")), ValueError, "timeout"),
    ("conn_wait_str", lambda c: c.conn.wait("1"), TypeError, "timeout"),
]


@pytest.mark.parametrize("call,exc,names", [b[1:] for b in BAD_ARGUMENTS], ids=[b[0] for b in BAD_ARGUMENTS])
def test_bad_argument_raises_the_documented_class_naming_it(ctx, call, exc, names):
    with pytest.raises(Exception) as info:
        call(ctx)
    # Exactly the documented class: RuntimeError("Unable to cast ...") was the old answer.
    assert type(info.value) is exc, f"{type(info.value).__name__}: {info.value}"
    assert names in str(info.value)
    assert "Unable to cast" not in str(info.value)


# --- Nesting (item 5) --------------------------------------------------------------------

def deep_list(depth):
    top = cur = []
    for _ in range(depth):
        nxt = []
        cur.append(nxt)
        cur = nxt
    return top


def self_referencing():
    d = {"host": "127.0.0.1", "port": 1}
    d["mr_info"] = d
    return d


DEEP_ARGUMENTS = [
    ("connect_self_reference", lambda c: c.ep.connect(self_referencing())),
    ("connect_deep_list", lambda c: c.ep.connect({**c.ep.endpoint_info(), "extra": deep_list(40000)})),
    ("register_remote_deep", lambda c: c.ep.register_remote_memory_region("r", {"x": deep_list(40000)})),
    ("register_remote_self_reference", lambda c: c.ep.register_remote_memory_region("r", self_referencing())),
    ("client_post_deep", lambda c: c.client.post("x", deep_list(40000))),
    ("client_post_self_reference", lambda c: c.client.post("x", self_referencing())),
    ("start_peer_agent_metadata", lambda c: c.client.start_peer_agent(metadata=self_referencing())),
    ("client_call_deep", lambda c: c.client.call("/query", {"a": deep_list(40000)})),
]


@pytest.mark.parametrize("call", [d[1] for d in DEEP_ARGUMENTS], ids=[d[0] for d in DEEP_ARGUMENTS])
def test_deep_or_self_referencing_argument_raises_value_error(ctx, call):
    with pytest.raises(ValueError, match="deeper than 64 levels"):
        call(ctx)


def test_nesting_up_to_the_limit_is_accepted(ctx):
    def converts(value):
        try:
            ctx.ep.register_remote_memory_region("r", value)
        except ValueError as e:  # a record this deep is not a valid mr_info entry either
            return "deeper than" not in str(e)
        return True

    assert converts(deep_list(63))  # 64 nested lists
    assert not converts(deep_list(64))


class DeepReplyHandler(http.server.BaseHTTPRequestHandler):
    """A hostile 'NanoCtrl' whose every answer is a 200,000-deep JSON array."""

    BODY = b"[" * 200000 + b"]" * 200000

    def _reply(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.BODY)))
        self.end_headers()
        self.wfile.write(self.BODY)

    do_GET = do_POST = _reply

    def log_message(self, *args):
        pass


def test_deep_json_reply_from_a_server_raises_value_error():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), DeepReplyHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = NanoCtrlClient(f"http://127.0.0.1:{server.server_address[1]}", timeout=10)
        for request in (client.query, client.healthz, lambda: client.call("/anything", {})):
            with pytest.raises(ValueError, match="NanoCtrl's reply is nested deeper than 64 levels"):
                request()
    finally:
        server.shutdown()
        server.server_close()


# --- Exceptions by status code (item 26) -----------------------------------------------

def test_not_implemented_from_the_agent_is_not_implemented_error(ctx):
    with pytest.raises(NotImplementedError, match="rdma") as info:
        ctx.agent.connect_to(f"someone_{ctx.unique}")  # rdma: this build and host have none
    assert type(info.value) is NotImplementedError
    # It says why, and what this host has instead (the registry's probe results).
    assert "not available here" in str(info.value) and "tcp" in str(info.value)


def test_not_connected_is_connection_error(ctx):
    with pytest.raises(ConnectionError, match="connect_to"):
        ctx.agent.send(f"nobody_{ctx.unique}", (ctx.addr, 0, 8))


def test_each_error_class_from_the_endpoint(ctx):
    with pytest.raises(KeyError):
        ctx.ep.unregister_memory_region("never_registered")
    with pytest.raises(NotImplementedError):
        ctx.ep.imm_recv()
    with pytest.raises(ValueError):
        ctx.ep.write([])  # an empty batch
    with pytest.raises(ValueError):
        TcpEndpoint("127.0.0.1", 0, lanes=0)  # in the field's range, refused by validate()
    with pytest.raises(TimeoutError, match="ghost_"):
        ctx.conn.wait(0.05)


def test_registering_on_a_shut_down_endpoint_is_value_error(ctx):
    # As for a closed file (hostile review 16g): no handle for an endpoint that is gone.
    ep = TcpEndpoint("127.0.0.1", 0)
    ep.shutdown()
    with pytest.raises(ValueError, match="shut down"):
        ep.register_memory_region("late", ctx.addr, 0, 8)


def _libc_mmap(length, prot):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    addr = libc.mmap(None, length, prot, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    return libc, addr


def test_registering_memory_the_process_cannot_read_is_value_error():
    # A PROT_NONE page would fault an I/O thread on first use (hostile review 16m); a NIC's
    # ibv_reg_mr refuses it with EFAULT. Refused at registration, naming the address.
    page = mmap.PAGESIZE
    libc, addr = _libc_mmap(3 * page, mmap.PROT_READ | mmap.PROT_WRITE)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(addr + page, page, mmap.PROT_READ) == 0
    assert libc.mprotect(addr + 2 * page, page, 0) == 0  # PROT_NONE: a guard page
    ep = TcpEndpoint("127.0.0.1", 0)
    try:
        assert ep.register_memory_region("rw_and_read_only", addr, 0, 2 * page) >= 0
        with pytest.raises(ValueError, match=f"memory at {addr + 2 * page:#x} is not readable") as info:
            ep.register_memory_region("into_the_guard_page", addr, 0, 3 * page)
        assert "memory region 'into_the_guard_page'" in str(info.value)
        with pytest.raises(ValueError, match="memory at 0x1000 is not mapped"):  # below vm.mmap_min_addr
            ep.register_memory_region("nowhere", 0x1000, 0, page)
        assert sorted(ep.mr_info()) == ["rw_and_read_only"]
    finally:
        ep.shutdown()
        libc.munmap(addr, 3 * page)


def test_connect_refused_is_connection_error():
    listener = TcpEndpoint("127.0.0.1", 0)
    info = listener.endpoint_info()
    listener.shutdown()  # nobody listens on that port any more
    ep = TcpEndpoint("127.0.0.1", 0, connect_timeout=5)
    try:
        with pytest.raises(ConnectionError):
            ep.connect(info)
    finally:
        ep.shutdown()


def test_running_future_status_is_pending_not_failed(ctx):
    fut = ctx.ep.recv((ctx.addr, 0, 8))  # nobody sends
    assert not fut.done()
    assert fut.status == int(StatusCode.PENDING) == 1
    assert fut.status != int(StatusCode.FAILED)
    assert fut.message == "operation still running"
    assert "running" in repr(fut)


def test_completed_future_status_is_final(ctx):
    a, b = TcpEndpoint("127.0.0.1", 0), TcpEndpoint("127.0.0.1", 0)
    try:
        connect_pair(a, b)
        src, dst = Buffer(8, b"x"), Buffer(8)
        rv = b.recv((dst.addr, 0, 8))
        assert a.send((src.addr, 0, 8)).wait() == 0
        assert rv.wait_for(10) == 0 and rv.status == int(StatusCode.SUCCESS)
    finally:
        a.shutdown()
        b.shutdown()


def test_status_codes_have_names():
    assert int(StatusCode.PENDING) == 1
    assert dlslime.StatusCode.AUTHENTICATION_FAILED.value == 414
