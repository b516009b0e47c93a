"""Deterministic release ids: the same topology, metric and window always name the same release."""

from __future__ import annotations

__all__ = ["release_id"]

import hashlib


def release_id(topology_version: str, metric: str, window_start: int, window_end: int) -> str:
    """sha256 hex of `topology_version|metric|window_start|window_end` (DESIGN §4 step 1).

    >>> release_id("v", "m", 0, 60) == release_id("v", "m", 0, 60)
    True
    """
    blob = f"{topology_version}|{metric}|{int(window_start)}|{int(window_end)}".encode()
    return hashlib.sha256(blob).hexdigest()
