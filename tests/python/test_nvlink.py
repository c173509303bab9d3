"""NVLinkEndpoint (docs/nvlink.md) on the simulated GPU, between two processes: byte-exact
reads and writes with offsets on both sides, batches, upstream's forms (ptr-first
registration, named assignments), the stream argument, errors that fail only their op,
shutdown with ops pending, a killed peer; and, in this process (no DLSLIME_GPU_SIM), the
error without a GPU. The two-process scripts run in a child with DLSLIME_GPU_SIM=1 set
before the library looks for a GPU, so this process's transports stay as they are."""

import os
import subprocess
import sys
import textwrap

import pytest

import dlslime
from dlslime import testing
from conftest import REPO

NVLinkEndpoint = getattr(dlslime, "NVLinkEndpoint", None)
pytestmark = pytest.mark.skipif(NVLinkEndpoint is None,
                                reason="NVLink transport not built (configure with -DBUILD_NVLINK=ON)")

# Shared by every scenario: the owner process ("peer") registers "weights" (1 MiB of device
# memory, pattern seed 1) at offset 4096 of its allocation and serves commands over a Pipe:
# ("dump", off, n) -> bytes, ("exit",). The scenario runs in the parent of the two.
COMMON = textwrap.dedent(
    """
    import multiprocessing, sys
    import dlslime
    from dlslime import testing
    from dlslime import NVLinkEndpoint
    OK, OUT_OF_BOUNDS, UNKNOWN_HANDLE, CANCELLED, PEER_CLOSED = 0, 404, 405, 406, 407
    ALLOC, OFF, REGION = 1 << 20, 4096, 256 * 1024

    def pattern(n, seed, start=0):
        return bytes(((start + i) * 131 + seed ^ ((start + i) >> 9)) & 0xFF for i in range(n))

    def peer(conn):
        buf = testing.device_buffer(ALLOC)
        buf.write(0, pattern(ALLOC, 1))
        ep = NVLinkEndpoint()
        ep.register_memory_region("weights", buf.ptr, OFF, REGION)
        conn.send(ep.endpoint_info())
        ep.connect(conn.recv())
        while True:
            cmd = conn.recv()
            if cmd[0] == "dump":
                conn.send(buf.read(OFF + cmd[1], cmd[2]))
            else:
                break
        ep.shutdown()

    def start():
        ctx = multiprocessing.get_context("spawn")
        conn, child = ctx.Pipe()
        proc = ctx.Process(target=peer, args=(child,))
        proc.start()
        if not conn.poll(60):
            raise RuntimeError("the peer did not publish its endpoint_info")
        info = conn.recv()
        local = testing.device_buffer(ALLOC)
        local.write(0, pattern(ALLOC, 9))
        ep = NVLinkEndpoint(device=0)
        h = ep.register_memory_region("local", local.ptr, OFF, REGION)
        conn.send(ep.endpoint_info())
        ep.connect(info)
        return proc, conn, ep, local, h, ep.register_remote_memory_region("weights", info["mr_info"]["weights"])

    def dump(conn, off, n):
        conn.send(("dump", off, n))
        if not conn.poll(60):
            raise RuntimeError("the peer did not answer")
        return conn.recv()

    def stop(proc, conn, ep):
        ep.shutdown()
        conn.send(("exit",))
        proc.join(60)
        assert proc.exitcode == 0, proc.exitcode
    """
)

SCENARIOS = {
    "byte_exact": """
        proc, conn, ep, local, h, r = start()
        assert ep.is_connected() and ep.capabilities()["transport"] == "nvlink"
        assert ep.capabilities()["device_memory"] and not ep.capabilities()["send_recv"]
        # read: remote[target_offset:+n] -> local[source_offset:+n]
        f = ep.read([(h, r, 1000, 8, 5000)])
        assert f.wait_for(10) == OK and f.nbytes == 5000, f.message
        assert local.read(OFF + 8, 5000) == pattern(5000, 1, OFF + 1000)
        assert local.read(OFF, 8) == pattern(8, 9, OFF)  # around it: untouched
        # write: local[source_offset:+n] -> remote[target_offset:+n]
        assert ep.write((h, r, 777, 3, 3000)).wait_for(10) == OK
        assert dump(conn, 777, 3000) == local.read(OFF + 3, 3000)
        assert dump(conn, 770, 7) == pattern(7, 1, OFF + 770)
        # a batch
        batch = [(h, r, i * 4096 + 1, i * 8192 + 5, 4000) for i in range(16)]
        f = ep.async_write(batch)
        assert f.wait_for(10) == OK and f.nbytes == 16 * 4000
        for i in range(16):
            assert dump(conn, i * 4096 + 1, 4000) == local.read(OFF + i * 8192 + 5, 4000), i
        # the stream argument: 0 is the default stream
        assert ep.read([(h, r, 0, 0, 64)], stream=0).wait_for(10) == OK
        assert local.read(OFF, 64) == dump(conn, 0, 64)
        stop(proc, conn, ep)
    """,
    "upstream_forms": """
        proc, conn, ep, local, h, r = start()
        other = testing.device_buffer(8192)
        other.write(0, pattern(8192, 5))
        # upstream's order: (ptr, offset, length, name)
        h2 = ep.register_memory_region(other.ptr, 16, 4096, "other")
        assert ep.mr_info()["other"]["alloc_offset"] == 16 and ep.mr_info()["other"]["length"] == 4096
        h3 = ep.register_memory_region(other.ptr, 0, 1024, name="first")
        assert h3 != h2
        # named: (local_name, remote_name, target_offset, source_offset, length)
        assert ep.write([("other", "weights", 500, 100, 1000)]).wait_for(10) == OK
        assert dump(conn, 500, 1000) == pattern(1000, 5, 116)
        assert ep.read(("other", "weights", 0, 0, 16), None).wait_for(10) == OK
        assert other.read(16, 16) == pattern(16, 1, OFF)
        try:
            ep.read([("nope", "weights", 0, 0, 8)])
        except KeyError as e:
            assert "nope" in str(e)
        else:
            raise AssertionError("an unknown region name was accepted")
        stop(proc, conn, ep)
    """,
    "errors_fail_alone": """
        proc, conn, ep, local, h, r = start()
        f = ep.read([(h, r, REGION - 10, 0, 11)])   # past the owner's published length
        assert f.wait_for(10) == OUT_OF_BOUNDS, f.message
        assert ep.write([(h, r + 50, 0, 0, 8)]).wait_for(10) == UNKNOWN_HANDLE
        assert ep.write([(h + 50, r, 0, 0, 8)]).wait_for(10) == UNKNOWN_HANDLE
        assert ep.write([(h, r, 0, 0, 64), (h, r, REGION, 0, 1)]).wait_for(10) == OUT_OF_BOUNDS
        assert dump(conn, 0, 64) == pattern(64, 1, OFF)   # nothing of the bad batch was copied
        assert ep.write([(h, r, 0, 0, 64)]).wait_for(10) == OK  # still connected
        assert dump(conn, 0, 64) == local.read(OFF, 64)
        for call in (lambda: ep.send((local.ptr, 0, 8)), lambda: ep.recv((local.ptr, 0, 8)),
                     lambda: ep.imm_recv(), lambda: ep.write_with_imm([(h, r, 0, 0, 8)], 1)):
            try:
                call()
            except NotImplementedError as e:
                assert "nvlink" in str(e), e
            else:
                raise AssertionError("a two-sided op was accepted")
        host = bytearray(64)
        import ctypes
        addr = ctypes.addressof((ctypes.c_char * 64).from_buffer(host))
        try:
            ep.register_memory_region("host", addr, 0, 64)
        except ValueError as e:
            assert "GPU memory only" in str(e), e
        else:
            raise AssertionError("host memory was registered")
        stop(proc, conn, ep)
    """,
    "shutdown_pending": """
        proc, conn, ep, local, h, r = start()
        futures = [ep.write([(h, r, 0, 0, REGION)]) for _ in range(8)]
        ep.shutdown()
        # Each completes (OK if its copies ran before the shutdown, else CANCELLED once they ran).
        for f in futures:
            assert f.wait_for(10) in (OK, CANCELLED), f.message
        assert ep.write([(h, r, 0, 0, 8)]).wait_for(10) == CANCELLED
        assert not ep.is_connected()
        stop(proc, conn, ep)
    """,
    "killed_peer": """
        proc, conn, ep, local, h, r = start()
        assert ep.read([(h, r, 0, 0, 4096)]).wait_for(10) == OK
        proc.kill()
        proc.join(60)
        assert not ep.is_connected()
        f = ep.read([(h, r, 0, 0, 4096)])
        assert f.wait_for(10) == PEER_CLOSED, f.message
        assert "exited" in f.message
        ep.shutdown()
    """,
}


def run_scenario(name, directory):
    # A file, not -c: the spawned peer re-imports it (as __mp_main__) to find peer().
    body = textwrap.indent(textwrap.dedent(SCENARIOS[name]), "    ")
    script = directory / f"nvlink_{name}.py"
    script.write_text(COMMON + "\n\ndef main():\n" + body +
                      "\n\nif __name__ == '__main__':\n    main()\n    print('SCENARIO OK')\n")
    env = dict(os.environ, DLSLIME_GPU_SIM="1")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and "SCENARIO OK" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_nvlink_two_processes_on_the_simulated_gpu(scenario, tmp_path):
    run_scenario(scenario, tmp_path)


def test_example_p2p_nvlink_runs_across_two_processes():
    path = os.path.join(REPO, "examples", "python", "p2p_nvlink.py")
    env = dict(os.environ, DLSLIME_GPU_SIM="1")
    proc = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("OK")


@pytest.mark.skipif(testing.gpu_unavailable_reason() == "", reason="this host has a GPU")
def test_without_a_gpu_or_the_variable_it_says_so():
    assert os.environ.get("DLSLIME_GPU_SIM") != "1"
    with pytest.raises(testing.GpuUnavailableError) as info:
        NVLinkEndpoint()
    assert "GPU" in str(info.value) and "DLSLIME_GPU_SIM" in str(info.value)
    (nvlink,) = [t for t in dlslime.available_transports() if t["name"] == "nvlink"]
    assert nvlink["built"] and not nvlink["available"] and "DLSLIME_GPU_SIM" in nvlink["reason"]
    with pytest.raises(NotImplementedError, match="DLSLIME_GPU_SIM"):
        dlslime.make_endpoint("nvlink")
