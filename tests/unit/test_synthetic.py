"""Tests of the synthetic event generator (workers/synthetic)."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import NamedTuple

import pytest

from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import load_topology
from dpstream.workers.pipeline import PartitionPipeline
from dpstream.workers.synthetic import EventGenerator, GeneratorConfig, Malformation, write_jsonl


class _Rec(NamedTuple):
    offset: int
    value: bytes
    timestamp: int | None = None


EXAMPLE = Path(__file__).resolve().parents[2] / "topology" / "examples" / "web-analytics.yaml"


@pytest.fixture(scope="module")
def topology():
    """The web-analytics reference topology."""
    return load_topology(EXAMPLE)


def test_events_carry_every_field_the_metrics_need(topology) -> None:
    """Well-formed events have unit, ts, declared page keys, referrer and both numeric fields; key = unit."""
    gen = EventGenerator(topology, config=GeneratorConfig(users=50, seed=1))
    pages = set(topology.metrics["page_views"].keys)
    for ev in gen.events(500, rate=100):
        doc = json.loads(ev.value)
        assert ev.key == doc["user_id"].encode()
        assert doc["page"] in pages
        assert doc["referrer"].startswith("referrer-")
        assert isinstance(doc["ts"], float) and isinstance(doc["basket_eur"], float)


def test_users_are_zipf_skewed(topology) -> None:
    """A few heavy users dominate: the top 1% of 1000 users send more than the bottom 50%."""
    gen = EventGenerator(topology, config=GeneratorConfig(users=1000, seed=2))
    counts = collections.Counter(ev.key for ev in gen.events(20_000))
    ranked = [c for _u, c in counts.most_common()] + [0] * (1000 - len(counts))
    assert sum(ranked[:10]) > sum(ranked[500:])


def test_some_values_fall_outside_bounds(topology) -> None:
    """Values are mostly within bounds and sometimes outside, so clamping is exercised."""
    gen = EventGenerator(topology, config=GeneratorConfig(users=100, seed=3, outside_bounds=0.05))
    values = [json.loads(ev.value)["basket_eur"] for ev in gen.events(4000)]
    outside = sum(not 0 <= v <= 200 for v in values)
    assert 0 < outside < len(values) * 0.2


def test_speedup_compresses_event_time(topology) -> None:
    """With speedup 60 at 100 events/s, 100 events span about 60 s of event time."""
    gen = EventGenerator(topology, config=GeneratorConfig(users=10, seed=4, speedup=60, start_ts=1000.0))
    ts = [ev.ts for ev in gen.events(101, rate=100)]
    assert ts[0] == 1000.0 and abs(ts[-1] - 1060.0) < 1e-6


def test_malformed_events_fail_validation_with_their_reason(topology) -> None:
    """Each malformation is dead-lettered by a live partition pipeline with the matching reason; good
    events are accepted."""
    want = {
        Malformation.BAD_JSON: "not_json",
        Malformation.NOT_OBJECT: "not_object",
        Malformation.MISSING_UNIT: "missing_unit",
        Malformation.NAN_VALUE: "bad_value",
        Malformation.BAD_TIMESTAMP: "bad_timestamp",
        Malformation.FUTURE_TIMESTAMP: "future_timestamp",
    }
    gen = EventGenerator(topology, config=GeneratorConfig(users=20, seed=5, malformed=0.5))
    events = list(gen.events(400))
    now = max(ev.ts for ev in events if ev.malformation is None)
    pipe = PartitionPipeline(topology, "clicks", 0, schedule_start=0)
    records = [_Rec(i, ev.value, int(now * 1000)) for i, ev in enumerate(events)]  # all appended at `now`
    dead = {d.offset: d.reason for d in pipe.process_batch(records).dead_letters}
    assert {i: want[ev.malformation] for i, ev in enumerate(events) if ev.malformation is not None} == dead
    assert {ev.malformation for ev in events} == set(want) | {None}


def test_write_jsonl_writes_one_event_per_line(topology, tmp_path: Path) -> None:
    """write_jsonl writes N parseable lines."""
    gen = EventGenerator(topology, config=GeneratorConfig(users=5, seed=6))
    n = write_jsonl(tmp_path / "e.jsonl", gen.events(25))
    lines = (tmp_path / "e.jsonl").read_bytes().splitlines()
    assert n == 25 and len(lines) == 25 and all(json.loads(line)["user_id"] for line in lines)


def test_bad_settings_raise_config_error() -> None:
    """Out-of-range generator settings are user mistakes."""
    with pytest.raises(ConfigError, match="--malformed"):
        GeneratorConfig(malformed=1.5)
    with pytest.raises(ConfigError, match="--users"):
        GeneratorConfig(users=0)
