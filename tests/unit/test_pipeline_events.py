"""Event parsing and validation: the fixed reason vocabulary, timestamps, dead letters."""

from __future__ import annotations

import base64
import json
from typing import NamedTuple

import pytest

from dpstream.topology.errors import EventError
from dpstream.topology.loader import load_topology_text
from dpstream.workers.pipeline import REASONS, EventParser, PartitionPipeline

_YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
metrics:
  basket:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: sum
    value: eur
    bounds: [0, 100]
    mechanism: gaussian
  pages:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    group_by: page
    keys: [a, b]
    mechanism: gaussian
sinks: {releases: t.rel, dead_letter: t.dlq}
"""


class Rec(NamedTuple):
    offset: int
    value: bytes | None
    timestamp: int | None = None


@pytest.fixture(scope="module")
def topo():
    return load_topology_text(_YAML)


@pytest.fixture()
def parser(topo):
    return EventParser(topo.sources["clicks"], value_fields=["eur"], key_fields=["page"])


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "not_json"),
        (b"\xff\xfe", "not_json"),
        (b"[1, 2]", "not_object"),
        (b'"text"', "not_object"),
        (b'{"ts": 10}', "missing_unit"),
        (b'{"user_id": "", "ts": 10}', "missing_unit"),
        (b'{"user_id": 1.5, "ts": 10}', "bad_unit"),
        (b'{"user_id": true, "ts": 10}', "bad_unit"),
        (b'{"user_id": "u", "ts": "yesterday"}', "bad_timestamp"),
        (b'{"user_id": "u", "ts": -5}', "bad_timestamp"),
        (b'{"user_id": "u", "ts": "2026-01-01T00:00:00"}', "bad_timestamp"),
        (b'{"user_id": "u", "ts": [1]}', "bad_timestamp"),
        (b'{"user_id": "u"}', "missing_timestamp"),
        (b'{"user_id": "u", "ts": 10, "eur": "12"}', "bad_value"),
        (b'{"user_id": "u", "ts": 10, "page": {"x": 1}}', "bad_key"),
    ],
)
def test_invalid_events_get_their_reason(parser, raw, reason):
    """Each malformed shape raises EventError with its reason from the fixed vocabulary."""
    assert reason in REASONS
    with pytest.raises(EventError) as info:
        parser.parse(raw, None, 0)
    assert info.value.reason == reason
    assert "yesterday" not in str(info.value) and "12" not in str(info.value)


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"1e400"])
def test_non_finite_value_is_bad_value_or_not_json(parser, literal):
    """NaN / infinite values are never accepted, whichever JSON decoder is in use."""
    with pytest.raises(EventError) as info:
        parser.parse(b'{"user_id": "u", "ts": 10, "eur": ' + literal + b"}", None, 0)
    assert info.value.reason in ("bad_value", "not_json")


@pytest.mark.parametrize(
    ("ts", "expected"),
    [
        (1_700_000_000, 1_700_000_000.0),
        (1_700_000_000_500, 1_700_000_000.5),
        (1_700_000_000.25, 1_700_000_000.25),
        ("1700000000", 1_700_000_000.0),
        ("2023-11-14T22:13:20Z", 1_700_000_000.0),
        ("2023-11-15T00:13:20+02:00", 1_700_000_000.0),
    ],
)
def test_timestamps_in_seconds_ms_or_iso(parser, ts, expected):
    """Epoch seconds, milliseconds, numeric strings and ISO-8601 with offset all give epoch seconds."""
    ev = parser.parse(json.dumps({"user_id": "u", "ts": ts}).encode(), None, 0)
    assert ev.time == pytest.approx(expected)


def test_absent_timestamp_uses_record_time(parser):
    """An event without its timestamp field takes the Kafka record time (ms)."""
    ev = parser.parse(b'{"user_id": 7}', 1_700_000_000_000, 0)
    assert ev.time == 1_700_000_000.0
    assert ev.unit == "7"


def test_absent_value_and_key_are_not_errors(parser):
    """Optional numeric / group fields may be absent: the event is valid."""
    ev = parser.parse(b'{"user_id": "u", "ts": 5}', None, 0)
    assert ev.fields == {"user_id": "u", "ts": 5}


def test_pipeline_dead_letters_and_keeps_going(topo):
    """Bad events become dead letters (reason, offset, raw bytes) and good ones around them count."""
    pipe = PartitionPipeline(topo, "clicks", 3, schedule_start=0)
    recs = [
        Rec(0, b'{"user_id": "u1", "ts": 10, "page": "a"}'),
        Rec(1, b"garbage"),
        Rec(2, None),
        Rec(3, b'{"user_id": "u2", "ts": 11, "eur": "x"}'),
        Rec(4, b'{"user_id": "u3", "ts": 12, "page": "b"}'),
    ]
    out = pipe.process_batch(recs)
    assert [(d.reason, d.offset) for d in out.dead_letters] == [("not_json", 1), ("not_json", 2), ("bad_value", 3)]
    dl = json.loads(out.dead_letters[0].to_bytes())
    assert dl == {
        "reason": "not_json",
        "source": "clicks",
        "topic": "t.clicks",
        "partition": 3,
        "offset": 1,
        "raw_b64": base64.b64encode(b"garbage").decode(),
    }
    counts = pipe.refresh_counts().snapshot()
    assert counts["accepted"] == 2
    assert counts["invalid:not_json"] == 2 and counts["invalid:bad_value"] == 1


def test_far_future_event_is_dead_lettered_by_its_own_arrival_time(topo):
    """An event timed past its own record's append time + max_future goes to the DLQ as
    future_timestamp; the others around it are untouched. A replay line (no record time) arrives at
    its own event time, so it is never in the future."""
    now = 1_700_000_000.0
    horizon = now + topo.sources["clicks"].max_future_s
    stamp = int(now * 1000)
    recs = [
        Rec(0, json.dumps({"user_id": "a", "ts": now - 5, "eur": 1.0}).encode(), stamp),
        Rec(1, json.dumps({"user_id": "b", "ts": horizon + 1, "eur": 1.0}).encode(), stamp),
        Rec(2, json.dumps({"user_id": "c", "ts": now - 4, "eur": 1.0}).encode(), stamp),
        Rec(3, json.dumps({"user_id": "d", "ts": horizon - 1, "eur": 1.0}).encode(), stamp),  # inside: kept
    ]
    live = PartitionPipeline(topo, "clicks", 0, schedule_start=int(now) - 3600)
    out = live.process_batch(recs)
    assert [(d.reason, d.offset) for d in out.dead_letters] == [("future_timestamp", 1)]
    assert live.counts.invalid["future_timestamp"] == 1 and live.counts.late == 0 and live.counts.accepted == 3
    replay = PartitionPipeline(topo, "clicks", 0, schedule_start=int(now) - 3600)
    plain = [Rec(r.offset, r.value) for r in recs]
    assert replay.process_batch(plain).dead_letters == [] and replay.counts.accepted == 4


def test_events_outside_the_replay_range_are_dead_lettered(topo):
    """replay --from/--to: an event timed outside [from, to) is `out_of_range`, never a window."""
    pipe = PartitionPipeline(topo, "clicks", 0, schedule_start=600, until=1200, event_range=(600, 1200))
    recs = [Rec(i, json.dumps({"user_id": "a", "ts": t}).encode()) for i, t in enumerate([599, 600, 1199, 1200])]
    out = pipe.process_batch(recs)
    assert [(d.reason, d.offset) for d in out.dead_letters] == [("out_of_range", 0), ("out_of_range", 3)]
