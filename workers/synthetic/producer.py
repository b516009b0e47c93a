"""Send synthetic events to a source topic at a steady rate (aiokafka), key = privacy unit."""

from __future__ import annotations

__all__ = ["Observer", "ProduceStats", "produce", "produce_async", "send_all"]

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dpstream.workers.synthetic.generator import EventGenerator, SyntheticEvent

_TICK_S = 0.1

Observer = Callable[[list[SyntheticEvent], float], None]
"""observe(events, acked_at): one tick's events, once the broker acknowledged them (wall-clock seconds)."""


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
    observe: Observer | None = None,
) -> ProduceStats:
    """Send `rate` events per second for `duration_s` seconds (or until `stop` is set).

    Every tick's events carry the event time of their sending: the wall clock (× the generator's
    speed-up from its start), so a live worker sees them on time however the tick ran. `observe`,
    if given, gets each tick's events and the wall-clock time by which the broker had them.
    """
    from aiokafka import AIOKafkaProducer

    total = int(rate * duration_s)
    config = generator.config
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=10, acks=1)
    await producer.start()
    sent = malformed = 0
    first_ts = last_ts = None
    started = time.monotonic()
    origin = config.start_ts if config.start_ts is not None else time.time()
    try:
        while sent < total and not (stop is not None and stop.is_set()):
            elapsed = time.monotonic() - started
            due = min(total, int((elapsed + _TICK_S) * rate))
            if due > sent:
                events = generator.events_at(due - sent, origin + elapsed * config.speedup)
                topic = generator.source.topic
                pending = [await producer.send(topic, event.value, key=event.key) for event in events]
                await asyncio.gather(*pending)
                if observe is not None:
                    observe(events, time.time())
                sent += len(events)
                malformed += sum(event.malformation is not None for event in events)
                first_ts = events[0].ts if first_ts is None else first_ts
                last_ts = events[-1].ts
            await asyncio.sleep(_TICK_S)
        await producer.flush()
    finally:
        await producer.stop()
    return ProduceStats(sent, malformed, time.monotonic() - started, first_ts, last_ts)


def produce(bootstrap: str, generator: EventGenerator, rate: float, duration_s: float) -> ProduceStats:
    """Sync form of `produce_async`."""
    return asyncio.run(produce_async(bootstrap, generator, rate, duration_s))
