"""The hot path: an aiokafka consumer-group member, run as a service inside the Faust worker.

It fetches batches (`getmany`), hands each partition's records to that partition's processor (the
Kafka-free core: validate, bound, window, aggregate), sends dead letters and window partials, waits
for their acks, and only then commits each partition's `safe_offset()` — never past the first event
of a window not yet emitted there, so a restarted or rebalanced worker rebuilds open windows by replay.
Per-event work is the core's few dict updates; Faust's per-event machinery is not on this path.
"""

from __future__ import annotations

__all__ = ["IngestService", "IngestStats"]

import asyncio
import gc
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import OffsetAndMetadata
from mode import Service

from topology.model import Source, Topology
from workers.runtime.core import PartitionCore, ProcessorOutput, new_partition_core
from workers.runtime.settings import RuntimeSettings
from workers.runtime.topics import ingest_topic

_log = logging.getLogger(__name__)

GC_YOUNG_THRESHOLD = 100_000
"""Container allocations between young-generation collections in an ingest process (default 700)."""


@dataclass
class IngestStats:
    """Counters of what this worker's ingest saw (no raw values, no per-user detail)."""

    events: int = 0
    batches: int = 0
    dead_letters: int = 0
    partials: int = 0
    commits: int = 0
    revoked: int = 0
    assigned: int = 0
    busy_s: float = 0.0
    per_partition_events: dict[str, int] = field(default_factory=dict)


class _Listener(ConsumerRebalanceListener):
    """Drops the state of revoked partitions; assigned partitions resume from their committed offsets."""

    def __init__(self, service: IngestService) -> None:
        self._service = service

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self._service.drop_partitions(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self._service.stats.assigned += len(assigned)


class IngestService(Service):
    """Batch consumer of every source of a topology; one processor per assigned source partition."""

    def __init__(
        self,
        topology: Topology,
        settings: RuntimeSettings,
        core_factory: Callable[[Topology, Source, str, int], PartitionCore] = new_partition_core,
        *,
        offload: bool = True,
        **kwargs: object,
    ) -> None:
        self.topology = topology
        self.settings = settings
        self.stats = IngestStats()
        self._core_factory = core_factory
        self._by_topic = {ingest_topic(s): s for s in topology.sources.values()}
        self._cores: dict[TopicPartition, PartitionCore] = {}
        self._committed: dict[TopicPartition, int] = {}
        """Last offset this worker committed per owned partition (an unchanged safe offset is not re-sent)."""
        self._lock = asyncio.Lock()
        self._offload = offload
        """Process batches on a thread, for a process that also runs the release agent."""
        self._max_records = settings.batch_max_records if not offload else settings.shared_batch_max_records
        """Records per fetch; smaller when the release agent shares the loop, because aiokafka decodes a
        fetched batch on the event loop and a release waits behind that."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpstream-ingest")
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        super().__init__(**kwargs)

    async def on_start(self) -> None:
        # Hand the GIL back to the event loop every 0.5 ms (default 5 ms) while the ingest thread
        # crunches a batch: a release's ledger/producer round trips then wait ≈ 0.5 ms, not 5.
        if self._offload:
            sys.setswitchinterval(0.0005)
        # Every event allocates a few short-lived containers (the decoded object, key tuples) that
        # reference counting frees; with the default threshold (700) the cyclic collector still runs
        # every few hundred events. Rarer young-generation runs: about 11 % less CPU per event.
        gc.freeze()
        gc.set_threshold(GC_YOUNG_THRESHOLD, 50, 100)
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.bootstrap, linger_ms=2, acks="all", enable_idempotence=True
        )
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.bootstrap,
            group_id=f"{self.settings.group_id(self.topology)}-ingest",
            client_id=f"dpstream-ingest-{self.settings.worker_id}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=4 * 1024 * 1024,
            fetch_max_bytes=32 * 1024 * 1024,
            fetch_max_wait_ms=self.settings.fetch_timeout_ms,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=1_000,
            max_poll_interval_ms=300_000,
        )
        self._consumer.subscribe(list(self._by_topic), listener=_Listener(self))
        await self._consumer.start()
        self.add_future(self._consume_forever())
        self.add_future(self._idle_forever())

    async def on_stop(self) -> None:
        async with self._lock:
            if self._consumer is not None:
                await self._consumer.stop()
            if self._producer is not None:
                await self._producer.stop()
        self._executor.shutdown(wait=True)

    async def drop_partitions(self, revoked: list[TopicPartition]) -> None:
        """Forget the windows of partitions this worker no longer owns (their new owner replays them)."""
        async with self._lock:
            for tp in revoked:
                self._committed.pop(tp, None)
                if self._cores.pop(tp, None) is not None:
                    self.stats.revoked += 1

    async def _consume_forever(self) -> None:
        assert self._consumer is not None
        while not self.should_stop:
            try:
                batches = await self._consumer.getmany(
                    timeout_ms=self.settings.fetch_timeout_ms, max_records=self._max_records
                )
            except (KafkaError, IllegalStateError) as exc:
                if self.should_stop:
                    return
                _log.warning("ingest: fetch failed (%s); retrying", type(exc).__name__)
                await asyncio.sleep(0.5)
                continue
            if not batches:
                continue
            async with self._lock:
                owned = self._consumer.assignment()
                work = [(tp, self._core(tp), records) for tp, records in batches.items() if tp in owned and records]
                if self._offload:
                    # The batch runs on the ingest thread: the event loop stays free for the release
                    # agent's ledger and producer round trips, so a big batch does not delay a release.
                    outputs = await asyncio.get_running_loop().run_in_executor(self._executor, self._process, work)
                else:  # ingest-only process: nothing else waits on this loop
                    outputs = self._process(work)
                await self._flush(outputs)

    def _process(
        self, work: list[tuple[TopicPartition, PartitionCore, list]]
    ) -> list[tuple[TopicPartition, ProcessorOutput]]:
        """Feed each partition's batch to its core (on the ingest thread, under the ingest lock)."""
        started = time.thread_time()
        outputs = []
        for tp, core, records in work:
            outputs.append((tp, core.process(records)))
            self.stats.events += len(records)
            self.stats.batches += 1
        self.stats.busy_s += time.thread_time() - started
        return outputs

    async def _idle_forever(self) -> None:
        while not self.should_stop:
            await self.sleep(self.settings.idle_interval_s)
            if self._consumer is None:
                continue
            async with self._lock:
                now = time.time()
                owned = self._consumer.assignment()
                for tp in owned:
                    if tp not in self._cores and tp.topic in self._by_topic:
                        self._core(tp)  # a partition that never saw an event still has windows to close
                outputs = [(tp, core.advance_idle(now)) for tp, core in self._cores.items() if tp in owned]
                await self._flush(outputs)

    def _core(self, tp: TopicPartition) -> PartitionCore:
        core = self._cores.get(tp)
        if core is None:
            source = self._by_topic[tp.topic]
            core = self._cores[tp] = self._core_factory(self.topology, source, tp.topic, tp.partition)
        return core

    async def _flush(self, outputs: list[tuple[TopicPartition, ProcessorOutput]]) -> None:
        """Send dead letters and partials, wait for every ack, then commit each partition's safe offset."""
        assert self._producer is not None and self._consumer is not None
        sends = []
        sinks = self.topology.sinks
        for _tp, out in outputs:
            for value in out.dead_letters:
                sends.append(await self._producer.send(sinks.dead_letter, value))
            for metric, value in out.partials:
                sends.append(await self._producer.send(sinks.partials_topic, value, key=metric.encode()))
            self.stats.dead_letters += len(out.dead_letters)
            self.stats.partials += len(out.partials)
        if sends:
            await asyncio.gather(*sends)
        offsets = {}
        for tp, _out in outputs:
            safe = self._cores[tp].safe_offset() if tp in self._cores else None
            if safe is not None and safe != self._committed.get(tp):
                offsets[tp] = OffsetAndMetadata(safe, "")
        if offsets:  # the safe offset only moves when a window is emitted: most batches commit nothing
            try:
                await self._consumer.commit(offsets)
                self.stats.commits += 1
                self._committed.update((tp, meta.offset) for tp, meta in offsets.items())
            except (CommitFailedError, IllegalStateError, KafkaError) as exc:
                # a rebalance took these partitions: their new owner replays from the last good commit
                _log.info("ingest: commit skipped (%s); the partition's new owner replays", type(exc).__name__)
