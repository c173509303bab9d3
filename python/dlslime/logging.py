"""Logging for upstream DLSlime scripts: ``get_logger`` and a ``set_log_level`` that takes
upstream's forms.

The library logs through its own spdlog logger (C++, quiet by default; docs/api.md,
"Logging"). ``set_log_level(level)`` sets that logger and the Python logger ``"slime"``
(upstream's root name, which ``get_logger`` hands out) to the same level, so a script's
``dlslime.set_log_level(logging.INFO)`` shows both. ``level``: ``"info"``, ``"INFO"``,
``"warning"``, ... or a ``logging`` number.
"""

from __future__ import annotations

import logging as _logging
from typing import Optional, Union

from . import _dlslime

__all__ = ["get_logger", "set_log_level", "get_log_level"]

_ROOT = "slime"
# The library's level names (get_log_level()) as Python logging levels.
_PY_LEVEL = {
    "trace": 5,
    "debug": _logging.DEBUG,
    "info": _logging.INFO,
    "warning": _logging.WARNING,
    "error": _logging.ERROR,
    "critical": _logging.CRITICAL,
    "off": _logging.CRITICAL + 10,
}


def get_logger(name: Optional[str] = None) -> _logging.Logger:
    """The Python logger ``"slime"``, or ``"slime.<name>"`` (a name already under
    ``"slime"`` is kept)."""
    if not name:
        return _logging.getLogger(_ROOT)
    if name == _ROOT or name.startswith(_ROOT + "."):
        return _logging.getLogger(name)
    return _logging.getLogger(f"{_ROOT}.{name}")


def set_log_level(level: Union[int, str]) -> _logging.Logger:
    """Set the library's level and the ``"slime"`` Python logger's; returns that logger.
    An unknown name raises ``ValueError``, another type ``TypeError``."""
    _dlslime.set_log_level(level)  # the one parser of level names and numbers
    logger = get_logger()
    logger.setLevel(_PY_LEVEL.get(_dlslime.get_log_level(), _logging.WARNING))
    return logger


def get_log_level() -> str:
    """The library's level name: trace, debug, info, warning, error, critical or off."""
    return _dlslime.get_log_level()


# Quiet unless the application configures logging (the library's default too).
get_logger().addHandler(_logging.NullHandler())
