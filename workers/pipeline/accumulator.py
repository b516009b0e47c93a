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

Both are decided when the window closes, from all the rows it took at once (`window_rows`): the
window's outcome is a function of the set of its rows. With `contribution.max_windows`, the close
then takes out, whole, the units whose count of windows this period has reached the cap
(`window_caps`): as if their events had never come.
With a running total's `contribution.max_per_period: L`, each window's close cuts every unit's
contributions, key by key in sorted key order, to what is left of L this period (`window_caps`): the
aggregate moves as if only the kept part had come, and a contribution cut to nothing is taken out.
Replaying a partition from the first event of an open window feeds it the same records, so it
rebuilds the same partial.

Events come in batches (`add_batch`, an `EventBatch`): windows and inclusion are decided on arrays,
and the rows wait, as arrays, for their window's close, where they are grouped per (window, unit,
key) and bounded for all the closing windows at once; per-event Python work is none. Units and keys
are int64 codes meanwhile (`codes`). A metric whose open windows hold many rows has them compacted
(what L∞ would drop anyway is dropped early), so memory follows what bounding keeps, not the events.

Values are clamped to `bounds` and then put on an exact integer grid (`fixed_point`).
`count_units` counts a unit once per (window, key).

Partial values per key: count / count_units / top_k → int; sum and mean over a public
denominator → integer grid units; mean without denominator → [grid units, count]; quantile
(ungrouped, bounded as a sum) → {'': [count per cell of its public grid]}.
"""

from __future__ import annotations

__all__ = ["MetricAccumulator", "PartialValues"]

import math
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np

from dpstream.topology.errors import InternalError
from dpstream.topology.model import Aggregate, Metric, Source
from dpstream.workers.pipeline.batch import EventBatch, objects
from dpstream.workers.pipeline.codes import Codes
from dpstream.workers.pipeline.counters import MISSING_GROUP_FIELD, MISSING_VALUE_FIELD, SKIP_REASONS, UNDECLARED_KEY
from dpstream.workers.pipeline.fixed_point import value_exponent
from dpstream.workers.pipeline.key_priority import key_priorities, string_hashes
from dpstream.workers.pipeline.quantile_cells import cell_count
from dpstream.workers.pipeline.window_caps import CountDelta, PeriodBound, PeriodRule, WindowCaps
from dpstream.workers.pipeline.window_rows import Groups, Pile, Piles, group_rows

PartialValues = dict[str, Any]
"""key → int count, int grid-unit sum, or [grid-unit sum, count] for a mean without public denominator."""

_COUNT, _UNITS, _SUM, _MEAN = 0, 1, 2, 3

_EXACT = float(1 << 52)
"""Window starts below this are computed in int64 and compared with float times exactly."""

_GRID_FITS = 1 << 43
"""Grid values below this in magnitude are kept in int64 (sums of up to `_EXACT_ROWS` of them cannot overflow)."""

_EXACT_ROWS = 1 << 19

_COMPACT_FLOOR = 1 << 16
"""Rows a metric's open windows hold before their first compaction (then: four times what the last one
kept, so that compacting costs a fraction of the rows added)."""

_KEY_FLOOR = 1 << 12
"""Key strings a metric holds before its key codes are pruned."""


class _Rows(NamedTuple):
    """The (event, window) pairs one metric takes from a batch, one row each."""

    event: np.ndarray
    """Index of the row's event in the batch."""
    start: np.ndarray
    """The window's start (int64; Python ints in an object array past `_EXACT`)."""
    key: np.ndarray | None
    """The row's key code (an index into `names`), None for an ungrouped metric."""
    names: np.ndarray | None
    """The batch's keys of the metric's group-by field."""
    value: np.ndarray | None
    """The row's clamped value in grid units (int64, or Python ints when they may not fit), None for counts."""


class MetricAccumulator:
    """Windows of one metric on one partition, from `first_start` on; `add_batch` is the hot path."""

    def __init__(
        self,
        metric: Metric,
        source: Source,
        first_start: int,
        *,
        until: int | None = None,
        period_s: int | None = None,
        units: Codes | None = None,
    ) -> None:
        """`first_start`: the first window of the schedule not yet emitted here (on the grid);
        `until`: no window ending after it is ever emitted (replay's `--to`); `period_s`: the metric's
        budget period, needed by a metric with `contribution.max_windows` or `max_per_period` (their
        per-unit state is per period); `units`: the unit codes shared by the partition's metrics (None:
        this metric's own)."""
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
        self._declared = frozenset(metric.keys) if metric.keys is not None else None
        self._value = metric.value if self._kind in (_SUM, _MEAN) else None
        self._lo = metric.bounds.lower if metric.bounds is not None else -math.inf
        self._hi = metric.bounds.upper if metric.bounds is not None else math.inf
        self.exponent = value_exponent(metric.bounds) if self._value is not None and metric.bounds else 0
        """Sums are kept in units of 2^-exponent (see `fixed_point`)."""
        self._grid_fits = max(abs(self._lo), abs(self._hi)) * math.ldexp(1.0, self.exponent) < _GRID_FITS
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
        self.windows: dict[int, int] = {}
        """Open windows that took a row: start → the first offset that reached it (for the safe commit)."""
        self._sums: dict[int, PartialValues] = {}
        """Unbounded (an event-level source, not a quantile): the aggregate of each open window."""
        self._piles = Piles()
        """Bounded: the rows of the open windows, bounded at their close."""
        self._dropped: dict[int, int] = {}
        """Rows a compaction dropped per open window (L∞ would have dropped them at the close)."""
        self._compact_at = _COMPACT_FLOOR
        self._units = Codes() if units is None else units
        self._units.attach(self)
        self._keys = Codes(_KEY_FLOOR)
        self._keys.attach(self)
        self.first_start = first_start
        """The first window this accumulator was started at (earlier ones are never emitted here)."""
        self.next_start = first_start
        """Smallest window start not yet emitted: every earlier window is closed here."""
        self.until = until
        self.capped = 0
        """Contributions bounding dropped (L0 or L∞; for count_units, events of keys not kept), counted
        when their window closes: the same in whatever order its events came."""
        self.clamped = 0
        self.skips = [0] * len(SKIP_REASONS)
        """Events this metric left out, per reason (indexed as `SKIP_REASONS`): no group field, a key
        outside its declared keys, no value field."""
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
        """Add one validated event: `add_batch` of a batch of one. `horizon` = its arrival time −
        allowed_lateness; `order`: its L∞ order key, a tuple (None: `offset`). True when some window
        covering the event time was missed."""
        columns = None if order is None else tuple(np.array([o]) for o in order)
        batch = EventBatch.of(
            [unit], np.array([float(ts)]), np.array([float(horizon)]), np.array([offset], np.int64), [fields], columns
        )
        return bool(self.add_batch(batch)[0])

    def add_batch(self, batch: EventBatch) -> np.ndarray:
        """Add validated events (in record order); returns, per event, whether some window covering its
        event time was missed (closed on its arrival, or already emitted here).

        An event counts in window w iff its event time lies in w, w's end is at or after the event's
        horizon (w had not closed on its arrival) and w is not emitted yet. Its rows (event, window)
        then wait for their windows' close (bounded), or add to the window's aggregate (unbounded).
        """
        late = np.zeros(len(batch), bool)
        rows = self._rows(batch, late)
        if rows is None:
            return late
        start = rows.start
        if len(start) > 1 and not bool((start[1:] >= start[:-1]).all()):  # by window (stable: record order)
            order = np.argsort(start, kind="stable")
            rows = rows._replace(
                event=rows.event[order],
                start=start[order],
                key=None if rows.key is None else rows.key[order],
                value=None if rows.value is None else rows.value[order],
            )
            start = rows.start
        heads = np.flatnonzero(np.concatenate(([True], start[1:] != start[:-1])))
        first = np.minimum.reduceat(rows.event, heads)  # the first event (in record order) to reach each window
        starts = start[heads].tolist()
        opened = self.windows
        for s, offset in zip(starts, batch.offset[first].tolist(), strict=True):
            if s not in opened:
                opened[s] = offset
        if self._bounded:
            self._hold(batch, rows)
        else:
            window = np.repeat(np.arange(len(heads)), np.diff(np.append(heads, len(start))))
            self._aggregate(rows, [self._sums.setdefault(s, {}) for s in starts], window)
        return late

    def _rows(self, batch: EventBatch, late: np.ndarray) -> _Rows | None:
        """The (event, window) pairs the batch adds, with each row's key code and grid value; counts the
        skips and clamps, and marks in `late` the events that missed a window. None when no row."""
        use: np.ndarray | None = None  # None: every event
        key = names = None
        skips = self.skips
        if self._group is not None:
            key, names = batch.keys(self._group, self._declared)
            skips[MISSING_GROUP_FIELD] += int(np.count_nonzero(key == -1))
            skips[UNDECLARED_KEY] += int(np.count_nonzero(key == -2))
            use = key >= 0
        column = None
        if self._value is not None:
            column = batch.values(self._value)
            skips[MISSING_VALUE_FIELD] += int(
                np.count_nonzero(~column.present if use is None else use & ~column.present)
            )
            use = column.present if use is None else use & column.present
        picked = np.arange(len(batch)) if use is None else np.flatnonzero(use)
        if not len(picked):
            return None
        value = None
        if column is not None:  # clamped to bounds, then exact integer grid units (see `fixed_point`)
            f = column.value[picked]
            self.clamped += int(np.count_nonzero(f < self._lo) + np.count_nonzero(f > self._hi))
            grid = np.rint(np.clip(f, self._lo, self._hi) * math.ldexp(1.0, self.exponent))
            value = grid.astype(np.int64) if self._grid_fits else objects([int(x) for x in grid.tolist()])
        horizon = batch.horizon[picked]
        every, size = self.every, self.size
        seconds = batch.seconds()
        if seconds is not None:  # the last window holding the event: ⌊t / every⌋ · every
            last: np.ndarray = seconds[picked] // every * every
        else:  # some time in the batch is past 2^52 s
            q = np.floor_divide(batch.time[picked], every)
            if float(q.max()) * every < _EXACT:
                last = q.astype(np.int64) * every
            else:  # past the exactly representable range: window starts as Python ints
                last = objects([int(x) * every for x in q.tolist()])
        missed_any = np.zeros(len(picked), bool)
        parts: list[np.ndarray] = []
        starts: list[np.ndarray] = []
        for lag in range(every - size, 1, every):  # each window covering the event time
            s = last + lag
            missed = np.asarray((s + size < horizon) | (s < self.next_start), bool)
            missed_any |= missed & np.asarray(s >= self.first_start, bool)  # before the schedule: no window
            parts.append(np.flatnonzero(~missed))
            starts.append(s[~missed])
        late[picked] = missed_any
        part = np.concatenate(parts)
        if not len(part):
            return None
        event = picked[part]
        return _Rows(
            event,
            np.concatenate(starts),
            None if key is None else key[event],
            names,
            None if value is None else value[part],
        )

    def _aggregate(self, rows: _Rows, states: list[PartialValues], window: np.ndarray) -> None:
        """Unbounded (an event-level source, not a quantile): every row adds to its (window, key) aggregate."""
        names = rows.names
        cell = window if rows.key is None or names is None else window * len(names) + rows.key
        order = np.argsort(cell, kind="stable")
        cells = cell[order]
        heads = np.flatnonzero(np.r_[True, cells[1:] != cells[:-1]])
        counts = np.diff(np.r_[heads, len(cells)]).tolist()
        wins = window[order][heads].tolist()
        keys = [""] * len(heads) if rows.key is None or names is None else names[rows.key[order][heads]].tolist()
        sums = counts
        if rows.value is not None:
            value = rows.value if len(rows.value) < _EXACT_ROWS else rows.value.astype(object)
            sums = np.add.reduceat(value[order], heads).tolist()
        kind = self._kind
        for w, k, n, total in zip(wins, keys, counts, sums, strict=True):
            agg = states[w]
            if kind == _MEAN:
                pair = agg.get(k)
                if pair is None:
                    agg[k] = [total, n]
                else:
                    pair[0] += total
                    pair[1] += n
            else:  # a count adds its events, a sum their values
                agg[k] = agg.get(k, 0) + total

    def _hold(self, batch: EventBatch, rows: _Rows) -> None:
        """Keep a batch's rows for their windows' close, units and keys as codes (`codes`)."""
        event = rows.event
        unit = batch.unit_codes(self._units)[event]
        if rows.key is None or rows.names is None:
            key = np.zeros(len(event), np.int64)
        else:
            key = self._keys.of(rows.names.tolist())[rows.key]
        order: tuple[np.ndarray, ...] = ()
        value = None
        if self.uses_order:
            columns = (batch.offset,) if batch.order is None else batch.order
            order = tuple(c[event] for c in columns)
            value = rows.value
        elif self._candidates is not None:  # pragma: no cover - a quantile is a sum: it uses the order
            raise InternalError("a quantile keeps its values")
        weight = np.ones(len(event), np.int64) if self._kind == _UNITS else None
        self._piles.add(Pile(rows.start, unit, key, order, value, weight))
        if self._piles.rows > self._compact_at:
            self._compact()

    def _compact(self) -> None:
        """Drop, in every open window, the rows L∞ drops anyway: a group's rows past its max_per_key of
        smallest (order key, value) (count_units: all but one, which then weighs them all). Only these
        can go before the close: a group's later rows never bring back a row its earlier ones outranked."""
        pile = self._piles.all()
        assert pile is not None
        starts, window = np.unique(pile.start, return_inverse=True)
        window = window.reshape(-1)
        g = group_rows(window, pile, self._max_per_key, len(self._units), max(len(self._keys), 1))
        kept = pile.take(g.kept_rows)
        if self._kind == _UNITS:
            kept = kept._replace(weight=g.size)
        else:  # counted as capped when their window closes
            dropped = np.zeros(len(starts), np.int64)
            np.add.at(dropped, g.window, g.size - g.kept)
            for s, n in zip(starts.tolist(), dropped.tolist(), strict=True):
                if n:
                    self._dropped[s] = self._dropped.get(s, 0) + n
        self._piles = Piles()
        self._piles.add(kept)
        self._compact_at = max(_COMPACT_FLOOR, 4 * kept.length)

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
        closing: list[int] = []
        s = self.next_start
        size, every, lateness, until = self.size, self.every, self.lateness, self.until
        while s + size + lateness <= t and (until is None or s + size <= until):
            if limit is not None and len(closing) >= limit:
                break
            closing.append(s)
            s += every
        out = list(zip(closing, self._close(closing), strict=True)) if closing else []
        self.next_start = s
        if until is not None:  # events for windows past the schedule's end are never emitted
            beyond = [w for w in self.windows if w + size > until]
            for w in beyond:
                del self.windows[w]
                self._sums.pop(w, None)
                self._dropped.pop(w, None)
            if beyond and self._bounded:
                self._piles.drop_after(until - size)
        if closing:
            self._units.prune()
            self._keys.prune()
        return out

    def _close(self, closing: list[int]) -> list[PartialValues]:
        """The partials of the windows `closing` (consecutive, in order): their rows bounded at once, then
        the period rule applied window by window."""
        for s in closing:
            self.windows.pop(s, None)
        if not self._bounded:  # no per-unit state: each close still moves the period rule on
            if self.caps is not None:
                self._period_close(closing, None, np.zeros(0, bool), np.zeros(0, np.int64))
            return [self._sums.pop(s, {}) for s in closing]
        self.capped += sum(self._dropped.pop(s, 0) for s in closing)
        pile = self._piles.take_through(closing[-1])
        if pile is None:
            if self.caps is not None:
                self._period_close(closing, None, np.zeros(0, bool), np.zeros(0, np.int64))
            return [{} for _ in closing]
        starts = objects(closing) if pile.start.dtype == object else np.array(closing, np.int64)
        window = np.searchsorted(starts, pile.start)
        g = group_rows(window, pile, self._max_per_key, len(self._units), max(len(self._keys), 1))
        alive = self._l0(g, closing)
        if self._kind == _UNITS:
            self.capped += int(g.size[~alive].sum())
        else:
            self.capped += int(g.size.sum() - g.kept[alive].sum())
        amount = g.amount
        if self.caps is not None:
            amount = amount.copy()
            self._period_close(closing, g, alive, amount)
        if self._candidates is not None:
            return self._quantile_partials(len(closing), pile, g, alive)
        return self._partials(len(closing), g, alive, amount)

    def _l0(self, g: Groups, closing: list[int]) -> np.ndarray:
        """Per group, whether L0 keeps it: a unit with more than `max_keys` keys in a window keeps those of
        smallest (`key_priority`, key)."""
        alive = np.ones(len(g.size), bool)
        if self._group is None or len(alive) <= self._max_keys:
            return alive
        w, u = g.window, g.unit
        heads = np.flatnonzero(np.r_[True, (w[1:] != w[:-1]) | (u[1:] != u[:-1])])
        length = np.diff(np.r_[heads, len(w)])
        over = length > self._max_keys
        if not over.any():
            return alive
        at = np.flatnonzero(np.repeat(over, length))  # the groups of units past max_keys
        run = np.repeat(np.arange(len(heads)), length)[at]
        starts = objects(closing) if closing[-1] >= 1 << 63 else np.array(closing, np.int64)
        priority = key_priorities(
            self.metric.name,
            string_hashes(self._units.digests(u[at])),
            starts[w[at]],
            string_hashes(self._keys.digests(g.key[at])),
        )
        ranked = at[np.lexsort((self._key_ranks()[g.key[at]], priority, run))]
        runs = length[over]
        position = np.arange(len(at)) - np.repeat(np.cumsum(runs) - runs, runs)  # each group's rank in its run
        alive[ranked[position >= self._max_keys]] = False
        return alive

    def _period_close(self, closing: list[int], g: Groups | None, alive: np.ndarray, amount: np.ndarray) -> None:
        """The period rule at the close of the windows `closing`, for their groups still alive:
        `max_windows` takes out, whole, the units whose count reached the cap; `max_per_period` cuts each
        unit's per-key amounts to what is left of its bound (a cut to 0 takes the group out). Every
        window closes through the rule, with or without groups; the deltas are kept."""
        caps = self.caps
        assert caps is not None
        at = np.flatnonzero(alive)
        if g is None or not len(at):
            none = np.zeros(0, np.int64)
            if isinstance(caps, WindowCaps):
                deltas = caps.decide(closing, none, none, objects([]))[1]
            else:
                assert isinstance(caps, PeriodBound)
                deltas = caps.decide(closing, none, none, objects([]), none)[1]
            self.deltas += deltas
            return
        if isinstance(caps, WindowCaps):
            w, u = g.window[at], g.unit[at]
            heads = np.flatnonzero(np.concatenate(([True], (w[1:] != w[:-1]) | (u[1:] != u[:-1]))))
            drop, deltas = caps.decide(closing, w[heads], u[heads], self._units.digests(u[heads]))
            if drop.any():
                self.capped_windows += int(np.count_nonzero(drop))
                alive[at[np.repeat(drop, np.diff(np.append(heads, len(at))))]] = False
        else:
            assert isinstance(caps, PeriodBound)
            if self._group is not None:  # within a window, each unit's keys in sorted key order
                at = at[np.lexsort((self._key_ranks()[g.key[at]], g.unit[at], g.window[at]))]
            asked, unit = amount[at], g.unit[at]
            kept, deltas = caps.decide(closing, g.window[at], unit, self._units.digests(unit), asked)
            cut = kept != asked
            if cut.any():
                self.capped_period += int(np.count_nonzero(cut))
                alive[at[cut & (kept == 0)]] = False
                amount[at[cut]] = kept[cut]
        self.deltas += deltas

    def _key_ranks(self) -> np.ndarray:
        """Each key code's rank among the metric's keys in string order."""
        names = self._keys.names
        rank = np.empty(len(names), np.int64)
        rank[np.argsort(objects(names), kind="stable")] = np.arange(len(names))
        return rank

    def _partials(self, windows: int, g: Groups, alive: np.ndarray, amount: np.ndarray) -> list[PartialValues]:
        """Each closing window's partial from its groups still alive: per key, the kept contributions
        (count), the units (count_units), the sum of the kept values (sum), or [sum, count] (mean)."""
        out: list[PartialValues] = [{} for _ in range(windows)]
        live = np.flatnonzero(alive)
        if not len(live):
            return out
        n_keys = max(len(self._keys), 1)
        cell = g.window[live] * n_keys + g.key[live]
        order = np.argsort(cell, kind="stable")
        cells = cell[order]
        heads = np.flatnonzero(np.r_[True, cells[1:] != cells[:-1]])
        wins = (cells[heads] // n_keys).tolist()
        if self._group is None:
            keys = [""] * len(heads)
        else:
            names = self._keys.names
            keys = [names[c] for c in (cells[heads] % n_keys).tolist()]
        kind = self._kind
        if kind == _UNITS:
            totals = np.diff(np.r_[heads, len(cells)]).tolist()
        else:
            picked = amount[live][order]
            if len(picked) >= _EXACT_ROWS and picked.dtype != object:
                picked = picked.astype(object)
            totals = np.add.reduceat(picked, heads).tolist()
        if kind == _MEAN:
            counts = np.add.reduceat(g.kept[live][order], heads).tolist()
            for w, k, total, n in zip(wins, keys, totals, counts, strict=True):
                out[w][k] = [total, n]
        else:
            for w, k, total in zip(wins, keys, totals, strict=True):
                out[w][k] = total
        return out

    def _quantile_partials(self, windows: int, pile: Pile, g: Groups, alive: np.ndarray) -> list[PartialValues]:
        """A quantile window's partial: {'': counts per cell of its public grid} of the kept contributions
        of the groups still alive (the same L0/L∞ rules as a sum); {} when none is left."""
        out: list[PartialValues] = [{} for _ in range(windows)]
        survives = np.repeat(alive, g.kept)
        rows = g.kept_rows[survives]
        if not len(rows):
            return out
        owner = np.repeat(g.window, g.kept)[survives]
        candidates = self._candidates
        assert candidates is not None and pile.value is not None
        grid = np.asarray(candidates, np.float64)
        values = pile.value[rows]
        if values.dtype == object:
            value = np.array([math.ldexp(v, -self.exponent) for v in values.tolist()], np.float64)
        else:  # exact: grid values are below 2^43, and the scale a power of two
            value = values.astype(np.float64) * math.ldexp(1.0, -self.exponent)
        i = np.searchsorted(grid, value, side="left")
        at = (i < len(grid)) & (grid[np.minimum(i, len(grid) - 1)] == value)
        counts = np.zeros((windows, cell_count(candidates)), np.int64)
        np.add.at(counts, (owner, 2 * i + at), 1)
        for w in np.unique(owner).tolist():
            out[w] = {"": counts[w].tolist()}
        return out

    def first_open_offset(self) -> int | None:
        """Smallest first-offset among windows not yet emitted (None if none is open)."""
        return min(self.windows.values()) if self.windows else None

    # -- codes (`codes.CodeUser`) --------------------------------------------------------
    def held_codes(self, codes: Codes) -> list[np.ndarray]:
        """The unit or key codes the open windows' rows hold."""
        column = 0 if codes is self._units else 1
        return [(c.unit, c.key)[column] for c in self._piles.chunks]

    def renumber(self, codes: Codes, mapping: np.ndarray) -> None:
        """Renumber the rows' unit or key codes after `codes` was pruned (`mapping`: old code → new)."""
        if codes is self._units:
            self._piles.chunks = [c._replace(unit=mapping[c.unit]) for c in self._piles.chunks]
        else:
            self._piles.chunks = [c._replace(key=mapping[c.key]) for c in self._piles.chunks]
