"""One metric on one source partition: the public window schedule, contribution bounding, partial sums.

Windows follow a public schedule: every window of the metric's grid from the schedule start S
onwards (the first window starting at or after S), closed in order and emitted whether or not any
event fell in it. An event counts in window w iff its own event time lies in w and its own
arrival (append) time is at or before w's close time C(w) = end(w) + allowed_lateness. Nothing
another event did moves that decision.

Bounding is order-independent: which of a unit's contributions survive is a function of that
unit's own records, never of the order a repartition hop, a batch cut or a restart delivered them
in. Per (unit, window):

- L0: at most `max_keys` keys, those with the smallest `key_priority(metric, unit, window, key)`,
  a fixed public hash (a unit that steers which of its own keys count stays inside its own bound);
- L∞: at most `max_per_key` contributions per key, those with the smallest order key (the caller's
  (source append time, source partition, source offset) of each record). Counts and
  `count_units` keep only how many there were (every contribution weighs 1); sums and means keep
  the retained (order, value) pairs, so a smaller-ordered one arriving later replaces the largest.

The window's aggregate follows that state (a replaced or evicted contribution is taken out
again). With `contribution.max_windows`, each window's close then takes out, whole, the units whose
count of windows this period has reached the cap (`window_caps`): as if their events had never come.
With a running total's `contribution.max_per_period: L`, each window's close cuts every unit's
contributions, key by key in sorted key order, to what is left of L this period (`window_caps`): the
aggregate moves as if only the kept part had come, and a contribution cut to nothing is taken out.
Replaying a partition from the first event of an open window feeds it the same records, so it
rebuilds the same partial.

Values are clamped to `bounds` and then put on an exact integer grid (`fixed_point`).
`count_units` counts a unit once per (window, key).

Partial values per key: count / count_units / top_k → int; sum and mean over a public
denominator → integer grid units; mean without denominator → [grid units, count]; quantile
(ungrouped, bounded as a sum) → {'': [count per cell of its public grid]}.
"""

from __future__ import annotations

__all__ = ["MetricAccumulator", "PartialValues", "key_priority"]

import hashlib
import math
from bisect import insort
from fractions import Fraction
from typing import Any

from dpstream.topology.errors import InternalError
from dpstream.topology.model import Aggregate, Metric, Source
from dpstream.workers.pipeline.counters import MISSING_GROUP_FIELD, MISSING_VALUE_FIELD, SKIP_REASONS, UNDECLARED_KEY
from dpstream.workers.pipeline.fixed_point import value_exponent
from dpstream.workers.pipeline.quantile_cells import cell_count, cell_index
from dpstream.workers.pipeline.window_caps import CountDelta, PeriodBound, PeriodRule, WindowCaps

PartialValues = dict[str, Any]
"""key → int count, int grid-unit sum, or [grid-unit sum, count] for a mean without public denominator."""

_COUNT, _UNITS, _SUM, _MEAN = 0, 1, 2, 3

_REJECTED_KEPT = 65_536
"""Refused (unit, key) pairs remembered per window (past that, a repeat is hashed again: same answer)."""


def key_priority(metric: str, unit: str, window_start: int, key: str) -> bytes:
    """L0 rank of `key` among a unit's keys in one window of `metric`: the smaller, the sooner kept.

    A fixed public hash (BLAKE2b, 8 bytes) of (metric, unit, window start, key): the same on every
    worker, after every restart and for every replay. It need not be secret: a unit that steers
    which of its own keys count stays inside its own bound. Ties (a collision) fall to the key.
    """
    return hashlib.blake2b(f"{metric}\0{unit}\0{window_start}\0{key}".encode(), digest_size=8).digest()


class _WindowState:
    """Open-window state: first offset (for the safe commit), the retained contributions, the aggregate.

    `kept`: per (unit, key) of a grouped metric, or per unit: the number of events seen (count
    kinds; a count keeps at most `max_per_key` of them), else the retained (order, grid value)
    pair while there is one, a sorted list of them once there are more; `unit_keys`: per unit,
    the tuple of its retained keys; `priority`: the `key_priority` of a retained key, computed only
    once its unit has more keys than `max_keys`; `rejected`: (unit, key) pairs L0 refused (a refused
    key stays refused, the bar only falls), so a repeat is not hashed again, at most
    `_REJECTED_KEPT`; `agg`: the aggregate of what `kept` holds, kept up to date as contributions
    come and go; `support`: per key of a grouped sum, how many units hold a contribution to it (a
    key none holds leaves `agg`)."""

    __slots__ = ("first_offset", "kept", "unit_keys", "priority", "rejected", "agg", "support")

    def __init__(self, first_offset: int) -> None:
        self.first_offset = first_offset
        self.kept: dict[Any, Any] = {}
        self.unit_keys: dict[str, tuple[str, ...]] = {}
        self.priority: dict[tuple[str, str], bytes] = {}
        self.rejected: set[tuple[str, str]] = set()
        self.agg: PartialValues = {}
        self.support: dict[str, int] = {}


class MetricAccumulator:
    """Windows of one metric on one partition, from `first_start` on; `add` is the per-event hot path."""

    def __init__(
        self,
        metric: Metric,
        source: Source,
        first_start: int,
        *,
        until: int | None = None,
        period_s: int | None = None,
    ) -> None:
        """`first_start`: the first window of the schedule not yet emitted here (on the grid);
        `until`: no window ending after it is ever emitted (replay's `--to`); `period_s`: the metric's
        budget period, needed by a metric with `contribution.max_windows` or `max_per_period` (their
        per-unit state is per period)."""
        self.metric = metric
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
        self._candidates = metric.candidates if agg is Aggregate.QUANTILE else None
        """A quantile's public grid: bounded like a sum, its window emitted as counts per grid cell."""
        c = metric.contribution
        self._max_keys = c.max_keys if self._group is not None else 1
        self._max_per_key = 1 if self._kind == _UNITS else c.max_per_key
        self._bounded = not source.event_level or self._candidates is not None
        """A quantile keeps its values in the bounding state even when event-level (each event its own
        unit '#offset', so nothing is cut): its window is emitted from them."""
        self.uses_order = self._bounded and self._kind in (_SUM, _MEAN)
        """Whether which contributions survive depends on their order key (sums and means do;
        a count keeps how many, whichever they were)."""
        self.windows: dict[int, _WindowState] = {}
        self.first_start = first_start
        """The first window this accumulator was started at (earlier ones are never emitted here)."""
        self.next_start = first_start
        """Smallest window start not yet emitted: every earlier window is closed here."""
        self.until = until
        self.capped = 0
        """Contributions bounding dropped (L0 or L∞; for count_units, events of keys not kept);
        once a window closes, its share is the same in whatever order its events came."""
        self.clamped = 0
        self.skips = [0] * len(SKIP_REASONS)
        """Events this metric left out, per reason (indexed as `SKIP_REASONS`): no group field, a key
        outside its declared keys, no value field. A list, so the hot path bumps one int slot."""
        self.caps = self._period_rule(period_s)
        """The metric's per-unit period state: `WindowCaps` under `contribution.max_windows`, `PeriodBound`
        under a running total's `max_per_period` (None without either)."""
        self.capped_windows = 0
        """(unit, window) pairs max_windows dropped: the unit had counted in max_windows windows this period."""
        self.capped_period = 0
        """(unit, window, key) contributions max_per_period cut, in part or whole: the unit had used (nearly)
        all of its bound this period."""
        self.deltas: list[CountDelta] = []
        """Count deltas of windows closed here and not yet taken by the driver (`take_deltas`)."""
        self.add_fn = self._make_add()  # after `_period_rule`: it may narrow an event-level sum's clamp
        """The specialised per-event closure (what `add` calls); drivers may call it directly."""

    def _period_rule(self, period_s: int | None) -> PeriodRule | None:
        """The rule of `contribution.max_windows` or `max_per_period` (a running total: count or sum; a
        sum's L in grid units, rounded down, so the bound holds exactly); None without either. An
        event-level source keeps no per-unit state (each event is its own unit, in one window): a sum's
        values are clamped to [-L, L] as well, which is the cut of a single event."""
        metric = self.metric
        cap, bound = metric.contribution.max_windows, metric.contribution.max_per_period
        if cap is None and bound is None:
            return None
        if period_s is None:
            raise InternalError(f"metric {metric.name!r}: its per-unit state is per period, and no period was given")
        if cap is not None:
            return WindowCaps(metric.name, cap, period_s)
        assert bound is not None
        if metric.aggregate not in (Aggregate.COUNT, Aggregate.SUM) or self._candidates is not None:
            raise InternalError(f"metric {metric.name!r}: max_per_period bounds a count or a sum only")
        units = bound if self._kind == _COUNT else math.floor(Fraction(bound) * (1 << self.exponent))
        if not self._bounded and self._kind == _SUM:
            limit = math.ldexp(units, -self.exponent)
            self._lo, self._hi = max(self._lo, -limit), min(self._hi, limit)
        return PeriodBound(metric.name, units, period_s)

    @property
    def skipped(self) -> int:
        """Events without this metric's value / group field, or outside its declared keys (all reasons)."""
        return sum(self.skips)

    def skip_counts(self) -> dict[str, int]:
        """Skip reason → events this metric left out for it (every reason, zeros included)."""
        return dict(zip(SKIP_REASONS, self.skips, strict=True))

    # -- hot path ----------------------------------------------------------------------
    def add(self, unit: str, ts: float, fields: dict[str, Any], offset: int, horizon: float, order: Any = None) -> bool:
        """Add one validated event; `horizon` = its arrival time − allowed_lateness: a window that
        ends before it had closed when the event arrived; `order`: the event's L∞ order key, unique
        per record and a function of the record alone (the pipeline passes (source append time,
        source partition, source offset)); None uses `offset` (a driver whose offsets are already
        such a key). Returns True when some window covering the event time was missed (closed on
        arrival, already emitted, or before the schedule).

        Replaced per instance by a closure specialised to this metric (see `_make_add`): the hot
        path then reads its settings from closure cells instead of attributes.
        """
        return self.add_fn(unit, ts, fields, offset, horizon, order)

    def _make_add(self):  # noqa: C901 - per-event hot path: pipeline_core 11-15 µs CPU/event (demo, web-analytics); its closure `add` runs once per event and metric
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
        skips = self.skips
        no_group, undeclared, no_value = MISSING_GROUP_FIELD, UNDECLARED_KEY, MISSING_VALUE_FIELD
        first = self.first_start
        admit = self._admit_key
        support_keys = grouped and is_sum  # a grouped sum's key may hold 0 and still be held
        single = max_per_key == 1

        def add(unit: str, ts: float, fields: dict[str, Any], offset: int, horizon: float, order: Any = None) -> bool:  # noqa: C901 - per-event hot path: pipeline_core 11-15 µs CPU/event; one call per event and metric
            if grouped:
                key = fields.get(group_field)
                if key is None:
                    skips[no_group] += 1
                    return False
                if type(key) is not str:
                    key = str(key)
                if declared is not None and key not in declared:
                    skips[undeclared] += 1
                    return False
                uk: Any = (unit, key)
            else:
                key = ""
                uk = unit
            v = 0
            if value_field is not None:
                raw = fields.get(value_field)
                if raw is None:
                    skips[no_value] += 1
                    return False
                f = float(raw)  # the parser dead-lettered a present value that is not a finite number
                if f < lo:
                    f = lo
                    acc.clamped += 1
                elif f > hi:
                    f = hi
                    acc.clamped += 1
                v = round(f * scale)  # exact integer grid units; bounds are whole units
            last = int(ts // every) * every
            start = last - size + every
            late = False
            while start <= last:
                s = start
                start += every
                if s + size < horizon or s < acc.next_start:
                    if s >= first:  # closed when the event arrived, or already emitted here
                        late = True
                    continue  # a window before the schedule's start S does not exist
                st = windows.get(s)
                if st is None:
                    st = windows[s] = _WindowState(offset)
                if bounded:
                    kept = st.kept
                    got = kept.get(uk)
                    if got is None:  # the unit's first contribution to this key: L0
                        if grouped:
                            unit_keys = st.unit_keys
                            keys = unit_keys.get(unit)
                            if keys is None:
                                unit_keys[unit] = (key,)
                            elif len(keys) < max_keys:
                                unit_keys[unit] = keys + (key,)
                            elif uk in st.rejected or not admit(st, s, unit, key, keys):
                                acc.capped += 1
                                continue
                            if support_keys:
                                support = st.support
                                support[key] = support.get(key, 0) + 1
                        if is_count:
                            kept[uk] = 1
                        else:  # one pair; a list once there are more (max_per_key > 1)
                            kept[uk] = (offset if order is None else order, v)
                    elif is_count:  # L∞ by number: which events they were does not matter
                        if got < max_per_key:
                            kept[uk] = got + 1
                        elif is_units:  # counted once; events seen, for `capped` should the key go
                            kept[uk] = got + 1
                            continue
                        else:
                            acc.capped += 1
                            continue
                    else:  # L∞ by order: keep the max_per_key smallest (order, value) pairs
                        o = offset if order is None else order
                        if single:
                            acc.capped += 1
                            if o >= got[0]:  # in order (the common case): nothing to replace
                                continue
                            kept[uk] = (o, v)
                            v -= got[1]  # the aggregate moves by the difference
                        elif type(got) is tuple:
                            kept[uk] = [got, (o, v)] if o > got[0] else [(o, v), got]
                            o = None
                        elif len(got) < max_per_key:
                            if o > got[-1][0]:
                                got.append((o, v))
                            else:
                                insort(got, (o, v))
                            o = None  # a new contribution, added below
                        else:
                            acc.capped += 1
                            if o >= got[-1][0]:
                                continue
                            dropped = got.pop()[1]
                            insort(got, (o, v))
                            v -= dropped
                        if o is not None:  # replaced one
                            if is_sum:
                                st.agg[key] += v
                            else:
                                st.agg[key][0] += v
                            continue
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

    def _admit_key(self, st: _WindowState, start: int, unit: str, key: str, keys: tuple[str, ...]) -> bool:
        """L0 for a unit already holding `max_keys` keys in window `start`: admit `key` iff its
        priority is below the largest one held, which it then evicts (its contributions count as
        capped). Off the hot path: only a unit past its key bound gets here."""
        name, priority = self.metric.name, st.priority
        worst: tuple[bytes, str] | None = None
        for k in keys:
            p = priority.get((unit, k))
            if p is None:
                p = priority[(unit, k)] = key_priority(name, unit, start, k)
            if worst is None or (p, k) > worst:
                worst = (p, k)
        mine = key_priority(name, unit, start, key)
        assert worst is not None  # max_keys ≥ 1
        if (mine, key) >= worst:
            if len(st.rejected) < _REJECTED_KEPT:
                st.rejected.add((unit, key))
            return False
        evicted = worst[1]
        st.unit_keys[unit] = (*(k for k in keys if k != evicted), key)
        priority[(unit, key)] = mine
        del priority[(unit, evicted)]
        if len(st.rejected) < _REJECTED_KEPT:
            st.rejected.add((unit, evicted))
        self.capped += self._take_out(st, (unit, evicted), evicted)  # count_units: every event on that key
        return True

    def _take_out(self, st: _WindowState, uk: Any, key: str) -> int:
        """Remove what `uk` ((unit, key), or the unit of an ungrouped metric) holds in a window, as if it
        had never come: the aggregate moves back, and a key no unit holds any more leaves it. Returns
        how many contributions (count_units: events seen) it held."""
        gone = st.kept.pop(uk)
        agg, kind = st.agg, self._kind
        if kind == _COUNT:
            n = gone
            left = agg[key] = agg[key] - gone
        elif kind == _UNITS:
            n = gone
            left = agg[key] = agg[key] - 1
        else:
            pairs = [gone] if type(gone) is tuple else gone  # max_per_key 1: the pair itself
            n = len(pairs)
            if kind == _SUM:
                agg[key] -= sum(v for _, v in pairs)
                if self._group is None:  # the one key is held while any unit is
                    left = len(st.kept)
                else:
                    left = st.support[key] = st.support[key] - 1
                    if not left:
                        del st.support[key]
            else:
                pair = agg[key]
                pair[0] -= sum(v for _, v in pairs)
                left = pair[1] = pair[1] - n
        if not left:  # no unit holds the key any more: as if it had never come
            del agg[key]
        return n

    def _apply_caps(self, start: int, st: _WindowState | None) -> None:
        """`contribution.max_windows` at the close of window `start`: drop the units present whose
        count has reached the cap (`WindowCaps.close`) and keep the delta of those included."""
        caps = self.caps
        if isinstance(caps, PeriodBound):
            self._apply_bound(caps, start, st)
            return
        assert isinstance(caps, WindowCaps)
        grouped = self._group is not None
        present = () if st is None else (st.unit_keys if grouped else st.kept)
        dropped, delta = caps.close(start, present)
        if delta is not None:
            self.deltas.append(delta)
        if not dropped:
            return
        assert st is not None  # someone was present
        self.capped_windows += len(dropped)
        for unit in dropped:
            if grouped:
                for key in st.unit_keys.pop(unit):
                    self._take_out(st, (unit, key), key)
            else:
                self._take_out(st, unit, "")

    def _apply_bound(self, bound: PeriodBound, start: int, st: _WindowState | None) -> None:
        """`contribution.max_per_period` at the close of window `start`: cut each present unit's final
        per-key contributions to what is left of its bound (`PeriodBound.close`) and keep the delta of
        what they used. A cut moves the aggregate by v - c, as if only c had come; a contribution cut to
        0 is taken out (`_take_out`), so a key nobody holds any more leaves the partial."""
        grouped, kind = self._group is not None, self._kind
        present: dict[str, list[tuple[str, int]]] = {}
        if st is not None:
            kept = st.kept

            def amount(got: Any) -> int:
                if kind == _COUNT:
                    return int(got)
                return int(got[1]) if type(got) is tuple else sum(v for _, v in got)

            if grouped:
                for unit, keys in st.unit_keys.items():
                    present[unit] = [(key, amount(kept[(unit, key)])) for key in keys]
            else:
                for unit, got in kept.items():
                    present[unit] = [("", amount(got))]
        cuts, delta = bound.close(start, present)
        if delta is not None:
            self.deltas.append(delta)
        if not cuts:
            return
        assert st is not None  # someone was present
        self.capped_period += len(cuts)
        agg = st.agg
        for unit, key, v, c in cuts:
            if c == 0:
                self._take_out(st, (unit, key) if grouped else unit, key)
            else:
                agg[key] -= v - c

    def take_deltas(self) -> list[CountDelta]:
        """The count deltas of the windows closed since the last call (the driver persists them before it
        commits progress past those windows)."""
        out, self.deltas = self.deltas, []
        return out

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
        s = self.next_start
        size, every, windows, lateness, until = self.size, self.every, self.windows, self.lateness, self.until
        while s + size + lateness <= t and (until is None or s + size <= until):
            if limit is not None and len(out) >= limit:
                break
            st = windows.pop(s, None)
            if self.caps is not None:
                self._apply_caps(s, st)
            if st is None:
                out.append((s, {}))
            else:
                out.append((s, st.agg if self._candidates is None else self._quantile_cells(st)))
            s += every
        self.next_start = s
        if until is not None:  # events for windows past the schedule's end are never emitted
            for w in [w for w in windows if w + size > until]:
                del windows[w]
        return out

    def _quantile_cells(self, st: _WindowState) -> PartialValues:
        """A quantile window's partial: {'': counts per grid cell} of the retained contributions (the
        sum path's bounding keeps them, so the counts follow the same L0/L∞ rules); {} when empty."""
        if not st.kept:
            return {}
        candidates = self._candidates
        assert candidates is not None
        cells = [0] * cell_count(candidates)
        shift = -self.exponent
        for got in st.kept.values():
            for _, v in (got,) if type(got) is tuple else got:
                cells[cell_index(candidates, math.ldexp(v, shift))] += 1
        return {"": cells}

    def first_open_offset(self) -> int | None:
        """Smallest first-offset among windows not yet emitted (None if none is open)."""
        if not self.windows:
            return None
        return min(st.first_offset for st in self.windows.values())
