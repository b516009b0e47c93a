"""`MetricAccumulator` against a slow, plainly written model of its rules: which windows an event counts
in (its own event time and arrival time only), order-independent L0 / L∞ bounding, exact fixed-point
sums, and the late / capped / clamped / skipped tallies; tumbling and hopping windows, closes between
events anywhere."""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import Metric
from dpstream.workers.pipeline.accumulator import MetricAccumulator
from dpstream.workers.pipeline.fixed_point import value_exponent
from dpstream.workers.pipeline.key_priority import key_priority

pytestmark = pytest.mark.unit

_YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts, allowed_lateness: 3s}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
metrics:
  views:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 5s}
    aggregate: count
    group_by: page
    keys: [a, b, c]
    contribution: {max_keys: 2, max_per_key: 2}
    mechanism: gaussian
  spend:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 5s}
    aggregate: mean
    value: eur
    bounds: [0, 10]
    contribution: {max_per_key: 3}
    mechanism: gaussian
  basket:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 5s}
    aggregate: sum
    value: eur
    bounds: [0, 10]
    group_by: page
    keys: [a, b, c]
    contribution: {max_keys: 2, max_per_key: 2}
    mechanism: gaussian
  tips:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 5s}
    aggregate: sum
    value: eur
    bounds: [0, 10]
    group_by: page
    keys: [a, b, c]
    contribution: {max_keys: 2, max_per_key: 1}
    mechanism: gaussian
  active:
    source: clicks
    budget: b
    weight: 1
    window: {hopping: 10s, every: 5s}
    aggregate: count_units
    group_by: page
    keys: [a, b, c]
    contribution: {max_keys: 1}
    mechanism: gaussian
sinks: {releases: t.rel, dead_letter: t.dlq}
"""
_TOPO = load_topology_text(_YAML)
_SOURCE = _TOPO.sources["clicks"]
_FIRST = 995
"""The schedule's first window (events reach back to 991: some fall before it)."""


def _arrivals(events: list) -> list[tuple[str, float, float, str, float | None, tuple[int, int]]]:
    """(unit, arrival, event time, page, eur, L∞ order key) per event: arrival times never go back; the
    order key is a function of the record, not of when it came (a repartition hop reorders records)."""
    out, arrival = [], 1_000.0
    for i, (unit, step, delay, page, eur, rank) in enumerate(events):
        arrival += step
        out.append((unit, arrival, max(0.0, arrival - delay), page, eur, (rank, i)))
    return out


def _run(metric: str, events: list, cuts: list[int]) -> tuple:
    """The accumulator fed the events one by one, closing what is due after each event in `cuts`."""
    acc = MetricAccumulator(_TOPO.metrics[metric], _SOURCE, _FIRST)
    lateness = float(_SOURCE.allowed_lateness_s)
    out, late, arrival = [], 0, 1_000.0
    for i, (unit, arrival, ts, page, eur, order) in enumerate(_arrivals(events)):
        late += acc.add(unit, ts, {"page": page, "eur": eur}, i, arrival - lateness, order)
        if i in cuts:  # a close between batches: everything appended before now is consumed
            out.extend(acc.close_through(arrival - 0.001))
    out.extend(acc.close_through(arrival + 100))
    return out, late, acc.capped, acc.clamped, acc.skipped


Held = dict[tuple[int, str, str], list[tuple[tuple[int, int], int]]]
"""(window start, unit, key) → the (order key, grid value) of each record the window holds."""


def _covering(m: Metric, ts: float) -> list[int]:
    """Every window start of the metric's grid whose window [s, s + size) holds `ts`."""
    size, every = m.window.size_s, m.window.every_s
    return [s for s in range(int(ts) - size, int(ts) + 1) if s % every == 0 and s <= ts < s + size]


def _model_windows(m: Metric, timeline: list) -> tuple[Held, int, int, int]:
    """Which window holds which record (its own event time and arrival only), and the late, skipped and
    clamped tallies."""
    size, lateness = m.window.size_s, int(_SOURCE.allowed_lateness_s)
    lo, hi = (m.bounds.lower, m.bounds.upper) if m.bounds is not None else (0.0, 0.0)
    exponent = value_exponent(m.bounds) if m.bounds is not None else 0
    late = skipped = clamped = 0
    held: Held = defaultdict(list)
    for unit, arrival, ts, page, eur, order in timeline:
        if (m.group_by is not None and page not in m.keys) or (m.value is not None and eur is None):
            skipped += 1
            continue
        units = 0
        if m.value is not None:
            clamped += not lo <= eur <= hi
            units = round(Fraction(min(max(eur, lo), hi)) * 2**exponent)  # the exact value on the 2^-E grid
        key = page if m.group_by is not None else ""
        in_schedule = [s for s in _covering(m, ts) if s >= _FIRST]  # none exists before the schedule
        on_time = [s for s in in_schedule if arrival - lateness <= s + size]  # arrived by C(w) = end + lateness
        late += len(on_time) < len(in_schedule)
        for s in on_time:
            held[(s, unit, key)].append((order, units))
    return held, late, skipped, clamped


def _model_bounding(m: Metric, held: Held, partials: dict[int, dict]) -> int:
    """L0 then L∞ per (unit, window) from all of the unit's records at once, added into `partials`;
    returns how many contributions were capped."""
    per_unit: dict[tuple[int, str], set[str]] = defaultdict(set)
    for s, unit, key in held:
        per_unit[(s, unit)].add(key)
    max_keys = m.contribution.max_keys if m.group_by is not None else 1
    capped = 0
    for (s, unit), keys in per_unit.items():
        ranked = sorted(keys, key=lambda k: (key_priority(m.name, unit, s, k), k))  # noqa: B023 - used at once
        for rank, key in enumerate(ranked):
            records = sorted(held[(s, unit, key)])
            if rank >= max_keys:  # L0: only the keys of smallest priority
                capped += len(records)
                continue
            kept = records[:1] if m.aggregate.value == "count_units" else records[: m.contribution.max_per_key]
            capped += 0 if m.aggregate.value == "count_units" else len(records) - len(kept)
            agg = partials[s]
            if m.aggregate.value in ("count", "count_units"):
                agg[key] = agg.get(key, 0) + len(kept)
            elif m.aggregate.value == "sum":
                agg[key] = agg.get(key, 0) + sum(v for _, v in kept)
            else:
                total, n = agg.get(key, [0, 0])
                agg[key] = [total + sum(v for _, v in kept), n + len(kept)]
    return capped


def _model(metric: str, events: list) -> tuple:
    """The rules, slowly: every event against every window of the schedule, then bounding per
    (unit, window); every window of the schedule closed by the last close, empty or not, in order."""
    m = _TOPO.metrics[metric]
    timeline = _arrivals(events)
    final = (timeline[-1][1] if timeline else 1_000.0) + 100
    size, lateness = m.window.size_s, int(_SOURCE.allowed_lateness_s)
    starts = [s for s in range(_FIRST, int(final), m.window.every_s) if s + size + lateness <= final]
    held, late, skipped, clamped = _model_windows(m, timeline)
    partials: dict[int, dict] = {s: {} for s in starts}
    capped = _model_bounding(m, held, partials)
    return [(s, partials[s]) for s in starts], late, capped, clamped, skipped


_events = st.lists(
    st.tuples(
        st.sampled_from(["u1", "u2", "u3", "u4"]),
        st.floats(min_value=0.0, max_value=4.0, allow_nan=False),  # arrival step (append times never go back)
        st.floats(min_value=-2.0, max_value=9.0, allow_nan=False),  # event time = arrival − this: some ahead, some late
        st.sampled_from(["a", "b", "c", "zzz"]),  # zzz: not a declared key (skipped by grouped metrics)
        st.one_of(st.none(), st.floats(min_value=-5.0, max_value=15.0, allow_nan=False)),  # None: skipped by sums
        st.integers(min_value=0, max_value=3),  # the first part of the L∞ order key: records come out of order
    ),
    max_size=120,
)


@settings(max_examples=400, deadline=None)
@given(_events, st.lists(st.integers(min_value=0, max_value=120), max_size=10), st.sampled_from(list(_TOPO.metrics)))
def test_the_accumulator_emits_what_the_model_says(events, cuts, metric):
    """Same partials (every window of the schedule, in order), late, capped, clamped and skipped counts."""
    assert _run(metric, events, cuts) == _model(metric, events)


def test_a_unit_is_capped_at_max_per_key_in_one_window():
    """Twenty events of one unit in one window: two counted, eighteen capped (a non-vacuous case)."""
    events = [("u1", 0.01, 0.0, "a", 1.0, 0)] * 20
    got = _run("views", events, [])
    assert got == _model("views", events)
    assert [(s, v) for s, v in got[0] if v] == [(1000, {"a": 2})] and got[2] == 18


def test_an_event_for_a_window_closed_on_its_arrival_is_late():
    """A goes to [1000, 1005) (C = 1008); B, back in [1000, 1005) but appended at 1008.5, is late, not added."""
    events = [
        ("u1", 1.0, 0.0, "a", 1.0, 0),
        ("u3", 7.5, 8.0, "a", 1.0, 0),
    ]  # (ts, arrival): (1001, 1001), (1000.5, 1008.5)
    got = _run("views", events, [0])
    assert got == _model("views", events)
    assert got[1] == 1 and dict(got[0])[1000] == {"a": 1}


def test_a_hopping_event_counts_in_both_its_windows():
    """[995, 1005) and [1000, 1010) both hold an event at 1002 that arrived in time."""
    events = [("u1", 2.0, 0.0, "b", None, 0)]
    got = _run("active", events, [])
    assert got == _model("active", events)
    assert {s: v for s, v in got[0] if v} == {995: {"b": 1}, 1000: {"b": 1}}


def test_an_event_appended_exactly_at_the_close_time_counts():
    """C(w) is inclusive: [1000, 1005) closes at 1008; an event for it appended at 1008 counts, at 1008.25 not."""
    on_time = [("u1", 8.0, 7.0, "a", 1.0, 0)]  # appended 1008, event time 1001
    too_late = [("u1", 8.25, 7.25, "a", 1.0, 0)]
    assert _run("views", on_time, []) == _model("views", on_time)
    assert dict(_run("views", on_time, [])[0])[1000] == {"a": 1}
    assert _run("views", too_late, []) == _model("views", too_late)
    assert dict(_run("views", too_late, [])[0])[1000] == {} and _run("views", too_late, [])[1] == 1


def test_a_smaller_order_key_arriving_later_replaces_the_largest_kept():
    """L∞ keeps the contributions of smallest order key, not the first to arrive: values 1, 2, 3, 4 with
    order keys 3, 2, 1, 0 keep 4 for `tips` (max_per_key 1), 4 and 3 for `basket` (2) and 4, 3, 2 for `spend` (3)."""
    events = [("u1", 0.5, 0.0, "a", float(v), 4 - v) for v in (1, 2, 3, 4)]
    basket, spend = _run("basket", events, []), _run("spend", events, [])
    assert basket == _model("basket", events) and spend == _model("spend", events)
    one = 1 << value_exponent(_TOPO.metrics["basket"].bounds)
    assert dict(basket[0])[1000] == {"a": 7 * one} and basket[2] == 2
    assert dict(spend[0])[1000] == {"": [9 * one, 3]} and spend[2] == 1
    tips = _run("tips", events, [])
    assert tips == _model("tips", events) and dict(tips[0])[1000] == {"a": 4 * one} and tips[2] == 3
