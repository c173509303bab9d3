"""Vendor libraries are loaded at run time, never linked (docs/rdma.md and docs/nvlink.md,
"Loading libibverbs and libcudart"): libdlslime and the extension have no link-time
dependency on libibverbs or CUDA, and on a host without them TCP still runs while RDMA and
NVLink say which library is missing and which variable points at another copy.

"A host without rdma-core" is made here by pointing DLSLIME_IBVERBS_LIBRARY (and
DLSLIME_CUDART_LIBRARY) at a file that does not exist, or at a library that is not
libibverbs; the library honours an explicit choice and never falls back to the system copy.
Each case runs in a child process, since a library is loaded once per process."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

import dlslime

VENDOR = ("libibverbs", "libcuda", "libcudart", "libmlx5", "librdmacm")


def package_libraries():
    root = pathlib.Path(dlslime.__file__).parent
    libs = sorted(p for p in root.rglob("*.so*") if p.is_file())
    assert libs, f"no shared objects under {root}"
    return libs


def test_no_shared_object_of_the_package_links_a_vendor_library():
    readelf = shutil.which("readelf")
    assert readelf, "readelf (binutils) is needed to read the ELF dependencies"
    for lib in package_libraries():
        out = subprocess.run([readelf, "-d", str(lib)], capture_output=True, text=True, check=True).stdout
        needed = [line for line in out.splitlines() if "(NEEDED)" in line]
        bad = [line for line in needed if any(v in line for v in VENDOR)]
        assert not bad, f"{lib.name} links {bad}"


def run_child(code, **env):
    child_env = {k: v for k, v in os.environ.items() if k not in ("DLSLIME_RDMA_SIM", "DLSLIME_GPU_SIM")}
    child_env.update(env)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=child_env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


# Without libibverbs: TCP moves bytes, RDMAEndpoint() raises ConnectionError naming the
# library and the variable, and available_transports() gives the same reason.
WITHOUT_RDMA = """
import ctypes, json
import dlslime
from dlslime import TcpEndpoint

a, b = TcpEndpoint("127.0.0.1", 0), TcpEndpoint("127.0.0.1", 0)
a.connect(b.endpoint_info()); b.connect(a.endpoint_info())
src = ctypes.create_string_buffer(bytes(range(256)) * 4, 1024)
dst = ctypes.create_string_buffer(1024)
hs = a.register_memory_region("src", ctypes.addressof(src), 0, 1024)
b.register_memory_region("dst", ctypes.addressof(dst), 0, 1024)
hd = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"])
assert a.write([(hs, hd, 0, 0, 1024)]).wait_for(10) == 0
assert dst.raw == src.raw
a.shutdown(); b.shutdown()

try:
    dlslime.RDMAEndpoint()
except ConnectionError as e:
    error = str(e)
else:
    raise SystemExit("RDMAEndpoint() did not raise")
rdma = [t for t in dlslime.available_transports() if t["name"] == "rdma"][0]
print(json.dumps({"error": error, "available": rdma["available"], "reason": rdma["reason"]}))
"""


def test_without_libibverbs_tcp_runs_and_rdma_names_the_library(tmp_path):
    missing = str(tmp_path / "libibverbs.so.1")
    out = json.loads(run_child(WITHOUT_RDMA, DLSLIME_IBVERBS_LIBRARY=missing))
    for text in (out["error"], out["reason"]):
        assert "libibverbs could not be loaded" in text, text
        assert "DLSLIME_IBVERBS_LIBRARY" in text and missing in text, text
        assert "DLSLIME_RDMA_SIM=1" in text, text  # and the way to run without a NIC
    assert out["available"] is False


def test_a_library_without_the_verbs_names_the_missing_symbols():
    out = json.loads(run_child(WITHOUT_RDMA, DLSLIME_IBVERBS_LIBRARY="libc.so.6"))
    for text in (out["error"], out["reason"]):
        assert "lacks ibv_get_device_list" in text and "ibv_create_qp" in text, text
        assert "DLSLIME_IBVERBS_LIBRARY" in text, text
    assert out["available"] is False


def test_an_explicit_libcudart_that_is_missing_is_named_and_not_replaced(tmp_path):
    missing = str(tmp_path / "libcudart.so.13")
    out = run_child(
        """
        import dlslime
        nv = [t for t in dlslime.available_transports() if t["name"] == "nvlink"][0]
        assert nv["available"] is False
        print(nv["reason"])
        """,
        DLSLIME_CUDART_LIBRARY=missing,
    )
    assert "libcudart could not be loaded" in out and "DLSLIME_CUDART_LIBRARY" in out and missing in out, out


def test_the_simulated_device_needs_no_libibverbs(tmp_path):
    # The simulated NIC is the transport's own code: it runs where libibverbs is missing.
    out = run_child(
        """
        import dlslime
        ep = dlslime.RDMAEndpoint()
        assert ep.endpoint_info()
        print("ok")
        """,
        DLSLIME_IBVERBS_LIBRARY=str(tmp_path / "libibverbs.so.1"),
        DLSLIME_RDMA_SIM="1",
    )
    assert out.strip() == "ok", out


def test_the_simulated_device_is_a_libibverbs_the_real_path_can_load():
    # One adapter, one simulation (docs/rdma.md, "The verbs seam"): the simulated device's
    # library exports the libibverbs ABI, so pointing the real path at it, with no
    # DLSLIME_RDMA_SIM, runs RDMA over it, as any program that loads libibverbs could.
    out = run_child(
        """
        import ctypes, pathlib
        import dlslime
        maps = pathlib.Path("/proc/self/maps").read_text().split()
        lib = next(p for p in maps if p.endswith("/libdlslime.so") or "/libdlslime.so." in p)
        print(pathlib.Path(lib).parent / "libdlslime_sim_ibverbs.so")
        """
    )
    sim_library = out.strip().splitlines()[-1]
    assert pathlib.Path(sim_library).is_file(), f"the simulated device's library is not beside libdlslime: {sim_library}"
    out = run_child(
        """
        import ctypes
        import dlslime
        rdma = [t for t in dlslime.available_transports() if t["name"] == "rdma"][0]
        assert rdma["available"], rdma
        a, b = dlslime.RDMAEndpoint(), dlslime.RDMAEndpoint()
        a.connect(b.endpoint_info()); b.connect(a.endpoint_info())
        src = ctypes.create_string_buffer(bytes(range(256)) * 16, 4096)
        dst = ctypes.create_string_buffer(4096)
        hs = a.register_memory_region("src", ctypes.addressof(src), 0, 4096)
        b.register_memory_region("dst", ctypes.addressof(dst), 0, 4096)
        hd = a.register_remote_memory_region("dst", b.endpoint_info()["mr_info"]["dst"])
        assert a.write([(hs, hd, 0, 0, 4096)]).wait_for(10) == 0
        assert dst.raw == src.raw
        a.shutdown(); b.shutdown()
        print("ok", a.endpoint_info()["device"] if "device" in a.endpoint_info() else "")
        """,
        DLSLIME_IBVERBS_LIBRARY=sim_library,
    )
    assert out.strip().startswith("ok"), out


def test_the_simulated_gpu_is_a_libcudart_the_real_path_can_load():
    # One adapter, one simulation (docs/nvlink.md, "The simulated GPU"): the simulated GPU's
    # library exports the CUDA runtime and driver entry points, so pointing the real path at
    # it, with no DLSLIME_GPU_SIM, moves bytes through device memory over it.
    out = run_child(
        """
        import pathlib
        import dlslime
        maps = pathlib.Path("/proc/self/maps").read_text().split()
        lib = next(p for p in maps if p.endswith("/libdlslime.so") or "/libdlslime.so." in p)
        print(pathlib.Path(lib).parent / "libdlslime_sim_cudart.so")
        """
    )
    sim_library = out.strip().splitlines()[-1]
    assert pathlib.Path(sim_library).is_file(), f"the simulated GPU's library is not beside libdlslime: {sim_library}"
    out = run_child(
        """
        from dlslime import testing
        assert testing.gpu_runtime() == "cuda", testing.gpu_runtime()
        data = bytes(range(256)) * 20
        with testing.DeviceBuffer(len(data), 1) as buf:
            assert testing.pointer_type(buf.ptr) == "device"
            buf.write(0, data)
            assert buf.read(0, len(data)) == data
        print("ok")
        """,
        DLSLIME_CUDART_LIBRARY=sim_library,
        DLSLIME_CUDA_DRIVER_LIBRARY=sim_library,
    )
    assert out.strip().endswith("ok"), out
