"""The per-event pipeline dpstream shipped before the batch path, kept in tests as the oracle.

`oracle_process_batch(pipe, records)` feeds records to a `PartitionPipeline`'s accumulators one event
at a time, with the per-event rules exactly as they were written (parse, key check, unit hash, range,
future, arrival-time inclusion, L0 by `key_priority`, L∞ by order key, fixed-point sums, skip and
clamp tallies), into per-window state that follows every event (`_WindowState`), and closes windows
with the close-time code shipped alongside it (`OracleAccumulator`: the period rules applied unit by
unit, contributions taken out one by one). `oracle_pipeline` swaps a `PartitionPipeline`'s accumulators
for oracle ones, so a test can run both on equal pipelines and compare partials, dead letters, count
deltas, counters and commit points after every batch. Contributions bounding drops are tallied per
window and counted at its close, as the shipped path counts them.
"""

from __future__ import annotations

import math
from bisect import insort
from collections.abc import Iterable
from typing import Any

from dpstream.topology.errors import EventError
from dpstream.workers.pipeline.accumulator import (
    _COUNT,
    _SUM,
    _UNITS,
    MetricAccumulator,
    PartialValues,
)
from dpstream.workers.pipeline.copies import position_order, source_position_of
from dpstream.workers.pipeline.counters import MISSING_GROUP_FIELD, MISSING_VALUE_FIELD, UNDECLARED_KEY
from dpstream.workers.pipeline.events import DeadLetter
from dpstream.workers.pipeline.key_priority import key_priority
from dpstream.workers.pipeline.partition import BatchOutput, PartitionPipeline, RecordLike
from dpstream.workers.pipeline.quantile_cells import cell_count, cell_index
from dpstream.workers.pipeline.window_caps import PeriodBound, WindowCaps, unit_key

_REJECTED_KEPT = 65_536
"""Refused (unit, key) pairs remembered per window (past that, a repeat is hashed again: same answer)."""


class _WindowState:
    """An open window as the per-event path held it: per (unit, key) (or unit) what is kept (a count, or the
    (order, grid value) pair(s)), each unit's kept keys, the priorities and refusals of L0, the aggregate,
    a grouped sum's support per key, the units' period-state keys, and the contributions dropped so far."""

    __slots__ = ("first_offset", "kept", "unit_keys", "priority", "rejected", "agg", "support", "digests", "capped")

    def __init__(self, first_offset: int) -> None:
        self.first_offset = first_offset
        self.kept: dict[Any, Any] = {}
        self.unit_keys: dict[str, tuple[str, ...]] = {}
        self.priority: dict[tuple[str, str], int] = {}
        self.rejected: set[tuple[str, str]] = set()
        self.agg: PartialValues = {}
        self.support: dict[str, int] = {}
        self.digests: dict[str, bytes] = {}
        self.capped = 0


class OracleAccumulator(MetricAccumulator):
    """A `MetricAccumulator` whose windows are `_WindowState`s filled by the per-event path, closed by the
    close-time code that went with it."""

    windows: dict[int, _WindowState]  # type: ignore[assignment]  # the per-event state, not first offsets

    @classmethod
    def like(cls, acc: MetricAccumulator) -> OracleAccumulator:
        """An oracle accumulator with `acc`'s metric, schedule, rules and tallies (nothing open)."""
        oracle = cls.__new__(cls)
        oracle.__dict__.update(acc.__dict__)
        oracle.windows = {}
        return oracle

    def add_batch(self, batch: Any) -> Any:  # pragma: no cover - the oracle is fed event by event
        raise AssertionError("the oracle takes events one by one (oracle_process_batch)")

    def close_through(self, t: float, limit: int | None = None) -> list[tuple[int, PartialValues]]:
        out: list[tuple[int, PartialValues]] = []
        s = self.next_start
        size, every, windows, lateness, until = self.size, self.every, self.windows, self.lateness, self.until
        while s + size + lateness <= t and (until is None or s + size <= until):
            if limit is not None and len(out) >= limit:
                break
            st = windows.pop(s, None)
            if st is not None:
                self.capped += st.capped
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

    def first_open_offset(self) -> int | None:
        if not self.windows:
            return None
        return min(st.first_offset for st in self.windows.values())

    def _take_out(self, st: _WindowState, uk: Any, key: str) -> int:
        """Remove what `uk` holds in a window, as if it had never come; how many contributions it held."""
        gone = st.kept.pop(uk)
        agg, kind = st.agg, self._kind
        if kind == _COUNT:
            n = gone
            left = agg[key] = agg[key] - gone
        elif kind == _UNITS:
            n = gone
            left = agg[key] = agg[key] - 1
        else:
            pairs = [gone] if type(gone) is tuple else gone
            n = len(pairs)
            if kind == _SUM:
                agg[key] -= sum(v for _, v in pairs)
                if self._group is None:
                    left = len(st.kept)
                else:
                    left = st.support[key] = st.support[key] - 1
                    if not left:
                        del st.support[key]
            else:
                pair = agg[key]
                pair[0] -= sum(v for _, v in pairs)
                left = pair[1] = pair[1] - n
        if not left:
            del agg[key]
        return n

    def _apply_caps(self, start: int, st: _WindowState | None) -> None:
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
        assert st is not None
        self.capped_windows += len(dropped)
        for unit in dropped:
            if grouped:
                for key in st.unit_keys.pop(unit):
                    self._take_out(st, (unit, key), key)
            else:
                self._take_out(st, unit, "")

    def _apply_bound(self, bound: PeriodBound, start: int, st: _WindowState | None) -> None:
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
        assert st is not None
        self.capped_period += len(cuts)
        agg = st.agg
        for unit, key, v, c in cuts:
            if c == 0:
                self._take_out(st, (unit, key) if grouped else unit, key)
            else:
                agg[key] -= v - c

    def _quantile_cells(self, st: _WindowState) -> PartialValues:
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


def oracle_pipeline(pipe: PartitionPipeline) -> PartitionPipeline:
    """`pipe` with its accumulators swapped for oracle ones (feed it with `oracle_process_batch`)."""
    pipe._accs = [OracleAccumulator.like(acc) for acc in pipe._accs]
    return pipe


def _key_problem(pipe: PartitionPipeline, rec: RecordLike, unit: str) -> str | None:
    """The key check of one record, spelled out: its Kafka key must be its unit, and in its home partition."""
    key = rec.key  # type: ignore[attr-defined]  # check_keys only on Kafka records, which have a key
    if key != unit.encode():
        return "key_mismatch"
    if pipe._home is not None and pipe._home(key) != pipe.partition:
        return "wrong_partition"
    return None


def oracle_process_batch(pipe: PartitionPipeline, records: Iterable[RecordLike]) -> BatchOutput:
    """`PartitionPipeline.process_batch` as it was: one event at a time, every metric per event."""
    parse = pipe._parser.parse
    adds = [_make_add(acc) for acc in pipe._accs]
    ordered, own = any(acc.uses_order for acc in pipe._accs), pipe.partition
    lateness = pipe._lateness
    max_future = pipe._max_future
    check_keys = pipe._check_keys
    hash_unit = pipe._hash_unit
    lo, hi = pipe._event_range
    start = pipe.schedule_start
    seen = pipe.seen_copies
    dead: list[DeadLetter] = []
    accepted = late = 0
    offset = pipe.last_offset
    for rec in records:
        offset = rec.offset
        position = None
        if seen is not None:
            position = source_position_of(rec)
            if position is not None and position in seen:
                seen.skipped += 1
                continue
        try:
            unit, ts, fields = parse(rec.value, rec.timestamp, offset)  # type: ignore[arg-type]
        except EventError as exc:
            pipe._dead_letter(dead, exc.reason, offset, rec.value)
            continue
        if check_keys and (problem := _key_problem(pipe, rec, unit)) is not None:
            pipe._dead_letter(dead, problem, offset, rec.value)
            continue
        if hash_unit is not None:
            unit = hash_unit(unit)
        if not lo <= ts < hi:
            pipe._dead_letter(dead, "out_of_range", offset, rec.value)
            continue
        arrival = ts if rec.timestamp is None else rec.timestamp / 1000.0
        if ts > arrival + max_future:
            pipe._dead_letter(dead, "future_timestamp", offset, rec.value)
            continue
        accepted += 1
        if seen is not None and position is not None:
            seen.add(position, ts)
        if ts < start:
            late += 1
            continue
        horizon = arrival - lateness
        order = None
        if ordered:
            order = (arrival, own, offset) if position is None else (arrival, *position_order(position, (-1, offset)))
        was_late = False
        for add in adds:
            if add(unit, ts, fields, offset, horizon, order):
                was_late = True
        if was_late:
            late += 1
    pipe.last_offset = offset
    pipe.counts.accepted += accepted
    pipe.counts.late += late
    return pipe._output(pipe._close_reached(), dead)


def _make_add(self: OracleAccumulator):  # noqa: C901 - the old per-event code, verbatim but for one fix (`d`)
    group = self._group
    declared = self._declared
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
    group_field = group if group is not None else ""
    acc = self
    skips = self.skips
    no_group, undeclared, no_value = MISSING_GROUP_FIELD, UNDECLARED_KEY, MISSING_VALUE_FIELD
    first = self.first_start
    support_keys = grouped and is_sum
    single = max_per_key == 1

    def admit(st: _WindowState, start: int, unit: str, key: str, keys: tuple[str, ...]) -> bool:
        return _admit_key(acc, st, start, unit, key, keys)

    def add(unit: str, ts: float, fields: dict[str, Any], offset: int, horizon: float, order: Any = None) -> bool:  # noqa: C901
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
            f = float(raw)
            if f < lo:
                f = lo
                acc.clamped += 1
            elif f > hi:
                f = hi
                acc.clamped += 1
            v = round(f * scale)
        last = int(ts // every) * every
        start = last - size + every
        late = False
        while start <= last:
            s = start
            start += every
            if s + size < horizon or s < acc.next_start:
                if s >= first:
                    late = True
                continue
            st = windows.get(s)
            if st is None:
                st = windows[s] = _WindowState(offset)
            if bounded:
                if acc.caps is not None:  # the close reads each unit's period-state key from the window
                    st.digests[unit] = unit_key(unit)
                kept = st.kept
                got = kept.get(uk)
                if got is None:
                    if grouped:
                        unit_keys = st.unit_keys
                        keys = unit_keys.get(unit)
                        if keys is None:
                            unit_keys[unit] = (key,)
                        elif len(keys) < max_keys:
                            unit_keys[unit] = keys + (key,)
                        elif uk in st.rejected or not admit(st, s, unit, key, keys):
                            st.capped += 1
                            continue
                        if support_keys:
                            support = st.support
                            support[key] = support.get(key, 0) + 1
                    if is_count:
                        kept[uk] = 1
                    else:
                        kept[uk] = (offset if order is None else order, v)
                elif is_count:
                    if got < max_per_key:
                        kept[uk] = got + 1
                    elif is_units:
                        kept[uk] = got + 1
                        continue
                    else:
                        st.capped += 1
                        continue
                else:
                    o = offset if order is None else order
                    d = v  # the old code moved `v` itself here, so a hopping event's next window got a wrong value
                    if single:
                        st.capped += 1
                        if o >= got[0]:
                            continue
                        kept[uk] = (o, v)
                        d = v - got[1]
                    elif type(got) is tuple:
                        kept[uk] = [got, (o, v)] if o > got[0] else [(o, v), got]
                        o = None
                    elif len(got) < max_per_key:
                        if o > got[-1][0]:
                            got.append((o, v))
                        else:
                            insort(got, (o, v))
                        o = None
                    else:
                        st.capped += 1
                        if o >= got[-1][0]:
                            continue
                        dropped = got.pop()[1]
                        insort(got, (o, v))
                        d = v - dropped
                    if o is not None:
                        if is_sum:
                            st.agg[key] += d
                        else:
                            st.agg[key][0] += d
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


def _admit_key(
    self: OracleAccumulator, st: _WindowState, start: int, unit: str, key: str, keys: tuple[str, ...]
) -> bool:
    name, priority = self.metric.name, st.priority
    worst: tuple[int, str] | None = None
    for k in keys:
        p = priority.get((unit, k))
        if p is None:
            p = priority[(unit, k)] = key_priority(name, unit, start, k)
        if worst is None or (p, k) > worst:
            worst = (p, k)
    mine = key_priority(name, unit, start, key)
    assert worst is not None
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
    st.capped += self._take_out(st, (unit, evicted), evicted)
    return True
