"""GPU memory over RDMA (docs/rdma.md "GPU memory") on the simulated RDMA device and the
strict simulated GPU. Each scenario runs in a child process with DLSLIME_RDMA_SIM=1 and
DLSLIME_GPU_SIM=1 (set before the library looks for devices); the simulated device memory is
PROT_NONE to host code, so a host touch of it anywhere in the library (an inline post, an
eager copy) kills the child with SIGSEGV and fails the test: only the simulated NIC moves
its bytes, as GPUDirect RDMA does."""

import os
import subprocess
import sys
import textwrap

import pytest

import dlslime
from conftest import run_script

pytestmark = pytest.mark.skipif(not hasattr(dlslime, "RDMAEndpoint"),
                                reason="RDMA transport not built (configure with -DBUILD_RDMA=ON)")

COMMON = textwrap.dedent(
    """
    import ctypes
    import os

    import dlslime
    from dlslime import testing

    def pattern(n, seed):
        block = bytes((i * 31 + seed) & 0xFF for i in range(251))
        return (block * (n // 251 + 1))[:n]

    def pair(**options):
        a = dlslime.RDMAEndpoint(**options)
        b = dlslime.RDMAEndpoint(**options)
        a.connect(b.endpoint_info())
        b.connect(a.endpoint_info())
        return a, b

    def remote(a, b, name):
        return a.register_remote_memory_region(name, b.endpoint_info()["mr_info"][name])

    def ok(f):
        assert f.wait() == 0, f.message
        return f
    """
)


def run_sim(tmp_path, script, extra_env=None):
    run_script(tmp_path, COMMON + textwrap.dedent(script) + "\nprint('OK')\n",
               env={"DLSLIME_RDMA_SIM": "1", "DLSLIME_GPU_SIM": "1", "DLSLIME_RDMA_SIM_DEVICE_MEMORY": None,
                    **(extra_env or {})})


def test_write_and_read_move_gpu_bytes_in_every_direction_at_offsets_and_sizes(tmp_path):
    run_sim(tmp_path, """
    a, b = pair(num_qp=2, chunk_size=256 * 1024)
    assert a.capabilities()["device_memory"]
    size = 3 * 1024 * 1024 + 64
    a_dev, b_dev = testing.device_buffer(size), testing.device_buffer(size)
    a_host, b_host = ctypes.create_string_buffer(size), ctypes.create_string_buffer(size)
    a_bytes, b_bytes = pattern(size, 1), pattern(size, 2)
    a_dev.write(0, a_bytes)
    b_dev.write(0, b_bytes)
    # Plain register_memory_region: the library sees the pointer is GPU memory.
    la_dev = a.register_memory_region("a_dev", a_dev.ptr, 0, size)
    la_host = a.register_memory_region("a_host", ctypes.addressof(a_host), 0, size)
    b.register_memory_region("b_dev", b_dev.ptr, 0, size)
    b.register_memory_region("b_host", ctypes.addressof(b_host), 0, size)
    rb_dev, rb_host = remote(a, b, "b_dev"), remote(a, b, "b_host")
    a_dev_now, b_dev_now = bytearray(a_bytes), bytearray(b_bytes)   # what each GPU buffer holds
    for n in (1, 17, 4099, 1 << 20, 3 * 1024 * 1024 + 5):
        src_off, dst_off = n % 7 + 1, n % 13 + 3
        ok(a.write([(la_dev, rb_dev, dst_off, src_off, n)]))           # GPU -> GPU
        b_dev_now[dst_off:dst_off + n] = a_dev_now[src_off:src_off + n]
        assert b_dev.read(0, size) == bytes(b_dev_now), n
        ok(a.write([(la_dev, rb_host, dst_off, src_off, n)]))          # GPU -> host
        assert b_host.raw[dst_off:dst_off + n] == a_dev_now[src_off:src_off + n], n
        ok(a.read([(la_host, rb_dev, 0, 5, n)]))                       # GPU -> host (read)
        assert a_host.raw[5:5 + n] == bytes(b_dev_now[:n]), n
        ok(a.read([(la_dev, rb_host, dst_off, 2, n)]))                 # host -> GPU (read)
        a_dev_now[2:2 + n] = b_host.raw[dst_off:dst_off + n]
        assert a_dev.read(0, size) == bytes(a_dev_now), n
    """)


def test_send_recv_and_write_with_imm_into_gpu_memory_and_unregister(tmp_path):
    run_sim(tmp_path, """
    a, b = pair()
    a_dev, b_dev = testing.device_buffer(65536), testing.device_buffer(65536)
    data = pattern(65536, 9)
    a_dev.write(0, data)
    b_dev.write(0, bytes(65536))
    la = a.register_memory_region("a_dev", a_dev.ptr, 0, 65536)
    b.register_memory_region("b_dev", b_dev.ptr, 0, 65536)
    rb = remote(a, b, "b_dev")
    imm = b.imm_recv()
    ok(a.write_with_imm([(la, rb, 32, 8, 16)], 0x1234))   # 16 bytes: never inline from GPU memory
    ok(imm)
    assert imm.imm_data() == 0x1234
    assert b_dev.read(32, 16) == data[8:24]
    # A small GPU message (rendezvous: the receiver's NIC reads it) into GPU memory, a host
    # message (eager) into GPU memory, and a large GPU message into host memory.
    host_msg = ctypes.create_string_buffer(b"host bytes", 10)
    box = ctypes.create_string_buffer(40000)
    r1 = b.recv((b_dev.ptr, 1000, 200))
    r2 = b.recv((b_dev.ptr, 2000, 10))
    r3 = b.recv((ctypes.addressof(box), 0, 40000))
    for f in (a.send((a_dev.ptr, 10, 200)), a.send((ctypes.addressof(host_msg), 0, 10)),
              a.send((a_dev.ptr, 0, 40000)), r1, r2, r3):
        ok(f)
    assert (r1.nbytes, r2.nbytes, r3.nbytes) == (200, 10, 40000)
    assert b_dev.read(1000, 200) == data[10:210]
    assert b_dev.read(2000, 10) == b"host bytes"
    assert box.raw == data[:40000]
    # Unregistered at the owner: the peer's next op on it fails with UNKNOWN_HANDLE.
    b.unregister_memory_region("b_dev")
    late = a.write([(la, rb, 0, 0, 64)])
    assert late.wait() == int(dlslime.StatusCode.UNKNOWN_HANDLE), (late.status, late.message)
    """)


def test_register_dmabuf_memory_region_takes_upstreams_arguments(tmp_path):
    # dma-buf only: the regions below can only have registered through reg_dmabuf_mr.
    run_sim(tmp_path, """
    dev = testing.device_buffer(8192)
    # On the simulated GPU a dma-buf is the allocation's memfd (docs/rdma.md "GPU memory").
    def target(f):
        try:
            return os.readlink(f"/proc/self/fd/{f}")
        except FileNotFoundError:  # listdir's own descriptor, closed since
            return ""
    fds = [int(f) for f in os.listdir("/proc/self/fd") if target(f).startswith("/memfd:dlslime-sim-gpu:")]
    assert len(fds) == 1, fds
    fd = os.open(f"/proc/self/fd/{fds[0]}", os.O_RDWR)
    initiator, owner = pair()
    h = owner.register_dmabuf_memory_region(fd, 4096, 4096, dev.ptr + 4096, "kv")
    unnamed = owner.register_dmabuf_memory_region(fd, 0, 4096, dev.ptr)
    assert owner.mr_info()["kv"]["handle"] == h and owner.mr_info()[hex(dev.ptr)]["handle"] == unnamed
    assert owner.mr_info()["kv"]["addr"] == dev.ptr + 4096 and "rkey" in owner.mr_info()["kv"]
    src = ctypes.create_string_buffer(pattern(8192, 3), 8192)
    hs = initiator.register_memory_region("src", ctypes.addressof(src), 0, 8192)
    hd = initiator.register_dmabuf_memory_region(fd, 0, 4096, dev.ptr, name="mine")
    os.close(fd)   # borrowed for the calls
    ok(initiator.write([(hs, remote(initiator, owner, "kv"), 0, 100, 4096)]))
    assert dev.read(4096, 4096) == src.raw[100:4196]
    ok(initiator.read([(hs, remote(initiator, owner, hex(dev.ptr)), 0, 0, 4096)]))
    assert src.raw[:4096] == dev.read(0, 4096)
    # A dma-buf region as the local side of a write.
    ok(initiator.write([(hd, remote(initiator, owner, "kv"), 0, 0, 4096)]))
    assert dev.read(4096, 4096) == dev.read(0, 4096)
    # Bad arguments are ValueErrors, as upstream's checks are; so is an fd that is no
    # dma-buf of that memory (hostile N11: a pipe, /dev/null, another memfd were taken).
    r, w = os.pipe()
    null = os.open("/dev/null", os.O_RDONLY)
    other = os.memfd_create("not-a-gpu")
    os.ftruncate(other, 8192)
    mine = os.open(f"/proc/self/fd/{fds[0]}", os.O_RDWR)
    for args in ((-1, 0, 4096, dev.ptr), (3, 0, 0, dev.ptr), (3, 0, 64, ctypes.addressof(src)), (r, 0, 64, dev.ptr),
                 (null, 0, 64, dev.ptr), (other, 0, 64, dev.ptr), (mine, 0, 64, dev.ptr + 64)):
        try:
            owner.register_dmabuf_memory_region(*args)
        except ValueError:
            pass
        else:
            raise AssertionError(f"accepted {args}")
    """, extra_env={"DLSLIME_RDMA_SIM_DEVICE_MEMORY": "dmabuf"})


def test_gpu_memory_the_nic_cannot_register_is_a_clear_error_never_a_host_fallback(tmp_path):
    run_sim(tmp_path, """
    ep = dlslime.RDMAEndpoint()
    dev = testing.device_buffer(4096)
    try:
        ep.register_memory_region("dev", dev.ptr, 0, 4096)
    except RuntimeError as e:
        text = str(e)
        assert "dma-buf" in text and "nvidia-peermem" in text and "never staged through host memory" in text, text
    else:
        raise AssertionError("GPU memory registered on a NIC without dma-buf or peer-memory support")
    assert "dev" not in ep.mr_info()
    """, extra_env={"DLSLIME_RDMA_SIM_DEVICE_MEMORY": "none"})



# Two processes, each its own simulated host: the responder's NIC copies from and into the
# other process's GPU memory through that process's NIC view (process_vm_readv/writev),
# never through its device pointer.
PEER = textwrap.dedent(
    """
    import json
    import sys

    N = 1 << 20
    ep = dlslime.RDMAEndpoint()
    dev = testing.device_buffer(N)
    dev.write(0, pattern(N, int(sys.argv[1])))
    ep.register_memory_region("dev", dev.ptr, 0, N)
    print(json.dumps(ep.endpoint_info()), flush=True)
    peer = json.loads(sys.stdin.readline())
    ep.connect(peer)
    if sys.argv[1] == "5":  # the initiator
        remote = ep.register_remote_memory_region("dev", peer["mr_info"]["dev"])
        ok(ep.write([(0, remote, 100, 3, 300000)]))
        ok(ep.read([(0, remote, 500000, 400000, 70000)]))   # the peer's bytes into our GPU memory
        assert dev.read(400000, 70000) == pattern(N, 7)[500000:570000]
    print("done", flush=True)
    if sys.stdin.readline().strip() == "check":   # the target: report what its GPU memory holds
        print(dev.read(0, N).hex(), flush=True)
        sys.stdin.readline()
    ep.shutdown()
    """
)


def test_gpu_to_gpu_write_and_read_between_two_processes(tmp_path):
    path = tmp_path / "peer.py"
    path.write_text(COMMON + PEER)
    env = dict(os.environ, DLSLIME_RDMA_SIM="1", DLSLIME_GPU_SIM="1")
    env.pop("DLSLIME_RDMA_SIM_DEVICE_MEMORY", None)
    procs = [subprocess.Popen([sys.executable, str(path), seed], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in ("7", "5")]
    target, initiator = procs
    try:
        infos = [p.stdout.readline() for p in procs]
        for p, info in zip(procs, infos):
            assert info.startswith("{"), info + p.stderr.read()
        target.stdin.write(infos[1])
        target.stdin.flush()
        initiator.stdin.write(infos[0])
        initiator.stdin.flush()
        for p in (initiator, target):
            line = p.stdout.readline()
            assert line.strip() == "done", line + p.stderr.read()
        target.stdin.write("check\n")
        target.stdin.flush()
        got = bytes.fromhex(target.stdout.readline().strip())
        want = bytearray(_pattern(1 << 20, 7))
        want[100:300100] = _pattern(1 << 20, 5)[3:300003]
        assert got == bytes(want)
        for p in procs:
            p.stdin.write("bye\n")
            p.stdin.flush()
        for p in procs:
            assert p.wait(timeout=60) == 0, p.stderr.read()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _pattern(n, seed):
    block = bytes((i * 31 + seed) & 0xFF for i in range(251))
    return (block * (n // 251 + 1))[:n]
