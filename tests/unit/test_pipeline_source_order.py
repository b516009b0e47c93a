"""The L∞ order key: (source append time, source partition, source offset) of each record, read
from the record itself on a source and from the hop's header on a by-unit topic."""

from __future__ import annotations

import json
from typing import NamedTuple

from dpstream.topology.loader import load_topology_text
from dpstream.workers.pipeline import PartitionPipeline
from dpstream.workers.pipeline.copies import SOURCE_POSITION_HEADER, position_order, source_position
from dpstream.workers.pipeline.fixed_point import value_exponent

_YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts, allowed_lateness: 30s}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
metrics:
  spend:
    source: clicks
    budget: b
    window: {tumbling: 1m}
    aggregate: sum
    value: eur
    bounds: [0, 100]
    contribution: {max_per_key: 1}
    mechanism: gaussian
sinks: {releases: t.rel, dead_letter: t.dlq}
"""
_TOPO = load_topology_text(_YAML)
_ONE = 2 ** value_exponent(_TOPO.metrics["spend"].bounds)


class Rec(NamedTuple):
    offset: int
    value: bytes
    timestamp: int
    key: bytes = b"u"
    headers: tuple[tuple[str, bytes], ...] = ()


def _event(eur: int) -> bytes:
    return json.dumps({"user_id": "u", "ts": 10, "eur": eur}).encode()


def _spend(records: list[Rec], topic: str | None = None) -> int:
    pipe = PartitionPipeline(_TOPO, "clicks", 0, schedule_start=0, topic=topic)
    out = pipe.process_batch(records).partials + pipe.flush().partials
    (partial,) = [p for p in out if p.start == 0]
    return partial.values[""]


def test_on_a_source_the_earliest_append_time_survives_not_the_lowest_offset():
    """A keyed source whose record times are not in offset order (create time): with max_per_key 1
    the record appended first is kept, whatever its offset."""
    late_first = [Rec(0, _event(90), 12_000), Rec(1, _event(5), 11_000)]
    assert _spend(late_first) == 5 * _ONE


def test_on_a_by_unit_topic_the_source_position_orders_ties_of_append_time():
    """Two hop copies appended at the same millisecond: the lower (source partition, offset) is kept,
    in either by-unit order."""
    a = (_event(90), ((SOURCE_POSITION_HEADER, source_position(0, 7)),))
    b = (_event(5), ((SOURCE_POSITION_HEADER, source_position(2, 3)),))
    for first, second in ((a, b), (b, a)):
        records = [Rec(0, first[0], 11_000, headers=first[1]), Rec(1, second[0], 11_000, headers=second[1])]
        assert _spend(records, topic="t.clicks.by-unit") == 90 * _ONE


def test_position_order_parses_the_hop_header_and_falls_back_on_any_other():
    """b"<partition>:<offset>" → ints; a header that is not the hop's gives the fallback (no crash)."""
    assert position_order(source_position(3, 1_234_567), (-1, 0)) == (3, 1_234_567)
    assert position_order(b"nonsense", (-1, 9)) == (-1, 9)
    assert position_order(b"1:x", (-1, 9)) == (-1, 9)
    records = [Rec(0, _event(40), 11_000, headers=((SOURCE_POSITION_HEADER, b"garbage"),))]
    assert _spend(records, topic="t.clicks.by-unit") == 40 * _ONE
