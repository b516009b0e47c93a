"""The public schedule of one metric: its windows on the grid, none starting before the schedule start S.

A window is [s, s + size_s) with s a multiple of every_s (the UTC-epoch grid). A deployment that
starts at S releases only the windows starting at or after S; with no S (`start` None) every grid
window counts. Every count of "which windows of a period" (pricing, plan gauges, report, verify,
the pipeline's first window) is one method here, so they cannot drift apart. Pure: no I/O.

A budget schedule (`schedule:`, `model.HourlyShape`) weighs a window by the UTC hour of day its
start falls in; `starts_by_hour` and `left_by_hour` count windows per such hour, for a grid whose
step divides a day (so every day holds the same starts at the same hours).

Degenerate grids keep the behaviour their callers always had: `starts_in` and `ended` count nothing
when every_s ≤ 0 (and `ended` when size_s ≤ 0); the other methods divide by every_s.
"""

from __future__ import annotations

__all__ = ["Schedule"]

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from dpstream.topology.model import HOURS_PER_DAY, Metric, Window

_DAY_S = 86_400
_HOUR_S = 3_600


@dataclass(frozen=True, slots=True)
class Schedule:
    """A metric's window grid (size_s, every_s) from the schedule start S (`start`; None: no S)."""

    size_s: int
    every_s: int
    start: int | None = None

    @classmethod
    def of(cls, metric: Metric, schedule_start: int | None = None) -> Schedule:
        """The public schedule of `metric` for a deployment starting at `schedule_start` (None: no S)."""
        return cls.of_window(metric.window, schedule_start)

    @classmethod
    def of_window(cls, window: Window, schedule_start: int | None = None) -> Schedule:
        """The public schedule of a metric with this window, from `schedule_start` (None: no S)."""
        return cls(window.size_s, window.every_s, None if schedule_start is None else int(schedule_start))

    def first_start_at_or_after(self, t: float) -> int:
        """The first grid start at or after `t` (truncated to an int second), S not applied."""
        every = self.every_s
        return -(-int(t) // every) * every

    def first_window(self) -> int:
        """The schedule's first window start: the first grid start at or after S (S must be set)."""
        if self.start is None:
            raise ValueError("a schedule without a start S has no first window")
        return self.first_start_at_or_after(self.start)

    def first_in_period(self, period_start: int) -> int:
        """The first window of the schedule starting in the period from `period_start`: the first grid
        start at or after both the period's start and S (a running total's step 1)."""
        lo = period_start if self.start is None or self.start <= period_start else self.start
        return self.first_start_at_or_after(lo)

    def on_grid(self, start: int, end: int) -> bool:
        """True when [start, end) is a window of the grid (size_s long, on a multiple of every_s); S not applied."""
        return end - start == self.size_s and start % self.every_s == 0

    def starts(self, since: float | None = None) -> Iterator[int]:
        """Window starts in order, without end, from the first at or after both S and `since` (one must be set)."""
        if self.start is None:
            if since is None:
                raise ValueError("a schedule without a start S needs `since`")
            return itertools.count(self.first_start_at_or_after(since), self.every_s)
        first = self.first_window()
        if since is not None and since > first:
            first = self.first_start_at_or_after(since)
        return itertools.count(first, self.every_s)

    def starts_in(self, lo: int, hi: int) -> int:
        """How many windows start in [max(lo, S), hi); 0 when every_s ≤ 0."""
        every = self.every_s
        if self.start is not None and self.start > lo:
            lo = self.start
        if every <= 0 or hi <= lo:
            return 0
        first = -(-lo // every) * every
        last = ((hi - 1) // every) * every
        return 0 if last < first else (last - first) // every + 1

    def left(self, period_start: int, period_s: int, current_end: int) -> int:
        """Windows starting in the period [period_start, +period_s), not before S, that end at or after
        `current_end`: a metric's releases still to come when a window ending at `current_end` is priced."""
        # the ledger's quote path calls this per metric per quote: kept to plain integer steps
        every = self.every_s
        first = current_end - self.size_s
        if first < period_start:
            first = period_start
        start = self.start
        if start is not None and start > first:
            first = start
        first = -(-first // every) * every  # the first grid start ≥ first
        last = period_start + period_s - 1
        return 0 if first > last else (last - first) // every + 1

    def ended(self, period_start: int, period_end: int, now: float) -> int:
        """Windows starting in [max(period_start, S), period_end) that have ended by `now` (s + size_s ≤ now);
        0 when every_s ≤ 0 or size_s ≤ 0."""
        size, every = self.size_s, self.every_s
        if self.start is not None and self.start > period_start:
            period_start = self.start
        if every <= 0 or size <= 0 or period_end <= period_start:
            return 0
        first = -(-period_start // every) * every
        last_in_period = ((period_end - 1) // every) * every
        last_ended = (
            (math.floor(now) - size) // every * every
        )  # s + size ≤ now ⇔ s + size ≤ ⌊now⌋: exact for a float now
        last = min(last_in_period, last_ended)
        return 0 if last < first else int((last - first) // every) + 1

    def touching(self, period_start: int, horizon: int) -> int:
        """Windows not starting before S that end after `period_start` and at or before `horizon`."""
        size, every = self.size_s, self.every_s
        first = -(-(period_start - size + 1) // every) * every  # the first window whose end passes period_start
        if self.start is not None:
            first = max(first, self.first_window())
        last = (horizon - size) // every * every
        return max(0, (last - first) // every + 1) if last >= first else 0

    def starts_by_hour(self, lo: int, hi: int) -> tuple[int, ...]:
        """How many windows start in [max(lo, S), hi) in each UTC hour of day (index 0: 00:00–01:00).
        The step must divide a day (ValueError otherwise). Σ of the counts is `starts_in(lo, hi)`."""
        every = self.every_s
        if every <= 0 or _DAY_S % every:
            raise ValueError(f"a window step of {every}s does not divide a day: no hour-of-day pattern")
        if self.start is not None and self.start > lo:
            lo = self.start
        if hi <= lo:
            return (0,) * HOURS_PER_DAY
        below_hi, below_lo = _starts_before(every, hi), _starts_before(every, lo)
        return tuple(a - b for a, b in zip(below_hi, below_lo, strict=True))

    def left_by_hour(self, period_start: int, period_s: int, current_end: int) -> tuple[int, ...]:
        """`left` per UTC hour of day of the window start: the windows of the period, not before S, that
        end at or after `current_end`, by the hour they start in (the step must divide a day)."""
        first = max(current_end - self.size_s, period_start)
        return self.starts_by_hour(first, period_start + period_s)


@lru_cache(maxsize=1024)
def _per_day(every: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(starts per UTC hour of one day, starts of the day before each hour) of a grid of step `every` | day."""
    per_hour = tuple(_starts_between(every, h * _HOUR_S, (h + 1) * _HOUR_S) for h in range(HOURS_PER_DAY))
    return per_hour, tuple(itertools.accumulate(per_hour, initial=0))[:HOURS_PER_DAY]


def _starts_between(every: int, lo: int, hi: int) -> int:
    """Multiples of `every` in [lo, hi)."""
    return max(0, -(-hi // every) - -(-lo // every))


def _starts_before(every: int, t: int) -> tuple[int, ...]:
    """Per UTC hour of day, the grid starts before `t` (from epoch 0: only differences are used)."""
    days, into = divmod(t, _DAY_S)
    per_hour, _ = _per_day(every)
    hour, into_hour = divmod(into, _HOUR_S)
    partial = _starts_between(every, hour * _HOUR_S, hour * _HOUR_S + into_hour)
    return tuple(days * n + (n if h < hour else partial if h == hour else 0) for h, n in enumerate(per_hour))
