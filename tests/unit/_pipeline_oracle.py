"""The per-event pipeline dpstream shipped before the batch path, kept in tests as the oracle.

`oracle_process_batch(pipe, records)` feeds records to a `PartitionPipeline`'s accumulators one event
at a time, with the per-event rules exactly as they were written (parse, key check, unit hash, range,
future, arrival-time inclusion, L0 by `key_priority`, L∞ by order key, fixed-point sums, skip and
clamp tallies). It writes the same per-window state (`_WindowState`) the shipped batch path writes,
and leaves closing to the shipped close-time code, so a test can run both on equal pipelines and
compare partials, dead letters, counters and state after every batch.
"""

from __future__ import annotations

import math
from bisect import insort
from collections.abc import Iterable
from typing import Any

from dpstream.topology.errors import EventError
from dpstream.workers.pipeline.accumulator import (
    _COUNT,
    _REJECTED_KEPT,
    _SUM,
    _UNITS,
    MetricAccumulator,
    _WindowState,
    key_priority,
)
from dpstream.workers.pipeline.copies import position_order, source_position_of
from dpstream.workers.pipeline.counters import MISSING_GROUP_FIELD, MISSING_VALUE_FIELD, UNDECLARED_KEY
from dpstream.workers.pipeline.events import DeadLetter
from dpstream.workers.pipeline.partition import BatchOutput, PartitionPipeline, RecordLike
from dpstream.workers.pipeline.window_caps import unit_key


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
        if check_keys and (problem := pipe._key_problem(rec, unit)) is not None:
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


def oracle_add(
    acc: MetricAccumulator, unit: str, ts: float, fields: dict[str, Any], offset: int, horizon: float, order: Any = None
) -> bool:
    """`MetricAccumulator.add` as it was, for one event (True when a window covering it was missed)."""
    return _make_add(acc)(unit, ts, fields, offset, horizon, order)


def _make_add(self: MetricAccumulator):  # noqa: C901 - the old per-event code, verbatim but for one fix (`d`)
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
                            acc.capped += 1
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
                        acc.capped += 1
                        continue
                else:
                    o = offset if order is None else order
                    d = v  # the old code moved `v` itself here, so a hopping event's next window got a wrong value
                    if single:
                        acc.capped += 1
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
                        acc.capped += 1
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
    self: MetricAccumulator, st: _WindowState, start: int, unit: str, key: str, keys: tuple[str, ...]
) -> bool:
    name, priority = self.metric.name, st.priority
    worst: tuple[bytes, str] | None = None
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
    self.capped += self._take_out(st, (unit, evicted), evicted)
    return True
