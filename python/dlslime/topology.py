"""Upstream DLSlime's host discovery: ``available_nic()`` and ``discover_topology()``.

``available_nic()`` lists the RDMA devices this build can use: the RDMA transport's own
list when it is built (``_dlslime.available_nic``), else ``[]`` (no RDMA device, not an
error; TCP needs none). ``discover_topology()`` returns upstream's record shape (schema
version 1) built from that list and ``available_transports()``; it never raises for a
host without NICs (upstream's PeerAgent needed one, ours does not).
"""

from __future__ import annotations

import socket
import time
from typing import Any, Dict, List, Optional, Sequence

from . import _dlslime

__all__ = ["available_nic", "discover_topology"]


def available_nic() -> List[str]:
    """Names of the RDMA devices this build can use; ``[]`` without any."""
    nics = getattr(_dlslime, "available_nic", None)
    return list(nics()) if nics is not None else []


def _host_address() -> str:
    """The address the host name resolves to (IPv4), else loopback."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def discover_topology(preferred_device: Optional[str] = None, ib_port: int = 1,
                      preferred_link_type: Optional[str] = None, sysfs_root: str = "/sys",
                      devices: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """This host as upstream's topology record: ``host`` {hostname, address}, ``nics``
    (one per RDMA device; ``preferred_device`` first, ``devices`` restricts the list),
    ``accelerators`` (none are probed), ``memory_keys``, ``transports`` (ours:
    ``available_transports()``), ``schema_version`` 1 and ``topology_epoch``.
    ``sysfs_root`` is accepted for upstream's signature; devices come from the RDMA
    transport, not from sysfs."""
    if not isinstance(ib_port, int) or isinstance(ib_port, bool) or ib_port < 1:
        raise ValueError(f"ib_port must be an int >= 1, not {ib_port!r}")
    if not isinstance(sysfs_root, str):
        raise TypeError("sysfs_root must be a str")
    names = available_nic()
    if devices is not None:
        wanted = [str(d) for d in devices]
        names = [n for n in names if n in wanted]
    if preferred_device in names:
        names.remove(preferred_device)
        names.insert(0, preferred_device)
    nics = [{"name": n, "device": n, "ib_port": ib_port, "link_type": preferred_link_type or ""} for n in names]
    return {
        "schema_version": 1,
        "host": {"hostname": socket.gethostname(), "address": _host_address()},
        "nics": nics,
        "accelerators": [],
        "memory_keys": [],
        "transports": _dlslime.available_transports(),
        "topology_epoch": int(time.time()),
    }
