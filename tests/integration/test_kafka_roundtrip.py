"""The session Kafka fixture is a real broker: topics are created idempotently and messages round-trip."""

from __future__ import annotations

import asyncio
import json
import uuid

from dpstream.workers.localstack import create_topics

_N = 40


async def _produce(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for key, value in messages:
            await producer.send(topic, key=key, value=value)
        await producer.flush()
    finally:
        await producer.stop()


async def _consume(bootstrap: str, topic: str, want: int, limit_s: float = 60.0) -> list[tuple[int, bytes, bytes]]:
    """Read from the beginning until `want` records arrived (or the limit passed); returns (partition, key, value)."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"g-{topic}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    got: list[tuple[int, bytes, bytes]] = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while len(got) < want and loop.time() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                got.extend((r.partition, r.key, r.value) for r in records)
    finally:
        await consumer.stop()
    return got


async def _partitions(bootstrap: str, topic: str) -> set[int]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
        return {p["partition"] for p in described["partitions"]}
    finally:
        await admin.close()


def test_create_topics_is_idempotent(kafka_broker) -> None:
    """Creating a topic twice creates it once; the topic has the 4 partitions asked for."""
    name = f"idem-{uuid.uuid4().hex[:12]}"
    assert create_topics(kafka_broker.bootstrap, [name], partitions=4) == [name]
    assert create_topics(kafka_broker.bootstrap, [name], partitions=4) == []
    assert asyncio.run(_partitions(kafka_broker.bootstrap, name)) == {0, 1, 2, 3}


def test_produce_consume_round_trip(kafka_broker, kafka_topic) -> None:
    """Every produced payload is consumed exactly once, and one key's messages keep their order."""
    messages = [(f"user-{i % 5}".encode(), json.dumps({"seq": i, "user": i % 5}).encode()) for i in range(_N)]
    asyncio.run(_produce(kafka_broker.bootstrap, kafka_topic, messages))
    got = asyncio.run(_consume(kafka_broker.bootstrap, kafka_topic, _N))

    assert sorted(value for _, _, value in got) == sorted(value for _, value in messages)
    for user in range(5):
        seqs = [json.loads(v)["seq"] for _, k, v in got if k == f"user-{user}".encode()]
        assert seqs == sorted(seqs) and len(seqs) == _N // 5
    partitions_by_key = {}
    for partition, key, _ in got:
        partitions_by_key.setdefault(key, set()).add(partition)
    assert all(len(parts) == 1 for parts in partitions_by_key.values())
