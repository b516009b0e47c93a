"""contribution.max_windows in the pipeline: at each close, units present below m are counted, the others dropped."""

from __future__ import annotations

import json
import random
import sys
import tracemalloc
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.topology.errors import ConfigError, InternalError
from dpstream.topology.loader import load_topology_text
from dpstream.workers.pipeline import PartitionPipeline
from dpstream.workers.pipeline.window_caps import UNIT_KEY_BYTES, CountDelta, WindowCaps, unit_key

T0 = 1_796_083_200  # a UTC midnight, so also an hour start
HOUR = 3_600

_YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1h}
metrics:
  views:
    source: clicks
    budget: b
    window: {tumbling: 1m}
    aggregate: count
    contribution: {max_per_key: 3, max_windows: 2}
    mechanism: gaussian
  pages:
    source: clicks
    budget: b
    window: {tumbling: 1m}
    aggregate: sum
    group_by: page
    value: eur
    bounds: [0, 10]
    contribution: {max_keys: 2, max_per_key: 2, max_windows: 2}
    mechanism: gaussian
  users:
    source: clicks
    budget: b
    window: {tumbling: 1m}
    aggregate: count_units
    contribution: {max_windows: 3}
    mechanism: gaussian
  avg:
    source: clicks
    budget: b
    window: {tumbling: 1m}
    aggregate: mean
    value: eur
    bounds: [0, 10]
    contribution: {max_windows: 1}
    mechanism: gaussian
  plain:
    source: clicks
    budget: b
    window: {tumbling: 1m}
    aggregate: count
    mechanism: gaussian
sinks: {releases: out, dead_letter: dlq}
"""


class Rec(NamedTuple):
    offset: int
    value: bytes
    timestamp: int


def _topology():
    return load_topology_text(_YAML, env={})


def _records(events: list[tuple[str, float, str, float]], first_offset: int = 0) -> list[Rec]:
    """(unit, event time, page, eur) → records appended a second after their event time, in time order."""
    ordered = sorted(events, key=lambda e: (e[1], e[0], e[2], e[3]))
    return [
        Rec(first_offset + i, json.dumps({"user_id": u, "ts": t, "page": p, "eur": v}).encode(), round(t * 1000) + 1000)
        for i, (u, t, p, v) in enumerate(ordered)
    ]


def _run(events, *, until: int = T0 + HOUR, start: int = T0) -> tuple[dict, PartitionPipeline, list[CountDelta]]:
    """Every window of [start, until) on one partition: ((metric, window start) → values, pipeline, deltas)."""
    pipe = PartitionPipeline(_topology(), "clicks", 0, schedule_start=start, until=until)
    outs = [pipe.process_batch(_records(events)), pipe.flush()]
    partials = {(p.metric, p.start): p.values for out in outs for p in out.partials}
    return partials, pipe, [d for out in outs for d in out.counted]


def test_a_unit_counts_in_its_first_m_windows_of_the_period_then_is_dropped() -> None:
    """views (m = 2): u counts in minutes 0 and 2, not 3 and 5; v, present only in minute 3, counts there."""
    events = [("u", T0 + 60 * k + 1, "a", 1.0) for k in (0, 2, 3, 5)] + [("v", T0 + 181, "a", 1.0)]
    partials, pipe, _ = _run(events)
    views = {s - T0: partials[("views", s)] for s in range(T0, T0 + 360, 60)}
    assert views == {0: {"": 1}, 60: {}, 120: {"": 1}, 180: {"": 1}, 240: {}, 300: {}}
    assert pipe.refresh_counts().capped_windows["views"] == 2
    assert partials[("plain", T0 + 300)] == {"": 1}  # a metric without the cap keeps every window


def test_counts_restart_with_each_period() -> None:
    """The counts are per period: in the next hour the unit counts in its first m windows again."""
    times = [T0 + 60 * k + 1 for k in range(4)] + [T0 + HOUR + 60 * k + 1 for k in range(4)]
    partials, pipe, deltas = _run([("u", t, "a", 1.0) for t in times], until=T0 + 2 * HOUR)
    counted = sorted(s - T0 for (m, s), v in partials.items() if m == "views" and v)
    assert counted == [0, 60, HOUR, HOUR + 60]
    assert [(d.period_start - T0, d.window_start - T0) for d in deltas if d.metric == "views"] == [
        (0, 0),
        (0, 60),
        (HOUR, HOUR),
        (HOUR, HOUR + 60),
    ]
    assert pipe.refresh_counts().capped_windows["views"] == 4


def test_a_dropped_unit_leaves_no_trace_in_the_window() -> None:
    """Dropped from a grouped sum, a mean and count_units: keys only it held vanish, the rest is as without it."""
    shared = [("v", T0 + 240 + 2, "a", 5.0)]
    u_events = [("u", T0 + 60 * k + 1, "a", 3.0) for k in range(4)] + [("u", T0 + 240 + 1, "b", 7.0)]
    with_u, _, _ = _run(u_events + shared)
    # without u in minute 4 at all: what the capped run must give for that window
    without_u, _, _ = _run([e for e in u_events if e[1] < T0 + 240] + shared)
    for metric in ("pages", "avg", "users", "views"):
        assert with_u[(metric, T0 + 240)] == without_u[(metric, T0 + 240)], metric
    assert with_u[("pages", T0 + 240)] == {"a": 5 * 2 ** with_u_exponent()}  # 'b' came from u alone
    assert with_u[("avg", T0 + 60)] == {}  # m = 1: u counted in minute 0 only


def with_u_exponent() -> int:
    from dpstream.workers.pipeline.fixed_point import value_exponent

    bounds = _topology().metrics["pages"].bounds
    assert bounds is not None
    return value_exponent(bounds)


def test_the_decision_reads_the_counts_before_the_window() -> None:
    """Two units sharing a count key (a forced collision) in one window are both in or both out, in any order."""
    caps = WindowCaps("m", 1, HOUR)
    caps.counts[unit_key("a")] = 0
    dropped, delta = caps.close(T0, ["a", "b"])
    assert dropped == [] and delta is not None and len(delta.keys) == 2
    dropped, delta = caps.close(T0 + 60, ["b", "a"])
    assert sorted(dropped) == ["a", "b"] and delta is None
    with pytest.raises(InternalError, match="decided twice or out of order"):
        caps.close(T0 + 60, [])


def test_count_delta_round_trips_through_bytes() -> None:
    """A delta's bytes hold the metric, period, window and 16-byte keys, and read back equal."""
    delta = CountDelta("views", T0, T0 + 60, tuple(sorted(unit_key(u) for u in ("a", "b", "c"))))
    raw = delta.to_bytes()
    assert CountDelta.from_bytes(raw) == delta
    assert b"views" in raw and b'"a"' not in raw  # keys, never unit ids
    with pytest.raises(InternalError, match="malformed"):
        CountDelta.from_bytes(b'{"metric":"m","period":0,"start":0,"keys":"AAAA"}')


def _period_events(seed: int, units: int = 12) -> list[tuple[str, float, str, float]]:
    rng = random.Random(seed)
    return [
        (f"u{rng.randrange(units)}", T0 + rng.uniform(0, HOUR - 1), rng.choice("abc"), float(rng.randint(0, 10)))
        for _ in range(400)
    ]


def test_a_restarted_pipeline_rebuilds_the_counts_from_the_persisted_deltas() -> None:
    """Stop after some windows closed, restart at the committed offset and progress with the deltas written
    so far (some past the progress point, some twice): every partial and count is the clean run's."""
    events = _period_events(1)
    clean, clean_pipe, _ = _run(events)
    records = _records(events)
    topo = _topology()
    first = PartitionPipeline(topo, "clicks", 0, schedule_start=T0, until=T0 + HOUR)
    cut = len(records) // 2
    out = first.process_batch(records[:cut])
    close = first.mark_end(records[cut - 1].timestamp / 1000, cut)
    emitted = {(p.metric, p.start): p.values for o in (out, close) for p in o.partials}
    persisted = out.counted + close.counted
    assert persisted and emitted
    progress, safe = first.progress(), first.safe_offset()
    assert safe is not None
    # a delta written before a crash that beat the commit, and one written twice: both harmless
    extra = first.close_through(records[-1].timestamp / 1000 + 120)
    persisted += [d for acc in first._accs if acc.caps is not None for d in acc.take_deltas()]
    persisted += persisted[:3]
    assert extra
    restarted = PartitionPipeline(
        topo,
        "clicks",
        0,
        schedule_start=T0,
        until=T0 + HOUR,
        resume=progress,
        start_offset=safe,
        counted=reversed(persisted),
    )
    outs = [restarted.process_batch(records[safe:]), restarted.flush()]
    emitted.update({(p.metric, p.start): p.values for o in outs for p in o.partials})
    assert emitted == clean
    for acc, clean_acc in zip(restarted._accs, clean_pipe._accs, strict=True):
        if acc.caps is not None:
            assert clean_acc.caps is not None and acc.caps.counts == clean_acc.caps.counts, acc.metric.name


def test_resuming_inside_a_period_without_the_deltas_is_refused() -> None:
    """Counts restarting at zero mid-period would let a unit count in more than m windows: one-line refusal."""
    topo = _topology()
    with pytest.raises(ConfigError, match=r"metric 'views': contribution.max_windows: .* without the persisted"):
        PartitionPipeline(topo, "clicks", 0, schedule_start=T0, resume={"views": T0 + 600}, start_offset=10)
    # at the period's first window there is nothing to restore
    PartitionPipeline(topo, "clicks", 0, schedule_start=T0, resume={"views": T0 + HOUR}, start_offset=10)


@settings(max_examples=60, deadline=None)
@given(
    mine=st.lists(st.tuples(st.integers(0, HOUR - 1), st.sampled_from("abc")), min_size=1, max_size=30),
    others=st.lists(
        st.tuples(st.sampled_from(["o1", "o2", "o3"]), st.integers(0, HOUR - 1), st.sampled_from("abc")), max_size=60
    ),
)
def test_which_windows_a_unit_counts_in_depends_on_its_own_records_only(mine, others) -> None:
    """Adding other units' events never changes the windows the unit counts in, for every capped metric."""
    own = [("me", T0 + t + 0.5, p, 1.0) for t, p in mine]
    crowd = [(u, T0 + t + 0.25, p, 2.0) for u, t, p in others]
    me = unit_key("me")

    def counted(events) -> dict[str, list[int]]:
        _, _, deltas = _run(events)
        out: dict[str, list[int]] = {}
        for d in deltas:
            if me in d.keys:
                out.setdefault(d.metric, []).append(d.window_start)
        return out

    alone = counted(own)
    assert counted(own + crowd) == alone
    caps = {m.name: m.contribution.max_windows for m in _topology().metrics.values()}
    assert all(len(starts) <= (caps[name] or 0) for name, starts in alone.items())


def test_memory_per_active_unit() -> None:
    """The counts cost about 100 bytes of heap per unit active in the period (16-byte key, dict slot, count)."""
    caps = WindowCaps("m", 60, HOUR)
    units = [f"user-{i}" for i in range(50_000)]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    _, delta = caps.close(T0, units)
    assert delta is not None and len(delta.to_bytes()) < 22 * len(units)  # persisted: ~21.3 bytes per unit
    del delta
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    per_unit = sum(s.size_diff for s in after.compare_to(before, "filename")) / len(units)
    assert sys.getsizeof(unit_key("x")) == 33 + UNIT_KEY_BYTES
    assert 80 < per_unit < 120, per_unit  # measured ≈ 101 on CPython 3.11


def test_the_worker_serves_capped_windows_per_metric_to_the_curator_only() -> None:
    """`dpstream_windows_capped_total{source,metric}`: one series per capped metric (zeros too), none for
    a metric without max_windows, and the family is curator-only (absent without --curator-metrics)."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.registry import CollectorRegistry

    from dpstream.workers.runtime.clock_skew import ClockSkewGate
    from dpstream.workers.telemetry.classes import ClassFilter
    from dpstream.workers.telemetry.worker import WorkerCollector

    events = [("u", T0 + 60 * k + 1, "a", 1.0) for k in (0, 2, 3, 5)] + [("v", T0 + 181, "a", 1.0)]
    _, pipe, _ = _run(events)

    class Ingest:
        revoked_counts: dict = {}
        hop_counts: dict = {}
        clock_skew = ClockSkewGate(0.5, 30.0)

        def pipelines(self) -> list:
            return [pipe]

    def samples(collector) -> dict:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        text = generate_latest(registry).decode()
        return {
            s.labels.get("metric"): s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == "dpstream_windows_capped_total"
        }

    collector = WorkerCollector(_topology(), ingest=Ingest())
    got = samples(collector)
    assert got["views"] == 2 and "plain" not in got and set(got) == {"views", "pages", "users", "avg"}
    assert got["views"] == pipe.refresh_counts().capped_windows["views"]
    assert samples(ClassFilter(collector, curator=False)) == {}
