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

NPU memory works the same way: ``npu_buffer(nbytes, device=0)`` in the process's NPU runtime
(CANN's, or the simulated NPU with ``DLSLIME_ASCEND_SIM=1``; docs/ascend.md).
"""

import ctypes

from . import _dlslime
from ._dlslime import _gpu

GpuUnavailableError = _gpu.GpuUnavailableError
DeviceBuffer = _gpu.DeviceBuffer

__all__ = ["DeviceBuffer", "GpuUnavailableError", "HostBuffer", "buffer_for", "device_buffer", "gpu_runtime",
           "gpu_unavailable_reason", "npu_buffer", "pointer_type", "sim_gpu_objects", "sim_rdma_objects"]

_npu = getattr(_dlslime, "_npu", None)  # None in a build without the Ascend transport


def device_buffer(nbytes: int, device: int = 0) -> DeviceBuffer:
    """``nbytes`` of device memory on ``device``: ``.ptr``, ``.nbytes``, ``.write(offset, data)``,
    ``.read(offset, n) -> bytes``, ``.close()`` (also a context manager)."""
    return DeviceBuffer(nbytes, device)


def npu_buffer(nbytes: int, device: int = 0):
    """``nbytes`` of NPU memory on ``device``, with DeviceBuffer's interface: ``.ptr``,
    ``.nbytes``, ``.write(offset, data)``, ``.read(offset, n) -> bytes``, ``.close()`` (also a
    context manager). Raises ConnectionError without an NPU runtime (naming it and
    ``DLSLIME_ASCEND_SIM``), RuntimeError in a build without the Ascend transport."""
    if _npu is None:
        raise RuntimeError("this dlslime was built without the Ascend transport (-DBUILD_ASCEND=ON builds it)")
    return _npu.NpuBuffer(nbytes, device)


def gpu_runtime() -> str:
    """``"cuda"`` or ``"sim"``; raises GpuUnavailableError where there is no GPU."""
    return _gpu.runtime_name()


def gpu_unavailable_reason() -> str:
    """``""`` when a GPU runtime is usable, else why not (names the GPU)."""
    return _gpu.unavailable_reason()


def sim_rdma_objects() -> dict:
    """The simulated RDMA device's (``DLSLIME_RDMA_SIM=1``) live verbs objects in this
    process, ``contexts``, ``pds``, ``mrs``, ``cqs``, ``qps``, ``comp_channels``, and
    ``destroy_failures``: destroys it refused as verbs does (a PD, CQ or context destroyed
    while children of it lived, EBUSY on a NIC). Tests compare two snapshots: once every
    endpoint is shut down and released the counts are back and nothing failed."""
    fn = getattr(_dlslime, "_sim_rdma_objects", None)
    if fn is None:
        raise RuntimeError("this dlslime was built without the RDMA transport (-DBUILD_RDMA=ON builds it)")
    return fn()


def sim_gpu_objects() -> dict:
    """The simulated GPU's (``DLSLIME_GPU_SIM=1``) live objects in this process,
    ``device_allocations``, ``host_allocations`` (pinned), ``streams``, ``events`` and
    ``ipc_mappings`` (other processes' memory opened here), and ``errors``: calls it refused
    as misuse a GPU punishes too (freeing what is no allocation, destroying an unknown
    stream or event, recording an event on another device's stream). Tests compare two
    snapshots: once every endpoint is shut down and released the counts are back and no
    error was added."""
    return _gpu.sim_objects()


def pointer_type(ptr: int) -> str:
    """Where an address lives: ``"host"``, ``"pinned host"``, ``"device"`` (a GPU's) or ``"npu"``."""
    if _npu is not None and _npu.is_npu_memory(ptr):
        return "npu"
    return _gpu.pointer_type(ptr)


class HostBuffer:
    """``nbytes`` of zeroed host memory with DeviceBuffer's interface (``ptr``, ``nbytes``,
    ``write``, ``read``, ``close``), so code that moves bytes through either kind of buffer
    is written once."""

    device = None

    def __init__(self, nbytes: int):
        if nbytes <= 0:
            raise ValueError(f"a buffer needs at least one byte, not {nbytes}")
        self._raw = ctypes.create_string_buffer(nbytes)
        self.nbytes = nbytes
        self.ptr = ctypes.addressof(self._raw)

    def _check(self, offset: int, n: int) -> None:
        if self._raw is None:
            raise ValueError("the buffer is closed")
        if offset < 0 or n < 0 or offset + n > self.nbytes:
            raise ValueError(f"[{offset}, {offset + n}) is outside the buffer's {self.nbytes} bytes")

    def write(self, offset: int, data) -> None:
        data = bytes(data)
        self._check(offset, len(data))
        ctypes.memmove(self.ptr + offset, data, len(data))

    def read(self, offset: int, n: int) -> bytes:
        self._check(offset, n)
        return ctypes.string_at(self.ptr + offset, n)

    def close(self) -> None:
        self._raw = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def buffer_for(capabilities: dict, nbytes: int, device: int = 0, memory: str = None):
    """Zeroed memory an endpoint with these ``capabilities()`` registers: host memory where
    ``host_memory`` is true, else device memory on ``device`` (zeroed explicitly: CUDA's
    fresh memory is not): a GPU's, or an NPU's for the ascend transport. ``memory="device"``
    asks for device memory where the transport takes both. Every kind has ``ptr``, ``nbytes``,
    ``write``, ``read``, ``close``. Raises ValueError for a transport that moves neither."""
    if memory not in (None, "host", "device"):
        raise ValueError(f"memory must be None, 'host' or 'device', not {memory!r}")
    if memory == "device" and not capabilities.get("device_memory"):
        raise ValueError(f"{capabilities.get('transport')!r} does not register device memory")
    if capabilities.get("device_memory") and capabilities.get("transport") == "ascend" and memory == "device":
        buf = npu_buffer(nbytes, device)
        buf.write(0, bytes(nbytes))
        return buf
    if capabilities.get("host_memory") and memory != "device":
        return HostBuffer(nbytes)
    if capabilities.get("device_memory"):
        buf = device_buffer(nbytes, device)
        buf.write(0, bytes(nbytes))
        return buf
    raise ValueError(f"{capabilities.get('transport')!r} registers neither host nor device memory")
