"""The hot path: an aiokafka consumer-group member, run as a service inside the Faust worker.

It fetches batches (`getmany`), hands each partition's records to that partition's pipeline (the
Kafka-free core: validate, bound, window, aggregate), sends dead letters and window partials, waits
for their acks, and only then commits each partition's `safe_offset()` with the pipeline's progress
(the next window of each metric) as the commit's metadata — never past the first event of a window
not yet emitted there, so a restarted or rebalanced worker rebuilds the same open windows by replay.

Windows close by arrival, not by event time (see dpstream.topology, rule 1): once a window's close time C(w) has
passed on the wall clock, the partition's end offset is read; when consumption reaches it, every
record appended up to that read is in and the window's partial goes out, empty or not. For a
repartitioned source the end offset of the by-unit topic is read only after the hop's committed
offsets have reached the source topic's end offsets read at that time, so every source record
appended by then has been copied (with its source append time) first.
Per-event work is the core's few dict updates; Faust's per-event machinery is not on this path.
"""

from __future__ import annotations

__all__ = ["IngestService", "IngestStats"]

import asyncio
import contextlib
import gc
import json
import logging
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import OffsetAndMetadata
from mode import Service

from dpstream.topology.model import Topology
from dpstream.topology.periods import period_start
from dpstream.topology.schedule import Schedule
from dpstream.workers.pipeline.counters import EventCounts
from dpstream.workers.pipeline.partition import PartitionPipeline
from dpstream.workers.pipeline.window_caps import CountDelta
from dpstream.workers.runtime.clock_skew import ClockSkewGate, measure
from dpstream.workers.runtime.core import ProcessorOutput, to_output
from dpstream.workers.runtime.ledger_wait import open_ledger_waiting
from dpstream.workers.runtime.schedule import resolve_schedule_start
from dpstream.workers.runtime.settings import RuntimeSettings
from dpstream.workers.runtime.topics import clock_probe_topic, ingest_topic, partition_count, timestamp_rules
from dpstream.workers.runtime.window_counts import capped_sources, counts_topic, delta_key, read_deltas
from dpstream.workers.telemetry.worker import fold_event_counts

_log = logging.getLogger(__name__)

_COUNT_KEY = "#partitions"
"""Commit-metadata key of the partition count a pipeline checked keys against (never a metric name)."""


class _Refused(Exception):
    """A partition whose topic's partition count is not the one its pipeline was (or would be) made for."""


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
    """Batch consumer of every source of a topology; one pipeline per assigned source partition."""

    def __init__(
        self,
        topology: Topology,
        settings: RuntimeSettings,
        *,
        offload: bool = True,
        clock: Callable[[], float] = time.time,
        **kwargs: Any,
    ) -> None:
        """`clock`: the worker's wall clock, that windows close on (injectable for tests)."""
        self.topology = topology
        self.settings = settings
        self.stats = IngestStats()
        self._by_topic = {ingest_topic(s): s for s in topology.sources.values()}
        self._hop_of = {ingest_topic(s): s.topic for s in topology.sources.values() if ingest_topic(s) != s.topic}
        """by-unit topic → the source topic the repartition hop copies into it."""
        self._cores: dict[TopicPartition, PartitionPipeline] = {}
        self.revoked_counts: dict[str, EventCounts] = {}
        """source → event counts of the partitions revoked from this worker (metrics stay monotone)."""
        self.hop_counts: dict[str, EventCounts] = {}
        """source → events the repartition hop dead-lettered itself (no usable unit to hash)."""
        self._committed: dict[TopicPartition, tuple[int, str]] = {}
        """Last (offset, metadata) committed per owned partition (an unchanged pair is not re-sent)."""
        self._counts: dict[str, int] = {}
        """Partitions of each ingest topic when this worker started, read from its metadata (every partial
        carries it; a keyed source's keys are checked against it)."""
        self._refused: set[TopicPartition] = set()
        """Partitions left unread because their topic's partition count changed (logged once each)."""
        self._warned: set[str] = set()
        self._timestamp_rules = timestamp_rules(topology)
        self._clock = clock
        self.clock_skew = ClockSkewGate.for_interval(settings.max_clock_skew_s, settings.clock_probe_interval_s)
        """Holds window closes while the worker-broker clock skew is unknown or past its bound."""
        self._holding = False
        self._probe_topic = clock_probe_topic(topology)
        self.schedule_start: int | None = None
        self._lock = asyncio.Lock()
        self._made: dict[TopicPartition, int] = {}
        """When each partition's pipeline was made (a sequence number): records fetched before it are not its."""
        self._made_seq = 0
        self.stale_batches = 0
        """Fetched partition batches dropped because their partition's pipeline was (re)made after the fetch."""
        self._offload = offload
        """Process batches on a thread, for a process that also runs the release agent."""
        self._max_records = settings.batch_max_records if not offload else settings.shared_batch_max_records
        """Records per fetch; smaller when the release agent shares the loop, because aiokafka decodes a
        fetched batch on the event loop and a release waits behind that."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpstream-ingest")
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._ends: AIOKafkaConsumer | None = None
        """A group-less client that reads the source topics' end offsets for the repartition check."""
        self._capped = capped_sources(topology)
        """Sources with a period-bounded metric: their pipelines persist state deltas and read them back."""
        self._counts_topic = counts_topic(topology)
        self._deltas: AIOKafkaConsumer | None = None
        """A group-less client that reads state deltas back when a period-bounded source's partition resumes."""
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
        self.schedule_start = await open_ledger_waiting(
            lambda: resolve_schedule_start(self.topology, self.settings.redis_url), "ingest start"
        )
        for topic in self._by_topic:
            self._counts[topic] = await partition_count(self.settings.bootstrap, topic, self.settings.kafka_security)
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.bootstrap,
            linger_ms=2,
            acks="all",
            enable_idempotence=True,
            **self.settings.kafka_options(),
        )
        await self._producer.start()
        await self.measure_clock_skew()
        if self._hop_of:
            self._admin = AIOKafkaAdminClient(
                bootstrap_servers=self.settings.bootstrap, **self.settings.kafka_options()
            )
            await self._admin.start()
            self._ends = AIOKafkaConsumer(
                bootstrap_servers=self.settings.bootstrap, enable_auto_commit=False, **self.settings.kafka_options()
            )
            await self._ends.start()
        if self._capped:
            self._deltas = AIOKafkaConsumer(
                bootstrap_servers=self.settings.bootstrap, enable_auto_commit=False, **self.settings.kafka_options()
            )
            await self._deltas.start()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.bootstrap,
            group_id=f"{self.settings.group_id(self.topology)}-ingest",
            client_id=f"dpstream-ingest-{self.settings.worker_id}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=4 * 1024 * 1024,
            fetch_max_bytes=32 * 1024 * 1024,
            fetch_max_wait_ms=self.settings.fetch_timeout_ms,
            **self.settings.group_timeouts(),
            **self.settings.kafka_options(),
            max_poll_interval_ms=300_000,
        )
        self._consumer.subscribe(list(self._by_topic), listener=_Listener(self))
        await self._consumer.start()
        self.add_future(self._consume_forever())
        self.add_future(self._close_forever())
        self.add_future(self._probe_forever())

    async def on_stop(self) -> None:
        async with self._lock:
            for client in (self._consumer, self._producer, self._ends, self._deltas):
                if client is not None:
                    await client.stop()
            if self._admin is not None:
                await self._admin.close()
        self._executor.shutdown(wait=True)

    async def drop_partitions(self, revoked: list[TopicPartition]) -> None:
        """Forget the windows of partitions this worker no longer owns (their new owner replays them)."""
        async with self._lock:
            for tp in revoked:
                self._committed.pop(tp, None)
                self._made.pop(tp, None)
                core = self._cores.pop(tp, None)
                if core is not None:
                    self.stats.revoked += 1
                    fold_event_counts(
                        self.revoked_counts.setdefault(core.source.name, EventCounts()), core.refresh_counts()
                    )

    def pipelines(self) -> list[PartitionPipeline]:
        """The pipelines of the partitions this worker owns now (their `refresh_counts()` feed /metrics)."""
        return list(self._cores.values())

    async def _owned_work(
        self, batches: dict[TopicPartition, list[Any]], made_before: dict[TopicPartition, int]
    ) -> list[tuple[TopicPartition, PartitionPipeline, list[Any]]]:
        """Each owned partition's pipeline and its records of a fetched batch, leaving out the records of
        a partition whose pipeline was made after the fetch (`made_before`: the pipelines then). Those
        came from a position before the pipeline's start (e.g. fetched before a rebalance gave the
        partition back): fed to it, they would be counted before the records between its commit and
        them, and a window could close without those. The pipeline seeked the consumer to
        its start when it was made, so they come again, in order. Called under the ingest lock."""
        assert self._consumer is not None
        owned = self._consumer.assignment()
        work = []
        for tp, records in batches.items():
            if tp not in owned or not records:
                continue
            try:
                core = await self._core(tp)
            except (IllegalStateError, _Refused):  # unassigned meanwhile (its owner reads it), or refused
                continue
            if self._made.get(tp) != made_before.get(tp):
                self.stale_batches += 1
                # Made during this fetch: the records may precede the pipeline's start, or be its own first
                # records, fetched after its seek, and then the fetch moved the position past them. Either
                # way consumption restarts where the pipeline stands, so none is skipped.
                with contextlib.suppress(IllegalStateError):  # unassigned meanwhile: its owner reads it
                    self._consumer.seek(tp, core.next_offset())
                _log.info("ingest: records fetched before a partition's pipeline was made dropped; fetched again")
                continue
            self._check_timestamp_type(tp.topic, records[0])
            work.append((tp, core, records))
        return work

    async def _consume_forever(self) -> None:
        assert self._consumer is not None
        while not self.should_stop:
            made_before = dict(self._made)
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
                work = await self._owned_work(batches, made_before)
                if not work:
                    continue
                if self._offload:
                    # The batch runs on the ingest thread: the event loop stays free for the release
                    # agent's ledger and producer round trips, so a big batch does not delay a release.
                    outputs = await asyncio.get_running_loop().run_in_executor(self._executor, self._process, work)
                else:  # ingest-only process: nothing else waits on this loop
                    outputs = self._process(work)
                await self._flush(outputs)

    def _process(
        self, work: list[tuple[TopicPartition, PartitionPipeline, list]]
    ) -> list[tuple[TopicPartition, ProcessorOutput]]:
        """Feed each partition's batch to its pipeline (on the ingest thread, under the ingest lock)."""
        started = time.thread_time()
        outputs = []
        for tp, core, records in work:
            outputs.append((tp, to_output(core.process_batch(records))))
            self.stats.events += len(records)
            self.stats.batches += 1
        self.stats.busy_s += time.thread_time() - started
        return outputs

    def _check_timestamp_type(self, topic: str, record: object) -> None:
        """Log once per source topic whose records break its timestamp rule (`timestamp_rules`): the start
        refused such a topic, so its type was changed while the worker runs; restart to be refused."""
        if topic in self._warned or topic in self._hop_of:
            return
        self._warned.add(topic)
        rule = self._timestamp_rules.get(topic)
        problem = rule.record_problem(getattr(record, "timestamp_type", 1)) if rule is not None else None
        if problem is not None:
            _log.error("ingest: %s", problem)

    async def measure_clock_skew(self) -> None:
        """Read the worker-broker clock skew into `clock_skew` (`clock_skew.measure`)."""
        assert self._producer is not None
        await measure(self.clock_skew, self._producer, self._probe_topic, self._clock, "ingest")

    async def _probe_forever(self) -> None:
        """Measure the skew every `clock_probe_interval_s`; every second while closes are held."""
        while not self.should_stop:
            await self.sleep(self.clock_skew.next_probe_in(self._clock(), self.settings.clock_probe_interval_s))
            await self.measure_clock_skew()

    async def _close_forever(self) -> None:
        """Once a window's close time passed, read end offsets; windows close when consumption reaches them."""
        assert self._consumer is not None
        while not self.should_stop:
            await self.sleep(self.settings.close_interval_s)
            try:
                async with self._lock:
                    await self._close_due()
            except (KafkaError, IllegalStateError) as exc:
                _log.warning("ingest: close check failed (%s); retrying", type(exc).__name__)

    async def _close_due(self) -> None:
        assert self._consumer is not None
        owned = []
        for tp in [tp for tp in self._consumer.assignment() if tp.topic in self._by_topic]:
            try:
                await self._core(tp)  # a partition that never saw an event still has windows to close
            except _Refused:
                continue
            owned.append(tp)
        self._check_partition_counts()
        now = self._clock()
        held = self.clock_skew.problem(now)
        if held is not None:  # a close on an untrusted clock could miss records appended up to C(w)
            self.clock_skew.holds += 1
            if not self._holding:
                _log.error("ingest: window closes held: %s; see the DPClockSkew runbook", held)
            self._holding = True
            return
        if self._holding:
            _log.warning("ingest: window closes resume: clock skew within %g s", self.clock_skew.bound_s)
            self._holding = False
        read_at = now - self.settings.close_grace_s
        due = []
        for tp in owned:
            t = self._cores[tp].next_close_time()
            if t is not None and t <= read_at:
                due.append(tp)
        if not due:
            return
        for hop_topic in {tp.topic for tp in due if tp.topic in self._hop_of}:
            if not await self._hop_caught_up(self._hop_of[hop_topic]):
                due = [tp for tp in due if tp.topic != hop_topic]  # not all copied yet: next round
        if not due:
            return
        ends = await self._consumer.end_offsets(due)
        outputs = [(tp, to_output(self._cores[tp].mark_end(read_at, ends[tp]))) for tp in due if tp in ends]
        await self._flush(outputs)

    async def _hop_caught_up(self, source_topic: str) -> bool:
        """True when the repartition hop has committed past every record of `source_topic` that was
        in the topic now (so all of them are in the by-unit topic, acknowledged)."""
        assert self._admin is not None and self._ends is not None
        parts = range(await partition_count(self.settings.bootstrap, source_topic, self.settings.kafka_security))
        tps = [TopicPartition(source_topic, p) for p in parts]
        ends = await self._ends.end_offsets(tps)
        group = f"{self.settings.group_id(self.topology)}-repartition"
        committed = await self._admin.list_consumer_group_offsets(group, partitions=tps)
        return all(ends[tp] == 0 or (tp in committed and committed[tp].offset >= ends[tp]) for tp in tps)

    def _check_partition_counts(self) -> None:
        assert self._consumer is not None
        for topic, count in self._counts.items():
            now = self._consumer.partitions_for_topic(topic)
            if now is not None and len(now) != count and topic not in self._warned:
                self._warned.add(topic)
                _log.error(
                    "ingest: topic %s changed from %d to %d partitions mid-deployment: a unit would be bounded once "
                    "per partition, so the release side refuses these partials; restore the count or deploy a new "
                    "topology version on a new topic",
                    topic,
                    count,
                    len(now),
                )

    async def _core(self, tp: TopicPartition) -> PartitionPipeline:
        """The partition's pipeline; a new one resumes from the last commit's offset and metadata."""
        core = self._cores.get(tp)
        if core is not None:
            return core
        assert self._consumer is not None and self.schedule_start is not None
        # aiokafka's public committed() drops the metadata we resume from
        committed = await self._consumer._coordinator.fetch_committed_offsets([tp])
        meta = committed.get(tp)
        resume: dict[str, int] | None = None
        if meta is not None and meta.offset >= 0:
            resume = _parse_progress(meta.metadata)
        count = self._counts.get(tp.topic) or len(self._consumer.partitions_for_topic(tp.topic) or ())
        self._counts[tp.topic] = count
        self._refuse_changed_count(tp, count, (resume or {}).pop(_COUNT_KEY, None))
        if meta is not None and meta.offset >= 0:
            offset = meta.offset
        else:
            offset = (await self._consumer.beginning_offsets([tp]))[tp]
        # consumption restarts exactly where the pipeline does, whatever the consumer's position was
        # (IllegalStateError when the partition is no longer assigned: no pipeline is made then)
        self._consumer.seek(tp, offset)
        source = self._by_topic[tp.topic]
        counted = await self._read_counted(tp, resume) if meta is not None and meta.offset >= 0 else None
        core = self._cores[tp] = PartitionPipeline(
            self.topology,
            source.name,
            tp.partition,
            schedule_start=self.schedule_start,
            topic=tp.topic,
            partitions=count,
            resume=resume,
            start_offset=offset,
            check_keys=True,
            counted=counted,
        )
        self._committed[tp] = (offset, meta.metadata if meta is not None else "")
        self._made_seq += 1
        self._made[tp] = self._made_seq
        return core

    async def _read_counted(self, tp: TopicPartition, resume: dict[str, int] | None) -> list[CountDelta] | None:
        """The period-state deltas a resuming partition persisted in its period-bounded metrics' current
        periods (None for a source without such a metric)."""
        source = self._by_topic[tp.topic]
        if source.name not in self._capped or self._deltas is None:
            return None
        assert self.schedule_start is not None
        since = min(
            period_start(
                self.topology.budgets[m.budget].period_s,
                (resume or {}).get(m.name, Schedule.of(m, self.schedule_start).first_window()),
            )
            for m in self.topology.metrics.values()
            if m.source == source.name and m.period_bounded
        )
        return await read_deltas(self._deltas, self.topology, tp.topic, tp.partition, since)

    def _refuse_changed_count(self, tp: TopicPartition, count: int, committed: int | None) -> None:
        """Raise `_Refused` (and leave the partition paused, unread and uncommitted) when the topic's
        partition count is not the one this worker started with, or not the one the partition's last
        commit was made with: a unit's records would then sit on two partitions and be bounded once
        on each. The release side refuses such partials too; this keeps the records for a new
        topology version instead of dead-lettering them as `wrong_partition`."""
        assert self._consumer is not None
        if count > 0 and tp.partition < count and committed in (None, count):
            return
        self._consumer.pause(tp)
        if tp not in self._refused:
            self._refused.add(tp)
            was = f"its last commit was made with {committed}" if committed not in (None, count) else "it was added"
            _log.error(
                "ingest: topic %s partition %d refused: the topic had %d partitions when this worker started "
                "and %s; changing a source's partition count mid-deployment would bound a unit once per "
                "partition: restore the count, or deploy a new topology version on a new topic",
                tp.topic,
                tp.partition,
                count,
                was,
            )
        raise _Refused(tp)

    async def _send_counted(self, tp: TopicPartition, counted: list[bytes]) -> list[Any]:
        """Send one partition's state deltas to its partition of the window-counts topic; their ack futures."""
        assert self._producer is not None
        parts = await self._producer.partitions_for(self._counts_topic)
        key, partition = delta_key(tp.topic, tp.partition), tp.partition % len(parts)
        return [await self._producer.send(self._counts_topic, v, key=key, partition=partition) for v in counted]

    async def _flush(self, outputs: list[tuple[TopicPartition, ProcessorOutput]]) -> None:
        """Send dead letters and partials, wait for every ack, then commit each partition's safe offset
        with its progress as metadata."""
        assert self._producer is not None and self._consumer is not None
        sends = []
        sinks = self.topology.sinks
        for _tp, out in outputs:
            for value in out.dead_letters:
                sends.append(await self._producer.send(sinks.dead_letter, value))
            for metric, value in out.partials:
                sends.append(await self._producer.send(sinks.partials_topic, value, key=metric.encode()))
            if out.counted:  # acked before the commit below moves the progress past their windows
                sends += await self._send_counted(_tp, out.counted)
            self.stats.dead_letters += len(out.dead_letters)
            self.stats.partials += len(out.partials)
        if sends:
            await asyncio.gather(*sends)
        offsets = {}
        for tp, _out in outputs:
            core = self._cores.get(tp)
            if core is None:
                continue
            safe = core.safe_offset()
            meta = json.dumps({**core.progress(), _COUNT_KEY: core.partitions}, sort_keys=True, separators=(",", ":"))
            if safe is not None and (safe, meta) != self._committed.get(tp):
                offsets[tp] = OffsetAndMetadata(safe, meta)
        if offsets:  # offset and progress move only when a window closes: most batches commit nothing
            try:
                await self._consumer.commit(offsets)
                self.stats.commits += 1
                self._committed.update((tp, (m.offset, m.metadata)) for tp, m in offsets.items())
            except (CommitFailedError, IllegalStateError, KafkaError) as exc:
                # a rebalance took these partitions: their new owner replays from the last good commit
                _log.info("ingest: commit skipped (%s); the partition's new owner replays", type(exc).__name__)


def _parse_progress(metadata: str) -> dict[str, int] | None:
    """The commit metadata written by `_flush` (metric → next window start); None if absent or foreign."""
    try:
        doc = json.loads(metadata) if metadata else None
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    return {str(k): int(v) for k, v in doc.items() if isinstance(v, int)}
