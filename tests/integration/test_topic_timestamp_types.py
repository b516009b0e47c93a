"""Timestamp types of a topology's topics on a real Kafka broker: created pinned, checked at start.

Inclusion is by the source topic's broker append time (LogAppendTime); the by-unit hop copies keep the
source's append time and a release keeps its publish-time stamp, so those topics are CreateTime, set on
the topic itself (a broker default of LogAppendTime would otherwise replace the times the worker writes).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from typing import Any

import pytest

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Arrival, Sinks, Source, Topology
from dpstream.workers.ledger.testing import one_scope_topology
from dpstream.workers.runtime.admin import create_topics, describe_topic_config_async
from dpstream.workers.runtime.topics import (
    APPEND_TIME,
    CREATE_TIME,
    TIMESTAMP_TYPE,
    clock_probe_topic,
    ensure_topics,
    repartition_topic,
)


def _topology(arrival: Arrival = Arrival.APPEND_TIME) -> Topology:
    prefix = f"ts-{uuid.uuid4().hex[:10]}"
    source = Source("src", f"{prefix}.events", "user_id", timestamp="ts", arrival=arrival)
    return replace(one_scope_topology(), sources={"src": source}, sinks=Sinks(f"{prefix}.releases", f"{prefix}.dead"))


def _types(bootstrap: str, topics: list[str]) -> dict[str, tuple[str, bool]]:
    return asyncio.run(describe_topic_config_async(bootstrap, topics, TIMESTAMP_TYPE))


def test_created_topics_pin_their_timestamp_type_on_the_topic(kafka_broker: Any) -> None:
    """The worker creates the source and probe topics LogAppendTime, the by-unit and releases topics
    CreateTime, each set on the topic itself (not left to the broker default)."""
    topology = _topology()
    source = topology.sources["src"]
    ensure_topics(kafka_broker.bootstrap, topology, partitions=1)
    hop, releases, probe = repartition_topic(source), topology.sinks.releases, clock_probe_topic(topology)
    found = _types(kafka_broker.bootstrap, [source.topic, hop, releases, probe])
    assert found == {
        source.topic: ("LogAppendTime", True),
        hop: ("CreateTime", True),
        releases: ("CreateTime", True),
        probe: ("LogAppendTime", True),
    }


def test_a_create_time_source_topic_is_refused_at_start(kafka_broker: Any) -> None:
    """A source topic that stamps records with the producer's time is refused in one line naming the
    topic, the setting and both fixes."""
    topology = _topology()
    topic = topology.sources["src"].topic
    create_topics(kafka_broker.bootstrap, [topic], 1, configs={topic: CREATE_TIME})
    with pytest.raises(ConfigError) as refused:
        ensure_topics(kafka_broker.bootstrap, topology, partitions=1)
    message = str(refused.value)
    assert message.startswith(f"topic {topic!r} (source 'src'): message.timestamp.type is CreateTime, so ")
    assert "--add-config message.timestamp.type=LogAppendTime" in message
    assert "set `arrival: create_time` on source 'src'" in message


def test_a_create_time_source_topic_runs_when_the_source_opts_in(kafka_broker: Any) -> None:
    """With `arrival: create_time` (weaker, labelled) the same CreateTime source topic is accepted."""
    topology = _topology(Arrival.CREATE_TIME)
    topic = topology.sources["src"].topic
    create_topics(kafka_broker.bootstrap, [topic], 1, configs={topic: CREATE_TIME})
    ensure_topics(kafka_broker.bootstrap, topology, partitions=1)
    assert _types(kafka_broker.bootstrap, [topic]) == {topic: ("CreateTime", True)}


@pytest.mark.parametrize("which", ["hop", "releases"])
def test_a_log_append_time_hop_or_releases_topic_is_refused_at_start(kafka_broker: Any, which: str) -> None:
    """A by-unit or releases topic whose broker would overwrite the worker's record times is refused."""
    topology = _topology()
    topic = repartition_topic(topology.sources["src"]) if which == "hop" else topology.sinks.releases
    create_topics(kafka_broker.bootstrap, [topic], 1, configs={topic: APPEND_TIME})
    with pytest.raises(ConfigError, match=r"message.timestamp.type is LogAppendTime, so .*=CreateTime`") as refused:
        ensure_topics(kafka_broker.bootstrap, topology, partitions=1)
    assert str(refused.value).startswith(f"topic {topic!r} (")
