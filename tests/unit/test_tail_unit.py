"""`dpstream tail`'s printing without Kafka: each release_id once, windows from each metric's start only,
the worker's row or the record's bytes, conflicts on stderr; an unknown --metric is one line."""

from __future__ import annotations

import io
import json

import pytest

from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import load_topology_text
from dpstream.workers.commands.tail import Tail, _metrics
from dpstream.workers.feed.testing import release_record
from dpstream.workers.release.display import release_line
from dpstream.workers.release.record import canonical_bytes

START = 1_796_083_200  # 2026-12-01T00:00Z


def _tail(as_json: bool = False) -> tuple[Tail, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return Tail({"views": START, "basket": START}, as_json=as_json, out=out, err=err), out, err


def test_each_release_shows_once_from_its_metrics_start_and_a_conflict_goes_to_stderr() -> None:
    tail, out, err = _tail()
    shown = release_record("views", START, 3600, {"": 4.0})
    before = release_record("views", START - 3600, 3600, {"": 1.0})
    other = release_record("clicks_by_hour", START, 3600, {"": 2.0})  # not a chosen metric
    for record in (shown, shown, before, other):
        tail.offer(canonical_bytes(record))
    tail.offer(canonical_bytes(dict(shown, values={"": 5.0})))
    assert out.getvalue().splitlines() == [release_line(json.loads(canonical_bytes(shown)))]
    assert err.getvalue().count("conflict") == 1 and shown["release_id"] in err.getvalue()


def test_json_prints_the_records_bytes_and_skips_what_is_not_a_release() -> None:
    tail, out, _err = _tail(as_json=True)
    record = release_record("basket", START + 60, 60, {"": 9.5})
    tail.offer(canonical_bytes(record))
    tail.offer(b"not a record")
    tail.offer(canonical_bytes(dict(release_record("basket", START, 60, {}), charge_only=True)))
    assert out.getvalue() == canonical_bytes(record).decode() + "\n"


def test_an_unknown_metric_is_one_line_naming_the_known_ones() -> None:
    topology = load_topology_text(
        """
version: 1
sources: {clicks: {topic: t, privacy_unit: user_id, timestamp: ts}}
budgets: {b: {epsilon: 1.0, delta: 1.0e-6, period: 1d}}
metrics:
  views: {source: clicks, budget: b, weight: 1, window: {tumbling: 1h}, aggregate: count, mechanism: gaussian}
sinks: {releases: r, dead_letter: d}
"""
    )
    assert _metrics(topology, None) == ["views"]
    with pytest.raises(ConfigError, match=r"^--metric nope: not a metric of the topology; give one of views$"):
        _metrics(topology, ["nope"])
