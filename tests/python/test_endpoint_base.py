"""dlslime.Endpoint, the surface every transport shares, and the transport registry's
Python face: available_transports() and make_endpoint() (docs/api.md, "Endpoint base
class and available_transports")."""

import pytest

import dlslime
from dlslime import Endpoint, TcpEndpoint
from conftest import Buffer, connect_pair

OK = 0
HARDWARE = ("rdma", "nvlink", "ascend")


@pytest.fixture
def made_pair():
    """Two loopback TCP endpoints made through the registry."""
    a = dlslime.make_endpoint("tcp", ip="127.0.0.1", port=0)
    b = dlslime.make_endpoint("tcp", ip="127.0.0.1")
    yield a, b
    a.shutdown()
    b.shutdown()


def test_tcp_endpoint_is_an_endpoint():
    assert issubclass(TcpEndpoint, Endpoint)
    with TcpEndpoint("127.0.0.1", 0) as ep:
        assert isinstance(ep, Endpoint)
    # The ops are the base class's: a transport's binding adds only its constructor and options.
    for name in ("connect", "read", "write", "send", "recv", "register_memory_region", "capabilities", "shutdown"):
        assert name in Endpoint.__dict__ and name not in TcpEndpoint.__dict__, name


def test_endpoint_has_no_constructor():
    with pytest.raises(TypeError):
        Endpoint()


def test_make_endpoint_returns_the_transports_own_class(made_pair):
    a, _ = made_pair
    assert type(a) is TcpEndpoint and isinstance(a, Endpoint)
    # Its TcpEndpoint surface works on it: host, port, options, repr.
    assert a.host == "127.0.0.1" and a.port > 0
    assert "TcpEndpoint 127.0.0.1" in repr(a)
    assert a.capabilities()["transport"] == "tcp"
    # The context manager hands back the same object.
    with a as same:
        assert same is a


def test_make_endpoint_applies_the_options_json_keys():
    ep = dlslime.make_endpoint("tcp", ip="127.0.0.1", lanes=3, op_timeout_ms=2500, chunk_size=65536)
    try:
        assert ep.options["lanes"] == 3 and ep.options["op_timeout_ms"] == 2500
        assert ep.options["chunk_size"] == 65536
        assert ep.endpoint_info()["lanes"] == 3
    finally:
        ep.shutdown()


def test_made_endpoints_move_bytes_exactly(made_pair):
    a, b = made_pair
    connect_pair(a, b)
    assert a.is_connected() and b.is_connected()
    pattern = bytes(range(256)) * 16
    src, dst = Buffer(4096, pattern), Buffer(4096)
    h_src = a.register_memory_region("src", src.addr, 0, 4096)
    b.register_memory_region("dst", dst.addr, 0, 4096)
    h_dst = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"])
    # write: local[source_offset:] -> remote[target_offset:]
    assert a.write([(h_src, h_dst, 100, 7, 1000)]).wait_for(10) == OK
    assert dst.bytes(100, 1100) == pattern[7:1007]
    assert dst.bytes(0, 100) == bytes(100) and dst.bytes(1100) == bytes(4096 - 1100)
    # read back: remote[target_offset:] -> local[source_offset:]
    back = Buffer(4096)
    h_back = a.register_memory_region("back", back.addr, 0, 4096)
    assert a.read([(h_back, h_dst, 100, 3000, 1000)]).wait_for(10) == OK
    assert back.bytes(3000, 4000) == pattern[7:1007]
    # two-sided
    box = Buffer(4096)
    rv = b.recv((box.addr, 0, 4096))
    assert a.send((src.addr, 5, 333)).wait_for(10) == OK
    assert rv.wait_for(10) == OK and rv.nbytes == 333
    assert box.bytes(0, 333) == pattern[5:338]


def test_available_transports_lists_every_transport_with_its_probe():
    found = dlslime.available_transports()
    names = [t["name"] for t in found]
    assert names[0] == "tcp" and set(HARDWARE) <= set(names)
    for t in found:
        assert set(t) == {"name", "built", "available", "reason", "devices"}
        assert isinstance(t["devices"], list)
    tcp = found[0]
    assert tcp["built"] and tcp["available"] and tcp["reason"] == ""
    for t in found:
        if t["name"] in HARDWARE and not t["available"]:
            assert t["reason"], t  # says why: not built, no device, no driver


def test_unavailable_transport_raises_not_implemented_with_its_reason():
    missing = [t for t in dlslime.available_transports() if not t["available"]]
    assert missing, "this build and host have every transport"  # CI: no RDMA/NVLink/Ascend
    for t in missing:
        with pytest.raises(NotImplementedError) as info:
            dlslime.make_endpoint(t["name"])
        assert type(info.value) is NotImplementedError
        assert t["reason"] in str(info.value)


def test_unknown_transport_raises_value_error_naming_the_known_ones():
    with pytest.raises(ValueError) as info:
        dlslime.make_endpoint("carrier-pigeon")
    assert type(info.value) is ValueError
    assert "carrier-pigeon" in str(info.value) and "tcp" in str(info.value)


def test_unknown_option_raises_value_error_naming_it():
    with pytest.raises(ValueError, match="lanez") as info:
        dlslime.make_endpoint("tcp", ip="127.0.0.1", lanez=2)
    assert type(info.value) is ValueError


def test_make_endpoint_argument_types():
    with pytest.raises(TypeError, match="transport"):
        dlslime.make_endpoint(5)
    # Options must convert to JSON; the message names the option.
    with pytest.raises(TypeError, match=r'options\["lanes"\]'):
        dlslime.make_endpoint("tcp", lanes=object())


def test_base_class_methods_check_argument_types(made_pair):
    a, _ = made_pair
    # Called through the base class, on an endpoint the registry made.
    with pytest.raises(TypeError, match="assignments"):
        Endpoint.write(a, 5)
    with pytest.raises(TypeError, match="chunk"):
        Endpoint.send(a, "nope")
    with pytest.raises(TypeError, match="name"):
        Endpoint.register_memory_region(a, None, 4096, 0, 8)
    with pytest.raises(TypeError, match="name_or_handle"):
        Endpoint.unregister_memory_region(a, 1.5)
    with pytest.raises(TypeError, match="imm_data"):
        Endpoint.write_with_imm(a, [(0, 0, 0, 0, 8)], imm_data="1")
    with pytest.raises(TypeError):
        Endpoint.write(object(), [(0, 0, 0, 0, 8)])  # not an endpoint at all
