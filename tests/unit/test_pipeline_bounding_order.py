"""Which contributions survive bounding is a function of each unit's own records: the same records
on a by-unit topic, delivered in any order, cut into any batches, with a restart anywhere, give
the same partials."""

from __future__ import annotations

import json
import random
from typing import NamedTuple

from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.topology.loader import load_topology_text
from dpstream.workers.pipeline import PartitionPipeline
from dpstream.workers.pipeline.copies import SOURCE_POSITION_HEADER, source_position
from dpstream.workers.pipeline.fixed_point import value_exponent

_YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts, allowed_lateness: 5s}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
metrics:
  spend:
    source: clicks
    budget: b
    window: {tumbling: 1m}
    aggregate: sum
    value: eur
    bounds: [-10, 200]
    contribution: {max_per_key: 1}
    mechanism: gaussian
  spend_by_page:
    source: clicks
    budget: b
    window: {tumbling: 1m}
    aggregate: sum
    value: eur
    bounds: [-10, 200]
    group_by: page
    contribution: {max_keys: 2, max_per_key: 2}
    mechanism: gaussian
  avg:
    source: clicks
    budget: b
    window: {tumbling: 1m}
    aggregate: mean
    value: eur
    bounds: [0, 100]
    group_by: page
    keys: [a, b, c, d]
    contribution: {max_keys: 1, max_per_key: 3}
    mechanism: gaussian
  avg1:
    source: clicks
    budget: b
    window: {tumbling: 1m}
    aggregate: mean
    value: eur
    bounds: [0, 100]
    contribution: {max_per_key: 1}
    mechanism: gaussian
  views:
    source: clicks
    budget: b
    window: {tumbling: 1m}
    aggregate: count
    group_by: page
    contribution: {max_keys: 2, max_per_key: 2}
    mechanism: gaussian
  users:
    source: clicks
    budget: b
    window: {hopping: 2m, every: 1m}
    aggregate: count_units
    group_by: page
    keys: [a, b, c, d]
    contribution: {max_keys: 2}
    mechanism: gaussian
sinks: {releases: t.rel, dead_letter: t.dlq}
"""
_TOPO = load_topology_text(_YAML)
_BY_UNIT = "t.clicks.by-unit"
_WINDOWS = 3
_LATENESS = 5


class Rec(NamedTuple):
    offset: int
    value: bytes
    timestamp: int
    key: bytes
    headers: tuple[tuple[str, bytes], ...]


class _Copy(NamedTuple):
    """A source record as the hop copies it: its append time, its source position, the event."""

    append_ms: int
    partition: int
    source_offset: int
    value: bytes


def _close_time(i: int) -> int:
    return 60 * (i + 1) + _LATENESS


_event = st.tuples(
    st.sampled_from(["u1", "u2", "u3"]),
    st.integers(0, 4),  # source partition
    st.integers(0, 60 * _WINDOWS - 1),  # event second
    st.integers(0, 7_000),  # ms after the event time it was appended (past 5 s: late)
    st.sampled_from(["a", "b", "c", "d", "e"]),
    st.integers(-20, 220),  # eur (some outside the bounds: clamped)
)


def _copies(events: list[tuple]) -> list[_Copy]:
    """Source records with append times rounded to whole 100 ms (ties across partitions) and
    source offsets that grow with the append time within each source partition."""
    rows = sorted(
        ((ts * 1000 + delay) // 100 * 100, p, unit, ts, page, eur) for unit, p, ts, delay, page, eur in events
    )
    next_offset = [0] * 5
    out = []
    for append_ms, p, unit, ts, page, eur in rows:
        doc = {"user_id": unit, "ts": ts, "page": page, "eur": eur}
        out.append(_Copy(append_ms, p, next_offset[p], json.dumps(doc).encode()))
        next_offset[p] += 1
    return out


def _deliveries(copies: list[_Copy], rng: random.Random) -> list[list[_Copy]]:
    """The hop's delivery: per close time, the copies appended by then (and after the previous
    one), in an order of the hop's fetches (shuffled)."""
    segments: list[list[_Copy]] = [[] for _ in range(_WINDOWS + 1)]
    for c in copies:
        i = next((i for i in range(_WINDOWS) if c.append_ms <= _close_time(i) * 1000), _WINDOWS)
        segments[i].append(c)
    for seg in segments:
        rng.shuffle(seg)
    return segments


def _run(segments: list[list[_Copy]], cuts: set[int], crash_at: int | None) -> tuple[list[bytes], int]:
    """Feed the segments to a by-unit pipeline in batches cut at `cuts` (indices in the delivered
    order), telling it after each segment that the end offset read at that close time is reached;
    at delivered index `crash_at` the worker restarts from its last commit. Returns the partials
    (bytes, sorted) and the capped count of the last pipeline."""
    records: list[Rec] = []
    steps: list[tuple[str, int, int]] = []  # ("records", from, to) or ("mark", close time, end offset)
    for i, seg in enumerate(segments):
        first = len(records)
        for c in seg:
            header = ((SOURCE_POSITION_HEADER, source_position(c.partition, c.source_offset)),)
            records.append(Rec(len(records), c.value, c.append_ms, b"", header))
        bounds = [first, *sorted(x for x in cuts if first < x < len(records)), len(records)]
        steps += [("records", a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
        if i < _WINDOWS:
            steps.append(("mark", _close_time(i), len(records)))

    def fresh(resume: dict[str, int] | None = None, start: int | None = None) -> PartitionPipeline:
        return PartitionPipeline(
            _TOPO, "clicks", 0, schedule_start=0, topic=_BY_UNIT, until=60 * _WINDOWS, resume=resume, start_offset=start
        )

    pipe = fresh()
    out: list[bytes] = []
    marks: list[tuple[int, int]] = []
    consumed = 0
    for kind, a, b in steps:
        if kind == "mark":
            marks.append((a, b))
            got = pipe.mark_end(a, b)
        else:
            got = pipe.process_batch(records[a:b])
            consumed = b
        out += [p.to_bytes() for p in got.partials]
        if crash_at is not None and kind == "records" and a <= crash_at < b:
            crash_at = None  # the worker dies after this batch's commit and restarts from it
            safe, progress = pipe.safe_offset(), pipe.progress()
            pipe = fresh(progress, safe)
            got = pipe.process_batch(records[safe or 0 : consumed])
            out += [p.to_bytes() for p in got.partials]
            for read_at, end in marks:
                out += [p.to_bytes() for p in pipe.mark_end(read_at, end).partials]
    out += [p.to_bytes() for p in pipe.flush().partials]
    return sorted(out), pipe.refresh_counts().capped


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_event, min_size=1, max_size=80),
    st.randoms(use_true_random=False),
    st.sets(st.integers(1, 80), max_size=8),
    st.one_of(st.none(), st.integers(0, 79)),
)
def test_partials_do_not_depend_on_the_hop_order_batch_cuts_or_a_restart(events, rng, cuts, crash_at):
    """Every partial (sums, means, counts, count_units; L0 and L∞ caps hit) is byte-identical to
    the one of the same records delivered in source order in one batch; so is the capped count
    without a restart."""
    copies = _copies(events)
    in_order = _deliveries(copies, random.Random(0))
    for seg in in_order:
        seg.sort()
    reference, capped = _run(in_order, set(), None)
    shuffled = _deliveries(copies, rng)
    got, got_capped = _run(shuffled, cuts, crash_at)
    assert got == reference
    assert len(reference) == 6 * _WINDOWS - 1  # every scheduled window, empty ones included (users: 2)
    if crash_at is None:
        assert got_capped == capped


def test_a_units_200_and_1_on_two_source_partitions_sum_to_the_same_in_both_orders():
    """sum with max_per_key 1: a unit's 200 (source partition 0) and 1 (partition 1, appended
    first) keep the 1 whichever the hop delivers first (first-come bounding kept 200 or 1)."""
    big = _Copy(30_100, 0, 0, json.dumps({"user_id": "u", "ts": 30, "page": "a", "eur": 200}).encode())
    small = _Copy(30_000, 1, 0, json.dumps({"user_id": "u", "ts": 30, "page": "a", "eur": 1}).encode())

    def spend(first: _Copy, second: _Copy) -> int:
        partials, _ = _run([[first, second], [], [], []], set(), None)
        docs = [json.loads(p) for p in partials]
        (doc,) = [d for d in docs if d["metric"] == "spend" and d["start"] == 0]
        return doc["values"][""]

    one = 2 ** value_exponent(_TOPO.metrics["spend"].bounds)  # 1 in grid units
    assert spend(big, small) == spend(small, big) == one
