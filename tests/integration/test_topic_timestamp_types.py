"""Timestamp types of a topology's topics on a real Kafka broker: created pinned, checked at start.

Inclusion is by the source topic's broker append time (LogAppendTime); the by-unit hop copies keep the
source's append time and a release keeps its publish-time stamp, so those topics are CreateTime, set on
the topic itself (a broker default of LogAppendTime would otherwise replace the times the worker writes).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from kafka import KafkaProducer

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Arrival, Sinks, Source, Topology
from dpstream.workers.ledger.testing import one_scope_topology
from dpstream.workers.runtime.admin import create_topics, describe_topic_config_async
from dpstream.workers.runtime.repartition import RepartitionService
from dpstream.workers.runtime.settings import RuntimeSettings
from dpstream.workers.runtime.topics import (
    APPEND_TIME,
    CREATE_TIME,
    TIMESTAMP_TYPE,
    clock_probe_topic,
    ensure_topics,
    repartition_topic,
)

DEMO = Path(__file__).resolve().parents[2] / "topology" / "examples" / "demo.yaml"


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


def test_the_hop_stops_before_committing_when_the_broker_stamps_its_copies(kafka_broker: Any) -> None:
    """A by-unit topic switched to LogAppendTime while the hop runs: the hop crashes with the one-line
    refusal before committing the batch, so no copy stamped with its copy time is taken as copied."""
    topology = _topology()
    source = topology.sources["src"]
    hop = repartition_topic(source)
    create_topics(kafka_broker.bootstrap, [source.topic], 1, configs={source.topic: APPEND_TIME})
    create_topics(kafka_broker.bootstrap, [hop], 1, configs={hop: APPEND_TIME})  # as if altered after the start
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
    producer.send(source.topic, b'{"user_id": "u1", "ts": 1796000000}', key=b"x")
    producer.flush()
    producer.close()
    settings = RuntimeSettings(kafka_broker.bootstrap, "redis://127.0.0.1:1/0")
    svc = RepartitionService(topology, settings, [source])

    async def body() -> tuple[BaseException | None, int | None]:
        await svc.start()
        try:
            for _ in range(300):
                if svc.crash_reason is not None:
                    break
                await asyncio.sleep(0.1)
        finally:
            await svc.stop()
        group = f"{settings.group_id(topology)}-repartition"
        reader = AIOKafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=group)
        await reader.start()
        try:
            committed = await reader.committed(TopicPartition(source.topic, 0))
        finally:
            await reader.stop()
        return svc.crash_reason, committed

    reason, committed = asyncio.run(body())
    assert isinstance(reason, ConfigError)
    assert str(reason).startswith(f"topic {hop!r} (repartition hop of source 'src'): message.timestamp.type is ")
    assert committed is None  # the batch was not committed: it is copied again once the topic is fixed


def test_dpstream_worker_on_a_create_time_source_exits_2_with_one_line(
    kafka_broker: Any, fresh_redis: Any, tmp_path: Path
) -> None:
    """`dpstream worker` on a CreateTime source topic stops before consuming: exit 2, one line, no traceback."""
    prefix = f"cli-{uuid.uuid4().hex[:10]}"
    text = DEMO.read_text().replace("demo.clicks", f"{prefix}.clicks").replace("demo.", f"{prefix}.")
    path = tmp_path / "topology.yaml"
    path.write_text(text)
    create_topics(kafka_broker.bootstrap, [f"{prefix}.clicks"], 1, configs={f"{prefix}.clicks": CREATE_TIME})
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPSTREAM_")} | {"TMPDIR": str(tmp_path)}
    argv = [sys.executable, "-m", "dpstream.workers.cli", "worker", str(path)]
    argv += ["--bootstrap", kafka_broker.bootstrap, "--redis", fresh_redis.url]
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    err = run.stderr.strip()
    assert run.returncode == 2, run.stderr
    assert "\n" not in err and "Traceback" not in err, run.stderr
    assert err.startswith(f"dpstream: error: topic '{prefix}.clicks' (source 'clicks'): message.timestamp.type is ")
