"""Ingest checks keys against the source topic's real partition count and refuses a changed count (real Kafka).

The count is read from the topic's metadata, written into every commit's metadata, and a partition
whose topic no longer has the count its pipeline would hash keys over is refused: left paused, unread
and uncommitted, with one error line, instead of dead-lettering its records as `wrong_partition`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions
from aiokafka.structs import OffsetAndMetadata
from kafka import KafkaProducer

from dpstream.topology.model import Source
from dpstream.workers.ledger.testing import one_scope_topology
from dpstream.workers.runtime.core import to_output
from dpstream.workers.runtime.ingest import IngestService, _Listener, _Refused
from dpstream.workers.runtime.settings import RuntimeSettings
from dpstream.workers.runtime.topics import partition_count

_T0 = 1_796_000_000


def _service(bootstrap: str, redis_url: str, topic: str) -> IngestService:
    base = one_scope_topology()
    topology = replace(base, sources={"src": Source("src", topic, "user_id", timestamp="ts", keyed_by_unit=True)})
    svc = IngestService(topology, RuntimeSettings(bootstrap, redis_url), offload=False)
    svc.schedule_start = _T0
    return svc


async def _member(svc: IngestService, bootstrap: str, topic: str, want: int) -> AIOKafkaConsumer:
    """The service's consumer-group member, once it holds `want` partitions (metadata refreshed each second)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=f"g-{topic}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        metadata_max_age_ms=1000,
    )
    svc._consumer = consumer  # noqa: SLF001 - the service's consumer, driven step by step here
    consumer.subscribe([topic], listener=_Listener(svc))
    await consumer.start()
    for _ in range(300):
        if len(consumer.assignment()) == want:
            return consumer
        await asyncio.sleep(0.1)
    await consumer.stop()
    raise AssertionError(f"not assigned {want} partitions in 30 s")


def test_a_partition_committed_under_another_count_is_refused_and_the_count_is_committed(
    kafka_broker: Any, fresh_redis: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Partition 0's last commit was made with 4 partitions, the topic has 2: refused (paused, one error
    line however often asked); partition 1 is made with the topic's count, and its commit records it."""
    topic = kafka_broker.new_topic("count-committed", partitions=2)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
    for i in range(20):
        doc = {"user_id": f"u{i}", "ts": _T0 + i}
        producer.send(topic, json.dumps(doc).encode(), key=f"u{i}".encode())
    producer.flush()
    producer.close()
    svc = _service(kafka_broker.bootstrap, fresh_redis.url, topic)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)

    async def body() -> tuple[bool, int, int, dict, int]:
        svc._counts[topic] = await partition_count(kafka_broker.bootstrap, topic)  # noqa: SLF001 - as on_start
        consumer = await _member(svc, kafka_broker.bootstrap, topic, 2)
        try:
            await consumer.commit({tp0: OffsetAndMetadata(0, json.dumps({"#partitions": 4}))})
            for _ in range(3):
                with pytest.raises(_Refused):
                    await svc._core(tp0)  # noqa: SLF001
            paused = tp0 in consumer.paused()
            core = await svc._core(tp1)  # noqa: SLF001
            fetched: list[Any] = []
            for _ in range(100):
                fetched += (await consumer.getmany(tp1, timeout_ms=200)).get(tp1, [])
                if fetched:
                    break
            out = core.process_batch(fetched)
            svc._producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap)  # noqa: SLF001
            await svc._producer.start()  # noqa: SLF001
            try:
                await svc._flush([(tp1, to_output(out))])  # noqa: SLF001 - no window closed: commits progress only
            finally:
                await svc._producer.stop()  # noqa: SLF001
            meta = (await consumer._coordinator.fetch_committed_offsets([tp1]))[tp1]  # noqa: SLF001
            return paused, core.partitions, len(out.dead_letters), json.loads(meta.metadata), len(fetched)
        finally:
            await consumer.stop()

    with caplog.at_level(logging.ERROR, logger="dpstream.workers.runtime.ingest"):
        paused, partitions, dead, committed, fetched = asyncio.run(body())
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and f"topic {topic} partition 0 refused" in refusals[0]
    assert "its last commit was made with 4" in refusals[0]
    assert paused
    assert (partitions, dead) == (2, 0) and fetched > 0  # the producer's default partitioner: all in place
    assert committed["#partitions"] == 2


def test_a_partition_added_after_the_start_is_refused(
    kafka_broker: Any, fresh_redis: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A topic grown from 1 to 2 partitions while the worker runs: the new partition is refused (its
    records stay for a new topology version), the old one keeps the count it started with."""
    topic = kafka_broker.new_topic("count-added", partitions=1)
    svc = _service(kafka_broker.bootstrap, fresh_redis.url, topic)

    async def body() -> tuple[int, bool]:
        svc._counts[topic] = await partition_count(kafka_broker.bootstrap, topic)  # noqa: SLF001 - as on_start
        consumer = await _member(svc, kafka_broker.bootstrap, topic, 1)
        try:
            core = await svc._core(TopicPartition(topic, 0))  # noqa: SLF001
            admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
            await admin.start()
            try:
                await admin.create_partitions({topic: NewPartitions(total_count=2)})
            finally:
                await admin.close()
            for _ in range(300):  # the group rebalances onto the new partition
                if TopicPartition(topic, 1) in consumer.assignment():
                    break
                await asyncio.sleep(0.1)
            with pytest.raises(_Refused):
                await svc._core(TopicPartition(topic, 1))  # noqa: SLF001
            return core.partitions, TopicPartition(topic, 1) in consumer.paused()
        finally:
            await consumer.stop()

    with caplog.at_level(logging.ERROR, logger="dpstream.workers.runtime.ingest"):
        partitions, paused = asyncio.run(body())
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert partitions == 1 and paused
    assert len(refusals) == 1 and "partition 1 refused: the topic had 1 partitions" in refusals[0]
