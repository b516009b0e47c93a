"""A by-unit topic holding two copies of a source record (the hop died before its commit) counts it once."""

from __future__ import annotations

import json
import random
from typing import NamedTuple

from dpstream.topology.loader import load_topology_text
from dpstream.workers.pipeline import PartitionPipeline
from dpstream.workers.pipeline.copies import SOURCE_POSITION_HEADER, SeenCopies, source_position

_YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
metrics:
  views:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    group_by: page
    keys: [a, b, c]
    contribution: {max_keys: 2, max_per_key: 3}
    mechanism: gaussian
  users:
    source: clicks
    budget: b
    weight: 1
    window: {hopping: 2m, every: 1m}
    aggregate: count_units
    mechanism: gaussian
  spend:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: sum
    value: eur
    bounds: [0, 100]
    contribution: {max_per_key: 2}
    mechanism: gaussian
sinks: {releases: t.rel, dead_letter: t.dlq}
"""

_BY_UNIT = "t.clicks.by-unit"


class Rec(NamedTuple):
    offset: int
    value: bytes
    timestamp: int | None
    key: bytes
    headers: tuple[tuple[str, bytes], ...]


def _copies(events: list[tuple[int, dict]], redo: list[int]) -> list[Rec]:
    """The hop's copies of `events` ((source offset, event) in source order, one source partition):
    every event once, then again from each index in `redo` on (a restart before the commit)."""
    out: list[Rec] = []
    order = list(range(len(events)))
    for start in redo:
        order += list(range(start, len(events)))
    for i in order:
        src_offset, doc = events[i]
        header = ((SOURCE_POSITION_HEADER, source_position(3, src_offset)),)
        ts_ms = int(doc["ts"] * 1000) + 500  # arrives half a second after its event time
        out.append(Rec(len(out), json.dumps(doc).encode(), ts_ms, doc["user_id"].encode(), header))
    return out


def _released(records: list[Rec]) -> tuple[dict[tuple[str, int], dict], PartitionPipeline]:
    topo = load_topology_text(_YAML)
    pipe = PartitionPipeline(topo, "clicks", 0, schedule_start=0, topic=_BY_UNIT)
    out = list(pipe.process_batch(records).partials)
    out += pipe.flush().partials
    return {(p.metric, p.start): p.values for p in out}, pipe


def _events(rng: random.Random, n: int) -> list[tuple[int, dict]]:
    return [
        (
            100 + 2 * i,
            {
                "user_id": f"u{rng.randrange(12)}",
                "ts": 60 * rng.randrange(4) + rng.randrange(60),
                "page": rng.choice("abc"),
                "eur": rng.randrange(200),
            },
        )
        for i in range(n)
    ]


def test_copies_of_a_source_record_count_once_whatever_the_hop_redid() -> None:
    """Every aggregate (count, hopping count_units, sum) of a by-unit partition with repeated copies
    equals the one of each record copied once."""
    rng = random.Random(7)
    for _ in range(30):
        events = _events(rng, rng.randrange(20, 120))
        once, _ = _released(_copies(events, []))
        redo = sorted(rng.randrange(len(events)) for _ in range(rng.randrange(1, 4)))
        again, pipe = _released(_copies(events, redo))
        assert again == once
        assert pipe.seen_copies is not None and pipe.seen_copies.skipped == sum(len(events) - s for s in redo)


def test_without_the_dedup_the_same_copies_would_count_twice() -> None:
    """The test above is not vacuous: a source topic pipeline (no dedup) counts the repeats."""
    rng = random.Random(11)
    events = _events(rng, 60)
    topo = load_topology_text(_YAML)
    pipe = PartitionPipeline(topo, "clicks", 0, schedule_start=0)  # the source topic itself: no dedup
    partials = pipe.process_batch(_copies(events, [0])).partials + pipe.flush().partials
    twice = {(p.metric, p.start): p.values for p in partials}
    once, _ = _released(_copies(events, []))
    assert twice != once


def test_positions_are_forgotten_once_every_window_that_could_hold_them_closed() -> None:
    """Memory stays with the open windows: after the windows close, their events' positions go."""
    topo = load_topology_text(_YAML)
    pipe = PartitionPipeline(topo, "clicks", 0, schedule_start=0, topic=_BY_UNIT)
    events = [(i, {"user_id": f"u{i}", "ts": i % 60, "page": "a", "eur": 1}) for i in range(50)]
    pipe.process_batch(_copies(events, []))
    assert pipe.seen_copies is not None and len(pipe.seen_copies) == 50
    pipe.close_through(60 * 10)  # every window up to 10 min closed: the first minute's events are gone
    assert len(pipe.seen_copies) == 0


def test_records_without_a_position_are_counted_as_they_come() -> None:
    """A record without the header (written by something else than the hop) is never skipped."""
    seen = SeenCopies()
    seen.add(b"3:100", 5.0)
    assert b"3:100" in seen and b"3:102" not in seen
    topo = load_topology_text(_YAML)
    pipe = PartitionPipeline(topo, "clicks", 0, schedule_start=0, topic=_BY_UNIT)
    doc = {"user_id": "u1", "ts": 5, "page": "a", "eur": 1}
    recs = [Rec(i, json.dumps(doc).encode(), 5500, b"u1", ()) for i in range(3)]
    partials = pipe.process_batch(recs).partials + pipe.flush().partials
    assert {(p.metric, p.start): p.values for p in partials}[("views", 0)] == {"a": 3}
