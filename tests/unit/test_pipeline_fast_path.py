"""The tumbling fast path (reuse the previous event's open window) emits exactly what the general grid path does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.topology.loader import load_topology_text
from dpstream.workers.pipeline.accumulator import MetricAccumulator

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
sinks: {releases: t.rel, dead_letter: t.dlq}
"""
_TOPO = load_topology_text(_YAML)
_LATENESS = 3.0

_events = st.lists(
    st.tuples(
        st.sampled_from(["u1", "u2", "u3", "u4"]),
        st.floats(min_value=0.0, max_value=4.0, allow_nan=False),  # arrival step (append times never go back)
        st.floats(min_value=-2.0, max_value=9.0, allow_nan=False),  # event time = arrival − this: some ahead, some late
        st.sampled_from(["a", "b", "c", "zzz"]),  # zzz: not a declared key (skipped by views)
        st.one_of(st.none(), st.floats(min_value=-5.0, max_value=15.0, allow_nan=False)),  # None: skipped by spend
    ),
    max_size=120,
)


def _run(metric: str, events: list, cuts: list[int], reuse: bool) -> tuple:
    acc = MetricAccumulator(_TOPO.metrics[metric], _TOPO.sources["clicks"], 995, reuse_window=reuse)
    out, late = [], 0
    arrival = 1_000.0
    for i, (unit, step, delay, page, eur) in enumerate(events):
        arrival += step
        ts = max(0.0, arrival - delay)
        late += acc.add(unit, ts, {"page": page, "eur": eur}, i, arrival - _LATENESS)
        if i in cuts:  # a close between batches: everything appended before now is consumed
            out.extend(acc.close_through(arrival - 0.001))
    out.extend(acc.close_through(arrival + 100))
    return out, late, acc.capped, acc.clamped, acc.skipped


@settings(max_examples=500, deadline=None)
@given(_events, st.lists(st.integers(min_value=0, max_value=120), max_size=10), st.sampled_from(["views", "spend"]))
def test_fast_path_matches_the_general_path(events, cuts, metric):
    """Same partials, late, capped, clamped and skipped counts with and without window reuse."""
    assert _run(metric, events, cuts, True) == _run(metric, events, cuts, False)


def test_the_fast_path_is_taken_and_bounds_like_the_general_path():
    """Twenty events of one unit in one window: capped at max_per_key either way (a non-vacuous case)."""
    events = [("u1", 0.01, 0.0, "a", 1.0)] * 20
    fast, general = _run("views", events, [], True), _run("views", events, [], False)
    assert fast == general
    nonempty = [(s, v) for s, v in fast[0] if v]
    assert nonempty == [(1000, {"a": 2})] and fast[2] == 18


def test_an_event_for_the_remembered_window_after_it_closed_is_late():
    """The remembered window is not reused once closed: A goes to [1000, 1005) (C = 1008); B, back in
    [1000, 1005) but appended at 1008.5, is late on both paths, not added."""
    events = [("u1", 1.0, 0.0, "a", 1.0), ("u3", 7.5, 8.0, "a", 1.0)]  # (ts, arrival): (1001, 1001), (1000.5, 1008.5)
    fast, general = _run("views", events, [], True), _run("views", events, [], False)
    assert fast == general
    partials, late = fast[0], fast[1]
    assert late == 1 and dict(partials)[1000] == {"a": 1}
