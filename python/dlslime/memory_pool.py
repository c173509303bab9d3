"""Memory pools: ``MemoryPool`` (upstream's ``TcpMemoryPool``) and, with RDMA built,
``RDMAMemoryPool``.

A pool is a view of the library's table of named memory regions (C++ ``MemoryRegistry``),
the same table every endpoint built on it uses: ``TcpEndpoint(pool=pool)``,
``RDMAEndpoint(pool=pool)``. A region registered in the pool, or on any of those endpoints,
has one handle on all of them. Upstream's methods: ``register_memory_region(addr, length,
name)`` (``data_ptr=`` too), ``get_mr_handle(name)``/``get_handle(name)`` (-1 if unknown),
``mr_info()``, ``unregister_memory_region(name_or_handle)``,
``register_remote_memory_region(mr_info, name=None)`` (a record of a peer's region; each
endpoint makes its own remote handles). ``register_into(endpoint)`` registers the pool's
regions on an endpoint that was not built on it.

Differences, kept on purpose (docs/upstream-compat.md): an empty name, a negative or
non-int address or length raise (``ValueError``/``TypeError``) instead of returning -1.
"""

from ._dlslime import MemoryPool  # noqa: F401

TcpMemoryPool = MemoryPool

__all__ = ["MemoryPool", "TcpMemoryPool"]

try:
    from ._dlslime import RDMAContext, RDMAMemoryPool  # noqa: F401
except ImportError:
    pass
else:
    __all__ += ["RDMAContext", "RDMAMemoryPool"]
