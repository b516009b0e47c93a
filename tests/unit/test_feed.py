"""The feed's pieces without Kafka: the dedupe rule, each metric's latest release (held until P(w),
only its keys), the key-bound refusal, where reading starts (the topology's Schedule), and what the
exporter's feed collector renders."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dpstream.topology.loader import load_topology_text
from dpstream.topology.schedule import Schedule
from dpstream.workers.feed import Dedupe, LatestReleases, Verdict, feed_starts, key_bound_refusal, seek_time
from dpstream.workers.release.record import canonical_bytes, iso_utc
from dpstream.workers.telemetry.exporter import ExporterFeed, FeedCollector

_YAML = """
version: 1
sources:
  clicks: {topic: t, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, period: 1d}
metrics:
  views:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1h}
    aggregate: count
    contribution: {max_per_key: 1}
    mechanism: gaussian
  by_page:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1h}
    aggregate: count
    group_by: page
    keys: [home, cart, pay]
    contribution: {max_per_key: 1, max_keys: 3}
    mechanism: gaussian
  any_page:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1h}
    aggregate: count
    group_by: page
    contribution: {max_per_key: 1}
    mechanism: gaussian
  top_pages:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1h}
    aggregate: top_k
    k: 2
    group_by: page
    contribution: {max_per_key: 1}
    mechanism: exponential
sinks: {releases: r, dead_letter: d}
"""

DAY = 1_796_083_200  # 2026-12-01T00:00Z


def _topology():
    return load_topology_text(_YAML)


def _record(metric: str, end: int, values: dict[str, float], *, half: Any = 1.5, ratio: float = 0.25) -> dict:
    return {
        "release_id": f"{metric}-{end}",
        "metric": metric,
        "values": values,
        "ci": {"level": 0.95, "half_width": half},
        "window": {"start_epoch": end - 3600, "end_epoch": end, "start": iso_utc(end - 3600), "end": iso_utc(end)},
        "budget": {"scope": "b", "period": "2026-12-01", "ratio_after": ratio},
        "published_at": iso_utc(end + 60),
    }


def test_the_first_record_wins_a_repeat_is_dropped_and_a_differing_one_is_a_conflict() -> None:
    """Same bytes again: a repeat; same release_id with other bytes: a conflict, counted per metric."""
    dedupe = Dedupe()
    first = canonical_bytes(_record("views", DAY + 3600, {"": 10.0}))
    other = canonical_bytes(_record("views", DAY + 3600, {"": 11.0}))
    assert dedupe.offer(first).verdict is Verdict.FIRST
    assert dedupe.offer(first).verdict is Verdict.REPEAT
    assert dedupe.offer(other).verdict is Verdict.CONFLICT
    assert dedupe.offer(other).verdict is Verdict.CONFLICT
    assert dedupe.offer(b"not json").verdict is Verdict.MALFORMED
    assert dedupe.offer(b'{"metric": "views"}').verdict is Verdict.MALFORMED
    assert dedupe.conflicts == {"views": 2}


def test_latest_is_by_window_end_not_arrival_and_held_until_its_publish_time() -> None:
    """An older window read later does not replace the latest; a record is shown only once P(w) passed."""
    latest = LatestReleases(_topology())
    newer, older = _record("views", DAY + 7200, {"": 2.0}), _record("views", DAY + 3600, {"": 1.0})
    latest.add(newer)
    latest.add(older)
    assert latest.latest(DAY + 7200 + 59) == {"views": older}  # the newer one's P(w) is still to come
    assert latest.latest(DAY + 7200 + 60) == {"views": newer}
    latest.add(_record("views", DAY, {"": 0.0}))
    assert latest.latest(DAY + 10_000)["views"] is newer


def test_unbounded_keys_are_refused_with_one_line_and_bounded_ones_served() -> None:
    """Declared keys, top-k with a k and ungrouped metrics are bounded; data-derived keys are not."""
    topology = _topology()
    latest = LatestReleases(topology)
    assert set(latest.refused) == {"any_page"}
    reason = latest.refused["any_page"]
    assert "\n" not in reason and "any_page" in reason and "keys" in reason
    assert key_bound_refusal(topology.metrics["top_pages"]) is None
    latest.add(_record("any_page", DAY + 3600, {"x": 1.0}))
    assert latest.latest(DAY + 10_000) == {}


def test_reading_starts_at_each_metrics_first_window_of_its_current_period() -> None:
    """The default start is the schedule's first window in the period holding now (S applied)."""
    topology = _topology()
    now = DAY + 5 * 3600 + 17
    starts = feed_starts(topology, ["views", "by_page"], now)
    expected = next(Schedule.of(topology.metrics["views"], topology.schedule_start).starts(since=DAY))
    assert starts == {"views": expected, "by_page": expected} and expected == DAY
    assert feed_starts(topology, ["views"], now, periods_back=1) == {"views": DAY - 86_400}
    assert feed_starts(topology, ["views"], now, since=DAY + 3600) == {"views": DAY + 3600}
    assert seek_time({"a": 5, "b": 3}) == 3


def _scrape(feed: ExporterFeed) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FeedCollector(feed))
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_the_collector_serves_only_the_latest_releases_keys_and_counts_conflicts() -> None:
    """Values, CI half-widths, window end and ratio of the latest release; a key it lacks is gone."""
    now = [DAY + 3600 + 60.0]
    feed = ExporterFeed(_topology(), clock=lambda: now[0])
    first = _record("by_page", DAY + 3600, {"home": 5.0, "cart": 2.0}, half={"home": 1.0, "cart": 2.0})
    assert feed.offer(canonical_bytes(first)) is Verdict.FIRST
    assert feed.offer(canonical_bytes(_record("views", DAY + 3600, {"": 7.0}, ratio=0.5))) is Verdict.FIRST
    got = _scrape(feed)
    assert got[("dpstream_release_value", (("key", "home"), ("metric", "by_page")))] == 5.0
    assert got[("dpstream_release_ci_half_width", (("key", "cart"), ("metric", "by_page")))] == 2.0
    assert got[("dpstream_release_value", (("key", ""), ("metric", "views")))] == 7.0
    assert got[("dpstream_release_ci_half_width", (("key", ""), ("metric", "views")))] == 1.5
    assert got[("dpstream_release_ratio_after", (("metric", "views"), ("scope", "b")))] == 0.5
    assert got[("dpstream_release_window_end_timestamp_seconds", (("metric", "by_page"),))] == DAY + 3600
    second = _record("by_page", DAY + 7200, {"home": 6.0}, half={"home": 1.0})
    feed.offer(canonical_bytes(second))
    changed = dict(second, values={"home": 9.0})
    assert feed.offer(json.dumps(changed).encode()) is Verdict.CONFLICT
    now[0] = DAY + 7200 + 60
    got = _scrape(feed)
    assert got[("dpstream_release_value", (("key", "home"), ("metric", "by_page")))] == 6.0
    assert ("dpstream_release_value", (("key", "cart"), ("metric", "by_page"))) not in got
    assert got[("dpstream_release_conflicts_total", (("metric", "by_page"),))] == 1
    assert got[("dpstream_release_conflicts_total", (("metric", "views"),))] == 0


def test_a_record_without_ci_half_widths_serves_its_values_only() -> None:
    """A quantile-shaped record (values per level, its error in ranks): value series per level, no
    half-width series (nothing is invented for them)."""
    feed = ExporterFeed(_topology(), clock=lambda: DAY + 7200.0)
    record = _record("views", DAY + 3600, {"p50": 870.0, "p90": 1920.0})
    record["ci"] = {"level": 0.95, "rank_error": {"p50": 1280, "p90": 1280}}
    feed.offer(canonical_bytes(record))
    got = _scrape(feed)
    assert got[("dpstream_release_value", (("key", "p50"), ("metric", "views")))] == 870.0
    assert got[("dpstream_release_value", (("key", "p90"), ("metric", "views")))] == 1920.0
    assert not [k for k in got if k[0] == "dpstream_release_ci_half_width"]
