"""DLSlime: a peer-to-peer transfer engine.

``TcpEndpoint`` moves bytes between two processes over TCP; every operation returns a
``Future``. See docs/quickstart.md.
"""

from ._dlslime import (  # noqa: F401
    Future,
    StatusCode,
    TcpEndpoint,
    __version__,
    get_log_level,
    set_log_level,
)

__all__ = ["Future", "StatusCode", "TcpEndpoint", "__version__", "get_log_level", "set_log_level"]
