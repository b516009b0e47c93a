"""The declared partitioner of a keyed source matches real clients' defaults (real Kafka, real producers).

librdkafka (confluent-kafka, under its default `consistent_random`) writes into one topic, aiokafka (its
default murmur2 partitioner) into another; the records are read back as the worker reads them and go
through each partition's pipeline, with the partition count read from the topic. Under the matching
partitioner nothing is dead-lettered; under the other one exactly the records whose partition differs
are `wrong_partition`, and no record is counted away from its key's partition.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

import confluent_kafka  # test-only: the dev extra installs it (a real librdkafka client)
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import Partitioner, Topology
from dpstream.workers.pipeline import PartitionPipeline
from dpstream.workers.pipeline.colocation import partition_of
from dpstream.workers.runtime.topics import partition_count

PARTITIONS = 6
UNITS = 120

_YAML = """
version: 1
sources:
  clicks: {topic: TOPIC, privacy_unit: user_id, timestamp: ts, keyed_by_unit: true}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
metrics:
  views:
    source: clicks
    budget: b
    window: {tumbling: 1m}
    aggregate: count
    contribution: {max_per_key: 1}
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""


def _events(now: float) -> list[tuple[bytes, bytes]]:
    return [(f"user-{i}".encode(), json.dumps({"user_id": f"user-{i}", "ts": now}).encode()) for i in range(UNITS)]


def _produce_librdkafka(bootstrap: str, topic: str, events: list[tuple[bytes, bytes]]) -> None:
    """librdkafka with no partitioner setting: its default, `consistent_random`."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for key, value in events:
        producer.produce(topic, value=value, key=key)
    assert producer.flush(30) == 0


async def _produce_aiokafka(bootstrap: str, topic: str, events: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in events:
            await producer.send(topic, value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


async def _read_back(bootstrap: str, topic: str) -> dict[int, list[Any]]:
    """Every record of the topic, per partition in offset order (aiokafka ConsumerRecords, as ingest gets)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(await partition_count(bootstrap, topic))]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: dict[int, list[Any]] = {tp.partition: [] for tp in tps}
        deadline = time.monotonic() + 60
        while any(len(out[tp.partition]) < ends[tp] for tp in tps) and time.monotonic() < deadline:
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                out[tp.partition].extend(records)
        return out
    finally:
        await consumer.stop()


def _topology(topic: str, partitioner: Partitioner) -> Topology:
    base = load_topology_text(_YAML.replace("TOPIC", topic))
    return replace(base, sources={"clicks": replace(base.sources["clicks"], partitioner=partitioner)})


def _through_pipelines(
    bootstrap: str, topic: str, partitioner: Partitioner, records: dict[int, list[Any]], start: int
) -> tuple[int, set[tuple[int, int]], set[str]]:
    """(accepted, dead letters as (partition, offset), their reasons) of every partition's pipeline."""
    count = asyncio.run(partition_count(bootstrap, topic))
    topo = _topology(topic, partitioner)
    accepted, dead, reasons = 0, set(), set()
    for p, recs in records.items():
        pipe = PartitionPipeline(topo, "clicks", p, schedule_start=start, partitions=count, check_keys=True)
        out = pipe.process_batch(recs)
        accepted += pipe.counts.accepted
        dead |= {(d.partition, d.offset) for d in out.dead_letters}
        reasons |= {d.reason for d in out.dead_letters}
    return accepted, dead, reasons


def _elsewhere(records: dict[int, list[Any]], partitioner: Partitioner) -> set[tuple[int, int]]:
    """Records not in the partition `partitioner` gives their key."""
    return {
        (p, r.offset) for p, recs in records.items() for r in recs if partition_of(r.key, PARTITIONS, partitioner) != p
    }


def test_librdkafka_default_matches_crc32_and_aiokafka_default_matches_murmur2(kafka_broker: Any) -> None:
    """Each client into its partitioner's source: nothing dead-lettered; into the other's: every record
    that landed elsewhere than the other partitioner says is `wrong_partition`, the rest counted."""
    now = time.time()
    start = int(now) // 60 * 60
    events = _events(now)
    by_rdkafka = kafka_broker.new_topic("coloc-rdkafka", partitions=PARTITIONS)
    by_aiokafka = kafka_broker.new_topic("coloc-aiokafka", partitions=PARTITIONS)
    _produce_librdkafka(kafka_broker.bootstrap, by_rdkafka, events)
    asyncio.run(_produce_aiokafka(kafka_broker.bootstrap, by_aiokafka, events))
    rdkafka_records = asyncio.run(_read_back(kafka_broker.bootstrap, by_rdkafka))
    aiokafka_records = asyncio.run(_read_back(kafka_broker.bootstrap, by_aiokafka))
    assert sum(map(len, rdkafka_records.values())) == sum(map(len, aiokafka_records.values())) == UNITS

    # the clients placed the keys as the two hashes say (and the hashes disagree on most keys)
    assert _elsewhere(rdkafka_records, Partitioner.CRC32) == set()
    assert _elsewhere(aiokafka_records, Partitioner.MURMUR2) == set()
    rd_elsewhere = _elsewhere(rdkafka_records, Partitioner.MURMUR2)
    aio_elsewhere = _elsewhere(aiokafka_records, Partitioner.CRC32)
    assert len(rd_elsewhere) > UNITS // 2 and len(aio_elsewhere) > UNITS // 2

    bootstrap = kafka_broker.bootstrap
    assert _through_pipelines(bootstrap, by_rdkafka, Partitioner.CRC32, rdkafka_records, start) == (UNITS, set(), set())
    assert _through_pipelines(bootstrap, by_aiokafka, Partitioner.MURMUR2, aiokafka_records, start) == (
        UNITS,
        set(),
        set(),
    )
    assert _through_pipelines(bootstrap, by_rdkafka, Partitioner.MURMUR2, rdkafka_records, start) == (
        UNITS - len(rd_elsewhere),
        rd_elsewhere,
        {"wrong_partition"},
    )
    assert _through_pipelines(bootstrap, by_aiokafka, Partitioner.CRC32, aiokafka_records, start) == (
        UNITS - len(aio_elsewhere),
        aio_elsewhere,
        {"wrong_partition"},
    )
