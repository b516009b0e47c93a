"""The release side: a Faust agent on the partials topic (keyed by metric: one owner per metric).

Partials of a window are merged in a changelogged Table (deduped by source partition, so replayed
partials change nothing). When every source partition has reported — or at the deadline — the
core's Releaser computes the aggregate, draws noise, reserves with the ledger and publishes the
stored record (idempotent producer, key = release_id). Deadline checks arrive as tick messages on
the same topic because a Faust Table can only be written while iterating its stream.
"""

from __future__ import annotations

__all__ = ["ReleaseSide", "TICK_PREFIX"]

import asyncio
import base64
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import faust
from aiokafka import AIOKafkaProducer

from topology.model import Topology
from workers.runtime import _core_adapter as core
from workers.runtime.settings import RuntimeSettings

_log = logging.getLogger(__name__)

TICK_PREFIX = b"dpstream-tick:"
"""Value prefix of deadline-check messages on the partials topic (never a valid partial)."""


@dataclass
class ReleaseStats:
    """Counters of the release side (close→publish latencies in seconds, for the benchmark)."""

    partials: int = 0
    duplicates: int = 0
    released: int = 0
    by_deadline: int = 0
    latencies: list[float] = field(default_factory=list)


class ReleaseSide:
    """Agent, table, tick and sweeper timers of one Faust app, bound to one releaser (ledger inside)."""

    def __init__(self, app: faust.App, topology: Topology, settings: RuntimeSettings, expected: dict[str, int]) -> None:
        self.app = app
        self.topology = topology
        self.settings = settings
        self.stats = ReleaseStats()
        self._expected = expected  # metric → number of source partitions that report partials
        self._releaser: Any = None
        self._producer: AIOKafkaProducer | None = None
        self.topic = app.topic(
            topology.sinks.partials_topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
        )
        self.table = app.Table("dpstream-partials", default=None, partitions=settings.partitions, value_serializer="json")
        app.agent(self.topic, name="dpstream-release")(self._agent)
        app.timer(1.0, name="dpstream-deadline-tick")(self._tick)
        app.timer(settings.sweep_interval_s, name="dpstream-sweeper")(self._sweep)

    async def start(self) -> None:
        """Open the idempotent releases producer and the releaser (ledger connection)."""
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.bootstrap, enable_idempotence=True, acks="all", linger_ms=0
        )
        await self._producer.start()
        self._releaser = await asyncio.to_thread(core.make_releaser, self.topology, self.settings.redis_url)

    async def stop(self) -> None:
        """Close the producer and the releaser."""
        if self._producer is not None:
            await self._producer.stop()
        if self._releaser is not None:
            await asyncio.to_thread(core.close_releaser, self._releaser)

    async def _agent(self, stream: faust.StreamT) -> None:
        async for event in stream.events():
            value = event.value
            if value.startswith(TICK_PREFIX):
                await self._on_tick(event.key.decode(), float(value[len(TICK_PREFIX):]))
            else:
                await self._on_partial(value, event.message.timestamp)

    async def _on_partial(self, value: bytes, sent_at: float) -> None:
        info = core.partial_info(value)
        key = f"{info.metric}|{info.start}|{info.end}"
        entry = self.table.get(key) or {"parts": {}, "first": time.time(), "released": False}
        part = str(info.partition)
        if entry["released"] or part in entry["parts"]:
            self.stats.duplicates += 1
            return
        self.stats.partials += 1
        entry["parts"][part] = base64.b64encode(value).decode("ascii")
        entry["closed_at"] = max(entry.get("closed_at", 0.0), sent_at)  # producer time of the partial
        if len(entry["parts"]) >= self._expected.get(info.metric, 1):
            await self._release(key, entry, by_deadline=False)
        self.table[key] = entry

    async def _on_tick(self, metric: str, now: float) -> None:
        for key, entry in list(self.table.items()):
            if not key.startswith(metric + "|") or not entry or entry["released"]:
                continue
            if now - entry["first"] >= self.settings.deadline_s:
                await self._release(key, entry, by_deadline=True)
                self.table[key] = entry

    async def _release(self, key: str, entry: dict[str, Any], by_deadline: bool) -> None:
        """Merge, quote, noise, reserve, publish, commit (the core's Releaser); mark the entry released."""
        partials = [base64.b64decode(v) for v in entry["parts"].values()]
        loop = asyncio.get_running_loop()
        published = await asyncio.to_thread(core.release_window, self._releaser, self.topology, partials, self._publisher(loop))
        entry["released"] = True
        entry["parts"] = {}
        self.stats.released += 1
        self.stats.by_deadline += by_deadline
        if published and entry.get("closed_at"):
            self.stats.latencies.append(max(0.0, time.time() - entry["closed_at"]))

    def _publisher(self, loop: asyncio.AbstractEventLoop):  # noqa: ANN202 - sync callable for the releaser thread
        producer = self._producer
        topic = self.topology.sinks.releases

        def publish(release_id: str, payload: bytes) -> None:
            assert producer is not None
            future = asyncio.run_coroutine_threadsafe(
                producer.send_and_wait(topic, payload, key=release_id.encode()), loop
            )
            future.result(timeout=30)

        return publish

    async def _tick(self) -> None:
        """Ask each metric's owner to check its deadlines (ticks ride the metric's partition)."""
        if self._producer is None:
            return
        now = f"{time.time():.3f}".encode()
        for metric in self.topology.metrics:
            await self._producer.send(self.topology.sinks.partials_topic, TICK_PREFIX + now, key=metric.encode())

    async def _sweep(self) -> None:
        """Republish reserved-but-unpublished releases with their stored bytes."""
        if self._releaser is None:
            return
        loop = asyncio.get_running_loop()
        try:
            await asyncio.to_thread(core.sweep, self._releaser, self.settings.sweep_age_s, self._publisher(loop))
        except Exception as exc:  # noqa: BLE001 - the sweeper retries next round; never crash the worker
            _log.warning("sweeper: round failed (%s); retrying", type(exc).__name__)


