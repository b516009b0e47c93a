"""Own watermark windows: tumbling / hopping, empty windows, lateness, idle advance, safe offset, replay."""

from __future__ import annotations

import json
from typing import NamedTuple

import pytest

from topology.loader import load_topology_text
from workers.pipeline import PartitionPipeline

_YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts, allowed_lateness: 10s, idle_timeout: 30s}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
metrics:
  tumble:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    contribution: {max_per_key: 100}
    mechanism: gaussian
  hop:
    source: clicks
    budget: b
    weight: 1
    window: {hopping: 3m, every: 1m}
    aggregate: count
    contribution: {max_per_key: 100}
    mechanism: gaussian
sinks: {releases: t.rel, dead_letter: t.dlq}
"""


class Rec(NamedTuple):
    offset: int
    value: bytes
    timestamp: int | None = None


@pytest.fixture(scope="module")
def topo():
    return load_topology_text(_YAML)


def _recs(times: list[float], first_offset: int = 0, unit: str = "u") -> list[Rec]:
    return [Rec(first_offset + i, json.dumps({"user_id": f"{unit}{i}", "ts": t}).encode()) for i, t in enumerate(times)]


def _by_metric(partials, metric):
    return {p.start: p.values.get("", 0) for p in partials if p.metric == metric}


def test_tumbling_window_is_final_once_watermark_passes_its_end(topo):
    """A 1m window [0,60) is emitted only once max event time − lateness ≥ 60."""
    pipe = PartitionPipeline(topo, "clicks", 0)
    assert _by_metric(pipe.process_batch(_recs([5, 30, 65])).partials, "tumble") == {}
    assert _by_metric(pipe.process_batch(_recs([69.9], 3)).partials, "tumble") == {}
    assert _by_metric(pipe.process_batch(_recs([70], 4)).partials, "tumble") == {0: 2}


def test_hopping_event_lands_in_every_covering_window(topo):
    """An event at t=130 counts in the 3m windows starting at 0, 60 and 120."""
    pipe = PartitionPipeline(topo, "clicks", 0)
    pipe.process_batch(_recs([130]))
    flushed = _by_metric(pipe.flush().partials, "hop")
    assert {s: v for s, v in flushed.items() if v} == {0: 1, 60: 1, 120: 1}
    assert topo.metrics["hop"].window.starts_covering(130) == range(0, 121, 60)


def test_empty_windows_between_events_are_emitted(topo):
    """Windows with no events after the partition's first window are emitted as empty partials."""
    pipe = PartitionPipeline(topo, "clicks", 0)
    out = pipe.process_batch(_recs([10, 400]))
    assert _by_metric(out.partials, "tumble") == {0: 1, 60: 0, 120: 0, 180: 0, 240: 0, 300: 0}
    assert [p.values for p in out.partials if p.metric == "tumble" and p.start == 60] == [{}]


def test_late_events_are_counted_and_dropped(topo):
    """An event for an already-final window is counted late and never reopens the window."""
    pipe = PartitionPipeline(topo, "clicks", 0)
    first = pipe.process_batch(_recs([10, 75]))
    assert _by_metric(first.partials, "tumble") == {0: 1}
    again = pipe.process_batch(_recs([20, 59], 2))
    assert _by_metric(again.partials, "tumble") == {}
    assert pipe.counts.late == 2
    flushed = _by_metric(pipe.flush().partials, "tumble")
    assert 0 not in flushed and flushed[60] == 1


def test_out_of_order_within_lateness_is_accepted(topo):
    """Events older than the max seen but within allowed_lateness still count."""
    pipe = PartitionPipeline(topo, "clicks", 0)
    pipe.process_batch(_recs([65, 55]))
    assert pipe.counts.late == 0
    assert _by_metric(pipe.flush().partials, "tumble") == {0: 1, 60: 1}


def test_idle_partition_advances_by_wall_clock(topo):
    """With no record for idle_timeout, watermark := now − lateness and due windows are emitted."""
    pipe = PartitionPipeline(topo, "clicks", 0, started_at=1000.0)
    pipe.process_batch(_recs([1000, 1010]), now=1011.0)
    assert _by_metric(pipe.advance_idle(1030.0).partials, "tumble") == {}  # not idle yet
    out = pipe.advance_idle(1080.0)  # idle 69 s ≥ 30 s: watermark 1070
    assert _by_metric(out.partials, "tumble") == {960: 2}
    assert pipe.watermark == 1070.0
    assert _by_metric(pipe.advance_idle(1090.0).partials, "tumble") == {1020: 0}


def test_never_seen_partition_starts_emitting_when_idle(topo):
    """A partition without events emits empty partials for windows closing after it went idle."""
    pipe = PartitionPipeline(topo, "clicks", 5, started_at=1000.0)
    assert pipe.advance_idle(1040.0).partials == []  # watermark 1030: first open window [1020,1080)
    out = pipe.advance_idle(1200.0)
    assert _by_metric(out.partials, "tumble") == {1020: 0, 1080: 0}
    assert all(p.partition == 5 and p.values == {} for p in out.partials)


def test_safe_offset_never_passes_first_event_of_an_open_window(topo):
    """The commit offset stays at the first event of the oldest unemitted window, then moves on."""
    pipe = PartitionPipeline(topo, "clicks", 0)
    assert pipe.safe_offset() is None
    pipe.process_batch(_recs([10, 20, 30], first_offset=100))
    assert pipe.safe_offset() == 100
    pipe.process_batch(_recs([70, 80], first_offset=103))
    assert pipe.safe_offset() == 100  # hop window [0,180) still open
    pipe.process_batch(_recs([400], first_offset=105))  # everything up to 390 final
    assert pipe.safe_offset() == 105
    pipe.flush()
    assert pipe.safe_offset() == 106


def test_replay_from_safe_offset_rebuilds_the_same_partials(topo):
    """A worker restarted at safe_offset() emits exactly the partials the uninterrupted one would."""
    times = [5, 50, 61, 62, 64, 119, 130, 185, 190, 250, 251, 400]
    recs = [Rec(i, json.dumps({"user_id": f"u{i % 3}", "ts": t}).encode()) for i, t in enumerate(times)]
    whole = PartitionPipeline(topo, "clicks", 0)
    expected = whole.process_batch(recs).partials + whole.flush().partials

    first = PartitionPipeline(topo, "clicks", 0)
    emitted = first.process_batch(recs[:8]).partials
    resume = first.safe_offset()
    restarted = PartitionPipeline(topo, "clicks", 0)
    rest = restarted.process_batch(recs[resume:]).partials + restarted.flush().partials
    seen = {(p.metric, p.start) for p in emitted}
    merged = emitted + [p for p in rest if (p.metric, p.start) not in seen]  # the merger's dedupe
    assert sorted(merged, key=lambda p: (p.metric, p.start)) == sorted(expected, key=lambda p: (p.metric, p.start))


def test_batch_boundaries_do_not_change_partials(topo):
    """Feeding events one by one or in one batch yields the same partials."""
    times = [5, 50, 61, 62, 64, 119, 130, 185, 190, 250]
    recs = _recs(times)
    a = PartitionPipeline(topo, "clicks", 0)
    one = a.process_batch(recs).partials + a.flush().partials
    b = PartitionPipeline(topo, "clicks", 0)
    many = [p for r in recs for p in b.process_batch([r]).partials] + b.flush().partials
    key = lambda p: (p.metric, p.start)  # noqa: E731
    assert sorted(one, key=key) == sorted(many, key=key)
