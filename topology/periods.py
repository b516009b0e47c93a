"""Budget periods: UTC-aligned blocks of time that each get a fresh budget (see dpstream.topology).

A period of `period_s` seconds starts at a multiple of `period_s` since the Unix epoch, so a
1d period runs from 00:00 UTC to the next 00:00 UTC. A window [start, end) is charged to every
period it touches: a hopping window across midnight is charged to both days (block composition).
"""

from __future__ import annotations

__all__ = ["period_start", "period_end", "period_id", "periods_touched", "period_ids_touched"]

import math
from datetime import UTC, datetime

from dpstream.topology.errors import InternalError

_DAY_S = 86_400
_MINUTE_S = 60


def _check_period(period_s: int) -> None:
    if not isinstance(period_s, int) or isinstance(period_s, bool) or period_s <= 0:
        raise InternalError(f"period must be a positive whole number of seconds, got {period_s!r}")


def period_start(period_s: int, ts: float) -> int:
    """Start (epoch seconds) of the period that contains event time `ts`.

    >>> period_start(86_400, 1_796_044_800.5)  # 2026-11-30T13:20Z
    1795996800
    """
    _check_period(period_s)
    if not math.isfinite(ts):
        raise InternalError(f"cannot place non-finite time {ts!r} in a period")
    return (math.floor(ts) // period_s) * period_s


def period_end(period_s: int, ts: float) -> int:
    """End (exclusive, epoch seconds) of the period that contains `ts`."""
    return period_start(period_s, ts) + period_s


def period_id(period_s: int, ts: float) -> str:
    """Readable, sortable name of the period containing `ts`, used in ledger keys.

    Whole-day periods are named by their first day (`2026-11-30`); shorter ones by their UTC
    start to the minute (`2026-11-30T13:00Z`), or to the second if not minute-aligned.
    """
    start = datetime.fromtimestamp(period_start(period_s, ts), tz=UTC)
    if period_s % _DAY_S == 0:
        return start.strftime("%Y-%m-%d")
    if period_s % _MINUTE_S == 0:
        return start.strftime("%Y-%m-%dT%H:%MZ")
    return start.strftime("%Y-%m-%dT%H:%M:%SZ")


def periods_touched(period_s: int, start: float, end: float) -> tuple[int, ...]:
    """Starts of every period that the window [start, end) overlaps, in time order."""
    if not end > start:
        raise InternalError(f"window [{start}, {end}) is empty")
    first = period_start(period_s, start)
    # the last instant inside the window is just before `end`
    last = period_start(period_s, math.ceil(end) - 1) if end == math.ceil(end) else period_start(period_s, end)
    return tuple(range(first, last + 1, period_s))


def period_ids_touched(period_s: int, start: float, end: float) -> tuple[str, ...]:
    """Names (see `period_id`) of every period the window [start, end) overlaps."""
    return tuple(period_id(period_s, p) for p in periods_touched(period_s, start, end))
