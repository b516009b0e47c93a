"""Send synthetic events to a source topic at a steady rate (aiokafka), key = privacy unit."""

from __future__ import annotations

__all__ = ["ProduceStats", "produce", "produce_async", "send_all"]

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass

from dpstream.workers.synthetic.generator import EventGenerator, SyntheticEvent

_TICK_S = 0.1


@dataclass(frozen=True)
class ProduceStats:
    """What one produce run sent."""

    events: int
    malformed: int
    seconds: float
    first_ts: float | None
    last_ts: float | None


async def send_all(bootstrap: str, topic: str, events: Iterable[SyntheticEvent], chunk: int = 5000) -> int:
    """Send every event as fast as the producer goes (pre-loading benchmarks and tests); returns the count."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=256 * 1024, acks=1)
    await producer.start()
    sent = 0
    try:
        pending = []
        for event in events:
            pending.append(await producer.send(topic, event.value, key=event.key))
            sent += 1
            if len(pending) >= chunk:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        await producer.flush()
    finally:
        await producer.stop()
    return sent


async def produce_async(
    bootstrap: str,
    generator: EventGenerator,
    rate: float,
    duration_s: float,
    stop: asyncio.Event | None = None,
) -> ProduceStats:
    """Send `rate` events per second for `duration_s` seconds (or until `stop` is set)."""
    from aiokafka import AIOKafkaProducer

    total = int(rate * duration_s)
    events = generator.events(total, rate=rate)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=10, acks=1)
    await producer.start()
    sent = malformed = 0
    first_ts = last_ts = None
    started = time.monotonic()
    try:
        while sent < total and not (stop is not None and stop.is_set()):
            due = min(total, int((time.monotonic() - started + _TICK_S) * rate))
            pending = []
            while sent < due:
                event = next(events)
                pending.append(await producer.send(generator.source.topic, event.value, key=event.key))
                sent += 1
                malformed += event.malformation is not None
                first_ts = event.ts if first_ts is None else first_ts
                last_ts = event.ts
            if pending:
                await asyncio.gather(*pending)
            await asyncio.sleep(_TICK_S)
        await producer.flush()
    finally:
        await producer.stop()
    return ProduceStats(sent, malformed, time.monotonic() - started, first_ts, last_ts)


def produce(bootstrap: str, generator: EventGenerator, rate: float, duration_s: float) -> ProduceStats:
    """Sync form of `produce_async`."""
    return asyncio.run(produce_async(bootstrap, generator, rate, duration_s))
