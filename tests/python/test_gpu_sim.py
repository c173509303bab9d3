"""dlslime.testing.device_buffer on the strict simulated GPU (DLSLIME_GPU_SIM=1, in a child
process so the variable is set before the library looks for a GPU), on a real GPU where there
is one, and, in this process, without any GPU: a clear error naming the GPU, never a silent
fallback."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import dlslime
from dlslime import testing

ROUND_TRIP_SCRIPT = textwrap.dedent(
    """
    import sys
    from dlslime import testing

    runtime = testing.gpu_runtime()
    assert runtime == sys.argv[1], runtime
    for nbytes in (1, 4097, (1 << 20) + 3):
        buf = testing.device_buffer(nbytes)
        assert buf.nbytes == nbytes and buf.device == 0
        assert testing.pointer_type(buf.ptr) == "device", testing.pointer_type(buf.ptr)
        data = bytes((i * 7 + 3) % 251 for i in range(nbytes))
        buf.write(0, data)
        assert buf.read(0, nbytes) == data
        if nbytes > 2:
            buf.write(1, memoryview(b"xy"))   # any bytes-like object, at an offset
            assert buf.read(0, 3) == data[:1] + b"xy"
        buf.close()
        assert buf.closed

    with testing.device_buffer(64) as buf:
        buf.write(60, b"tail")
        assert buf.read(60, 4) == b"tail"
        for bad in (lambda: buf.read(60, 5), lambda: buf.write(63, b"ab"), lambda: buf.read(65, 0)):
            try:
                bad()
            except ValueError as e:
                assert "outside the buffer" in str(e), e
            else:
                raise AssertionError("an out-of-range access was accepted")
        try:
            buf.write(0, 12)
        except TypeError:
            pass
        else:
            raise AssertionError("write() took an int")
    try:
        buf.read(0, 1)
    except ValueError as e:
        assert "close" in str(e), e
    else:
        raise AssertionError("a closed buffer was readable")
    try:
        testing.device_buffer(16, device=99)
    except ValueError as e:
        assert "device 99" in str(e), e
    else:
        raise AssertionError("device 99 was accepted")
    try:
        testing.device_buffer(0)
    except ValueError as e:
        assert "nbytes" in str(e), e
    else:
        raise AssertionError("nbytes=0 was accepted")
    print("OK")
    """
)

HOST_TOUCH_SCRIPT = textwrap.dedent(
    """
    import ctypes
    import sys
    from dlslime import testing

    buf = testing.device_buffer(8192)
    buf.write(0, b"secret" * 100)
    print("READY", flush=True)
    ctypes.string_at(buf.ptr + 4096, 1)   # host code reading device memory
    print("READ", flush=True)
    """
)


def run_child(script, *args, sim):
    env = dict(os.environ)
    if sim:
        env["DLSLIME_GPU_SIM"] = "1"
    else:
        env.pop("DLSLIME_GPU_SIM", None)
    return subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=120)


def test_device_buffer_on_the_simulated_gpu_round_trips_bytes_and_checks_its_arguments():
    proc = run_child(ROUND_TRIP_SCRIPT, "sim", sim=True)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr


def test_host_code_reading_simulated_device_memory_faults():
    proc = run_child(HOST_TOUCH_SCRIPT, sim=True)
    assert "READY" in proc.stdout, proc.stdout + proc.stderr
    assert "READ\n" not in proc.stdout.replace("READY", ""), proc.stdout
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stderr)


def test_without_a_gpu_device_buffers_raise_naming_the_missing_gpu():
    if os.environ.get("DLSLIME_GPU_SIM"):
        pytest.fail("this test checks the no-GPU path: run it without DLSLIME_GPU_SIM")
    if testing.gpu_unavailable_reason() == "":
        pytest.skip(f"this host has a GPU ({testing.gpu_runtime()}): the no-GPU path cannot be checked")
    assert issubclass(testing.GpuUnavailableError, RuntimeError)
    with pytest.raises(testing.GpuUnavailableError, match="GPU") as info:
        testing.device_buffer(16)
    assert "DLSLIME_GPU_SIM=1" in str(info.value), info.value
    with pytest.raises(testing.GpuUnavailableError, match="GPU"):
        testing.gpu_runtime()
    assert "GPU" in testing.gpu_unavailable_reason()
    # The rest of the library does not need a GPU.
    assert dlslime.available_transports()


def test_device_buffer_on_a_real_gpu_round_trips_bytes():
    reason = run_child("from dlslime import testing; print(testing.gpu_unavailable_reason())", sim=False)
    if reason.stdout.strip():
        pytest.skip(f"no GPU on this host: {reason.stdout.strip()}")
    proc = run_child(ROUND_TRIP_SCRIPT, "cuda", sim=False)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr


FORK_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from dlslime import testing

    buf = testing.device_buffer(4096)
    buf.write(0, b"parent")
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)  # a hang ends the child with SIGALRM, which the parent sees
        try:
            testing.device_buffer(64)
        except Exception as e:  # CUDA fails every call in such a child, and so does the sim
            assert "fork()" in str(e), e
        else:
            raise AssertionError("the GPU was usable in a fork() child of a process that had initialized it")
        sys.exit(0)  # interpreter exit frees the inherited buffer: it must not hang
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"
    assert buf.read(0, 6) == b"parent"  # the parent's GPU is untouched
    print("OK")
    """
)


def test_a_fork_child_of_a_process_that_used_the_simulated_gpu_fails_its_calls_and_exits():
    # As CUDA: a child forked after initialization cannot use the GPU; every call fails with
    # an initialization error naming fork(), and exiting frees nothing of the parent's
    # (review N8: the child once hung at exit, joining stream threads it does not have).
    env = dict(os.environ, DLSLIME_GPU_SIM="1")
    proc = subprocess.run([sys.executable, "-c", FORK_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr
