"""NanoCtrl, DLSlime's control plane: agents register, heartbeat, discover each other,
publish memory-region records and exchange handshake messages through it.

In-process (tests, single host)::

    with dlslime.nanoctrl.serve(port=0) as url:
        client = dlslime.nanoctrl.NanoCtrlClient(url)

    with dlslime.nanoctrl.serve(port=0, token=secret) as url:      # requests need the token
        client = dlslime.nanoctrl.NanoCtrlClient(url, token=secret)  # or $DLSLIME_NANOCTRL_TOKEN

As a service: ``nanoctrl server`` (foreground) or ``nanoctrl start|stop|status`` (daemon);
``python -m dlslime.nanoctrl`` is the same command. See docs/control-plane.md.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator, List, Optional

from .._dlslime import NanoCtrlClient, NanoCtrlServer, _nanoctrl_main

__all__ = ["NanoCtrlClient", "NanoCtrlServer", "serve", "main", "DEFAULT_URL"]

DEFAULT_URL = "http://127.0.0.1:4479"


@contextlib.contextmanager
def serve(host: str = "127.0.0.1", port: int = 0, redis_url: Optional[str] = None, token: Optional[str] = None,
          **options) -> Iterator[str]:
    """Run a NanoCtrl server in this process for the duration of the ``with`` block.

    Yields its URL (``port=0`` picks a free port). ``redis_url=None`` uses the in-memory store.
    ``token``: when set, every request but ``GET /healthz`` must carry
    ``Authorization: Bearer <token>`` (``NanoCtrlClient(url, token=...)`` sends it); a request
    without it gets 401 (``PermissionError`` in the client). ``None`` = no authentication.
    Other keyword options are ``NanoCtrlServer``'s (ttl, max_threads, max_waiters, max_wait,
    mailbox_max, mailbox_ttl, key_prefix, max_body, keep_alive, redis_timeout).
    """
    server = NanoCtrlServer(host=host, port=port, redis_url=redis_url, token=token, **options)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def main(argv: Optional[List[str]] = None) -> int:
    """The ``nanoctrl`` command: ``nanoctrl [server|start|stop|status] [options]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    # `start` runs this same command again as a daemon: `python -m dlslime.nanoctrl server ...`.
    return _nanoctrl_main(args, [sys.executable, "-m", "dlslime.nanoctrl"])
