"""The demo's topology: event time runs faster than the clock, so its sources accept that far ahead."""

from __future__ import annotations

from dpstream.topology.dumper import dump_topology
from dpstream.topology.loader import load_topology, load_topology_text
from dpstream.topology.plan import build_plan
from dpstream.workers.demo.run import accelerated, example_topology_path

_ENV = {"DPSTREAM_KAFKA": "127.0.0.1:9092", "DPSTREAM_REDIS": "redis://127.0.0.1:6379/0"}


def test_accelerated_sources_accept_the_whole_feed_and_the_plan_is_unchanged():
    """60× for 65 s runs 65 min ahead: every source's max_future covers it (default 1h would not);
    the file the worker reads round-trips and prices every release as the shipped example does."""
    shipped = load_topology(example_topology_path(), env=_ENV)
    demo = load_topology_text(dump_topology(accelerated(shipped, 60.0, 65, "demo1")), env=_ENV)
    assert all(s.max_future_s < 60 * 65 for s in shipped.sources.values())
    assert all(s.max_future_s >= 60 * 65 for s in demo.sources.values())
    plan, demo_plan = build_plan(shipped), build_plan(demo)
    for name in shipped.metrics:
        assert demo_plan.metric(name).per_release_cost == plan.metric(name).per_release_cost


def test_each_run_gets_its_own_topics():
    """A second demo run must not resume the first run's topics (their events ran up to an hour ahead)."""
    shipped = load_topology(example_topology_path(), env=_ENV)
    one, two = accelerated(shipped, 60.0, 65, "demo1"), accelerated(shipped, 60.0, 65, "demo2")
    topics = lambda t: {s.topic for s in t.sources.values()} | {t.sinks.releases, t.sinks.dead_letter,  # noqa: E731
                                                                t.sinks.partials_topic}
    assert not topics(one) & topics(two) and not topics(one) & topics(shipped)
