"""Events a metric leaves out are counted per (metric, reason): the pipeline's counters, the worker's
`dpstream_events_skipped_total` (curator-only), replay's summary line and `dpstream validate --sample`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from dpstream.topology.loader import load_topology_text
from dpstream.workers.cli import main
from dpstream.workers.ledger import open_ledger
from dpstream.workers.pipeline import PartitionPipeline
from dpstream.workers.pipeline.counters import SKIP_REASONS, EventCounts
from dpstream.workers.runtime.clock_skew import ClockSkewGate
from dpstream.workers.runtime.replay import CURATOR_ONLY_NOTE, ReplayRecord, ReplaySummary, replay_lines
from dpstream.workers.telemetry.classes import ClassFilter, MetricClass, metric_class
from dpstream.workers.telemetry.worker import WorkerCollector, fold_event_counts

_YAML = """
version: 1
sources:
  orders: {topic: t.orders, privacy_unit: user_id, timestamp: ts, allowed_lateness: 5s}
budgets:
  b: {epsilon: 50.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
metrics:
  revenue:
    source: orders
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: sum
    value: amount_eur
    bounds: [0, 1000]
    contribution: {max_per_key: 5}
    mechanism: gaussian
  by_country:
    source: orders
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    group_by: country
    keys: [DE, FR, IT]
    contribution: {max_keys: 2, max_per_key: 5}
    mechanism: gaussian
  orders:
    source: orders
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    contribution: {max_per_key: 5}
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""

_T0 = 1_796_000_400  # minute-aligned


@pytest.fixture(scope="module")
def topo():
    return load_topology_text(_YAML)


def _events() -> list[bytes]:
    """2 good events, 3 with `amount` for `amount_eur`, 2 with a lower-case key, 1 without a country,
    1 with a non-numeric amount (the parser dead-letters it: `bad_value`)."""
    ev: list[dict] = [
        {"user_id": "u0", "ts": _T0 + 1, "amount_eur": 10, "country": "DE"},
        {"user_id": "u1", "ts": _T0 + 2, "amount_eur": 20, "country": "FR"},
    ]
    ev += [{"user_id": f"m{i}", "ts": _T0 + 3, "amount": 5, "country": "DE"} for i in range(3)]  # mis-named
    ev += [{"user_id": f"l{i}", "ts": _T0 + 4, "amount_eur": 5, "country": "de"} for i in range(2)]  # lower case
    ev += [{"user_id": "g0", "ts": _T0 + 5, "amount_eur": 5}]  # no group field
    ev += [{"user_id": "b0", "ts": _T0 + 6, "amount_eur": "ten", "country": "DE"}]  # bad value
    return [json.dumps(e).encode() for e in ev]


def _zeros(topo) -> dict[tuple[str, str], int]:
    return {(m, r): 0 for m in topo.metrics for r in SKIP_REASONS}


def test_pipeline_counts_skips_per_metric_and_reason(topo) -> None:
    """A mis-named value field, a lower-case key and a missing group field each count under their own
    reason for the metric that needs the field; a bad value is a dead letter, not a skip."""
    pipe = PartitionPipeline(topo, "orders", 0, schedule_start=_T0)
    out = pipe.process_batch(ReplayRecord(i, raw) for i, raw in enumerate(_events()))
    counts = pipe.refresh_counts()
    assert [d.reason for d in out.dead_letters] == ["bad_value"]
    assert counts.accepted == 8 and counts.invalid == {"bad_value": 1}
    assert dict(counts.skips) == {
        **_zeros(topo),
        ("revenue", "missing_value_field"): 3,
        ("by_country", "undeclared_key"): 2,
        ("by_country", "missing_group_field"): 1,
    }
    assert counts.skipped == 6 == sum(counts.skips.values())  # the total stays the sum of its parts
    assert counts.skips_by_metric() == {
        "revenue": {"missing_value_field": 3},
        "by_country": {"missing_group_field": 1, "undeclared_key": 2},
    }
    assert counts.snapshot()["skipped"] == 6


class _Ingest:
    def __init__(self, pipes: list) -> None:
        self.revoked_counts: dict[str, EventCounts] = {}
        self.hop_counts: dict[str, EventCounts] = {}
        self.live = pipes
        self.clock_skew = ClockSkewGate(0.5, 30.0)

    def pipelines(self) -> list:
        return self.live


def _samples(collector) -> dict:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(generate_latest(registry).decode())
        for s in fam.samples
    }


def _skipped(metric: str, reason: str) -> tuple:
    return ("dpstream_events_skipped_total", (("metric", metric), ("reason", reason), ("source", "orders")))


def test_worker_serves_the_skip_counter_to_the_curator_only(topo) -> None:
    """Every (metric, reason) of the source is a series (zeros too), monotone across a revoke, and the
    family is curator-only: a worker without --curator-metrics does not serve it."""
    p0, p1 = (PartitionPipeline(topo, "orders", p, schedule_start=_T0, partitions=2) for p in (0, 1))
    events = _events()
    p0.process_batch(ReplayRecord(i, raw) for i, raw in enumerate(events))
    p1.process_batch(ReplayRecord(i, raw) for i, raw in enumerate(events[2:5]))  # 3 more mis-named
    ingest = _Ingest([p0, p1])
    collector = WorkerCollector(topo, ingest=ingest)
    got = _samples(collector)
    for m in topo.metrics:
        for r in SKIP_REASONS:
            assert _skipped(m, r) in got
    assert got[_skipped("revenue", "missing_value_field")] == 6
    assert got[_skipped("by_country", "undeclared_key")] == 2
    assert got[_skipped("orders", "missing_value_field")] == 0
    fold_event_counts(ingest.revoked_counts.setdefault("orders", EventCounts()), p0.refresh_counts())
    ingest.live = [p1]
    after = _samples(collector)
    assert {k: v for k, v in after.items() if k[0] == "dpstream_events_skipped_total"} == {
        k: v for k, v in got.items() if k[0] == "dpstream_events_skipped_total"
    }
    assert metric_class("dpstream_events_skipped_total") is MetricClass.CURATOR_ONLY
    public = _samples(ClassFilter(collector, curator=False))
    assert not any(k[0].startswith("dpstream_events") for k in public)
    assert _skipped("revenue", "missing_value_field") in _samples(ClassFilter(collector, curator=True))


def test_replay_summary_names_skips_per_metric_and_reason(topo) -> None:
    """replay's summary has a curator-only line with each metric's skips by reason (over all partitions)."""

    async def go():
        ledger = await open_ledger("memory", topo)

        async def publish(value: bytes, key: bytes) -> None:
            return None

        return await replay_lines(topo, _events(), ledger, publish, start=_T0, end=_T0 + 60, partitions=2)

    summary = asyncio.run(go())
    lines = summary.lines()
    assert "skipped=6" in lines[0]
    (line,) = [ln for ln in lines if ln.startswith("skipped by metric")]
    assert line == (
        f"skipped by metric ({CURATOR_ONLY_NOTE}): revenue: missing_value_field=3; "
        "by_country: missing_group_field=1, undeclared_key=2"
    )


def test_replay_summary_has_no_skip_line_when_nothing_is_skipped() -> None:
    assert not any(ln.startswith("skipped by metric") for ln in ReplaySummary().lines())


def _write(tmp_path: Path, topo_text: str, events: list[bytes]) -> tuple[str, str]:
    topo_file, sample = tmp_path / "topology.yaml", tmp_path / "events.jsonl"
    topo_file.write_text(topo_text, encoding="utf-8")
    sample.write_bytes(b"\n".join([*events, b"", b"not json"]) + b"\n")
    return str(topo_file), str(sample)


def test_validate_sample_reports_use_per_metric(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`validate FILE --sample` says per metric how many of the 10 sample events it uses and why not the rest."""
    topo_file, sample = _write(tmp_path, _YAML, _events())
    assert main(["validate", topo_file, "--sample", sample]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"ok: {topo_file}:")
    head = [ln for ln in out if ln.startswith("sample ")]
    assert head == [
        f"sample {sample}, source orders (curator-only: exact counts of the sample, not for publication): "
        "10 events, 8 valid, 2 invalid (bad_value=1, not_json=1)"
    ]
    rows = {ln.split(":")[0].strip(): ln.strip() for ln in out if ln.startswith("  ")}
    assert (
        rows["revenue"]
        == "revenue: uses 5 of 10; not 5: missing_value_field=3, invalid:bad_value=1, invalid:not_json=1"
    )
    assert rows["by_country"] == (
        "by_country: uses 5 of 10; not 5: missing_group_field=1, undeclared_key=2, invalid:bad_value=1, "
        "invalid:not_json=1"
    )
    assert rows["orders"] == "orders: uses 8 of 10; not 2: invalid:bad_value=1, invalid:not_json=1"


def test_validate_sample_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topo_file, sample = _write(tmp_path, _YAML, _events())
    assert main(["validate", topo_file, "--sample", sample, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["sample"]
    assert doc["events"] == 10 and doc["accepted"] == 8
    assert doc["invalid"] == {"bad_value": 1, "not_json": 1}
    assert doc["metrics"]["revenue"] == {"used": 5, "not_used": 5, "skipped": {"missing_value_field": 3}}
    assert doc["metrics"]["orders"] == {"used": 8, "not_used": 2, "skipped": {}}


def test_validate_sample_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unreadable sample, or --source without --sample, is a one-line error (exit 2)."""
    topo_file, _ = _write(tmp_path, _YAML, _events())
    assert main(["validate", topo_file, "--sample", str(tmp_path / "missing.jsonl")]) == 2
    assert "--sample" in capsys.readouterr().err
    assert main(["validate", topo_file, "--source", "orders"]) == 2
    assert "--source" in capsys.readouterr().err
