"""Parse and print durations such as `30s`, `5m`, `1h`, `1d` as whole seconds."""

from __future__ import annotations

__all__ = ["parse_duration", "format_duration"]

import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PATTERN = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")


def parse_duration(text: object) -> int:
    """Return the duration in seconds; raise ValueError with the accepted forms if `text` is not one.

    >>> parse_duration("5m")
    300
    """
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a duration; write e.g. 30s, 5m, 1h, 1d")
    if isinstance(text, int):
        if text <= 0:
            raise ValueError(f"{text!r} is not a positive duration; write e.g. 30s, 5m, 1h, 1d")
        return text
    match = _PATTERN.match(str(text))
    if not match or int(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration; write e.g. 30s, 5m, 1h, 1d")
    return int(match.group(1)) * _UNITS[match.group(2)]


def format_duration(seconds: int) -> str:
    """Shortest exact spelling of `seconds` (86400 -> '1d', 90 -> '90s')."""
    for unit in ("d", "h", "m"):
        if seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"
