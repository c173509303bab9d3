"""Device memory for tests and examples, in whichever GPU runtime this process uses: the CUDA
runtime on a host with a GPU, or the strict simulated GPU with ``DLSLIME_GPU_SIM=1``
(docs/nvlink.md). Without either, every call raises :class:`GpuUnavailableError`, a
``RuntimeError`` whose message names the missing GPU.

    buf = dlslime.testing.device_buffer(4096, device=0)
    buf.write(0, b"hello")          # host -> device, waited for
    assert buf.read(0, 5) == b"hello"
    ep.register_memory_region("kv", buf.ptr, 0, buf.nbytes)

On the simulated GPU ``buf.ptr`` is an address the host cannot touch (reading it faults), as
device memory on a GPU: move bytes with ``write``/``read`` or a transfer, never ctypes.
"""

from ._dlslime import _gpu

GpuUnavailableError = _gpu.GpuUnavailableError
DeviceBuffer = _gpu.DeviceBuffer

__all__ = ["DeviceBuffer", "GpuUnavailableError", "device_buffer", "gpu_runtime", "gpu_unavailable_reason",
           "pointer_type"]


def device_buffer(nbytes: int, device: int = 0) -> DeviceBuffer:
    """``nbytes`` of device memory on ``device``: ``.ptr``, ``.nbytes``, ``.write(offset, data)``,
    ``.read(offset, n) -> bytes``, ``.close()`` (also a context manager)."""
    return DeviceBuffer(nbytes, device)


def gpu_runtime() -> str:
    """``"cuda"`` or ``"sim"``; raises GpuUnavailableError where there is no GPU."""
    return _gpu.runtime_name()


def gpu_unavailable_reason() -> str:
    """``""`` when a GPU runtime is usable, else why not (names the GPU)."""
    return _gpu.unavailable_reason()


def pointer_type(ptr: int) -> str:
    """Where an address lives: ``"host"``, ``"pinned host"`` or ``"device"``."""
    return _gpu.pointer_type(ptr)
