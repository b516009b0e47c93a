"""The demo's truth is the worker's un-noised aggregate: the same events through `TruthBook` and through a
worker's `PartitionPipeline` (parsing, dead letters, late events, bounding) give the same value per window."""

from __future__ import annotations

import math
from typing import NamedTuple

import pytest

from dpstream.topology.loader import load_topology
from dpstream.workers.demo.run import demo_topology_path
from dpstream.workers.demo.truth import TruthBook
from dpstream.workers.pipeline import PartitionPipeline
from dpstream.workers.pipeline.fixed_point import value_exponent
from dpstream.workers.synthetic import EventGenerator, GeneratorConfig

_ENV = {"DPSTREAM_KAFKA": "127.0.0.1:9092", "DPSTREAM_REDIS": "redis://127.0.0.1:6379/0"}
S = 1_800_000_000


class _Rec(NamedTuple):
    offset: int
    value: bytes
    timestamp: int
    key: bytes | None = None


def test_truth_book_equals_the_worker_pipeline_for_the_same_records() -> None:
    """Well-formed, malformed, on-time and late events (arrival past C(w)), before and after the start S."""
    topology = load_topology(demo_topology_path(), env=_ENV)
    generator = EventGenerator(topology, None, GeneratorConfig(users=300, zipf_s=1.1, seed=11, malformed=0.05))
    book = TruthBook(topology, S)
    pipe = PartitionPipeline(topology, "clicks", 0, schedule_start=S)
    records: list[_Rec] = []
    ticks = [(S - 3 + 0.5 * i, S - 3 + 0.5 * i + 0.04) for i in range(90)]  # event time, arrival
    ticks.insert(60, (S + 5.0, S + 27.0))  # late for [S, S+10) (closed at S+12) and [S, S+20) (closed at S+22)
    for ts, arrival in ticks:
        events = generator.events_at(40, ts)
        book.observe(events, arrival)
        records += [_Rec(len(records) + i, e.value, int(arrival * 1000), e.key) for i, e in enumerate(events)]
    pipe.process_batch(records)
    end = S + 45
    book.close_through(end)
    partials = pipe.close_through(end)
    assert {p.metric for p in partials} == set(topology.metrics)
    compared = 0
    for partial in partials:
        metric = topology.metrics[partial.metric]
        exponent = value_exponent(metric.bounds) if metric.value and metric.bounds else 0
        worker = TruthBook._finish(metric, partial.values, exponent)
        mine = book.values(partial.metric, partial.start)
        assert mine is not None, (partial.metric, partial.start)
        assert mine.keys() == worker.keys()
        for key in worker:
            assert (math.isnan(mine[key]) and math.isnan(worker[key])) or mine[key] == worker[key], (partial, key)
            compared += 1
    assert compared > 20
    assert book.values("page_views", S - 10) is None  # before the schedule: no such window
    assert book.capped("page_views") > 0  # zipf 1.1 over 300 users: the busiest are cut


def test_a_running_totals_truth_sums_its_periods_windows_from_the_first_step() -> None:
    """basket_so_far's truth at a step is the sum of its windows' values from the period's first step at or
    after S through that step: it restarts at the hour boundary, and a record naming another first step gets
    none (S = 30 s before an hour: steps at S, S+10, S+20 in one period, S+30 the next period's step 1)."""
    topology = load_topology(demo_topology_path(), env=_ENV)
    start = S - 30  # S is a whole hour
    generator = EventGenerator(topology, None, GeneratorConfig(users=300, zipf_s=1.1, seed=5))
    book = TruthBook(topology, start)
    for i in range(120):
        ts = start + 0.5 * i
        book.observe(generator.events_at(30, ts), ts + 0.04)
    book.close_through(start + 60)
    name = "basket_so_far"
    steps = [start + 10 * k for k in range(5)]
    window = [book.values(name, s) for s in steps]
    assert all(w is not None and w[""] > 0 for w in window)
    so_far = 0.0
    for k, s in enumerate(steps):
        first = start if s < S else S
        so_far = (so_far if s != S else 0.0) + window[k][""]  # type: ignore[index]
        total = book.total_so_far(name, s, first)
        assert total is not None and total[""] == pytest.approx(so_far, rel=1e-12), s
        record = {"metric": name, "window": {"start_epoch": s}, "running_total": {"first_start": first}}
        assert book.released(record) == total
        assert book.released({**record, "running_total": {"first_start": first - 10}}) is None
    assert book.released({"metric": "basket_value", "window": {"start_epoch": S}}) == book.values("basket_value", S)
