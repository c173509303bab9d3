"""Upstream DLSlime 0.1.23's RDMA script shapes run unchanged on the simulated device
(DLSLIME_RDMA_SIM=1, set in a child process before the library looks for devices):
RDMAContext -> RDMAMemoryPool(ctx) -> RDMAEndpoint(pool=...) -> connect -> read, write,
write_with_imm with a positional stream, imm_recv(None).imm_data(), checked byte-exact, in
one process and across two (docs/upstream-compat.md, "RDMA")."""

import os

import pytest

import dlslime
from conftest import REPO, run_script

pytestmark = pytest.mark.skipif(not hasattr(dlslime, "RDMAEndpoint"),
                                reason="RDMA transport not built (configure with -DBUILD_RDMA=ON)")


def run_sim(script, tmp_path, timeout=120):
    run_script(tmp_path, script, env={"DLSLIME_RDMA_SIM": "1"}, timeout=timeout,
               path=[os.path.join(REPO, "examples", "python")])


ONE_PROCESS = """
    import ctypes
    import dlslime
    from dlslime import RDMAContext, RDMAEndpoint, RDMAMemoryPool, StatusCode, available_nic

    nic = available_nic()[0]
    ctx = RDMAContext()
    assert ctx.init(nic, 1, "RoCE") == 0
    pool = RDMAMemoryPool(ctx)

    src = ctypes.create_string_buffer(bytes(range(256)) * 16, 4096)
    back = ctypes.create_string_buffer(4096)
    dst = ctypes.create_string_buffer(8192)
    # Upstream's pool call: register_memory_region(data_ptr, length, name) -> handle.
    h_src = pool.register_memory_region(ctypes.addressof(src), 4096, "src")
    assert pool.get_handle("src") == h_src and pool.get_handle("nope") == -1

    initiator = RDMAEndpoint(pool=pool, num_qp=2)
    target = RDMAEndpoint(RDMAMemoryPool(ctx), 2)           # upstream's positional (pool, num_qp)
    assert initiator.get_pool() is pool
    h_dst = target.get_pool().register_memory_region(data_ptr=ctypes.addressof(dst), length=8192, name="dst")
    # A region registered on the endpoint is the pool's too, and the other way round.
    h_back = initiator.register_memory_region("back", ctypes.addressof(back), 0, 4096)
    assert pool.get_handle("back") == h_back
    assert set(initiator.mr_info()) == {"src", "back"} and initiator.mr_info()["src"]["handle"] == h_src

    target.connect(initiator.endpoint_info())
    initiator.connect(target.endpoint_info())
    h_remote = initiator.register_remote_memory_region("dst", target.endpoint_info()["mr_info"]["dst"])

    # (local, remote, target_offset=REMOTE, source_offset=LOCAL, length), stream positional.
    w = initiator.write([(h_src, h_remote, 100, 7, 1000)], None)
    assert w.wait() == 0, w.message
    assert dst.raw[100:1100] == src.raw[7:1007]
    r = initiator.read([(h_back, h_remote, 100, 0, 1000)], None)
    assert r.wait() == 0, r.message
    assert back.raw[:1000] == src.raw[7:1007]

    imm = target.imm_recv(None)
    wi = initiator.write_with_imm([(h_src, h_remote, 4096, 0, 4096)], 1, None)
    assert wi.wait() == 0 and imm.wait() == 0, (wi.message, imm.message)
    assert imm.imm_data() == 1 and dst.raw[4096:] == src.raw
    # Upstream's RDMA future class names are our Future.
    assert isinstance(w, dlslime.SlimeReadWriteFuture) and isinstance(imm, dlslime.SlimeImmRecvFuture)
    assert dlslime.SlimeSendFuture is dlslime.SlimeRecvFuture is dlslime.Future

    # A region added to the pool after the endpoint exists is usable on it at once.
    late = ctypes.create_string_buffer(b"late bytes", 64)
    h_late = pool.register_memory_region(ctypes.addressof(late), 64, "late")
    assert initiator.write([(h_late, h_remote, 0, 0, 10)], None).wait() == 0
    assert dst.raw[:10] == b"late bytes"
    # Unregistered through the pool: gone from the endpoint too.
    assert pool.unregister_memory_region("late") == 0
    gone = initiator.write([(h_late, h_remote, 0, 0, 10)], None)
    assert gone.wait() == int(StatusCode.UNKNOWN_HANDLE), (gone.status, gone.message)

    # A second endpoint on the pool has the pool's regions under the same handles.
    other = RDMAEndpoint(pool)
    assert {n: e["handle"] for n, e in other.mr_info().items()} == {"src": h_src, "back": h_back}
    # RDMAEndpoint(context=...): a new pool of its own on that context.
    own = RDMAEndpoint(context=ctx)
    assert own.get_pool() is not pool and own.get_pool().context is ctx and len(own.get_pool()) == 0
    for ep in (own, other, initiator, target):
        ep.shutdown()
    print("OK")
"""


def test_upstream_rdma_script_in_one_process(tmp_path):
    run_sim(ONE_PROCESS, tmp_path)


ERRORS = """
    import ctypes
    import dlslime
    from dlslime import RDMAContext, RDMAEndpoint, RDMAMemoryPool, available_nic

    def raises(exc, fn, *args, **kwargs):
        try:
            fn(*args, **kwargs)
        except exc as e:
            return str(e)
        raise AssertionError(f"{fn} did not raise {exc.__name__}")

    nic = available_nic()[0]
    assert "no RDMA device named 'mlx5_9'" in raises(KeyError, RDMAContext().init, "mlx5_9")
    assert "link_type" in raises(ValueError, RDMAContext().init, nic, 1, "Token-Ring")
    assert "ib_port" in raises(ValueError, RDMAContext, nic, 0)
    # A port the device does not have (active) is refused at once, naming the active ones
    # (hostile review N12), not when an endpoint first opens it.
    assert f"ib_port=7 is not an active port of {nic} (active ports: {nic}:1" in raises(ValueError, RDMAContext, nic, 7)
    assert "ib_port=7 is not an active port of any RDMA device" in raises(ValueError, RDMAContext().init, "", 7)
    assert "not initialised" in raises(ValueError, RDMAMemoryPool, RDMAContext())
    raises(TypeError, RDMAMemoryPool, "sim_rdma0")

    ctx = RDMAContext(nic)
    assert ctx.device_name == nic and not ctx.closed
    assert "already initialised" in raises(ValueError, ctx.init, nic, 2)
    pool = RDMAMemoryPool(ctx)
    buf = ctypes.create_string_buffer(64)
    raises(ValueError, pool.register_memory_region, ctypes.addressof(buf), 64, "")
    raises(ValueError, pool.register_memory_region, ctypes.addressof(buf), -1, "neg")
    raises(ValueError, pool.register_memory_region, 0, 64, "null")
    raises(TypeError, pool.register_memory_region, "0x10", 64, "str")
    raises(TypeError, pool.register_memory_region, ctypes.addressof(buf), 64.0, "float")
    raises(KeyError, pool.unregister_memory_region, "never")
    raises(ValueError, pool.register_dmabuf_memory_region, 3, 0, 64, 0)  # iova 0 is not GPU memory
    # Unnamed (upstream's name=None): named by its address.
    h = pool.register_memory_region(ctypes.addressof(buf), 64)
    assert pool.get_handle(hex(ctypes.addressof(buf))) == h

    # A pool with a context of another choice, a context or pool of the wrong kind, a
    # device given twice, a worker this package does not have.
    other = RDMAContext(nic)
    assert "belongs to RDMAContext" in raises(ValueError, RDMAEndpoint, pool=pool, context=other)
    assert "RDMAMemoryPool" in raises(TypeError, RDMAEndpoint, pool=dlslime.TcpMemoryPool())
    raises(TypeError, RDMAEndpoint, context=pool)
    raises(TypeError, RDMAEndpoint, pool, device_name=nic)
    raises(TypeError, RDMAEndpoint, pool, 1, object())
    raises(TypeError, RDMAEndpoint, pool, num_qp=1, pool=pool)
    raises(TypeError, RDMAEndpoint, pool=None)
    assert "unknown RDMAEndpoint option" in raises(ValueError, RDMAEndpoint, pool, no_such_option=1)

    # A closed context: no new pool or endpoint on it; an endpoint made before keeps working.
    ep = RDMAEndpoint(pool)
    ctx.stop_future()
    assert ctx.closed
    assert "closed" in raises(ValueError, RDMAMemoryPool, ctx)
    assert "closed" in raises(ValueError, RDMAEndpoint, pool=pool)
    assert "closed" in raises(ValueError, RDMAEndpoint, context=ctx)
    assert "closed" in raises(ValueError, ctx.init, nic)
    assert ep.mr_info()[hex(ctypes.addressof(buf))]["handle"] == h
    ep.shutdown()
    print("OK")
"""


def test_upstream_rdma_forms_raise_clear_errors(tmp_path):
    run_sim(ERRORS, tmp_path)


TWO_PROCESS = """
    import ctypes
    import sys

    from _two_process import run

    SIZE = 1 << 20

    def content(n):
        return bytes((i * 7 + 3) & 0xFF for i in range(256)) * (n // 256)

    def endpoint():
        from dlslime import RDMAContext, RDMAEndpoint, RDMAMemoryPool, available_nic
        ctx = RDMAContext()
        assert ctx.init(available_nic()[0], 1, "RoCE") == 0
        pool = RDMAMemoryPool(ctx)
        return pool, RDMAEndpoint(pool=pool, num_qp=2)

    def target(pipe):
        weights = ctypes.create_string_buffer(content(SIZE), SIZE)
        inbox = ctypes.create_string_buffer(4096)
        pool, ep = endpoint()
        pool.register_memory_region(ctypes.addressof(weights), SIZE, "weights")
        pool.register_memory_region(ctypes.addressof(inbox), 4096, "inbox")
        imm = ep.imm_recv(None)
        pipe.send(ep.endpoint_info())
        ep.connect(pipe.recv())
        ok = imm.wait() == 0 and imm.imm_data() == 7 and inbox.raw == content(SIZE)[:4096]
        done = ctypes.create_string_buffer(ok and b"ok" or b"no", 2)
        ok = ep.send((ctypes.addressof(done), 0, 2), None).wait() == 0 and ok
        ep.shutdown()
        sys.exit(0 if ok else 1)

    def initiator(pipe):
        dst = ctypes.create_string_buffer(SIZE)
        pool, ep = endpoint()
        h = pool.register_memory_region(ctypes.addressof(dst), SIZE, "dst")
        pipe.send(ep.endpoint_info())
        peer = pipe.recv()
        ep.connect(peer)
        h_weights = ep.register_remote_memory_region("weights", peer["mr_info"]["weights"])
        h_inbox = ep.register_remote_memory_region("inbox", peer["mr_info"]["inbox"])
        half = SIZE // 2
        fut = ep.read([(h, h_weights, 1000, 8, 5000), (h, h_weights, half, half, half)], None)
        expected = content(SIZE)
        ok = fut.wait() == 0 and dst.raw[8:5008] == expected[1000:6000] and dst.raw[half:] == expected[half:]
        # Back to the target, with an immediate it checks with the bytes.
        ok = ok and ep.write_with_imm([(h, h_inbox, 0, half, 4096)], 7, None).wait() == 0
        note = ctypes.create_string_buffer(2)
        ok = ok and ep.recv((ctypes.addressof(note), 0, 2), None).wait() == 0 and note.raw == b"ok"
        print(f"[initiator] bytes match: {ok}")
        ep.shutdown()
        sys.exit(0 if ok else 1)

    if __name__ == "__main__":
        run(target, initiator)
"""


def test_upstream_rdma_script_across_two_processes(tmp_path):
    # Each side: context -> pool -> endpoint(pool=); regions registered in the pool before
    # (target) and after (initiator) the endpoint exists; read with offsets on both sides,
    # then write_with_imm back, checked by the target.
    run_sim(TWO_PROCESS, tmp_path, timeout=180)


def test_rdma_context_without_a_device_raises_as_rdma_endpoint_does():
    # This process has no DLSLIME_RDMA_SIM: the host's own devices (none here).
    if os.environ.get("DLSLIME_RDMA_SIM"):
        pytest.fail("this test checks the host's devices: run it without DLSLIME_RDMA_SIM")
    ctx = dlslime.RDMAContext()
    if dlslime.available_nic():  # a host with a NIC: init opens the choice of the first one
        assert ctx.init("") == 0 and ctx.device_name == ""
        return
    with pytest.raises(ConnectionError, match="no RDMA device"):
        ctx.init("")
    with pytest.raises(ConnectionError, match="no RDMA device"):
        dlslime.RDMAContext("mlx5_0")
    with pytest.raises(ValueError, match="not initialised"):
        dlslime.RDMAMemoryPool(ctx)
