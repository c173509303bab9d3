"""DLSlime: a peer-to-peer transfer engine.

Every transport's endpoint is a ``dlslime.Endpoint`` (``TcpEndpoint`` moves bytes between
two processes over TCP); ``available_transports()`` says which this build and host have
and ``make_endpoint(transport, **options)`` makes one. ``PeerAgent`` finds peers and
connects them through the NanoCtrl control plane (``dlslime.nanoctrl``). Every operation
returns a ``Future``. See docs/quickstart.md.
"""

from ._dlslime import (  # noqa: F401
    Endpoint,
    Future,
    StatusCode,
    __version__,
    available_transports,
    get_log_level,
    make_endpoint,
    set_log_level,
)

__all__ = [
    "Endpoint",
    "Future",
    "StatusCode",
    "__version__",
    "available_transports",
    "get_log_level",
    "make_endpoint",
    "set_log_level",
]

# The parts below are bound only when they are built (BUILD_TCP, BUILD_NANOCTRL).
try:
    from ._dlslime import TcpEndpoint  # noqa: F401
except ImportError:
    pass
else:
    __all__.append("TcpEndpoint")

try:
    from ._dlslime import NanoCtrlClient, NanoCtrlServer, PeerAgent, PeerConnection  # noqa: F401
except ImportError:
    pass
else:
    from . import nanoctrl  # noqa: F401,E402

    __all__ += ["NanoCtrlClient", "NanoCtrlServer", "PeerAgent", "PeerConnection", "nanoctrl"]

__all__.sort()
