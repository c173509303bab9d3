"""DLSlime: a peer-to-peer transfer engine.

Every transport's endpoint is a ``dlslime.Endpoint`` (``TcpEndpoint`` moves bytes between
two processes over TCP); ``available_transports()`` says which this build and host have
and ``make_endpoint(transport, **options)`` makes one. ``PeerAgent`` finds peers and
connects them through the NanoCtrl control plane (``dlslime.nanoctrl``). Every operation
returns a ``Future``: wait on it, on several (``wait_any``, ``wait_all``), register a
callback (``Future.on_complete``) or ``await`` it in asyncio. See docs/quickstart.md.

Scripts written for upstream DLSlime 0.1.23 find its names here too (``TcpMemoryPool``,
``RDMAContext``, ``RDMAMemoryPool``, ``SlimeTcp*Future``, ``Slime*Future``,
``get_logger``, ``available_nic``, ``discover_topology``, ``start_peer_agent``,
``dlslime.peer_agent``); docs/upstream-compat.md lists each and where ours differs on
purpose.
"""

from ._dlslime import (  # noqa: F401
    Endpoint,
    Future,
    StatusCode,
    __version__,
    available_transports,
    make_endpoint,
    wait_all,
    wait_any,
)
from .logging import get_log_level, get_logger, set_log_level  # noqa: E402
from .memory_pool import MemoryPool, TcpMemoryPool  # noqa: E402
from .topology import available_nic, discover_topology  # noqa: E402

# Upstream DLSlime's future classes. Every op here returns a Future (recv's
# exact_size=True check is made by the transport, OpRequest::exact_size), so isinstance()
# holds for each name as upstream scripts check it.
SlimeTcpSendFuture = Future
SlimeTcpRecvFuture = Future
SlimeTcpReadWriteFuture = Future
# Upstream's RDMA future classes: the same Future. Its wait() returns the status (upstream's
# SlimeReadWriteFuture.wait() raises instead); imm_data() is a method, as upstream's.
SlimeReadWriteFuture = Future
SlimeSendFuture = Future
SlimeRecvFuture = Future
SlimeImmRecvFuture = Future

__all__ = [
    "Endpoint",
    "Future",
    "MemoryPool",
    "SlimeImmRecvFuture",
    "SlimeReadWriteFuture",
    "SlimeRecvFuture",
    "SlimeSendFuture",
    "SlimeTcpReadWriteFuture",
    "SlimeTcpRecvFuture",
    "SlimeTcpSendFuture",
    "StatusCode",
    "TcpMemoryPool",
    "__version__",
    "available_nic",
    "available_transports",
    "discover_topology",
    "get_log_level",
    "get_logger",
    "make_endpoint",
    "set_log_level",
    "wait_all",
    "wait_any",
]

# The parts below are bound only when they are built (BUILD_TCP, BUILD_RDMA, BUILD_NANOCTRL).
try:
    from ._dlslime import TcpEndpoint  # noqa: F401
except ImportError:
    pass
else:
    __all__.append("TcpEndpoint")

try:
    from ._dlslime import RDMAContext, RDMAEndpoint, RDMAMemoryPool  # noqa: F401
except ImportError:
    pass
else:
    __all__ += ["RDMAContext", "RDMAEndpoint", "RDMAMemoryPool"]

try:
    from ._dlslime import NVLinkEndpoint  # noqa: F401
except ImportError:
    pass
else:
    __all__.append("NVLinkEndpoint")

try:
    from ._dlslime import AscendDirectEndpoint  # noqa: F401
except ImportError:
    pass
else:
    __all__.append("AscendDirectEndpoint")

try:
    from ._dlslime import NanoCtrlClient, NanoCtrlServer, PeerAgent, PeerConnection  # noqa: F401
except ImportError:
    pass
else:
    from . import nanoctrl  # noqa: F401,E402
    from . import peer_agent  # noqa: F401,E402
    from .peer_agent import start_peer_agent  # noqa: F401,E402

    __all__ += ["NanoCtrlClient", "NanoCtrlServer", "PeerAgent", "PeerConnection", "nanoctrl", "peer_agent",
                "start_peer_agent"]

__all__.sort()
