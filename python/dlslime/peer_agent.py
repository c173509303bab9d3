"""``dlslime.peer_agent``: upstream DLSlime's module path for the agent.

``PeerAgent`` is the C++ agent (``dlslime.PeerAgent``); ``start_peer_agent(...)`` makes
one with the same arguments, as upstream's does (docs/peer-agent.md,
docs/upstream-compat.md).
"""

from __future__ import annotations

from ._dlslime import PeerAgent, PeerConnection

__all__ = ["PeerAgent", "PeerConnection", "start_peer_agent"]


def start_peer_agent(*args, **kwargs) -> PeerAgent:
    """``PeerAgent(*args, **kwargs)``: registers with NanoCtrl and starts the agent."""
    return PeerAgent(*args, **kwargs)
