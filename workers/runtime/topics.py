"""Names of every topic a topology's worker reads or writes, and their idempotent creation."""

from __future__ import annotations

__all__ = [
    "APPEND_TIME",
    "CREATE_TIME",
    "TIMESTAMP_TYPE",
    "TimestampRule",
    "timestamp_rules",
    "check_timestamp_types",
    "check_timestamp_types_async",
    "clock_probe_topic",
    "TopicNames",
    "topic_names",
    "topic_configs",
    "repartition_topic",
    "ingest_topic",
    "ensure_topics",
    "partition_count",
]

from dataclasses import dataclass

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Source, Topology
from dpstream.workers.runtime.admin import client_options, create_topics, describe_topic_config_async, run_sync
from dpstream.workers.runtime.kafka_security import KafkaSecurity
from dpstream.workers.runtime.window_counts import capped_sources, counts_topic, retention_ms


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


TIMESTAMP_TYPE = "message.timestamp.type"
"""The topic config that says whose clock stamps a record: the producer's (CreateTime) or the broker's."""

APPEND_TIME = {TIMESTAMP_TYPE: "LogAppendTime"}
"""Source topics stamp each record with the broker's append time: inclusion is by arrival."""

CREATE_TIME = {TIMESTAMP_TYPE: "CreateTime"}
"""Topics whose records carry a time the worker sets: the by-unit copies keep their source append time,
a release keeps its publish time P(w). Pinned, because a broker default of LogAppendTime would replace it."""

_RECORD_TYPES = {0: "CreateTime", 1: "LogAppendTime"}
"""A consumed record's `timestamp_type` → the topic config value that produced it."""


@dataclass(frozen=True)
class TimestampRule:
    """The `message.timestamp.type` values one topic of a topology may have, and why."""

    topic: str
    role: str
    """What the topic is to the worker, e.g. "source 'clicks'"."""
    accepted: tuple[str, ...]
    """Accepted values, the one the worker creates the topic with first."""
    harm: str
    """What goes wrong on another value (the clause after "so")."""
    opt_in: str = ""
    """A topology change that accepts the other value too, if there is one."""

    def problem(self, found: str, bootstrap: str = "BROKER") -> str | None:
        """The one-line refusal for a topic whose timestamp type is `found` (None when accepted)."""
        if found in self.accepted:
            return None
        fix = (
            f"kafka-configs --bootstrap-server {bootstrap} --alter --entity-type topics --entity-name {self.topic} "
            f"--add-config {TIMESTAMP_TYPE}={self.accepted[0]}"
        )
        other = f", or {self.opt_in}" if self.opt_in else ""
        return f"topic {self.topic!r} ({self.role}): {TIMESTAMP_TYPE} is {found}, so {self.harm}; run `{fix}`{other}"

    def record_problem(self, record_type: int) -> str | None:
        """`problem` for a consumed record's `timestamp_type` (0 CreateTime, 1 LogAppendTime)."""
        return self.problem(_RECORD_TYPES.get(record_type, str(record_type)))


def timestamp_rules(topology: Topology) -> dict[str, TimestampRule]:
    """topic → its rule, for the source topics, the by-unit hop topics and the releases topic.

    A source counts an event by its broker append time (LogAppendTime) unless every source on the topic
    opts in to the producer's time (`arrival: create_time`, weaker); a by-unit topic keeps the source's
    append time the hop writes, and the releases topic each release's P(w) stamp, so both are CreateTime.
    """
    rules: dict[str, TimestampRule] = {}
    by_topic: dict[str, list[Source]] = {}
    for source in topology.sources.values():
        by_topic.setdefault(source.topic, []).append(source)
    for topic, sources in by_topic.items():
        strict = [s for s in sources if not s.create_time_arrival]
        if not strict:  # every source of the topic opted in: the broker's time is still the better one
            rules[topic] = TimestampRule(topic, f"source '{sources[0].name}'", ("LogAppendTime", "CreateTime"), "")
            continue
        names = ", ".join(f"'{s.name}'" for s in strict)
        rules[topic] = TimestampRule(
            topic,
            f"source {names}",
            ("LogAppendTime",),
            "an event's inclusion would follow its producer's clock and the worker's load",
            f"set `arrival: create_time` on source {names} (weaker, labelled in the plan)",
        )
    for s in topology.sources.values():
        if _needs_repartition(s):
            hop = repartition_topic(s)
            rules[hop] = TimestampRule(
                hop,
                f"repartition hop of source '{s.name}'",
                ("CreateTime",),
                "the broker would stamp each copy with its copy time, not the source's append time",
            )
    releases = topology.sinks.releases
    rules[releases] = TimestampRule(
        releases, "releases", ("CreateTime",), "the broker would overwrite each release's publish-time stamp"
    )
    probe = clock_probe_topic(topology)
    rules[probe] = TimestampRule(
        probe, "clock probe", ("LogAppendTime",), "its records carry no broker time to measure the clock skew by"
    )
    return rules


def clock_probe_topic(topology: Topology) -> str:
    """The internal LogAppendTime topic whose probe records measure the worker–broker clock skew; it
    carries no data and falls under the worker's `dpstream-` prefixed topic ACL."""
    return f"dpstream-{topology.topology_version}-clock-probe"


def topic_configs(topology: Topology) -> dict[str, dict[str, str]]:
    """Per-topic configs of created topics: each topic with a timestamp rule gets its first accepted
    type (sources and the clock probe LogAppendTime; by-unit and releases topics CreateTime)."""
    return {topic: {TIMESTAMP_TYPE: rule.accepted[0]} for topic, rule in timestamp_rules(topology).items()}


async def check_timestamp_types_async(
    bootstrap: str, topology: Topology, security: KafkaSecurity | None = None
) -> None:
    """Refuse (ConfigError, one line naming the topic, the setting and the fix) a topic of `topology`
    whose `message.timestamp.type` breaks its rule; topics that do not exist are left to their creation."""
    rules = timestamp_rules(topology)
    found = await describe_topic_config_async(bootstrap, list(rules), TIMESTAMP_TYPE, security)
    for topic, rule in rules.items():
        if topic in found:
            problem = rule.problem(found[topic][0], bootstrap)
            if problem is not None:
                raise ConfigError(problem)


def check_timestamp_types(bootstrap: str, topology: Topology, security: KafkaSecurity | None = None) -> None:
    """Sync form of `check_timestamp_types_async`."""
    run_sync(check_timestamp_types_async(bootstrap, topology, security))


def ensure_topics(
    bootstrap: str, topology: Topology, partitions: int = 4, security: KafkaSecurity | None = None
) -> list[str]:
    """Create the topology's missing topics (existing ones are left alone), its clock-probe topic and,
    with a period-bounded metric (`max_windows`, `max_per_period`), its window-counts topic
    (`runtime.window_counts`), then refuse topics whose timestamp type breaks their rule
    (`check_timestamp_types`); returns the topics created.
    `security` defaults to the environment's (`KafkaSecurity.from_env`)."""
    names = topic_names(topology).all
    created = create_topics(bootstrap, names, partitions, configs=topic_configs(topology), security=security)
    probe = clock_probe_topic(topology)
    created += create_topics(
        bootstrap, [probe], 1, configs={probe: {**APPEND_TIME, **_PROBE_RETENTION}}, security=security
    )
    if capped_sources(topology):
        counts = counts_topic(topology)
        retention = {"retention.ms": str(retention_ms(topology))}
        created += create_topics(bootstrap, [counts], partitions, configs={counts: retention}, security=security)
    check_timestamp_types(bootstrap, topology, security)
    return created


_PROBE_RETENTION = {"retention.ms": str(3_600_000)}
"""Probe records are read back from the produce response only; an hour of them is kept, for debugging."""


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
