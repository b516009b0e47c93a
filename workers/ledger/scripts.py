"""The ledger's Lua scripts, read once from package data (`workers/ledger/lua/*.lua`)."""

from __future__ import annotations

__all__ = ["SCRIPT_NAMES", "script_text"]

from functools import cache
from importlib.resources import files

SCRIPT_NAMES = ("apply", "commit")


@cache
def script_text(name: str) -> str:
    """The source of `lua/<name>.lua`."""
    if name not in SCRIPT_NAMES:
        raise KeyError(name)
    return (files("dpstream.workers.ledger") / "lua" / f"{name}.lua").read_text(encoding="utf-8")
