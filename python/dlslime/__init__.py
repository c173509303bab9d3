"""DLSlime: a peer-to-peer transfer engine.

``TcpEndpoint`` moves bytes between two processes over TCP; ``PeerAgent`` finds peers and
connects them through the NanoCtrl control plane (``dlslime.nanoctrl``). Every operation
returns a ``Future``. See docs/quickstart.md.
"""

from ._dlslime import (  # noqa: F401
    Future,
    NanoCtrlClient,
    NanoCtrlServer,
    PeerAgent,
    PeerConnection,
    StatusCode,
    TcpEndpoint,
    __version__,
    get_log_level,
    set_log_level,
)
from . import nanoctrl  # noqa: F401,E402

__all__ = [
    "Future",
    "NanoCtrlClient",
    "NanoCtrlServer",
    "PeerAgent",
    "PeerConnection",
    "StatusCode",
    "TcpEndpoint",
    "__version__",
    "get_log_level",
    "nanoctrl",
    "set_log_level",
]
