"""The release side: a Faust agent on the partials topic (keyed by metric: one owner per metric).

Each metric's state (its `PartialMerger` and the windows merged but not yet released) lives in a
changelogged Table (one key per metric), so a rebalanced or restarted owner resumes it; partials are
deduped by (window, partition), so replayed partials change nothing. A window is released only when
every source partition has reported it (no deadline: a missing partial delays the release, it never
drops a partition's units). The agent only merges: a merged
window is recorded as releasing and handed to the `ReleaseDispatcher` (up to 16 releases at once;
quote → charge one scope at a time), which runs the core's `Releaser` (quote → noise → charge →
publish the stored bytes with key = release_id on an idempotent producer → commit); finished windows
leave the state at the metric's next message. A sweeper timer republishes charged-but-unpublished
records with their stored bytes.

Poison windows: a window whose release fails `park_after_attempts` times in a row on an internal
error is parked in the ledger (audited, `dpstream_releases_parked`) and held in its `releasing`
state; the sweeper timer re-reads the ledger's parked list and dispatches a window again once an
operator ran `dpstream budget retry` (its stored bytes if it was charged).

Release time is public: every publication of a release's stored bytes (first, retry, sweeper) is
held until its P(w) = C(w) + publish_delay on this worker's clock and sent with the Kafka record
timestamp P(w) (the record's `published_at` says the same), so how long the data took to process
does not show in when or how a release appears. The charge may happen earlier; a release that is
ready only after its P(w) goes out at once, still stamped P(w), and is counted as a miss
(`dpstream_release_publish_misses_total`, curator-only).

"Its own clock" is trusted only as far as the worker–broker clock skew allows (`clock_skew`): a
publication due at P(w) is also held while the skew gate is shut (past `max_clock_skew_s`, or no fresh
reading), as the ingest holds window closes. A release-only process measures the skew itself (the
same probe, every `clock_probe_interval_s`); a process running both halves shares the ingest's gate.
"""

from __future__ import annotations

__all__ = ["ReleaseSide", "ReleaseStats", "PublicTimePublisher"]

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import faust
from aiokafka import AIOKafkaProducer

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Topology
from dpstream.workers.ledger.base import Ledger
from dpstream.workers.pipeline.merger import MergedWindow, PartitionCountChanged
from dpstream.workers.pipeline.partials import WindowPartial
from dpstream.workers.release import Releaser, ReleaseResult, sweep
from dpstream.workers.release.dispatch import MetricReleaseState, ReleaseDispatcher
from dpstream.workers.release.display import release_line
from dpstream.workers.release.outcomes import ReleaseOutcome
from dpstream.workers.release.parking import Parking, is_transient
from dpstream.workers.release.record import publish_time_of
from dpstream.workers.runtime.clock_skew import ClockSkewGate, measure
from dpstream.workers.runtime.settings import RuntimeSettings
from dpstream.workers.runtime.topics import clock_probe_topic
from dpstream.workers.telemetry.histogram import LATENCY_BUCKETS, LabelledHistogram
from dpstream.workers.telemetry.ledger_proxy import LedgerTimings, TimedLedger

_log = logging.getLogger(__name__)

MAX_CONCURRENT_RELEASES = 16
"""Releases one process runs at once (their quote → charge still go one scope at a time)."""

KEEP_LATENCIES = 10_000
"""Most recent close→publish latencies kept in `ReleaseStats` (a long-running worker stays bounded)."""

KEEP_CLOSE_TIMES = 10_000
"""Close times of windows not yet released here; beyond this the oldest half is dropped."""


@dataclass
class ReleaseStats:
    """Counters of the release side; close→publish latencies (seconds) feed the benchmark."""

    partials: int = 0
    released: int = 0
    refused_partials: int = 0
    """Partials refused because their source's partition count changed (see PartialMerger)."""
    failed: int = 0
    latencies: list[float] = field(default_factory=list)
    last: list[ReleaseResult] = field(default_factory=list)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(metric, outcome value) → attempts (errors as ledger_unavailable / failed), for /metrics."""
    retries: Counter[str] = field(default_factory=Counter)
    """metric → failed attempts, each dispatched again after a backoff."""
    last_payload: dict[str, bytes] = field(default_factory=dict)
    """metric → the last record published here (its `noise` σ is exported; the record is public)."""
    parked: Counter[str] = field(default_factory=Counter)
    """metric → windows this process parked after repeated internal failures."""
    publish_misses: Counter[str] = field(default_factory=Counter)
    """metric → releases ready only after their public time P(w) (published late, stamped P(w))."""
    skew_holds: int = 0
    """Publication checks held because the clock-skew gate was shut (each re-checked a second later)."""


Send = Callable[[bytes, bytes, int | None], Awaitable[Any]]
"""send(value, key, timestamp_ms): produce one record to the releases topic."""

HOLD_RECHECK_S = 1.0
"""While the clock-skew gate is shut, a due publication looks again this often."""


class PublicTimePublisher:
    """Publishes stored release records no earlier than their public time P(w), stamped with it.

    P(w) is read from the record's own bytes (`published_at`, written by the releaser from
    `Topology.publish_time`), so the first publication, a retry and the sweeper's all hold the same
    bytes until the same time and give the Kafka record the same timestamp. `clock` and `sleep`
    are the worker's (tests pass a manual pair). `problem(now)`, when given, says why this clock
    cannot be trusted now (the clock-skew gate): a due publication is then held and `on_hold(why)`
    called, until it is None again; P(w) is checked again after a hold (the clock may be stepped)."""

    def __init__(
        self,
        send: Send,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        problem: Callable[[float], str | None] | None = None,
        on_hold: Callable[[str | None], None] | None = None,
    ) -> None:
        self._send = send
        self._clock = clock
        self._sleep = sleep
        self._problem = problem
        self._on_hold = on_hold

    def missed(self, value: bytes) -> bool:
        """True when the record's P(w) has passed already: it is ready late (a release lag)."""
        at = publish_time_of(value)
        return at is not None and self._clock() > at

    async def publish(self, value: bytes, key: bytes) -> None:
        """Wait until P(w), then send with timestamp P(w) in ms (at once, still stamped P(w), when
        P(w) has passed). A record without `published_at` (not a release record) is sent at once
        with the producer's timestamp."""
        at = publish_time_of(value)
        if at is None:
            await self._send(value, key, None)
            return
        while True:
            wait = at - self._clock()
            if wait > 0:
                await self._sleep(wait)
            why = self._problem(self._clock()) if self._problem is not None else None
            if self._on_hold is not None:
                self._on_hold(why)
            if why is None:
                break
            await self._sleep(HOLD_RECHECK_S)
        await self._send(value, key, at * 1000)


class ReleaseSide:
    """Agent, table, tick and sweeper timers of one Faust app, bound to one ledger."""

    def __init__(
        self,
        app: faust.App,
        topology: Topology,
        settings: RuntimeSettings,
        partitions: dict[str, int],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.app = app
        self.topology = topology
        self.settings = settings
        self.stats = ReleaseStats()
        self._partitions = partitions  # metric → number of source partitions that report partials
        self._ledger: Ledger | None = None
        self._timed_ledger: TimedLedger | None = None
        """The ledger as the releaser and sweeper see it: timed per call (workers.telemetry)."""
        self.ledger_timings = LedgerTimings()
        self.latency = LabelledHistogram("metric", topology.metrics, LATENCY_BUCKETS)
        """close → publish seconds per metric (`dpstream_release_latency_seconds`)."""
        self._metric_tp: dict[str, Any] = {}
        """metric → the partials-topic partition its partials came in on (who owns its state)."""
        self._settled: set[tuple[str, int]] = set()
        """(metric, start) released but not yet dropped from the metric's `releasing` windows."""
        self._releaser: Releaser | None = None
        self._producer: AIOKafkaProducer | None = None
        self._closed_at: dict[tuple[str, int], float] = {}
        self._states: dict[str, tuple[Any, MetricReleaseState]] = {}
        """metric → (the Table value it was loaded from or last written as, the live state)."""
        self._parking: Parking | None = None
        self._clock = clock
        """The clock P(w) is awaited on and the skew probe reads (tests shift it)."""
        self.clock_skew = ClockSkewGate.for_interval(settings.max_clock_skew_s, settings.clock_probe_interval_s)
        """Holds publication while the worker-broker clock skew is unknown or past its bound."""
        self._probes = True
        """Whether this side measures the skew itself (False: it shares a gate the ingest measures)."""
        self._probe_task: asyncio.Task[None] | None = None
        self._skew_holding = False
        self._public = PublicTimePublisher(
            self._send,
            clock=clock,
            problem=lambda now: self.clock_skew.problem(now),
            on_hold=self._held_for_skew,
        )
        self._missed: set[bytes] = set()
        """release_ids counted in `publish_misses` (each release once; bounded like `_closed_at`)."""
        self._logged: set[str] = set()
        """release_ids whose INFO line this process logged (each release once; bounded like `_missed`)."""
        self._dispatcher = ReleaseDispatcher(
            self._release,
            self._finished,
            MAX_CONCURRENT_RELEASES,
            park=self._park,
            max_attempts=settings.park_after_attempts,
            transient=is_transient,
        )
        self._ready = asyncio.Event()
        self.refused: ConfigError | None = None
        """Why this release side never opened (its releases topic is fed by another ledger), or None."""
        self.on_refused: Callable[[], None] | None = None
        """Called once `refused` is set: `run_worker` stops the process (exit 2); else the side stays closed."""
        self.topic = app.topic(
            topology.sinks.partials_topic,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
        )
        self.table = app.Table("dpstream-mergers", default=None, partitions=settings.partitions)
        app.agent(self.topic, name="dpstream-release")(self._agent)
        app.timer(settings.sweep_interval_s, name="dpstream-sweeper")(self._sweep)

    async def start(self) -> None:
        """Open the idempotent releases producer and the ledger (fails closed if Redis is unusable). Once
        the ledger answers, the releases topic is checked against it first (`verify.binding`): a topic
        holding records of this version from another ledger leaves the side closed (`refused`, one
        error line, `on_refused` called), nothing published, nothing swept."""
        from dpstream.workers.ledger import LedgerUnavailable, open_ledger
        from dpstream.workers.runtime.ledger_wait import open_ledger_waiting
        from dpstream.workers.runtime.schedule import schedule_start_of

        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.bootstrap,
            enable_idempotence=True,
            acks="all",
            linger_ms=0,
            **self.settings.kafka_options(),
        )
        await self._producer.start()
        if self._probes:  # measured before the ledger is reached: the gauges tell from the first scrape
            await self.measure_clock_skew()
            self._probe_task = asyncio.ensure_future(self._probe_forever())

        async def connect() -> bool:
            """Open the ledger, check that it is the one feeding the releases topic, and warm up against
            it; closed again if the ledger fails meanwhile. False (ledger closed) when the check refuses."""
            ledger = await open_ledger(self.settings.redis_url, self.topology, actor=self.settings.worker_id)
            try:
                # the CLI's start check was skipped if Redis was down then: run it whenever the ledger is reached
                if not await self._bound_to_releases_topic(ledger):
                    await ledger.close()
                    return False
                self._ledger = ledger
                # price the first period from S, as the ingest schedules it (every process the same S)
                ledger.use_schedule_start(await schedule_start_of(self.topology, ledger))
                self._timed_ledger = TimedLedger(ledger, self.ledger_timings)
                self._releaser = Releaser(self.topology, self._timed_ledger, actor=self.settings.worker_id)
                self._parking = Parking(self.topology, ledger, self.settings.worker_id)
                await self._parking.refresh()
                await self._warm_up()
            except LedgerUnavailable:
                await ledger.close()
                raise
            return True

        if await open_ledger_waiting(connect, "release side start"):
            self._ready.set()
        elif self.on_refused is not None:
            self.on_refused()

    async def _bound_to_releases_topic(self, ledger: Ledger) -> bool:
        """`verify.binding`'s check of the releases topic against this ledger; False, with one error line
        and `refused` set, when the topic holds records of this version from another ledger."""
        from dpstream.workers.ledger import MEMORY
        from dpstream.workers.ledger.connection import redact
        from dpstream.workers.verify.binding import check_publishing_ledger

        if self.settings.redis_url == MEMORY:
            return True  # as the CLI's start check: the in-process ledger binds nothing
        try:
            await check_publishing_ledger(
                self.settings.bootstrap,
                self.topology,
                ledger,
                redact(self.settings.redis_url),
                time.time(),
                self.settings.kafka_security,
            )
        except ConfigError as exc:
            self.refused = exc
            _log.error("release side: refusing to publish: %s", exc)
            return False
        return True

    def share_clock_skew(self, gate: ClockSkewGate) -> None:
        """Hold publication on `gate` (the ingest's, in a process running both halves) and probe no more."""
        self.clock_skew = gate
        self._probes = False

    async def measure_clock_skew(self) -> None:
        """Read the worker-broker clock skew into `clock_skew` (`clock_skew.measure`, as the ingest)."""
        assert self._producer is not None
        await measure(self.clock_skew, self._producer, clock_probe_topic(self.topology), self._clock, "release side")

    async def _probe_forever(self) -> None:
        """Measure the skew every `clock_probe_interval_s`; every second while publication is held."""
        interval = self.settings.clock_probe_interval_s
        while True:
            await asyncio.sleep(self.clock_skew.next_probe_in(self._clock(), interval))
            try:
                await self.measure_clock_skew()
            except Exception as exc:  # measured again next round; the stale reading shuts the gate
                _log.warning("release side: clock-skew round failed (%s); retrying", type(exc).__name__)

    def _held_for_skew(self, why: str | None) -> None:
        """Count a publication check held by the clock-skew gate; log the start and end of a hold once."""
        if why is None:
            if self._skew_holding:
                _log.warning("release side: publication resumes: clock skew within %g s", self.clock_skew.bound_s)
                self._skew_holding = False
            return
        self.stats.skew_holds += 1
        if not self._skew_holding:
            _log.error("release side: publication held: %s; see the DPClockSkew runbook", why)
            self._skew_holding = True

    async def _warm_up(self) -> None:
        """Pay the first-use costs before the first window: releases-topic metadata, the ledger's
        connection pool (as many concurrent quotes as releases may run at once), each metric's quote
        path and its mechanism at the quoted cost (built, no noise drawn)."""
        assert self._producer is not None and self._releaser is not None and self._ledger is not None
        await self._producer.partitions_for(self.topology.sinks.releases)
        now = int(time.time())
        metrics = list(self.topology.metrics.values())
        picks = [metrics[i % len(metrics)] for i in range(max(len(metrics), MAX_CONCURRENT_RELEASES))]
        quotes = await asyncio.gather(
            *(
                self._ledger.quote(m.name, now - now % m.window.size_s, now - now % m.window.size_s + m.window.size_s)
                for m in picks
            )
        )
        # quotes has one per pick (more than metrics): picks start with every metric once, in order
        for metric, quote in zip(metrics, quotes, strict=False):
            self._releaser.prepare(metric, quote.cost)

    async def stop(self) -> None:
        """Let running releases finish (briefly), then close the producer and the ledger."""
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
        await self._dispatcher.drain(timeout=10.0)
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
            state = self._state(metric)
            self._metric_tp[metric] = event.message.tp
            value: bytes = event.value
            if not value.startswith(b"{"):  # not a partial (e.g. an older release's tick message)
                continue
            partial = WindowPartial.from_bytes(value)
            self.stats.partials += 1
            key = (metric, partial.start)
            self._closed_at[key] = max(self._closed_at.get(key, 0.0), event.message.timestamp)
            if len(self._closed_at) > KEEP_CLOSE_TIMES:  # windows another owner released: forget the oldest
                for old in sorted(self._closed_at, key=self._closed_at.__getitem__)[: KEEP_CLOSE_TIMES // 2]:
                    del self._closed_at[old]
            try:
                ready = state.merger.add(partial)
            except PartitionCountChanged as exc:
                self.stats.refused_partials += 1
                if self.stats.refused_partials == 1 or self.stats.refused_partials % 1000 == 0:
                    _log.error("release side: %s", exc)
                ready = []
            for merged in ready:
                state.releasing[merged.start] = merged
            for start in self._dispatcher.take_finished(metric):
                state.releasing.pop(start, None)
                self._settled.discard((metric, start))
            for start in sorted(state.releasing):  # new ones, and failed ones whose backoff passed
                self._dispatcher.dispatch(state.releasing[start])
            doc = state.to_state()
            self.table[metric] = doc
            self._states[metric] = (doc, state)

    def _state(self, metric: str) -> MetricReleaseState:
        """The metric's live state; reloaded when the Table holds something this process did not
        write, i.e. after it (re)gained the metric (the agent then resumes its `releasing` windows)."""
        stored = self.table.get(metric)
        cached = self._states.get(metric)
        if cached is not None and cached[0] is stored:
            return cached[1]
        parts = range(self._partitions.get(metric, 1))
        state = MetricReleaseState.from_state(metric, parts, stored)
        self._states[metric] = (stored, state)
        return state

    async def _release(self, merged: MergedWindow) -> ReleaseResult:
        await self._ready.wait()  # partials can arrive before the ledger and producer are open
        assert self._releaser is not None and self._parking is not None
        # a window parked (by us or a previous owner) raises WindowParked and is held until `budget retry`
        return await self._parking.release(merged, self._release_now)

    async def _release_now(self, merged: MergedWindow) -> ReleaseResult:
        assert self._releaser is not None

        async def publish(value: bytes, key: bytes) -> None:
            await self._publish_release(value, key, merged.metric)

        return await self._releaser.release_merged(merged, publish)

    async def _park(self, merged: MergedWindow, attempts: int, error: BaseException) -> None:
        """Park a window that failed `attempts` times in a row on an internal error (audited in the ledger)."""
        assert self._parking is not None
        await self._parking.park(merged, attempts, error)
        self.stats.parked[merged.metric] += 1
        _log.error(
            "release of %s [%d, %d) PARKED after %d failed attempts (%s): held until "
            "`dpstream budget retry --scope %s`; see the DPReleasesParked runbook",
            merged.metric,
            merged.start,
            merged.end,
            attempts,
            type(error).__name__,
            self.topology.metrics[merged.metric].budget,
        )

    async def _retry_parked(self) -> None:
        """Re-read the ledger's parked list; dispatch again the held windows an operator asked to retry."""
        if self._parking is None:
            return
        await self._parking.refresh()
        owned = self.app.assignor.assigned_actives()
        for metric, (_doc, state) in list(self._states.items()):
            if self._metric_tp.get(metric) in owned:
                self._parking.redispatch(self._dispatcher, list(state.releasing.values()))

    def _finished(self, merged: MergedWindow, result: ReleaseResult | None, error: BaseException | None) -> None:
        """Count one dispatched release; its close→publish latency feeds the benchmark."""
        if error is not None or result is None:
            # counted; the window stays in the metric's state and is dispatched again after a backoff
            # (or, parked, once an operator asks for a retry)
            self.stats.failed += 1
            self.stats.retries[merged.metric] += 1
            self.stats.outcomes[(merged.metric, _error_outcome(error))] += 1
            _log.error(
                "release of %s [%d, %d) failed (attempt %d, retried later): %s",
                merged.metric,
                merged.start,
                merged.end,
                self._dispatcher.failures(merged.metric, merged.start),
                type(error).__name__,
            )
            return
        self.stats.released += 1
        self.stats.outcomes[(merged.metric, result.outcome.value)] += 1
        self._settled.add((merged.metric, merged.start))
        if result.payload:
            self.stats.last_payload[merged.metric] = result.payload
        closed = self._closed_at.pop((merged.metric, merged.start), None)
        if result.payload:  # published now, or the stored bytes again (duplicate)
            again = result.outcome is ReleaseOutcome.DUPLICATE
            self._log_published(result.release_id, result.payload, "republished" if again else "")
        else:  # refused or expired: no record, the outcome and the ledger's reason
            _log.info(
                "release %s [%d, %d): %s %s",
                merged.metric,
                merged.start,
                merged.end,
                result.outcome.value,
                result.reason,
            )
        self.stats.last.append(result)
        del self.stats.last[:-100]
        if result.payload and closed:
            self.stats.latencies.append(max(0.0, time.time() - closed))
            del self.stats.latencies[:-KEEP_LATENCIES]
            self.latency.observe(merged.metric, self.stats.latencies[-1])

    def open_windows(self) -> dict[str, list[int]]:
        """metric → ends of its windows closed but not released (pending in the merger or releasing),
        for the metrics whose state this process owns now (for release lag; schedule times only)."""
        owned = self.app.assignor.assigned_actives()
        out: dict[str, list[int]] = {}
        for metric, (_doc, state) in list(self._states.items()):
            if self._metric_tp.get(metric) not in owned:
                continue  # another owner has it now: this copy is stale
            size = self.topology.metrics[metric].window.size_s
            ends = [start + size for start in state.merger.pending_windows()]
            ends += [
                w.end
                for s, w in list(state.releasing.items())
                if (metric, s) not in self._settled and not self._is_parked(w)
            ]
            out[metric] = ends
        return out

    def _is_parked(self, window: MergedWindow) -> bool:
        """Held parked: left out of release lag (`DPReleasesParked` alerts on it instead)."""
        if self._dispatcher.parked(window.metric, window.start):
            return True
        return self._parking is not None and self._parking.held(window)

    async def _publish_release(self, value: bytes, key: bytes, metric: str) -> None:
        if self._public.missed(value) and key not in self._missed:
            self.stats.publish_misses[metric] += 1
            self._missed.add(key)
            if len(self._missed) > KEEP_CLOSE_TIMES:
                self._missed.clear()  # a window is retried within minutes: an old id comes back rarely
        async with self._dispatcher.outside_slot():  # the hold until P(w) takes no release slot
            await self._publish(value, key)

    def _log_published(self, release_id: str, payload: bytes, note: str = "") -> None:
        """One INFO line per release this process published (`display.release_line`, the demo's row, read
        from the published record: public values, CI and budget ratio only; keys that come from the data
        counted, not named); a release logged once is not logged again, so a retry or sweep of the same
        stored bytes adds no line."""
        if release_id in self._logged:
            return
        if len(self._logged) >= KEEP_CLOSE_TIMES:
            self._logged.clear()  # an old release published again later logs a second, 'republished' line
        self._logged.add(release_id)
        if not _log.isEnabledFor(logging.INFO):
            return
        try:
            record = json.loads(payload)
            metric = self.topology.metrics.get(record.get("metric"))
            line = release_line(record, note, hide_keys=metric is None or not metric.public_keys)
        except (
            ValueError,
            KeyError,
            TypeError,
            AttributeError,
        ) as exc:  # not a release record: a log line must not fail a release
            _log.warning(
                "release %s published; its record is unreadable for the log (%s)", release_id, type(exc).__name__
            )
            return
        if line is not None:
            _log.info("published %s", line)

    async def _publish_swept(self, value: bytes, key: bytes) -> None:
        """The sweeper's publication of stored bytes, logged as republished once it went out."""
        await self._publish(value, key)
        self._log_published(key.decode(), value, "republished")

    async def _publish(self, value: bytes, key: bytes) -> None:
        """Every publication of stored bytes (first, retry, sweeper): held until P(w), stamped P(w)."""
        await self._public.publish(value, key)

    async def _send(self, value: bytes, key: bytes, timestamp_ms: int | None) -> None:
        assert self._producer is not None
        await self._producer.send_and_wait(self.topology.sinks.releases, value, key=key, timestamp_ms=timestamp_ms)

    async def _sweep(self) -> None:
        """Republish charged-but-unpublished releases with their stored bytes."""
        if self._timed_ledger is None or self._releaser is None:
            return
        try:
            skip = self._parking.held_id if self._parking is not None else None
            await sweep(self._timed_ledger, self._publish_swept, self.settings.sweep_age_s, self._releaser.counts, skip)
        except Exception as exc:  # the sweeper retries next round; never crash the worker
            _log.warning("sweeper: round failed (%s); retrying", type(exc).__name__)
        try:
            await self._retry_parked()
        except Exception as exc:  # read again next round
            _log.warning("sweeper: parked windows unreadable (%s); retrying", type(exc).__name__)


def _error_outcome(error: BaseException | None) -> str:
    """The outcome label of a release attempt that raised (as `Releaser.counts` counts it)."""
    from dpstream.workers.ledger.errors import LedgerUnavailable

    return (ReleaseOutcome.LEDGER_UNAVAILABLE if isinstance(error, LedgerUnavailable) else ReleaseOutcome.FAILED).value
