"""A batch fetched before a partition's pipeline was (re)made is never fed to it (real Kafka).

The race: the ingest loop fetches records, a rebalance takes the partition and gives it back before
the loop processes them, and the new pipeline starts from the last commit, which may lie before
those records. Fed to it, they would count before the records in between, and a window could close
without those (an under-count seen once in the chaos suite). The pipeline seeks the consumer to its
own start, and the fetched records are dropped: they come again, in order.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata
from kafka import KafkaProducer

from dpstream.topology.model import Source
from dpstream.workers.ledger.testing import one_scope_topology
from dpstream.workers.runtime.ingest import IngestService, _Listener
from dpstream.workers.runtime.settings import RuntimeSettings

_T0 = 1_796_000_000


def _produce(bootstrap: str, topic: str, n: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for i in range(n):
        doc = {"user_id": f"u{i}", "ts": _T0 + i}
        producer.send(topic, json.dumps(doc).encode(), key=f"u{i}".encode(), partition=0)
    producer.flush()
    producer.close()


async def _fetch(consumer: AIOKafkaConsumer, tp: TopicPartition) -> list[Any]:
    """The next non-empty fetch of `tp`."""
    for _ in range(100):
        got = await consumer.getmany(tp, timeout_ms=200)
        if got.get(tp):
            return got[tp]
    raise AssertionError("nothing fetched in 20 s")


def test_records_fetched_before_a_pipeline_was_made_are_fetched_again_from_its_start(
    kafka_broker: Any, fresh_redis: Any
) -> None:
    topic = kafka_broker.new_topic("rebalance", partitions=1)
    _produce(kafka_broker.bootstrap, topic, 20)
    base = one_scope_topology()
    topology = replace(base, sources={"src": Source("src", topic, "user_id", timestamp="ts", keyed_by_unit=True)})
    svc = IngestService(topology, RuntimeSettings(kafka_broker.bootstrap, fresh_redis.url), offload=False)
    svc.schedule_start = _T0
    tp = TopicPartition(topic, 0)

    async def body() -> tuple[list[int], list[int], int, list[int], int]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka_broker.bootstrap,
            group_id=f"g-{topic}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        svc._consumer = consumer  # noqa: SLF001 - the service's consumer, driven step by step here
        consumer.subscribe([topic], listener=_Listener(svc))
        await consumer.start()
        try:
            made_before = dict(svc._made)  # noqa: SLF001 - the fetch-time snapshot the ingest loop takes
            first = await _fetch(consumer, tp)
            # the first fetch of a partition makes its pipeline (at the committed start: none, so 0):
            # those records were fetched before it, so they are left for the next fetch
            dropped_first = await svc._owned_work({tp: first}, made_before)  # noqa: SLF001
            made_before = dict(svc._made)  # noqa: SLF001
            again = await _fetch(consumer, tp)
            fed = await svc._owned_work({tp: again}, made_before)  # noqa: SLF001
            # now a rebalance takes the partition and gives it back while `again` (offsets 0..) is in
            # hand; meanwhile its previous owner had committed offset 7
            made_before = dict(svc._made)  # noqa: SLF001
            await svc.drop_partitions([tp])
            await consumer.commit({tp: OffsetAndMetadata(7, "")})
            stale = await svc._owned_work({tp: again}, made_before)  # noqa: SLF001
            after = await _fetch(consumer, tp)
            return (
                [r.offset for r in first] if dropped_first == [] else [],
                [r.offset for _tp, _core, recs in fed for r in recs],
                len(stale),
                [r.offset for r in after],
                svc.stale_batches,
            )
        finally:
            await consumer.stop()

    first, fed, stale, after, dropped = asyncio.run(body())
    assert first and first[0] == 0  # fetched, then dropped as older than the pipeline
    assert fed[0] == 0 and fed == list(range(len(fed)))  # fed from the pipeline's start, in order
    assert stale == 0  # the batch in hand at the rebalance is not fed to the remade pipeline (start 7)
    assert after[0] == 7  # the consumer reads again from the remade pipeline's start
    assert dropped == 2


def test_a_pipeline_made_during_a_fetch_gets_its_first_records_again(kafka_broker: Any, fresh_redis: Any) -> None:
    """The other order: the close loop makes the pipeline (and seeks to its start) while the ingest loop's
    fetch is in flight; the fetch then returns the pipeline's own first records and moves the position
    past them. Dropped as fetched before the pipeline, they must be fetched again: else they are lost
    and the first windows close without them (4 of 24 units once, in the canary e2e test under load)."""
    topic = kafka_broker.new_topic("made-mid-fetch", partitions=1)
    _produce(kafka_broker.bootstrap, topic, 20)
    base = one_scope_topology()
    topology = replace(base, sources={"src": Source("src", topic, "user_id", timestamp="ts", keyed_by_unit=True)})
    svc = IngestService(topology, RuntimeSettings(kafka_broker.bootstrap, fresh_redis.url), offload=False)
    svc.schedule_start = _T0
    tp = TopicPartition(topic, 0)

    async def body() -> tuple[list[int], int, list[int]]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka_broker.bootstrap,
            group_id=f"g-{topic}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        svc._consumer = consumer  # noqa: SLF001 - the service's consumer, driven step by step here
        consumer.subscribe([topic], listener=_Listener(svc))
        await consumer.start()
        try:
            for _ in range(100):  # wait for the assignment, as the loop's first fetch would
                if tp in consumer.assignment():
                    break
                await asyncio.sleep(0.1)
            made_before = dict(svc._made)  # noqa: SLF001 - the ingest loop's snapshot, taken before its fetch
            await svc._core(tp)  # noqa: SLF001 - the close loop makes the pipeline meanwhile (seek to 0)
            first = await _fetch(consumer, tp)  # the fetch returns the pipeline's own records 0..
            work = await svc._owned_work({tp: first}, made_before)  # noqa: SLF001
            again = await _fetch(consumer, tp)
            return [r.offset for r in first], len(work), [r.offset for r in again]
        finally:
            await consumer.stop()

    first, fed, again = asyncio.run(body())
    assert first[0] == 0 and fed == 0  # its own first records, dropped as fetched before it was made
    assert again[0] == 0 and again == list(range(len(again)))  # fetched again from its start, in order
