"""One metric on one source partition: event-time windows, contribution bounding, partial aggregates.

Per (unit, window): at most `max_keys` distinct keys (L0) and `max_per_key` events per key (L∞),
the *first* ones in partition (offset) order, so replaying a partition rebuilds the same partial.
Values are clamped to `bounds` first. `count_units` counts a unit once per (window, key).

Partial values per key: count / count_units / top_k → int; sum and mean over a public
denominator → clamped float sum; mean without denominator → [clamped sum, count]. Sums stay
floats here (exact enough for a partial; the noise module moves them to its fixed-point grid).
"""

from __future__ import annotations

__all__ = ["MetricAccumulator", "PartialValues"]

import math
from typing import Any

from topology.model import Aggregate, Metric, Source

PartialValues = dict[str, Any]
"""key → int count, float sum, or [sum, count] for a mean without public denominator."""

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
    """Windows of one metric on one partition; `add` is the per-event hot path."""

    def __init__(self, metric: Metric, source: Source, *, reuse_window: bool = True) -> None:
        """`reuse_window=False` sends every event through the general window-grid path (the
        reference the tumbling fast path is tested against)."""
        self.metric = metric
        self._reuse_window = reuse_window
        self.size = metric.window.size_s
        self.every = metric.window.every_s
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
        c = metric.contribution
        self._max_keys = c.max_keys if self._group is not None else 1
        self._max_per_key = 1 if self._kind == _UNITS else c.max_per_key
        self._bounded = not source.event_level
        self.windows: dict[int, _WindowState] = {}
        self.next_start: int | None = None
        """Smallest window start not yet emitted; None until the partition has a time."""
        self.emitted_any = False
        self.capped = 0
        self.clamped = 0
        self.skipped = 0
        """Events without this metric's value / group field, or outside its declared keys."""
        self._current: list[Any] = [math.inf, -math.inf, None]
        """Tumbling windows: [start, end, state] of the window the last event went to (emission clears it)."""
        self.add_fn = self._make_add()
        """The specialised per-event closure (what `add` calls); drivers may call it directly."""

    # -- window grid -------------------------------------------------------------------
    def first_start_covering(self, ts: float) -> int:
        """Start of the earliest window containing `ts`."""
        return (int(ts // self.every) * self.every) - self.size + self.every

    def first_start_after(self, watermark: float) -> int:
        """Start of the earliest window whose end lies beyond `watermark` (not yet final)."""
        return (math.floor((watermark - self.size) / self.every) + 1) * self.every

    # -- hot path ----------------------------------------------------------------------
    def add(self, unit: str, ts: float, fields: dict[str, Any], offset: int, watermark: float) -> bool:
        """Add one validated event; returns True when some window of it was already final (late).

        Replaced per instance by a closure specialised to this metric (see `_make_add`): the hot
        path then reads its settings from closure cells instead of attributes.
        """
        return self.add_fn(unit, ts, fields, offset, watermark)

    def _make_add(self):  # noqa: C901 - one flat function is the point: it runs per event
        group = self._group
        declared = self._keys
        value_field = self._value
        lo, hi = self._lo, self._hi
        max_keys, max_per_key = self._max_keys, self._max_per_key
        bounded = self._bounded
        kind = self._kind
        every, size = self.every, self.size
        windows = self.windows
        is_units = kind == _UNITS
        is_count = kind == _COUNT or is_units
        is_sum = kind == _SUM
        grouped = group is not None
        acc = self
        cur = self._current
        tumbling = every == size and self._reuse_window

        def add(unit: str, ts: float, fields: dict[str, Any], offset: int, watermark: float) -> bool:
            if grouped:
                key = fields.get(group)
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
            v = 0.0
            if value_field is not None:
                raw = fields.get(value_field)
                if raw is None:
                    acc.skipped += 1
                    return False
                v = float(raw)
                if v < lo:
                    v = lo
                    acc.clamped += 1
                elif v > hi:
                    v = hi
                    acc.clamped += 1
            if cur[0] <= ts < cur[1] and cur[1] > watermark:
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
                    if s + size <= watermark:
                        late = True
                        continue
                    next_start = acc.next_start
                    if next_start is not None and s < next_start:
                        if acc.emitted_any:
                            late = True
                            continue
                        acc.next_start = s  # before any emission: extend the sequence back
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
                    agg[key] = agg.get(key, 0.0) + v
                else:
                    pair = agg.get(key)
                    if pair is None:
                        agg[key] = [v, 1]
                    else:
                        pair[0] += v
                        pair[1] += 1
            return late

        return add

    # -- emission ----------------------------------------------------------------------
    def start_at(self, start: int) -> None:
        """Begin this partition's window sequence at `start` if it has none yet."""
        if self.next_start is None:
            self.next_start = start

    def emit_final(self, watermark: float, max_empty_run: int) -> list[tuple[int, PartialValues]]:
        """Pop every window whose end ≤ watermark, in order, empty ones included.

        A run of more than `max_empty_run` empty windows (an idle partition after a long gap) is
        jumped over instead of emitted; the merger reads a later partial as "empty before".
        """
        out: list[tuple[int, PartialValues]] = []
        self._current[0], self._current[1], self._current[2] = math.inf, -math.inf, None
        s = self.next_start
        if s is None:
            return out
        size, every, windows = self.size, self.every, self.windows
        while s + size <= watermark:
            st = windows.pop(s, None)
            if st is not None:
                out.append((s, st.agg))
                s += every
                continue
            nxt = min((w for w in windows if w > s), default=None)
            limit = math.floor((watermark - size) / every) * every  # last final start
            stop = limit if nxt is None else min(limit, nxt - every)
            run = (stop - s) // every + 1
            if run > max_empty_run:
                s = stop + every
                continue
            out.append((s, {}))
            s += every
        if s != self.next_start:
            self.emitted_any = True
        self.next_start = s
        return out

    def flush(self) -> list[tuple[int, PartialValues]]:
        """End of stream: emit every window up to the last one holding data."""
        if not self.windows:
            return []
        last = max(self.windows)
        return self.emit_final(last + self.size, max_empty_run=1 << 62)

    def first_open_offset(self) -> int | None:
        """Smallest first-offset among windows not yet emitted (None if none is open)."""
        if not self.windows:
            return None
        return min(st.first_offset for st in self.windows.values())
