"""Worker-broker clock skew on a real Kafka broker: measured by a probe's append time; closes held past the bound.

Windows close on the worker's clock while inclusion is by the broker's append time. A worker whose clock
runs ahead of the broker's by more than the close grace would read a window's end offsets before the
broker reaches its close time C(w), and a record appended after that read but stamped before C(w) would
be counted late: its inclusion would depend on when the worker read. The worker's clock is shifted here
(injected), the broker's is the machine's.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import replace
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Sinks, Source
from dpstream.workers.ledger.testing import one_scope_topology
from dpstream.workers.runtime.admin import create_topics
from dpstream.workers.runtime.clock_skew import probe_skew
from dpstream.workers.runtime.ingest import IngestService
from dpstream.workers.runtime.settings import RuntimeSettings
from dpstream.workers.runtime.topics import APPEND_TIME, CREATE_TIME, ensure_topics

WINDOW_S = 2


async def _probe(bootstrap: str, topic: str, offset_s: float) -> Any:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        return await probe_skew(producer, topic, lambda: time.time() + offset_s)
    finally:
        await producer.stop()


def test_a_probe_reading_brackets_a_worker_clock_five_seconds_ahead(kafka_broker: Any) -> None:
    """A worker clock 5 s ahead of the broker's reads as skew −5 s, within the reading's uncertainty."""
    topic = f"probe-{uuid.uuid4().hex[:10]}"
    create_topics(kafka_broker.bootstrap, [topic], 1, configs={topic: APPEND_TIME})
    reading = asyncio.run(_probe(kafka_broker.bootstrap, topic, 5.0))
    # the broker stamped the probe between send and ack; both clocks are this machine's, 5 s apart
    assert reading.skew_s - reading.uncertainty_s <= -5.0 <= reading.skew_s + reading.uncertainty_s
    assert reading.worst_s > 0.5


def test_a_probe_topic_without_broker_times_is_refused(kafka_broker: Any) -> None:
    """A CreateTime probe topic carries no broker time: one line naming the setting and the fix."""
    topic = f"probe-{uuid.uuid4().hex[:10]}"
    create_topics(kafka_broker.bootstrap, [topic], 1, configs={topic: CREATE_TIME})
    with pytest.raises(ConfigError, match=r"message.timestamp.type is CreateTime.*=LogAppendTime`"):
        asyncio.run(_probe(kafka_broker.bootstrap, topic, 0.0))


def test_closes_are_held_while_the_worker_clock_runs_ahead_so_no_record_is_counted_late(
    kafka_broker: Any, fresh_redis: Any
) -> None:
    """With the worker's clock 5 s ahead, a window whose C(w) passed on the worker's clock but not on the
    broker's is not closed; a record appended before C(w) then counts in it once the clocks agree again
    (without the hold the window closed at once and the record was counted late)."""
    prefix = f"skew-{uuid.uuid4().hex[:10]}"
    now = time.time()
    base = one_scope_topology(metrics=(("m", 1.0, WINDOW_S, WINDOW_S, False),))
    topology = replace(
        base,
        sources={"src": Source("src", f"{prefix}.events", "user_id", timestamp="ts", keyed_by_unit=True)},
        sinks=Sinks(f"{prefix}.releases", f"{prefix}.dead"),
        schedule_start=int(now) // WINDOW_S * WINDOW_S - 4 * WINDOW_S,
    )
    ensure_topics(kafka_broker.bootstrap, topology, partitions=1)
    offset = [5.0]
    settings = RuntimeSettings(
        kafka_broker.bootstrap, fresh_redis.url, close_interval_s=3600.0, clock_probe_interval_s=3600.0
    )
    svc = IngestService(topology, settings, offload=False, clock=lambda: time.time() + offset[0])

    async def body() -> tuple[int, int, int, float]:
        await svc.start()
        try:
            assert svc._consumer is not None  # noqa: SLF001 - started above
            for _ in range(300):  # the group's first assignment
                if svc._consumer.assignment():  # noqa: SLF001
                    break
                await asyncio.sleep(0.1)
            reading = svc.clock_skew.last
            assert reading is not None
            t1 = time.time()
            event_time = t1 + 2.5  # its window ends in (t1 + 2.5, t1 + 4.5]: "closed" on a clock 5 s ahead
            async with svc._lock:  # noqa: SLF001 - one close round, as the close loop runs it
                await svc._close_due()  # noqa: SLF001
            producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
            await producer.start()
            try:
                doc = {"user_id": "u1", "ts": event_time}
                appended = await producer.send_and_wait(f"{prefix}.events", json.dumps(doc).encode(), key=b"u1")
            finally:
                await producer.stop()
            assert appended.timestamp / 1000 < event_time  # appended before its window's end, on the broker
            offset[0] = 0.0  # the worker's clock is put right; the next reading lets closes go ahead
            await svc.measure_clock_skew()
            await asyncio.sleep(max(0.0, event_time + WINDOW_S + settings.close_grace_s - time.time()))
            for _ in range(300):  # wait for the record to be consumed
                if svc.stats.events >= 1:
                    break
                await asyncio.sleep(0.1)
            async with svc._lock:  # noqa: SLF001
                await svc._close_due()  # noqa: SLF001
            counts = svc.pipelines()[0].refresh_counts()
            return counts.accepted, counts.late, svc.clock_skew.holds, reading.skew_s
        finally:
            await svc.stop()

    accepted, late, holds, skew = asyncio.run(body())
    assert (accepted, late) == (1, 0)
    assert skew < -4.0  # the start's reading saw the worker 5 s ahead
    assert holds >= 1  # the first close round was held
