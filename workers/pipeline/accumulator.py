"""One metric on one source partition: the public window schedule, contribution bounding, partial sums.

Windows follow a public schedule: every window of the metric's grid from the deployment start S
onwards (the first window starting at or after S), closed in order and emitted whether or not any
event fell in it. An event counts in window w iff its own event time lies in w and its own
arrival (append) time is at or before w's close time C(w) = end(w) + allowed_lateness (DESIGN §1,
§3). Nothing another event did moves that decision.

Per (unit, window): at most `max_keys` distinct keys (L0) and `max_per_key` events per key (L∞),
the *first* ones in partition (offset) order, so replaying a partition rebuilds the same partial.
Values are clamped to `bounds` and then put on an exact integer grid (`fixed_point`).
`count_units` counts a unit once per (window, key).

Partial values per key: count / count_units / top_k → int; sum and mean over a public
denominator → integer grid units; mean without denominator → [grid units, count].
"""

from __future__ import annotations

__all__ = ["MetricAccumulator", "PartialValues"]

import math
from typing import Any

from dpstream.topology.model import Aggregate, Metric, Source
from dpstream.workers.pipeline.fixed_point import value_exponent

PartialValues = dict[str, Any]
"""key → int count, int grid-unit sum, or [grid-unit sum, count] for a mean without public denominator."""

_COUNT, _UNITS, _SUM, _MEAN = 0, 1, 2, 3


class _WindowState:
    """Open-window state: first offset (for the safe commit), bounding tallies, aggregate."""

    __slots__ = ("first_offset", "per_key", "unit_keys", "agg")

    def __init__(self, first_offset: int) -> None:
        self.first_offset = first_offset
        self.per_key: dict[Any, int] = {}
        self.unit_keys: dict[str, int] = {}
        self.agg: PartialValues = {}


class MetricAccumulator:
    """Windows of one metric on one partition, from `first_start` on; `add` is the per-event hot path."""

    def __init__(
        self,
        metric: Metric,
        source: Source,
        first_start: int,
        *,
        until: int | None = None,
        reuse_window: bool = True,
    ) -> None:
        """`first_start`: the first window of the schedule not yet emitted here (on the grid);
        `until`: no window ending after it is ever emitted (replay's `--to`); `reuse_window=False`
        sends every event through the general window-grid path (the reference the tumbling fast
        path is tested against)."""
        self.metric = metric
        self._reuse_window = reuse_window
        self.size = metric.window.size_s
        self.every = metric.window.every_s
        self.lateness = int(source.allowed_lateness_s)
        if first_start % self.every:
            raise ValueError(f"window start {first_start} is not on the {self.every} s grid")
        agg = metric.aggregate
        if agg in (Aggregate.COUNT, Aggregate.TOP_K):
            self._kind = _COUNT
        elif agg is Aggregate.COUNT_UNITS:
            self._kind = _UNITS
        elif agg is Aggregate.MEAN and metric.denominator is None:
            self._kind = _MEAN
        else:
            self._kind = _SUM
        self._group = metric.group_by
        self._keys = frozenset(metric.keys) if metric.keys is not None else None
        self._value = metric.value if self._kind in (_SUM, _MEAN) else None
        self._lo = metric.bounds.lower if metric.bounds is not None else -math.inf
        self._hi = metric.bounds.upper if metric.bounds is not None else math.inf
        self.exponent = value_exponent(metric.bounds) if self._value is not None and metric.bounds else 0
        """Sums are kept in units of 2^-exponent (see `fixed_point`)."""
        c = metric.contribution
        self._max_keys = c.max_keys if self._group is not None else 1
        self._max_per_key = 1 if self._kind == _UNITS else c.max_per_key
        self._bounded = not source.event_level
        self.windows: dict[int, _WindowState] = {}
        self.first_start = first_start
        """The first window this accumulator was started at (earlier ones are never emitted here)."""
        self.next_start = first_start
        """Smallest window start not yet emitted: every earlier window is closed here."""
        self.until = until
        self.capped = 0
        self.clamped = 0
        self.skipped = 0
        """Events without this metric's value / group field, or outside its declared keys."""
        self._current: list[Any] = [math.inf, -math.inf, None]
        """Tumbling windows: [start, end, state] of the window the last event went to (emission clears it)."""
        self.add_fn = self._make_add()
        """The specialised per-event closure (what `add` calls); drivers may call it directly."""

    # -- hot path ----------------------------------------------------------------------
    def add(self, unit: str, ts: float, fields: dict[str, Any], offset: int, horizon: float) -> bool:
        """Add one validated event; `horizon` = its arrival time − allowed_lateness: a window that
        ends before it had closed when the event arrived. Returns True when some window covering
        the event time was missed (closed on arrival, already emitted, or before the schedule).

        Replaced per instance by a closure specialised to this metric (see `_make_add`): the hot
        path then reads its settings from closure cells instead of attributes.
        """
        return self.add_fn(unit, ts, fields, offset, horizon)

    def _make_add(self):  # one flat function is the point: it runs per event
        group = self._group
        declared = self._keys
        value_field = self._value
        lo, hi = self._lo, self._hi
        scale = math.ldexp(1.0, self.exponent)
        max_keys, max_per_key = self._max_keys, self._max_per_key
        bounded = self._bounded
        kind = self._kind
        every, size = self.every, self.size
        windows = self.windows
        is_units = kind == _UNITS
        is_count = kind == _COUNT or is_units
        is_sum = kind == _SUM
        grouped = group is not None
        group_field = group if group is not None else ""  # read only when grouped
        acc = self
        cur = self._current
        tumbling = every == size and self._reuse_window
        first = self.first_start

        def add(unit: str, ts: float, fields: dict[str, Any], offset: int, horizon: float) -> bool:
            if grouped:
                key = fields.get(group_field)
                if key is None:
                    acc.skipped += 1
                    return False
                if type(key) is not str:
                    key = str(key)
                if declared is not None and key not in declared:
                    acc.skipped += 1
                    return False
                uk: Any = (unit, key)
            else:
                key = ""
                uk = unit
            v = 0
            if value_field is not None:
                raw = fields.get(value_field)
                if raw is None:
                    acc.skipped += 1
                    return False
                f = float(raw)
                if f < lo:
                    f = lo
                    acc.clamped += 1
                elif f > hi:
                    f = hi
                    acc.clamped += 1
                v = round(f * scale)  # exact integer grid units; bounds are whole units
            if cur[0] <= ts < cur[1] and cur[1] >= horizon:
                # tumbling, same open window as the previous event (the common case): no grid math
                start = last = cur[0]
                known = cur[2]
            else:
                last = int(ts // every) * every
                start = last - size + every
                known = None
            late = False
            while start <= last:
                s = start
                start += every
                if known is not None:
                    st = known
                else:
                    if s + size < horizon or s < acc.next_start:
                        if s >= first:  # closed when the event arrived, or already emitted here
                            late = True
                        continue  # a window before the schedule's start S does not exist
                    st = windows.get(s)
                    if st is None:
                        st = windows[s] = _WindowState(offset)
                    if tumbling:
                        cur[0], cur[1], cur[2] = s, s + size, st
                if bounded:  # L0 then L∞, first contributions win
                    per_key = st.per_key
                    n = per_key.get(uk, 0)
                    if n == 0:
                        if grouped:
                            unit_keys = st.unit_keys
                            nk = unit_keys.get(unit, 0)
                            if nk >= max_keys:
                                acc.capped += 1
                                continue
                            unit_keys[unit] = nk + 1
                    elif n >= max_per_key:
                        if not is_units:
                            acc.capped += 1
                        continue
                    per_key[uk] = n + 1
                agg = st.agg
                if is_count:
                    agg[key] = agg.get(key, 0) + 1
                elif is_sum:
                    agg[key] = agg.get(key, 0) + v
                else:
                    pair = agg.get(key)
                    if pair is None:
                        agg[key] = [v, 1]
                    else:
                        pair[0] += v
                        pair[1] += 1
            return late

        return add

    # -- closing -------------------------------------------------------------------------
    def close_time(self, start: int) -> int:
        """C(w) of the window starting at `start`: its end plus the allowed lateness."""
        return start + self.size + self.lateness

    def next_close_time(self) -> int | None:
        """C(w) of the next window to emit (None when the schedule has ended)."""
        s = self.next_start
        if self.until is not None and s + self.size > self.until:
            return None
        return self.close_time(s)

    def close_through(self, t: float, limit: int | None = None) -> list[tuple[int, PartialValues]]:
        """Pop, in order, every window with C(w) ≤ t (empty ones included), at most `limit` of them.

        The caller guarantees that every record appended up to t has been consumed: nothing can
        join these windows any more.
        """
        out: list[tuple[int, PartialValues]] = []
        self._current[0], self._current[1], self._current[2] = math.inf, -math.inf, None
        s = self.next_start
        size, every, windows, lateness, until = self.size, self.every, self.windows, self.lateness, self.until
        while s + size + lateness <= t and (until is None or s + size <= until):
            if limit is not None and len(out) >= limit:
                break
            st = windows.pop(s, None)
            out.append((s, st.agg if st is not None else {}))
            s += every
        self.next_start = s
        if until is not None:  # events for windows past the schedule's end are never emitted
            for w in [w for w in windows if w + size > until]:
                del windows[w]
        return out

    def first_open_offset(self) -> int | None:
        """Smallest first-offset among windows not yet emitted (None if none is open)."""
        if not self.windows:
            return None
        return min(st.first_offset for st in self.windows.values())
