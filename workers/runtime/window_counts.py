"""Where a live worker keeps per-unit period state across restarts: an internal topic of deltas.

The state is that of every period-bounded metric (`Metric.period_bounded`): `contribution.max_windows`
counts and a running total's `max_per_period` amounts, one home for both (`pipeline.window_caps`). Each
window close on a partition in which some unit used an amount yields a `CountDelta` (those units'
16-byte keys and, for `max_per_period`, the amount each used). The ingest sends them to
`dpstream-<version>-window-counts` with the partials and waits for every ack before it commits the
partition's progress past that window, so every delta below a committed progress point is in the topic.
A pipeline that resumes a partition reads back the deltas of that source partition written since its
period-bounded metrics' period start (the topic's partition `partition % n`, records keyed by source
topic and partition) and rebuilds exactly the state a clean run has (`PeriodRule.restore`: duplicates
and deltas past the progress point are ignored), without replaying the period's events.

The topic is curator-side, like the partials topic: its records carry keyed digests of unit ids (never
the ids, never a raw value; a `max_per_period` amount is what a unit used of its bound, a curator-side
figure like the partials) under the worker's `dpstream-` prefixed topic ACL. Size: about 21.3 bytes per
included unit and window (base64 of 16 bytes), so at most 21.3·m bytes per active unit and period under
`max_windows`; under `max_per_period` the amount's decimal digits and a comma on top (about 33 bytes
per unit and window it used some of its bound in). The topic keeps two of the longest such period
(`retention_ms`).
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
    """The internal topic of period-state deltas (`max_windows`, `max_per_period`) of this topology version."""
    return f"dpstream-{topology.topology_version}-window-counts"


def capped_sources(topology: Topology) -> frozenset[str]:
    """Names of the sources with a period-bounded metric (`Metric.period_bounded`: their pipelines persist
    deltas)."""
    return frozenset(m.source for m in topology.metrics.values() if m.period_bounded)


def retention_ms(topology: Topology) -> int:
    """Two of the longest budget period of a period-bounded metric: a resume reads back only its current period."""
    periods = [topology.budgets[m.budget].period_s for m in topology.metrics.values() if m.period_bounded]
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
