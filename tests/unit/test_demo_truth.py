"""The demo's truth is the worker's un-noised aggregate: the same events through `TruthBook` and through a
worker's `PartitionPipeline` (parsing, dead letters, late events, bounding) give the same value per window."""

from __future__ import annotations

import math
from typing import NamedTuple

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
