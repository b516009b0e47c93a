"""Read the public releases topic: every partition from a topic time on, then follow it.

No consumer group and no committed offsets (a reader is not a worker: it only looks). Each
partition is read from the broker's time index at `since_s` (a record's Kafka timestamp is its
P(w)), or from its beginning. Within a partition records come in offset order; across partitions
there is no order, so callers order by the record's own fields (window end), never by arrival.
The partitions are those the topic has when reading starts (partitions added later are read after
the next start).
"""

from __future__ import annotations

__all__ = ["FeedUnavailable", "read_releases"]

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from dpstream.topology.errors import ConfigError
from dpstream.workers.runtime.kafka_security import KafkaSecurity

_WAIT_TOPIC_S = (1.0, 10.0)
"""How soon, then at most how seldom, a reader looks again for a releases topic that does not exist yet."""


class FeedUnavailable(ConfigError):
    """Kafka cannot be read (unreachable broker, wrong protocol): one line naming it."""


async def read_releases(
    bootstrap: str,
    topic: str,
    security: KafkaSecurity,
    since_s: float | None,
    *,
    poll_ms: int = 500,
    on_waiting: Any = None,
) -> AsyncIterator[bytes]:
    """Every record value of `topic` from `since_s` (None: the beginning), then new ones as they come.

    `security` is the TLS/SASL of the workers' clients (`KafkaSecurity.from_env(kafka=topology.kafka)`).
    A missing topic is waited for (`on_waiting()` is called once); an unreachable broker raises
    FeedUnavailable."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.errors import KafkaError

    options = security.client_options()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, **options)
    try:
        try:
            await consumer.start()
            partitions = await _partitions(bootstrap, topic, security, on_waiting)
        except (KafkaError, OSError) as exc:
            protocol = options.get("security_protocol", "PLAINTEXT")
            raise FeedUnavailable(
                f"Kafka at {bootstrap} over {protocol}: cannot read the releases topic {topic!r} "
                f"({type(exc).__name__}); check the topology's kafka.bootstrap and the DPSTREAM_KAFKA_* settings"
            ) from None
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await _seek(consumer, tps, since_s)
        while True:
            batches = await consumer.getmany(*tps, timeout_ms=poll_ms)
            for tp in sorted(batches, key=lambda t: t.partition):
                for message in batches[tp]:
                    if message.value is not None:
                        yield message.value
    finally:
        await consumer.stop()


async def _partitions(bootstrap: str, topic: str, security: KafkaSecurity, on_waiting: Any) -> int:
    """The topic's partition count, once it exists."""
    from dpstream.workers.runtime.topics import partition_count

    wait, said = _WAIT_TOPIC_S[0], False
    while True:
        found = await partition_count(bootstrap, topic, security)
        if found:
            return found
        if not said and on_waiting is not None:
            on_waiting()
            said = True
        await asyncio.sleep(wait)
        wait = min(2 * wait, _WAIT_TOPIC_S[1])


async def _seek(consumer: Any, tps: list[Any], since_s: float | None) -> None:
    """Each partition at its first record with timestamp ≥ since_s (its end when none), or its beginning.

    The end offsets are read before the time index: a record appended between the two reads is then
    either found by the index or at or past the end, never skipped."""
    await consumer.seek_to_beginning(*tps)
    if since_s is None:
        return
    ends = await consumer.end_offsets(tps)
    found = await consumer.offsets_for_times({tp: int(since_s * 1000) for tp in tps})
    for tp in tps:
        at = found.get(tp)
        consumer.seek(tp, at.offset if at is not None else ends[tp])
