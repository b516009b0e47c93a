"""The release side: a Faust agent on the partials topic (keyed by metric: one owner per metric).

Each metric's `PartialMerger` state lives in a changelogged Table (one key per metric), so a
rebalanced or restarted owner resumes it; partials are deduped by (window, partition), so replayed
partials change nothing. A merged window goes to the core's `Releaser` (quote → noise → reserve →
publish the stored bytes with key = release_id on an idempotent producer → commit). Deadline checks
arrive as tick messages on the same topic, because a Faust Table is only written while iterating
its stream. A sweeper timer republishes reserved-but-unpublished records with their stored bytes.
"""

from __future__ import annotations

__all__ = ["ReleaseSide", "ReleaseStats", "TICK_PREFIX", "FAULT_ENV"]

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import faust
from aiokafka import AIOKafkaProducer

from topology.model import Topology
from workers.pipeline.merger import MergedWindow, PartialMerger
from workers.pipeline.partials import WindowPartial
from workers.release import Releaser, ReleaseResult, sweep
from workers.runtime.settings import RuntimeSettings

_log = logging.getLogger(__name__)

TICK_PREFIX = b"dpstream-tick:"
"""Value prefix of deadline-check messages on the partials topic (never a valid partial)."""

FAULT_ENV = "DPSTREAM_FAULT"
"""Test hook: `kill_before_publish` makes the worker SIGKILL itself after a reserve, before publishing."""


@dataclass
class ReleaseStats:
    """Counters of the release side; close→publish latencies (seconds) feed the benchmark."""

    partials: int = 0
    released: int = 0
    by_deadline: int = 0
    failed: int = 0
    latencies: list[float] = field(default_factory=list)
    last: list[ReleaseResult] = field(default_factory=list)


class ReleaseSide:
    """Agent, table, tick and sweeper timers of one Faust app, bound to one ledger."""

    def __init__(self, app: faust.App, topology: Topology, settings: RuntimeSettings, partitions: dict[str, int]) -> None:
        self.app = app
        self.topology = topology
        self.settings = settings
        self.stats = ReleaseStats()
        self._partitions = partitions  # metric → number of source partitions that report partials
        self._ledger: Any = None
        self._releaser: Releaser | None = None
        self._producer: AIOKafkaProducer | None = None
        self._closed_at: dict[tuple[str, int], float] = {}
        self.topic = app.topic(
            topology.sinks.partials_topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
        )
        self.table = app.Table("dpstream-mergers", default=None, partitions=settings.partitions)
        app.agent(self.topic, name="dpstream-release")(self._agent)
        app.timer(1.0, name="dpstream-deadline-tick")(self._tick)
        app.timer(settings.sweep_interval_s, name="dpstream-sweeper")(self._sweep)

    async def start(self) -> None:
        """Open the idempotent releases producer and the ledger (fails closed if Redis is unusable)."""
        from workers.ledger import open_ledger

        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.bootstrap, enable_idempotence=True, acks="all", linger_ms=0
        )
        await self._producer.start()
        self._ledger = await open_ledger(self.settings.redis_url, self.topology, actor=self.settings.worker_id)
        self._releaser = Releaser(self.topology, self._ledger)

    async def stop(self) -> None:
        """Close the producer and the ledger."""
        if self._producer is not None:
            await self._producer.stop()
        if self._ledger is not None:
            await self._ledger.close()

    @property
    def releaser(self) -> Releaser | None:
        """The releaser (its `counts` hold outcomes by kind)."""
        return self._releaser

    async def _agent(self, stream: faust.StreamT) -> None:
        async for event in stream.events():
            metric = event.key.decode()
            if metric not in self.topology.metrics:
                continue
            merger = self._merger(metric)
            value: bytes = event.value
            now = time.time()
            if value.startswith(TICK_PREFIX):
                ready = merger.expire(now)
                self.stats.by_deadline += len(ready)
            else:
                partial = WindowPartial.from_bytes(value)
                self.stats.partials += 1
                key = (metric, partial.start)
                self._closed_at[key] = max(self._closed_at.get(key, 0.0), event.message.timestamp)
                ready = merger.add(partial, now)
            if not ready and not value.startswith(TICK_PREFIX):
                self.table[metric] = merger.to_state()
                continue
            for merged in ready:
                await self._release(merged)
            self.table[metric] = merger.to_state()

    def _merger(self, metric: str) -> PartialMerger:
        parts = range(self._partitions.get(metric, 1))
        state = self.table.get(metric)
        if state is None:
            return PartialMerger(metric, parts, self.settings.deadline_s)
        return PartialMerger.from_state(metric, parts, state, self.settings.deadline_s)

    async def _release(self, merged: MergedWindow) -> None:
        assert self._releaser is not None
        try:
            result = await self._releaser.release_merged(merged, self._publish_release)
        except Exception as exc:  # noqa: BLE001 - fail closed: counted, the window is not retried with new noise
            self.stats.failed += 1
            _log.error("release of %s [%d, %d) failed: %s", merged.metric, merged.start, merged.end, type(exc).__name__)
            return
        self.stats.released += 1
        _log.info("release %s [%d, %d): %s %s", merged.metric, merged.start, merged.end, result.outcome.value, result.reason)
        self.stats.last.append(result)
        del self.stats.last[:-100]
        closed = self._closed_at.pop((merged.metric, merged.start), None)
        if result.payload and closed:
            self.stats.latencies.append(max(0.0, time.time() - closed))

    async def _publish_release(self, value: bytes, key: bytes) -> None:
        if os.environ.get(FAULT_ENV) == "kill_before_publish":
            os.kill(os.getpid(), signal.SIGKILL)
        await self._publish(value, key)

    async def _publish(self, value: bytes, key: bytes) -> None:
        assert self._producer is not None
        await self._producer.send_and_wait(self.topology.sinks.releases, value, key=key)

    async def _tick(self) -> None:
        """Ask each metric's owner to check its deadlines (ticks ride the metric's partition)."""
        if self._producer is None:
            return
        now = f"{time.time():.3f}".encode()
        for metric in self.topology.metrics:
            await self._producer.send(self.topology.sinks.partials_topic, TICK_PREFIX + now, key=metric.encode())

    async def _sweep(self) -> None:
        """Republish reserved-but-unpublished releases with their stored bytes."""
        if self._ledger is None or self._releaser is None:
            return
        try:
            await sweep(self._ledger, self._publish, self.settings.sweep_age_s, self._releaser.counts)
        except Exception as exc:  # noqa: BLE001 - the sweeper retries next round; never crash the worker
            _log.warning("sweeper: round failed (%s); retrying", type(exc).__name__)
