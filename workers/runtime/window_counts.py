"""Where a live worker keeps `contribution.max_windows` counts across restarts: an internal topic of deltas.

Each window close on a partition that includes units yields a `CountDelta` (the included units' 16-byte
keys, `pipeline.window_caps`). The ingest sends them to `dpstream-<version>-window-counts` with the
partials and waits for every ack before it commits the partition's progress past that window, so every
delta below a committed progress point is in the topic. A pipeline that resumes a partition reads back
the deltas of that source partition written since its capped metrics' period start (the topic's
partition `partition % n`, records keyed by source topic and partition) and rebuilds exactly the counts
a clean run has (`WindowCaps.restore`: duplicates and deltas past the progress point are ignored),
without replaying the period's events.

The topic is curator-side, like the partials topic: its records carry keyed digests of unit ids (never
the ids, never a value) under the worker's `dpstream-` prefixed topic ACL. Size: about 21.3 bytes per
included unit and window (base64 of 16 bytes), so at most 21.3·m bytes per active unit and period;
the topic keeps two of the longest capped period (`retention_ms`).
"""

from __future__ import annotations

__all__ = ["counts_topic", "capped_sources", "delta_key", "read_deltas", "retention_ms"]

import time

from aiokafka import AIOKafkaConsumer, TopicPartition

from dpstream.topology.model import Topology
from dpstream.workers.pipeline.window_caps import CountDelta

_READ_IDLE_S = 30.0
"""Give up reading back (and let the partition's pipeline refuse to resume) after this long without progress."""


def counts_topic(topology: Topology) -> str:
    """The internal topic of `max_windows` count deltas of this topology version."""
    return f"dpstream-{topology.topology_version}-window-counts"


def capped_sources(topology: Topology) -> frozenset[str]:
    """Names of the sources with a metric under `contribution.max_windows` (their pipelines persist deltas)."""
    return frozenset(m.source for m in topology.metrics.values() if m.contribution.max_windows is not None)


def retention_ms(topology: Topology) -> int:
    """Two of the longest budget period of a capped metric: a resume reads back only its current period."""
    periods = [
        topology.budgets[m.budget].period_s for m in topology.metrics.values() if m.contribution.max_windows is not None
    ]
    return 2 * max(periods, default=86_400) * 1000


def delta_key(topic: str, partition: int) -> bytes:
    """The record key of a source partition's deltas (the topic's partition is `partition % n`)."""
    return f"{topic}:{partition}".encode()


async def read_deltas(
    consumer: AIOKafkaConsumer, topology: Topology, source_topic: str, partition: int, since_s: int
) -> list[CountDelta]:
    """Every delta of `source_topic` partition `partition` appended at or after `since_s` (a period
    start: a delta is written after its window closes, so after its period starts), read to the end
    offset seen at the call. `consumer` is a started, group-less consumer this call may reassign."""
    topic = counts_topic(topology)
    parts = consumer.partitions_for_topic(topic) or await _partitions(consumer, topic)
    if not parts:
        return []
    tp = TopicPartition(topic, partition % len(parts))
    consumer.assign([tp])
    found = await consumer.offsets_for_times({tp: since_s * 1000})
    end = (await consumer.end_offsets([tp]))[tp]
    start = found[tp].offset if found.get(tp) is not None else end
    consumer.seek(tp, start)
    key = delta_key(source_topic, partition)
    out: list[CountDelta] = []
    position, idle_since = start, time.monotonic()
    while position < end:
        batches = await consumer.getmany(tp, timeout_ms=500)
        for record in batches.get(tp, []):
            position = record.offset + 1
            idle_since = time.monotonic()
            if record.key == key and record.value is not None:
                out.append(CountDelta.from_bytes(record.value))
        if time.monotonic() - idle_since > _READ_IDLE_S:
            raise TimeoutError(f"reading {topic} partition {tp.partition} back stalled at offset {position} of {end}")
    return out


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    # aiokafka has no public metadata refresh; a topic created since the consumer started needs one
    await consumer._client.force_metadata_update()
    return consumer.partitions_for_topic(topic) or set()
