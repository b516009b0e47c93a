"""The demo prints the PromQL of one feed series: a metric with bounded keys and values, its first key;
its Prometheus view counts the feed series it holds."""

from __future__ import annotations

from dpstream.topology.loader import load_topology, load_topology_text
from dpstream.workers.demo.monitoring import PromView, feed_query
from dpstream.workers.demo.run import demo_topology_path

_UNBOUNDED_FIRST = """
version: 1
sources:
  clicks: {topic: t, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, period: 1d}
metrics:
  any_page:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1h}
    aggregate: count
    group_by: page
    contribution: {max_per_key: 1}
    mechanism: gaussian
  views:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1h}
    aggregate: count
    contribution: {max_per_key: 1}
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""


def test_the_demo_topology_gives_a_keyed_feed_series() -> None:
    """The shipped demo's first bounded metric is page_views, on its first declared key."""
    topology = load_topology(demo_topology_path())
    query = feed_query(topology)
    first = next(m for m in topology.metrics.values() if m.keys)
    assert query == f'dpstream_release_value{{metric="{first.name}",key="{first.keys[0]}"}}'


def test_an_unbounded_metric_is_skipped_and_an_ungrouped_one_has_the_empty_key() -> None:
    assert feed_query(load_topology_text(_UNBOUNDED_FIRST)) == 'dpstream_release_value{metric="views",key=""}'


def test_the_prometheus_line_counts_the_feed_series() -> None:
    line = PromView(ratios={"b": 0.1}, targets_up=2, targets=2, feed_series=7).line()
    assert "2/2 dpstream targets up" in line and line.endswith("feed: 7 dpstream_release_value series")
