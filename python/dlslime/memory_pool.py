"""``TcpMemoryPool``: upstream DLSlime's table of named memory regions, on its own.

Upstream scripts build one to name regions and hand out handles
(``register_memory_region(addr, length, name) -> handle``, ``get_mr_handle(name)``,
``mr_info()``) and to record a peer's regions (``register_remote_memory_region(mr_info,
name=None)``). The pool only records; the bytes move through an endpoint:
``pool.register_into(ep)`` registers every local region on ``ep`` (our endpoints keep
their own table and their own handles, which it returns by name).

Differences, kept on purpose (docs/upstream-compat.md): an empty name, a negative or
non-int address or length raise (``ValueError``/``TypeError``) instead of returning -1;
registering an existing name replaces that region, as ``Endpoint.register_memory_region``
does. ``get_mr_handle`` of an unknown name returns -1, as upstream's does.
"""

from __future__ import annotations

import operator
import threading
from typing import Any, Dict, Optional

__all__ = ["TcpMemoryPool"]


def _uint(value: Any, what: str) -> int:
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}") from None
    if n < 0 or n >= 2**64:
        raise ValueError(f"{what}={n} is out of range (0..2**64-1)")
    return n


def _name(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"name must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError("name must not be empty")
    return value


class TcpMemoryPool:
    """Named local and remote regions with small int handles (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local: Dict[str, Dict[str, int]] = {}  # name -> {addr, length, handle}
        self._remote: Dict[str, Dict[str, Any]] = {}  # name -> entry (with its handle)
        self._next_local = 0
        self._next_remote = 0

    def register_memory_region(self, addr: int, length: int, name: str) -> int:
        """Record ``[addr, addr+length)`` as ``name``; returns its handle (a new one when
        ``name`` is registered again)."""
        entry = {"addr": _uint(addr, "addr"), "length": _uint(length, "length")}
        name = _name(name)
        if entry["addr"] + entry["length"] > 2**64:
            raise ValueError(f"region '{name}' [addr, addr+length) wraps past 2**64")
        with self._lock:
            entry["handle"] = self._next_local
            self._next_local += 1
            self._local[name] = entry
            return entry["handle"]

    def get_mr_handle(self, name: str) -> int:
        """The local handle of ``name``; -1 if no local region has that name."""
        with self._lock:
            entry = self._local.get(_name(name))
            return -1 if entry is None else entry["handle"]

    def mr_info(self) -> Dict[str, Dict[str, Any]]:
        """``{name: {"addr", "length", "handle", "name"}}`` of the local regions."""
        with self._lock:
            return {n: dict(e, name=n) for n, e in self._local.items()}

    def register_remote_memory_region(self, mr_info: Dict[str, Any], name: Optional[str] = None) -> int:
        """Record a peer's region (one ``mr_info`` entry: at least ``addr`` and ``length``)
        under ``name`` (default: the entry's ``name``); returns its remote handle. The same
        name with the same entry keeps its handle."""
        if not isinstance(mr_info, dict):
            raise TypeError(f"mr_info must be a dict, not {type(mr_info).__name__}")
        for key in ("addr", "length"):
            if key not in mr_info:
                raise ValueError(f"mr_info has no '{key}'")
            _uint(mr_info[key], f"mr_info['{key}']")
        name = _name(mr_info.get("name") if name is None else name)
        with self._lock:
            old = self._remote.get(name)
            if old is not None and old["entry"] == mr_info:
                return old["handle"]
            handle = self._next_remote
            self._next_remote += 1
            self._remote[name] = {"entry": dict(mr_info), "handle": handle}
            return handle

    def remote_mr_info(self) -> Dict[str, Dict[str, Any]]:
        """The recorded remote entries by name."""
        with self._lock:
            return {n: dict(r["entry"]) for n, r in self._remote.items()}

    def register_into(self, endpoint) -> Dict[str, int]:
        """Register every local region on ``endpoint`` (any ``dlslime.Endpoint``); returns
        ``{name: the endpoint's handle}``."""
        local = self.mr_info()
        return {n: endpoint.register_memory_region(n, e["addr"], 0, e["length"]) for n, e in local.items()}
