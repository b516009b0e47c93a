"""Tests of the derived answers of topology.model (windows, keys, topology_version)."""

import dataclasses
import hashlib
import json
from enum import Enum

from dpstream.topology.model import (
    Accounting,
    Aggregate,
    Budget,
    KafkaSettings,
    Mechanism,
    Metric,
    Partitioner,
    Sinks,
    Source,
    Topology,
    Window,
    WindowKind,
)


def _topology(**metric_changes) -> Topology:
    metric = Metric("views", "clicks", "daily", 1.0, Window(60, 60), Aggregate.COUNT, Mechanism.GAUSSIAN)
    metric = dataclasses.replace(metric, **metric_changes)
    return Topology(
        version=1,
        sources={"clicks": Source("clicks", "web.clicks", "user_id")},
        budgets={"daily": Budget("daily", 1.0, 1e-6, Accounting.ZCDP, 86400)},
        metrics={"views": metric},
        sinks=Sinks("out", "dlq"),
    )


def test_tumbling_window_covers_each_time_once():
    """A tumbling window puts every event time in exactly one window, the one containing it."""
    window = Window(60, 60)
    assert window.kind is WindowKind.TUMBLING and window.overlap == 1
    assert list(window.starts_covering(125.5)) == [120]
    assert window.releases_per_period(86400) == 1440


def test_hopping_window_covers_each_time_size_over_every_times():
    """A 5m-every-1m window puts an event in the five windows whose [start, start+size) holds it."""
    window = Window(300, 60)
    starts = list(window.starts_covering(600))
    assert window.kind is WindowKind.HOPPING and window.overlap == 5
    assert starts == [360, 420, 480, 540, 600]
    assert all(s <= 600 < s + 300 for s in starts)


def test_partition_selection_only_for_data_derived_keys():
    """Declared keys and ungrouped metrics need no selection; group_by without keys does, top-k included."""
    assert not _topology().metrics["views"].needs_partition_selection
    assert not _topology(group_by="page", keys=("a", "b")).metrics["views"].needs_partition_selection
    assert _topology(group_by="page").metrics["views"].needs_partition_selection
    assert _topology(group_by="ref", aggregate=Aggregate.TOP_K, k=3).metrics["views"].needs_partition_selection


def test_topology_version_ignores_connections_but_not_privacy_fields():
    """Moving Kafka does not change release_ids; changing a weight does."""
    base = _topology()
    moved = dataclasses.replace(base, kafka=KafkaSettings("elsewhere:9092"), path="/other/file.yaml")
    reweighted = _topology(weight=2.0)
    assert base.topology_version == moved.topology_version
    assert base.topology_version != reweighted.topology_version
    assert len(base.topology_version) == 16


def _source_before_new_fields(source: Source) -> dict:
    """A source as hashed before fields that are left out of the hash at their defaults existed."""
    doc = dataclasses.asdict(source)
    default = dataclasses.asdict(Source("", "", ""))
    for key in ("partitioner", "arrival"):
        if key in doc:
            assert doc.pop(key) == default[key]
    return doc


def _metric_before_new_fields(metric: Metric) -> dict:
    """A metric as hashed before the quantile fields and `contribution.max_windows` (left out of the
    hash while unset) existed."""
    doc = dataclasses.asdict(metric)
    for key in ("quantiles", "candidates", "schedule"):
        assert doc.pop(key) is None
    assert doc["contribution"].pop("max_windows") is None
    assert doc["contribution"].pop("max_per_period") is None
    assert doc.pop("release").value == "window"
    return doc


def _budget_before_new_fields(budget: Budget) -> dict:
    """A budget as hashed before `schedule` (left out of the hash while unset) existed."""
    doc = dataclasses.asdict(budget)
    assert doc.pop("schedule") is None
    return doc


def _version_without_start(topology: Topology) -> str:
    """topology_version as computed before `start:` existed: the doc has no start_s key at all."""
    doc = {
        "version": topology.version,
        "sources": {k: _source_before_new_fields(v) for k, v in sorted(topology.sources.items())},
        "budgets": {k: _budget_before_new_fields(v) for k, v in sorted(topology.budgets.items())},
        "metrics": {k: _metric_before_new_fields(v) for k, v in sorted(topology.metrics.items())},
        "sinks": dataclasses.asdict(topology.sinks),
    }
    blob = json.dumps(
        doc, sort_keys=True, default=lambda o: o.value if isinstance(o, Enum) else None, separators=(",", ":")
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def test_topology_version_without_start_is_unchanged():
    """A topology without start keeps the version it had before the field existed (same release_ids)."""
    for topology in (_topology(), _topology(group_by="page", keys=("a", "b")), _topology(weight=2.5)):
        assert topology.schedule_start is None
        assert topology.topology_version == _version_without_start(topology)


def test_topology_version_includes_start_when_set():
    """The public start is privacy content: setting it, or moving it, changes the version."""
    base = _topology()
    at = dataclasses.replace(base, schedule_start=1_796_083_200)
    later = dataclasses.replace(base, schedule_start=1_796_083_201)
    assert len({base.topology_version, at.topology_version, later.topology_version}) == 3
    assert at.topology_version == dataclasses.replace(at, path="/elsewhere.yaml").topology_version


def test_a_source_partitioner_other_than_the_default_changes_the_version():
    """crc32 decides which records count (others are wrong_partition): a new version; murmur2 is the old one."""
    base = _topology()
    keyed = dataclasses.replace(base.sources["clicks"], keyed_by_unit=True)
    murmur = dataclasses.replace(base, sources={"clicks": keyed})
    crc = dataclasses.replace(base, sources={"clicks": dataclasses.replace(keyed, partitioner=Partitioner.CRC32)})
    assert murmur.topology_version == _version_without_start(murmur)
    assert crc.topology_version != murmur.topology_version


def test_window_straddles_matches_brute_force() -> None:
    """`Window.straddles(period)` is true iff some grid window overlaps two periods (checked window by window)."""
    period = 3600
    for size in (60, 300, 600, 900, 3600, 7200, 420, 3000):
        for every in [e for e in range(60, size + 1, 60) if size % e == 0]:
            window = Window(size, every)
            brute = any(
                s // period != (s + size - 1) // period for s in range(0, 3 * period, every)
            )  # the grid repeats every lcm(every, period) ≤ 3 periods here
            assert window.straddles(period) is brute, (size, every)


def test_tumbling_divisor_never_straddles_and_hopping_always_does() -> None:
    """With a size that divides the period: tumbling windows never straddle, hopping ones always do."""
    assert not Window(60, 60).straddles(86_400)
    assert Window(300, 60).straddles(86_400)
    assert Window(120, 60).straddles(86_400)


def test_charged_per_period_is_min_of_windows_and_cap() -> None:
    """The windows one unit's contributions can reach per period: releases per period, at most max_windows."""
    metric = _topology().metrics["views"]
    assert metric.charged_per_period(86_400) == 1440
    capped = dataclasses.replace(metric, contribution=dataclasses.replace(metric.contribution, max_windows=60))
    assert capped.charged_per_period(86_400) == 60
    assert capped.charged_per_period(1800) == 30


def test_max_windows_changes_the_topology_version_only_when_set() -> None:
    """Setting contribution.max_windows is a new version (new release ids); unset keeps the old one."""
    base = _topology()
    capped = _topology(contribution=dataclasses.replace(base.metrics["views"].contribution, max_windows=60))
    assert capped.topology_version != base.topology_version
    assert base.topology_version == _version_without_start(base)
