"""`dpstream exporter` serves the releases topic of a real Kafka as the feed series: each metric's latest
release by window end (its keys only), CI half-widths, window end and ratio_after; a differing republish
counts as a conflict; a metric whose keys have no bound is refused with one line; the scrape passes
`promtool check metrics` and carries no sample timestamps.

The exporter runs as a subprocess (`python -m dpstream.workers.cli exporter --topology FILE`, no other
flag), on the session Redis and a fresh releases topic of the session broker.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dpstream.workers.feed.testing import produce_releases, release_record
from tests.integration.test_metrics_exporter import Exporter

TOPOLOGY = """\
version: 1
sources:
  clicks: {{topic: {topic}.clicks, privacy_unit: user_id, timestamp: ts}}
budgets:
  b: {{epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}}
metrics:
  views:
    source: clicks
    budget: b
    weight: 1
    window: {{tumbling: 1h}}
    aggregate: count
    contribution: {{max_per_key: 1}}
    mechanism: gaussian
  by_page:
    source: clicks
    budget: b
    weight: 1
    window: {{tumbling: 1h}}
    aggregate: count
    group_by: page
    keys: [home, cart]
    contribution: {{max_per_key: 1, max_keys: 2}}
    mechanism: gaussian
  any_page:
    source: clicks
    budget: b
    weight: 1
    window: {{tumbling: 1h}}
    aggregate: count
    group_by: page
    contribution: {{max_per_key: 1}}
    mechanism: gaussian
kafka: {{bootstrap: "{bootstrap}"}}
redis: {{url: "{redis}"}}
sinks: {{releases: {topic}, dead_letter: {topic}.dlq}}
"""

HOUR = 3600
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _hours_ago(n: int) -> int:
    return (int(time.time()) // HOUR - n) * HOUR


def _samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _poll(exporter: Exporter, ready, timeout_s: float = 60.0) -> Samples:  # noqa: ANN001 - a predicate
    deadline = time.monotonic() + timeout_s
    while True:
        got = _samples(exporter.scrape()[0])
        if ready(got):
            return got
        assert time.monotonic() < deadline, sorted(k for k in got if k[0].startswith("dpstream_release"))
        time.sleep(0.3)


@pytest.fixture
def feed(tmp_path: Path, kafka_broker, fresh_redis) -> Iterator[tuple[Exporter, str]]:  # noqa: ANN001
    topic = kafka_broker.new_topic("feed", partitions=2)
    path = tmp_path / "topology.yaml"
    path.write_text(TOPOLOGY.format(topic=topic, bootstrap=kafka_broker.bootstrap, redis=fresh_redis.url))
    exporter = Exporter(path, None, tmp_path / "exporter.log")
    yield exporter, topic
    exporter.stop()


def _value(metric: str, key: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return ("dpstream_release_value", (("key", key), ("metric", metric)))


def test_the_exporter_serves_each_metrics_latest_release_and_counts_conflicts(
    feed: tuple[Exporter, str],
    kafka_broker,  # noqa: ANN001
) -> None:
    """Latest by window end wins whatever the arrival order; a key the latest release lacks is gone;
    a differing republish counts; the unbounded metric is refused on stderr and served no values."""
    exporter, topic = feed
    start = _hours_ago(3)
    newer = release_record("by_page", start + HOUR, HOUR, {"home": 7.0}, half_width={"home": 1.25}, ratio_after=0.4)
    older = release_record("by_page", start, HOUR, {"home": 5.0, "cart": 2.0}, half_width={"home": 1.0, "cart": 1.0})
    views = release_record("views", start, HOUR, {"": 11.0}, half_width=2.5, ratio_after=0.3)
    unbounded = release_record("any_page", start, HOUR, {"x": 1.0})
    conflicting = dict(views, values={"": 12.0})
    bootstrap = kafka_broker.bootstrap
    asyncio.run(produce_releases(bootstrap, topic, [newer, older, views, views, unbounded, conflicting]))
    got = _poll(exporter, lambda s: s.get(("dpstream_release_conflicts_total", (("metric", "views"),))) == 1)
    assert got[_value("by_page", "home")] == 7.0
    assert _value("by_page", "cart") not in got  # the latest release has no cart
    assert got[("dpstream_release_ci_half_width", (("key", "home"), ("metric", "by_page")))] == 1.25
    assert got[_value("views", "")] == 11.0  # the first record of the release_id stands
    assert got[("dpstream_release_ci_half_width", (("key", ""), ("metric", "views")))] == 2.5
    assert got[("dpstream_release_window_end_timestamp_seconds", (("metric", "by_page"),))] == start + 2 * HOUR
    assert got[("dpstream_release_ratio_after", (("metric", "by_page"), ("scope", "b")))] == 0.4
    assert got[("dpstream_release_ratio_after", (("metric", "views"), ("scope", "b")))] == 0.3
    assert got[("dpstream_release_conflicts_total", (("metric", "by_page"),))] == 0
    feed_series = [k for k in got if k[0].startswith("dpstream_release_") and ("metric", "any_page") in k[1]]
    assert [k[0] for k in feed_series] == ["dpstream_release_conflicts_total"]  # refused: counted, never served
    refused = [line for line in exporter.log.read_text().splitlines() if "any_page" in line]
    assert len(refused) == 1 and "no bound" in refused[0]


def test_the_feed_scrape_passes_promtool_and_has_no_sample_timestamps(
    feed: tuple[Exporter, str],
    kafka_broker,  # noqa: ANN001
) -> None:
    """`promtool check metrics` is clean on a scrape holding every feed family, and no sample carries
    an explicit timestamp."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool missing: apt-get install prometheus (workers/localstack/sysdeps.py)")
    exporter, topic = feed
    start = _hours_ago(2)
    records = [
        release_record("views", start, HOUR, {"": 3.0}),
        release_record("by_page", start, HOUR, {"home": 1.0, "cart": 0.0}, half_width={"home": 1.0, "cart": 1.0}),
    ]
    asyncio.run(produce_releases(kafka_broker.bootstrap, topic, records))
    _poll(exporter, lambda s: _value("by_page", "cart") in s and _value("views", "") in s)
    text, _ = exporter.scrape()
    for family in (
        "dpstream_release_value",
        "dpstream_release_ci_half_width",
        "dpstream_release_window_end_timestamp_seconds",
        "dpstream_release_ratio_after",
        "dpstream_release_conflicts_total",
    ):
        assert f"\n{family}{{" in text, family
    for fam in text_string_to_metric_families(text):
        assert all(s.timestamp is None for s in fam.samples), fam.name
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), check.stdout + check.stderr


def test_the_exporter_serves_its_budget_gauges_with_kafka_unreachable(tmp_path: Path, fresh_redis) -> None:  # noqa: ANN001
    """A topology whose broker does not answer: the exporter still serves the budget gauges and the
    conflict counters (0), no feed value."""
    from dpstream.workers.localstack import free_port

    path = tmp_path / "topology.yaml"
    path.write_text(TOPOLOGY.format(topic="nowhere", bootstrap=f"127.0.0.1:{free_port()}", redis=fresh_redis.url))
    exporter = Exporter(path, None, tmp_path / "exporter.log")
    try:
        got = _samples(exporter.scrape()[0])
    finally:
        exporter.stop()
    assert got[("dpstream_ledger_up", ())] == 1.0
    assert got[("dpstream_release_conflicts_total", (("metric", "views"),))] == 0
    assert not any(k[0] == "dpstream_release_value" for k in got)
