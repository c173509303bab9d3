"""``dlslime.ctrl.NanoCtrlClient``: upstream DLSlime's control-plane client, by its method
names and return conventions, over our NanoCtrl client (``dlslime.NanoCtrlClient``).

Upstream's conventions, kept here: the entity calls never raise (``register`` and
``unregister`` return a bool, ``heartbeat`` ``"ok"``/``"not_found"``/``"error"``,
``get_entity_info`` ``None`` when absent, ``list_entities`` a list); the peer calls raise
on an error reply (ours: the exception of its status, docs/api.md "Exceptions").
``get_redis_url()`` returns the Redis URL of a NanoCtrl on the Redis store, ``None`` on the
memory store. docs/upstream-compat.md lists the rest.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, Dict, List, Optional

from ._dlslime import NanoCtrlClient as _Client

__all__ = ["NanoCtrlClient"]


def _url(address: str) -> str:
    if not isinstance(address, str) or not address:
        raise ValueError("address must be a non-empty str (host:port or a URL)")
    return address if "://" in address else "http://" + address


class NanoCtrlClient:
    """``NanoCtrlClient(address, scope=None)``; ``address`` may omit ``http://``."""

    def __init__(self, address: str, scope: Optional[str] = None) -> None:
        self._client = _Client(_url(address), scope=scope)
        self._entity: Optional[Dict[str, str]] = None  # the last one register() made
        self._hb_stop = threading.Event()
        self._hb_thread: Optional[threading.Thread] = None

    @property
    def address(self) -> str:
        return self._client.url

    @property
    def scope(self) -> Optional[str]:
        return self._client.scope or None

    def check_connection(self) -> None:
        """Raises ``RuntimeError`` if NanoCtrl does not answer."""
        try:
            self._client.healthz()
        except Exception as e:  # upstream raises RuntimeError whatever the cause
            raise RuntimeError(f"NanoCtrl at {self.address} is not reachable: {e}") from e

    # --- entities: never raise ------------------------------------------------------

    def register(self, entity_id: str, kind: str, *, entity_type: str = "service",
                 endpoint: Optional[Any] = None, metadata: Optional[dict] = None,
                 resource: Optional[dict] = None) -> bool:
        try:
            self._client.register(entity_id, kind, entity_type, endpoint, metadata, resource)
        except Exception:
            return False
        self._entity = {"entity_id": entity_id, "entity_type": entity_type}
        return True

    def unregister(self) -> bool:
        """Unregisters the entity the last ``register`` made; False if none or on error."""
        if self._entity is None:
            return False
        try:
            self._client.unregister(self._entity["entity_id"], self._entity["entity_type"])
        except Exception:
            return False
        self._entity = None
        return True

    def heartbeat(self) -> str:
        if self._entity is None:
            return "not_found"
        try:
            status = self._client.heartbeat(self._entity["entity_id"], self._entity["entity_type"])
        except Exception:
            return "error"
        return "ok" if status == "ok" else "not_found" if status == "not_found" else "error"

    def get_redis_url(self) -> Optional[str]:
        """The Redis URL NanoCtrl keeps its state in (``/get_redis_address``); ``None`` when it
        uses the memory store (NanoCtrl answers 404 ``not_found``) or on an error, as upstream."""
        try:
            reply = self._client.call("/get_redis_address", {})
        except Exception:
            return None
        url = reply.get("redis_address") if isinstance(reply, dict) else None
        if not isinstance(url, str) or not url:
            return None
        return url if "://" in url else "redis://" + url

    def get_entity_info(self, entity_id: str, *, entity_type: str = "service") -> Optional[dict]:
        try:
            return self._client.get_entity_info(entity_id, entity_type)
        except Exception:
            return None

    def list_entities(self, *, entity_type: Optional[str] = "service", kind: Optional[str] = None) -> List[dict]:
        try:
            reply = self._client.list_entities(entity_type, kind)
        except Exception:
            return []
        return list(reply.get("entities", [])) if isinstance(reply, dict) else list(reply)

    def start_heartbeat(self, interval: float = 15.0, on_not_found: Optional[Callable[[], None]] = None,
                        name: str = "nanoctrl-hb") -> None:
        """Heartbeat the registered entity every ``interval`` s on a daemon thread;
        ``on_not_found`` runs when NanoCtrl no longer knows it."""
        if not interval > 0:
            raise ValueError("interval must be > 0")
        self.stop_heartbeat()
        self._hb_stop.clear()

        def loop() -> None:
            while not self._hb_stop.wait(interval):
                if self.heartbeat() == "not_found" and on_not_found is not None:
                    on_not_found()

        self._hb_thread = threading.Thread(target=loop, name=name, daemon=True)
        self._hb_thread.start()

    def stop_heartbeat(self, timeout: float = 2.0) -> None:
        self._hb_stop.set()
        if self._hb_thread is not None and self._hb_thread is not threading.current_thread():
            self._hb_thread.join(timeout)
        self._hb_thread = None

    def stop(self, timeout: float = 2.0) -> None:
        self.stop_heartbeat(timeout)

    # --- peers: raise on an error reply -------------------------------------------------

    def register_peer(self, *, alias: Optional[str], address: str, resource: Optional[dict] = None,
                      device: Optional[str] = None, ib_port: Optional[int] = None,
                      link_type: Optional[str] = None) -> dict:
        fields = {k: v for k, v in (("address", address), ("resource", resource), ("device", device),
                                    ("ib_port", ib_port), ("link_type", link_type)) if v is not None}
        return self._client.start_peer_agent(alias, **fields)

    def cleanup_peer(self, agent_name: str) -> dict:
        return self._client.cleanup(agent_name)

    def heartbeat_peer(self, agent_name: str) -> dict:
        status = self._client.heartbeat(agent_name, "agent")
        return {"status": status}

    def set_desired_topology(self, alias: str, *, target_peers: List[str], min_bw: Optional[str] = None,
                             symmetric: bool = False) -> dict:
        """``min_bw``: upstream passes a str ("100"); a number or a string holding one."""
        bw = None
        if min_bw is not None:
            try:
                bw = float(min_bw)
            except (TypeError, ValueError):
                bw = math.nan
            if isinstance(min_bw, bool) or not math.isfinite(bw):
                raise ValueError(f"min_bw must be a number or a string holding one, not {min_bw!r}")
        return self._client.set_desired_topology(alias, target_peers, symmetric, bw)

    def query_peers(self) -> List[dict]:
        return list(self._client.query())
