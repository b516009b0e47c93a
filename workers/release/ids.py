"""Deterministic release ids: the same topology, metric and window always name the same release."""

from __future__ import annotations

__all__ = ["release_id"]

import hashlib
from functools import lru_cache
from typing import Any


def release_id(topology_version: str, metric: str, window_start: int, window_end: int) -> str:
    """sha256 hex of `topology_version|metric|window_start|window_end` (deterministic: a restart reproduces it).

    >>> release_id("v", "m", 0, 60) == release_id("v", "m", 0, 60)
    True
    """
    h = _prefix(topology_version, metric).copy()
    h.update(b"%d|%d" % (int(window_start), int(window_end)))
    return h.hexdigest()


@lru_cache(maxsize=1024)
def _prefix(topology_version: str, metric: str) -> Any:
    """sha256 fed with `topology_version|metric|` (copied per release id, never updated itself)."""
    return hashlib.sha256(f"{topology_version}|{metric}|".encode())
