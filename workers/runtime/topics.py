"""Names of every topic a topology's worker reads or writes, and their idempotent creation."""

from __future__ import annotations

__all__ = [
    "APPEND_TIME",
    "TopicNames",
    "topic_names",
    "topic_configs",
    "repartition_topic",
    "ingest_topic",
    "ensure_topics",
    "partition_count",
]

from dataclasses import dataclass

from dpstream.topology.model import Source, Topology
from dpstream.workers.runtime.admin import client_options, create_topics
from dpstream.workers.runtime.kafka_security import KafkaSecurity


def repartition_topic(source: Source) -> str:
    """The internal topic keyed by privacy unit that a source not keyed by it is copied through."""
    return f"{source.topic}.by-unit"


@dataclass(frozen=True)
class TopicNames:
    """Topics of one topology: sources, internal hops and sinks."""

    sources: tuple[str, ...]
    repartition: tuple[str, ...]
    partials: str
    releases: str
    dead_letter: str

    @property
    def all(self) -> tuple[str, ...]:
        """Every topic, in creation order."""
        return (*self.sources, *self.repartition, self.partials, self.releases, self.dead_letter)


def _needs_repartition(source: Source) -> bool:
    return not source.keyed_by_unit and not source.event_level


def topic_names(topology: Topology) -> TopicNames:
    """The topic set of `topology` (repartition topics only for sources not keyed by their unit)."""
    sources = tuple(dict.fromkeys(s.topic for s in topology.sources.values()))
    hops = tuple(repartition_topic(s) for s in topology.sources.values() if _needs_repartition(s))
    sinks = topology.sinks
    return TopicNames(sources, hops, sinks.partials_topic, sinks.releases, sinks.dead_letter)


def ingest_topic(source: Source) -> str:
    """The topic the batch consumer reads for `source`: the repartitioned one when a hop is needed."""
    return repartition_topic(source) if _needs_repartition(source) else source.topic


APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}
"""Source topics stamp each record with the broker's append time: inclusion is by arrival (DESIGN §3)."""


def topic_configs(topology: Topology) -> dict[str, dict[str, str]]:
    """Per-topic configs of created topics: source topics use append time; by-unit topics keep the
    source's append time the hop writes (CreateTime, the default)."""
    return {s.topic: dict(APPEND_TIME) for s in topology.sources.values()}


def ensure_topics(
    bootstrap: str, topology: Topology, partitions: int = 4, security: KafkaSecurity | None = None
) -> list[str]:
    """Create the topology's missing topics (existing ones are left alone); returns those created.
    `security` defaults to the environment's (`KafkaSecurity.from_env`)."""
    names = topic_names(topology).all
    return create_topics(bootstrap, names, partitions, configs=topic_configs(topology), security=security)


async def partition_count(bootstrap: str, topic: str, security: KafkaSecurity | None = None) -> int:
    """Number of partitions of `topic` (0 when it does not exist)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_options(security))
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
        return sum(len(t["partitions"]) for t in described if t["error_code"] == 0)
    finally:
        await admin.close()
