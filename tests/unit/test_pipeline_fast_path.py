"""The tumbling fast path (reuse the previous event's open window) emits exactly what the general grid path does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from topology.loader import load_topology_text
from workers.pipeline.accumulator import MetricAccumulator

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
        st.floats(min_value=-9.0, max_value=9.0, allow_nan=False),  # step from the previous event: some go back
        st.sampled_from(["a", "b", "c", "zzz"]),  # zzz: not a declared key (skipped by views)
        st.one_of(st.none(), st.floats(min_value=-5.0, max_value=15.0, allow_nan=False)),  # None: skipped by spend
    ),
    max_size=120,
)


def _run(metric: str, events: list, cuts: list[int], reuse: bool) -> tuple:
    acc = MetricAccumulator(_TOPO.metrics[metric], _TOPO.sources["clicks"], reuse_window=reuse)
    out, late = [], 0
    ts, maxt = 1_000.0, -1e18
    for i, (unit, step, page, eur) in enumerate(events):
        ts = max(0.0, ts + step)
        if maxt < -1e17:
            acc.start_at(acc.first_start_covering(ts))
        maxt = max(maxt, ts)
        late += acc.add(unit, ts, {"page": page, "eur": eur}, i, maxt - _LATENESS)
        if i in cuts:  # a batch boundary: windows final by now are emitted
            out.extend(acc.emit_final(maxt - _LATENESS, 10_000))
    out.extend(acc.flush())
    return out, late, acc.capped, acc.clamped, acc.skipped


@settings(max_examples=500, deadline=None)
@given(_events, st.lists(st.integers(min_value=0, max_value=120), max_size=10), st.sampled_from(["views", "spend"]))
def test_fast_path_matches_the_general_path(events, cuts, metric):
    """Same partials, late, capped, clamped and skipped counts with and without window reuse."""
    assert _run(metric, events, cuts, True) == _run(metric, events, cuts, False)


def test_the_fast_path_is_taken_and_bounds_like_the_general_path():
    """Twenty events of one unit in one window: capped at max_per_key either way (a non-vacuous case)."""
    events = [("u1", 0.01, "a", 1.0)] * 20
    fast, general = _run("views", events, [], True), _run("views", events, [], False)
    assert fast == general
    [(start, values)] = fast[0]
    assert values == {"a": 2} and fast[2] == 18


def test_an_event_for_the_remembered_window_after_the_watermark_passed_it_is_late():
    """The remembered window is not reused once final: A goes to [1000, 1005); an event the metric skips
    moves the watermark past 1005; B, back in [1000, 1005), is late on both paths, not added."""
    events = [("u1", 1.0, "a", 1.0), ("u2", 8.0, "zzz", 1.0), ("u3", -8.5, "a", 1.0)]  # times 1001, 1009, 1000.5
    fast, general = _run("views", events, [], True), _run("views", events, [], False)
    assert fast == general
    partials, late = fast[0], fast[1]
    assert late == 1 and dict(partials)[1000] == {"a": 1}
