"""Tests of the runtime's topic naming (workers/runtime/topics.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dpstream.topology.loader import load_topology
from dpstream.workers.runtime.topics import ingest_topic, repartition_topic, topic_names

EXAMPLE = Path(__file__).resolve().parents[2] / "topology" / "examples" / "web-analytics.yaml"


def test_unkeyed_source_gets_a_by_unit_hop() -> None:
    """A source not keyed by its unit is read through `<topic>.by-unit`, which is in the topic set."""
    topology = load_topology(EXAMPLE)
    source = topology.sources["clicks"]
    names = topic_names(topology)
    assert ingest_topic(source) == repartition_topic(source) == "web.clicks.by-unit"
    assert names.all == (
        "web.clicks",
        "web.clicks.by-unit",
        "web.dp-releases.partials",
        "web.dp-releases",
        "web.dead-letter",
    )


def test_keyed_source_skips_the_hop() -> None:
    """A source keyed by its unit is read directly and needs no repartition topic."""
    topology = load_topology(EXAMPLE)
    keyed = replace(topology.sources["clicks"], keyed_by_unit=True)
    topology = replace(topology, sources={"clicks": keyed})
    assert ingest_topic(keyed) == "web.clicks"
    assert topic_names(topology).repartition == ()


def test_replication_follows_the_cluster_size() -> None:
    """Three or more brokers: 3 replicas, min.insync.replicas 2; fewer: one replica each, min ISR 1."""
    from dpstream.workers.runtime.admin import replication_for

    assert replication_for(5) == replication_for(3) == (3, {"min.insync.replicas": "2"})
    assert replication_for(2) == (2, {"min.insync.replicas": "1"})
    assert replication_for(1) == replication_for(0) == (1, {"min.insync.replicas": "1"})
