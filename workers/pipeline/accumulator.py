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

Events come in batches (`add_batch`, an `EventBatch`): windows and inclusion are decided on arrays,
then the rows are grouped per (window, unit, key) and each group is bounded at once against what the
window already holds, so per-event Python work does not grow with the number of metrics.

Values are clamped to `bounds` and then put on an exact integer grid (`fixed_point`).
`count_units` counts a unit once per (window, key).

Partial values per key: count / count_units / top_k → int; sum and mean over a public
denominator → integer grid units; mean without denominator → [grid units, count]; quantile
(ungrouped, bounded as a sum) → {'': [count per cell of its public grid]}.
"""

from __future__ import annotations

__all__ = ["MetricAccumulator", "PartialValues", "key_priority"]

import hashlib
import itertools
import math
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np

from dpstream.topology.errors import InternalError
from dpstream.topology.model import Aggregate, Metric, Source
from dpstream.workers.pipeline.batch import EventBatch, objects
from dpstream.workers.pipeline.counters import MISSING_GROUP_FIELD, MISSING_VALUE_FIELD, SKIP_REASONS, UNDECLARED_KEY
from dpstream.workers.pipeline.fixed_point import value_exponent
from dpstream.workers.pipeline.quantile_cells import cell_count, cell_index
from dpstream.workers.pipeline.window_caps import CountDelta, PeriodBound, PeriodRule, WindowCaps

PartialValues = dict[str, Any]
"""key → int count, int grid-unit sum, or [grid-unit sum, count] for a mean without public denominator."""

_COUNT, _UNITS, _SUM, _MEAN = 0, 1, 2, 3

_REJECTED_KEPT = 65_536
"""Refused (unit, key) pairs remembered per window (past that, a repeat is hashed again: same answer)."""

_EXACT = float(1 << 52)
"""Window starts below this are computed in int64 and compared with float times exactly."""

_GRID_FITS = 1 << 43
"""Grid values below this in magnitude are kept in int64 (sums of up to `_EXACT_ROWS` of them cannot overflow)."""

_EXACT_ROWS = 1 << 19


class _Runs(NamedTuple):
    """A grouped metric's groups by unit: each run is one unit's groups in one window."""

    head: np.ndarray
    """The first group of each run."""
    length: np.ndarray
    """Its number of groups (keys)."""
    keys: list[tuple[str, ...]]
    """Its keys, as `unit_keys` holds them."""
    units: list[str]
    """Its unit."""


class _Groups(NamedTuple):
    """One metric's (window, unit, key) groups of a batch, sorted, with what each keeps when it is new."""

    window: np.ndarray
    """Index of the group's window (into the batch's window starts)."""
    unit: np.ndarray
    """The group's unit, as an index into the batch's units."""
    units: list[str]
    key: np.ndarray | None
    """Key codes (into `names`); None when ungrouped."""
    keys: list[str] | None
    names: np.ndarray | None
    size: np.ndarray
    """Events (rows) in the group."""
    taken: np.ndarray
    """Of them, the ones a new group keeps (count_units: all it saw)."""
    held: list[Any]
    """What a new group's `kept` entry is: its kept count, or its pair(s)."""
    pairs: list[Any] | None
    """A sum's or mean's kept (order key, value) pairs: one as is, more as a sorted list."""
    sums: np.ndarray | None
    """The sum of the kept values."""
    runs: _Runs | None


def _as_list(pairs: Any) -> list[tuple[Any, int]]:
    """A group's kept pairs as a list (one pair is held as is)."""
    return [pairs] if type(pairs) is tuple else pairs


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
    alone: list[tuple[str]] | None
    """Each of them as a 1-tuple."""
    value: np.ndarray | None
    """The row's clamped value in grid units (int64, or Python ints when they may not fit), None for counts."""


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
    key none holds leaves `agg`); `digests`: under a period rule, the `unit_key` of every unit that
    brought a contribution (hashed once per batch, not once per window and metric at the close)."""

    __slots__ = ("first_offset", "kept", "unit_keys", "priority", "rejected", "agg", "support", "digests")

    def __init__(self, first_offset: int) -> None:
        self.first_offset = first_offset
        self.kept: dict[Any, Any] = {}
        self.unit_keys: dict[str, tuple[str, ...]] = {}
        self.priority: dict[tuple[str, str], bytes] = {}
        self.rejected: set[tuple[str, str]] = set()
        self.agg: PartialValues = {}
        self.support: dict[str, int] = {}
        self.digests: dict[str, bytes] = {}


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
        horizon (w had not closed on its arrival) and w is not emitted yet. The rows (event, window)
        are then grouped per (window, unit, key) and each group is bounded and merged into its window's
        state at once: per-event work is array work, per-group work a few dict updates.
        """
        late = np.zeros(len(batch), bool)
        rows = self._rows(batch, late)
        if rows is None:
            return late
        starts, window = np.unique(rows.start, return_inverse=True)
        window = window.reshape(-1)
        first = np.full(len(starts), len(batch), np.int64)
        np.minimum.at(first, window, rows.event)  # the first event (in record order) to reach each window
        states = []
        for s, offset in zip(starts.tolist(), batch.offset[first].tolist(), strict=True):
            st = self.windows.get(s)
            if st is None:
                st = self.windows[s] = _WindowState(offset)
            states.append(st)
        if self._bounded:
            self._bound(batch, rows, states, starts.tolist(), window)
        else:
            self._aggregate(rows, states, window)
        return late

    def _rows(self, batch: EventBatch, late: np.ndarray) -> _Rows | None:
        """The (event, window) pairs the batch adds, with each row's key code and grid value; counts the
        skips and clamps, and marks in `late` the events that missed a window. None when no row."""
        use: np.ndarray | None = None  # None: every event
        key = names = alone = None
        skips = self.skips
        if self._group is not None:
            key, names, alone = batch.keys(self._group, self._keys)
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
        q = np.floor_divide(batch.time[picked], every)
        if float(q.max()) * every < _EXACT:
            last: np.ndarray = q.astype(np.int64) * every
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
            alone,
            None if value is None else value[part],
        )

    def _aggregate(self, rows: _Rows, states: list[_WindowState], window: np.ndarray) -> None:
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
            agg = states[w].agg
            if kind == _MEAN:
                pair = agg.get(k)
                if pair is None:
                    agg[k] = [total, n]
                else:
                    pair[0] += total
                    pair[1] += n
            else:  # a count adds its events, a sum their values
                agg[k] = agg.get(k, 0) + total

    def _bound(self, batch: EventBatch, rows: _Rows, states: list[_WindowState], starts: list[int], window) -> None:
        """Group the rows per (window, unit, key); bound each group and merge it into its window's state.

        A group is new when its unit holds nothing in the window yet (grouped: and brings at most
        `max_keys` keys, so L0 keeps them all): it keeps its first `max_per_key` contributions (a
        count: how many; count_units: how many it saw; a sum or mean: the pairs of smallest order key),
        and the new groups go in with a few bulk updates per window. The others are merged one by one
        (`_merge_unit`, `_hold`), which is rare: a unit met again in a later batch of the window."""
        g = self._groups(batch, rows, window)
        fresh = np.ones(len(g.window), bool)
        if g.runs is not None:  # L0 cuts a unit bringing more than max_keys keys: merged one by one
            fresh &= np.repeat(g.runs.length <= self._max_keys, g.runs.length)
        cuts = np.flatnonzero(np.r_[True, g.window[1:] != g.window[:-1]]).tolist()
        ends = [*cuts[1:], len(g.window)]
        window_of = g.window[cuts].tolist()
        for w, a, b in zip(window_of, cuts, ends, strict=True):
            present = states[w].unit_keys if g.runs is not None else states[w].kept
            if present and not present.keys().isdisjoint(g.units[a:b]):  # units met in an earlier batch
                stale = present.keys() & set(g.units[a:b])
                fresh[a:b] &= np.fromiter((u not in stale for u in g.units[a:b]), bool, b - a)
        if self.caps is not None:  # the units' period-state keys, for the close
            digests = batch.unit_digests()[g.unit].tolist()
            for w, a, b in zip(window_of, cuts, ends, strict=True):
                states[w].digests.update(zip(g.units[a:b], digests[a:b], strict=True))
        self._insert(states, g, fresh, cuts, ends, window_of)
        if not fresh.all():
            self._merge_slow(states, starts, g, np.flatnonzero(~fresh).tolist())
        new = np.flatnonzero(fresh)
        if len(new):
            if self._kind != _UNITS:
                self.capped += int((g.size[new] - g.taken[new]).sum())
            self._add_up(states, g, new)

    def _groups(self, batch: EventBatch, rows: _Rows, window: np.ndarray) -> _Groups:
        """The batch's (window, unit, key) groups of one metric, in (window, unit, key) order."""
        unit = batch.unit[rows.event]
        n_units = len(batch.units)
        names = rows.names
        n_keys = 1 if names is None else max(len(names), 1)
        key = 0 if rows.key is None else rows.key
        if (int(window.max()) + 1) * n_units * n_keys < 1 << 62:
            group = (window * n_units + unit) * n_keys + key
        else:  # pragma: no cover - a batch of millions of units and keys
            stacked = np.stack([window, unit, np.broadcast_to(key, unit.shape)])
            group = np.unique(stacked, axis=1, return_inverse=True)[1].reshape(-1)
        value = rows.value
        if value is not None:  # a sum's group: its rows by order key, smallest first (then by value)
            rank, distinct = batch.order_rank()
            ranks = rank[rows.event]
            if distinct and (int(group.max()) + 1) * len(rank) < 1 << 62:
                order = np.argsort(group * len(rank) + ranks)
            else:
                order = np.lexsort((value, ranks, group))
        else:
            order = np.argsort(group, kind="stable")
        sorted_groups = group[order]
        heads = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
        count = np.diff(np.r_[heads, len(order)])
        g_window = window[order][heads]
        g_unit = unit[order][heads]
        units = batch.unit_names()[g_unit].tolist()
        g_key = None if rows.key is None else rows.key[order][heads]
        keys = None if g_key is None or names is None else names[g_key].tolist()
        m = self._max_per_key
        taken = count if self._kind == _UNITS else np.minimum(count, m)
        held: list[Any] = taken.tolist()  # what a new group keeps: a count, or its pairs
        pairs: list[Any] | None = None
        sums = None
        if value is not None:  # the max_per_key smallest-ordered (order key, value) pairs of each group
            kept_rows = order[np.arange(len(order)) - np.repeat(heads, count) < m]
            kept_values = value[kept_rows]
            flat = list(zip(batch.order_keys(rows.event[kept_rows]), kept_values.tolist(), strict=True))
            begins = np.cumsum(taken) - taken
            if len(kept_values) >= _EXACT_ROWS:
                kept_values = kept_values.astype(object)
            sums = np.add.reduceat(kept_values, begins) if len(kept_values) else kept_values
            if m == 1:
                pairs = flat
            else:  # one pair as is, more as a sorted list
                pairs = [flat[b] for b in begins.tolist()]
                for i in np.flatnonzero(taken > 1).tolist():
                    b = int(begins[i])
                    pairs[i] = flat[b : b + int(taken[i])]
            held = pairs
        runs = None
        if keys is not None:
            run_heads = np.flatnonzero(np.r_[True, (g_window[1:] != g_window[:-1]) | (g_unit[1:] != g_unit[:-1])])
            length = np.diff(np.r_[run_heads, len(heads)])
            assert g_key is not None and rows.alone is not None
            tuples: list[tuple[str, ...]] = list(
                map(rows.alone.__getitem__, g_key[run_heads].tolist())
            )  # mostly one key
            for r in np.flatnonzero(length > 1).tolist():
                h = int(run_heads[r])
                tuples[r] = tuple(keys[h : h + int(length[r])])
            runs = _Runs(run_heads, length, tuples, batch.unit_names()[g_unit[run_heads]].tolist())
        return _Groups(g_window, g_unit, units, g_key, keys, names, count, taken, held, pairs, sums, runs)

    def _insert(
        self,
        states: list[_WindowState],
        g: _Groups,
        fresh: np.ndarray,
        cuts: list[int],
        ends: list[int],
        window_of: list[int],
    ) -> None:
        """Put the new groups into their windows' `kept` (grouped: and their units' keys into `unit_keys`):
        one update per window and dict, from lists of the new groups only."""
        everyone = bool(fresh.all())
        uk: list[Any] = g.units if g.keys is None else list(zip(g.units, g.keys, strict=True))
        held, a_s, b_s = g.held, cuts, ends
        if not everyone:
            flags = fresh.tolist()
            uk, held = list(itertools.compress(uk, flags)), list(itertools.compress(held, flags))
            new = np.flatnonzero(fresh)
            a_s, b_s = np.searchsorted(new, cuts).tolist(), np.searchsorted(new, ends).tolist()
        for w, a, b in zip(window_of, a_s, b_s, strict=True):
            if a < b:
                states[w].kept.update(zip(uk[a:b], held[a:b], strict=True))
        runs = g.runs
        if runs is None:
            return
        units, keys, heads = runs.units, runs.keys, runs.head
        if not everyone:
            new_runs = fresh[heads]
            flags = new_runs.tolist()
            units, keys, heads = (
                list(itertools.compress(units, flags)),
                list(itertools.compress(keys, flags)),
                heads[new_runs],
            )
        a_s, b_s = np.searchsorted(heads, cuts).tolist(), np.searchsorted(heads, ends).tolist()
        for w, a, b in zip(window_of, a_s, b_s, strict=True):
            if a < b:
                states[w].unit_keys.update(zip(units[a:b], keys[a:b], strict=True))

    def _add_up(self, states: list[_WindowState], g: _Groups, new: np.ndarray) -> None:
        """Add the new groups' kept contributions to their windows' aggregates (and a grouped sum's support)."""
        win = g.window[new]
        n_keys = 1 if g.names is None else max(len(g.names), 1)
        cell = win if g.key is None else win * n_keys + g.key[new]
        order = np.argsort(cell, kind="stable")
        cells = cell[order]
        heads = np.flatnonzero(np.r_[True, cells[1:] != cells[:-1]])
        groups = np.diff(np.r_[heads, len(cells)]).tolist()
        taken = np.add.reduceat(g.taken[new][order], heads).tolist()
        sums = taken if g.sums is None else np.add.reduceat(g.sums[new][order], heads).tolist()
        wins = win[order][heads].tolist()
        keys = [""] * len(heads) if g.key is None or g.names is None else g.names[g.key[new][order][heads]].tolist()
        kind = self._kind
        support = kind == _SUM and g.key is not None
        for w, k, n, t, total in zip(wins, keys, groups, taken, sums, strict=True):
            st = states[w]
            agg = st.agg
            if kind == _MEAN:
                pair = agg.get(k)
                if pair is None:
                    agg[k] = [total, t]
                else:
                    pair[0] += total
                    pair[1] += t
            else:  # a count: its kept events; count_units: one per unit; a sum: the kept values
                agg[k] = agg.get(k, 0) + (n if kind == _UNITS else total)
                if support:
                    st.support[k] = st.support.get(k, 0) + n

    def _merge_slow(self, states: list[_WindowState], starts: list[int], g: _Groups, slow: list[int]) -> None:
        """Merge the groups `slow` (whole units of a window, in group order) one unit at a time."""
        count = g.size.tolist()
        win = g.window
        i = 0
        while i < len(slow):
            a = slow[i]
            w, u = int(win[a]), g.units[a]
            j = i + 1
            while j < len(slow) and slow[j] == slow[j - 1] + 1 and g.units[slow[j]] == u and int(win[slow[j]]) == w:
                j += 1
            b = slow[j - 1] + 1
            pairs = None if g.pairs is None else g.pairs[a:b]
            if g.keys is None:
                for k in range(a, b):
                    self._hold(states[w], u, "", count[k], None if g.pairs is None else _as_list(g.pairs[k]))
            else:
                self._merge_unit(
                    states[w],
                    starts[w],
                    u,
                    g.keys[a:b],
                    count[a:b],
                    None if pairs is None else [_as_list(p) for p in pairs],
                )
            i = j

    def _merge_unit(
        self,
        st: _WindowState,
        start: int,
        unit: str,
        keys: list[str],
        counts: list[int],
        pairs: list[list[tuple[Any, int]]] | None,
    ) -> None:
        """One unit's keys in one window of a batch. L0: the unit keeps the `max_keys` keys of smallest
        `key_priority` among all it has sent to the window; a key that drops out (evicted or refused)
        stays refused (the bar only falls), and everything it held or brought counts as capped."""
        held = st.unit_keys.get(unit, ())
        new: list[int] = []
        for i, key in enumerate(keys):
            if key in held:
                self._hold(st, (unit, key), key, counts[i], None if pairs is None else pairs[i])
            elif (unit, key) in st.rejected:
                self.capped += counts[i]
            else:
                new.append(i)
        if not new:
            return
        admitted, kept_held = new, held
        if len(held) + len(new) > self._max_keys:
            name, priority, rejected = self.metric.name, st.priority, st.rejected
            ranked: list[tuple[bytes, str, int]] = []
            for k in held:
                p = priority.get((unit, k))
                if p is None:
                    p = priority[(unit, k)] = key_priority(name, unit, start, k)
                ranked.append((p, k, -1))
            ranked.extend((key_priority(name, unit, start, keys[i]), keys[i], i) for i in new)
            ranked.sort()  # (priority, key): keys are distinct, so the index never decides
            admitted = []
            for p, k, i in ranked[: self._max_keys]:
                if i >= 0:
                    admitted.append(i)
                    priority[(unit, k)] = p
            for _, k, i in ranked[self._max_keys :]:
                if len(rejected) < _REJECTED_KEPT:
                    rejected.add((unit, k))
                if i >= 0:
                    self.capped += counts[i]
                else:  # evicted: as if its contributions had never come
                    del priority[(unit, k)]
                    self.capped += self._take_out(st, (unit, k), k)
            dropped = {k for _, k, i in ranked[self._max_keys :] if i < 0}
            kept_held = tuple(k for k in held if k not in dropped)
        support = st.support if self._kind == _SUM else None
        for i in admitted:
            key = keys[i]
            self._hold(st, (unit, key), key, counts[i], None if pairs is None else pairs[i])
            if support is not None:
                support[key] = support.get(key, 0) + 1
        st.unit_keys[unit] = (*kept_held, *(keys[i] for i in sorted(admitted)))

    def _hold(self, st: _WindowState, uk: Any, key: str, n: int, pairs: list[tuple[Any, int]] | None) -> None:
        """L∞: add a group's `n` events to what `uk` ((unit, key), or the unit) holds in a window: a count
        keeps at most `max_per_key` of them (count_units: how many it saw, counted once), a sum or mean the
        `max_per_key` of smallest order key (`pairs`: the group's own smallest, sorted). The aggregate
        follows; whatever is not kept counts as capped."""
        kept, agg, kind = st.kept, st.agg, self._kind
        got = kept.get(uk)
        if kind == _COUNT:
            old = 0 if got is None else got
            now = kept[uk] = min(old + n, self._max_per_key)
            self.capped += old + n - now
            agg[key] = agg.get(key, 0) + now - old
            return
        if kind == _UNITS:
            kept[uk] = n if got is None else got + n
            if got is None:
                agg[key] = agg.get(key, 0) + 1
            return
        assert pairs is not None
        before: list[tuple[Any, int]] = [] if got is None else [got] if type(got) is tuple else got
        after = sorted(before + pairs)[: self._max_per_key] if before else pairs
        kept[uk] = after[0] if len(after) == 1 else after  # one pair as is, more as a sorted list
        self.capped += len(before) + n - len(after)
        delta = sum(v for _, v in after) - sum(v for _, v in before)
        if kind == _SUM:
            agg[key] = agg.get(key, 0) + delta
        else:
            pair = agg.get(key)
            if pair is None:
                agg[key] = [delta, len(after)]
            else:
                pair[0] += delta
                pair[1] += len(after) - len(before)

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
        dropped, delta = caps.close(start, present, None if st is None else st.digests)
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
        cuts, delta = bound.close(start, present, None if st is None else st.digests)
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
