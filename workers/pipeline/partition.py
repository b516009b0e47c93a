"""`PartitionPipeline`: the hot path for one source topic partition, driven batch by batch.

Feed it fetched records (anything with `.offset`, `.value` bytes and `.timestamp` in ms, e.g.
aiokafka's ConsumerRecord) in offset order. It validates, bounds and aggregates every metric of
the source, keeps the partition watermark (max event time − allowed_lateness; wall clock once
idle), and returns the partials of windows that became final plus the dead letters.

Commit protocol for the driver: produce the returned dead letters and partials, then commit
`safe_offset()` — it never passes the first event of a window not yet emitted here, so a
restarted worker replays and rebuilds every open window (DESIGN §3 "recovery by replay").
"""

from __future__ import annotations

__all__ = ["RecordLike", "BatchOutput", "PartitionPipeline"]

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from topology.errors import EventError
from topology.model import Topology
from workers.pipeline.accumulator import MetricAccumulator
from workers.pipeline.counters import EventCounts
from workers.pipeline.events import DeadLetter, EventParser
from workers.pipeline.partials import WindowPartial

MAX_EMPTY_RUN = 10_000
"""Longest run of consecutive empty windows emitted at once (see `MetricAccumulator.emit_final`)."""


class RecordLike(Protocol):
    """The fields of a Kafka record the pipeline reads (aiokafka's ConsumerRecord has them)."""

    offset: int
    value: bytes | None
    timestamp: int | None


@dataclass(frozen=True)
class BatchOutput:
    """What one batch (or idle tick, or flush) produced: partials to publish, dead letters to park."""

    partials: list[WindowPartial]
    dead_letters: list[DeadLetter]


class PartitionPipeline:
    """Bounding, windowing and partial aggregation of every metric of one source, on one partition."""

    def __init__(
        self,
        topology: Topology,
        source: str,
        partition: int,
        *,
        topic: str | None = None,
        started_at: float | None = None,
        max_empty_run: int = MAX_EMPTY_RUN,
    ) -> None:
        self.source = topology.sources[source]
        self.topic = topic or self.source.topic
        self.partition = partition
        metrics = [m for m in topology.metrics.values() if m.source == source]
        self._accs = [MetricAccumulator(m, self.source) for m in metrics]
        self._parser = EventParser(
            self.source,
            value_fields=[m.value for m in metrics if m.value],
            key_fields=[m.group_by for m in metrics if m.group_by],
        )
        self._lateness = float(self.source.allowed_lateness_s)
        self._idle_timeout = float(self.source.idle_timeout_s)
        self._max_future = float(self.source.max_future_s)
        self._max_empty_run = max_empty_run
        self.max_event_time = -math.inf
        self.watermark = -math.inf
        self.last_offset: int | None = None
        self.last_activity = started_at
        self.counts = EventCounts()

    # -- hot path ----------------------------------------------------------------------
    def process_batch(self, records: Iterable[RecordLike], now: float | None = None) -> BatchOutput:
        """Consume records in offset order; return partials of windows now final and dead letters.

        `now` (a live worker's clock) also dead-letters events timed more than the source's
        `max_future` ahead of it; a replay passes no clock and takes event times as they are.
        """
        horizon = math.inf if now is None else now + self._max_future
        parse = self._parser.parse_fast
        adds = [acc.add_fn for acc in self._accs]
        lateness = self._lateness
        maxt = self.max_event_time
        wm = self.watermark
        dead: list[DeadLetter] = []
        accepted = late = 0
        offset = self.last_offset
        for rec in records:
            offset = rec.offset
            try:
                unit, ts, fields = parse(rec.value, rec.timestamp, offset)
            except EventError as exc:
                self._dead_letter(dead, exc.reason, offset, rec.value)
                continue
            if ts > horizon:
                self._dead_letter(dead, "future_timestamp", offset, rec.value)
                continue
            if ts > maxt:
                if maxt == -math.inf:
                    self._start_sequences(ts, covering=True)
                maxt = ts
                if ts - lateness > wm:
                    wm = ts - lateness
            accepted += 1
            was_late = False
            for add in adds:
                if add(unit, ts, fields, offset, wm):
                    was_late = True
            if was_late:
                late += 1
        self.max_event_time = maxt
        self.watermark = wm
        self.last_offset = offset
        if now is not None:
            self.last_activity = now
        self.counts.accepted += accepted
        self.counts.late += late
        return BatchOutput(self._emit(), dead)

    def _dead_letter(self, dead: list[DeadLetter], reason: str, offset: int, raw: bytes | None) -> None:
        self.counts.invalid[reason] += 1
        dead.append(DeadLetter(reason, self.source.name, self.topic, self.partition, offset, raw or b""))

    # -- time --------------------------------------------------------------------------
    def advance_idle(self, now: float) -> BatchOutput:
        """Wall-clock tick: once no record arrived for `idle_timeout`, watermark := now − lateness."""
        if self.last_activity is None:
            self.last_activity = now
            return BatchOutput([], [])
        if now - self.last_activity < self._idle_timeout:
            return BatchOutput([], [])
        wm = now - self._lateness
        if wm > self.watermark:
            self.watermark = wm
            if self.max_event_time == -math.inf:
                self._start_sequences(wm)
        return BatchOutput(self._emit(), [])

    def flush(self) -> BatchOutput:
        """End of a finite stream (replay): every window holding data becomes final and is emitted."""
        partials: list[WindowPartial] = []
        for acc in self._accs:
            partials.extend(self._partial(acc, s, v) for s, v in acc.flush())
        return BatchOutput(partials, [])

    # -- commit ------------------------------------------------------------------------
    def safe_offset(self) -> int | None:
        """Offset to commit: the first event of the oldest open window, else the next record.

        None before any record was seen (nothing to commit).
        """
        firsts = [o for o in (acc.first_open_offset() for acc in self._accs) if o is not None]
        if firsts:
            return min(firsts)
        return None if self.last_offset is None else self.last_offset + 1

    def refresh_counts(self) -> EventCounts:
        """Fold the per-metric cap / clamp / skip tallies into `counts` and return it."""
        self.counts.capped = sum(a.capped for a in self._accs)
        self.counts.clamped = sum(a.clamped for a in self._accs)
        self.counts.skipped = sum(a.skipped for a in self._accs)
        return self.counts

    # -- internals ---------------------------------------------------------------------
    def _start_sequences(self, t: float, covering: bool = False) -> None:
        """The partition's first time: each metric's window sequence starts at the first window of
        the first event (`covering`), or, for a partition idle from the start, at the first window
        not yet final at watermark `t`. Earlier windows never get a partial from this partition."""
        for acc in self._accs:
            acc.start_at(acc.first_start_covering(t) if covering else acc.first_start_after(t))

    def _emit(self) -> list[WindowPartial]:
        out: list[WindowPartial] = []
        for acc in self._accs:
            for start, values in acc.emit_final(self.watermark, self._max_empty_run):
                out.append(self._partial(acc, start, values))
        return out

    def _partial(self, acc: MetricAccumulator, start: int, values: dict) -> WindowPartial:
        return WindowPartial(
            acc.metric.name, start, start + acc.size, self.source.name, self.topic, self.partition, values
        )
