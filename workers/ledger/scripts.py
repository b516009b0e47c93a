"""The ledger's Lua scripts, read once from package data (`workers/ledger/lua/*.lua`)."""

from __future__ import annotations

__all__ = ["SCRIPT_NAMES", "script_text", "script_sha"]

import hashlib
from functools import cache
from importlib.resources import files

SCRIPT_NAMES = ("apply", "commit", "quote")


@cache
def script_text(name: str) -> str:
    """The source of `lua/<name>.lua`."""
    if name not in SCRIPT_NAMES:
        raise KeyError(name)
    return (files("dpstream.workers.ledger") / "lua" / f"{name}.lua").read_text(encoding="utf-8")


@cache
def script_sha(name: str) -> str:
    """The SHA1 that EVALSHA names `lua/<name>.lua` by (what SCRIPT LOAD answers for it)."""
    return hashlib.sha1(script_text(name).encode("utf-8")).hexdigest()
