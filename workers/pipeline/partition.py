"""`PartitionPipeline`: the hot path for one source topic partition, driven batch by batch.

Feed it fetched records (anything with `.offset`, `.value` bytes, `.timestamp` in ms and `.key`,
e.g. aiokafka's ConsumerRecord) in offset order. It validates, bounds and aggregates every metric
of the source and returns dead letters. Windows close by arrival (see dpstream.topology, rule 1), never by a
watermark built from event times:

- an event counts in window w iff its event time lies in w and its record's append time
  (`.timestamp`; for a repartitioned source, the source topic's append time carried along) is at
  or before C(w) = end(w) + allowed_lateness;
- window w closes once the driver tells the pipeline (`mark_end`) that the partition's end
  offset, read at a wall-clock time T ≥ C(w), has been consumed: every record appended up to T
  is then in. Windows close in schedule order, every one from the schedule start, empty or not.

Commit protocol for the driver: produce the returned dead letters and partials, then commit
`safe_offset()` with `progress()` as the commit's metadata — the offset never passes the first
event of a window not yet emitted here, and the metadata tells a restarted owner which window
comes next, so it rebuilds exactly the same partials (recovery by replay).
"""

from __future__ import annotations

__all__ = ["RecordLike", "BatchOutput", "PartitionPipeline", "MAX_WINDOWS_PER_CLOSE"]

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Topology
from dpstream.topology.schedule import Schedule
from dpstream.workers.pipeline.accumulator import MetricAccumulator
from dpstream.workers.pipeline.batch import EventBatch
from dpstream.workers.pipeline.codes import Codes
from dpstream.workers.pipeline.colocation import home_partition
from dpstream.workers.pipeline.copies import SeenCopies, position_order, source_position_of
from dpstream.workers.pipeline.counters import EventCounts
from dpstream.workers.pipeline.events import DeadLetter, EventParser
from dpstream.workers.pipeline.partials import WindowPartial
from dpstream.workers.pipeline.unit_ids import unit_hasher
from dpstream.workers.pipeline.window_caps import CountDelta

MAX_WINDOWS_PER_CLOSE = 5_000
"""Windows one metric emits per close call (a long catch-up is emitted over several calls)."""

CHUNK_RECORDS = 2_500
"""Records decided together: a bigger fetch is consumed in chunks of this many, so each column pass over
a chunk's Python objects stays in cache. `bench pipeline_core` with the ingest's 20,000-record fetches,
CPU per event, 3 alternating runs of 500 k: web-analytics 4.85-5.79 µs whole against 3.34-4.00 in
chunks; demo 5.02-6.18 against 4.50-4.61 (chunks of 1,000: 3.8-4.0 and 4.7-4.8; of 5,000: 3.8-5.1 and
4.4-5.5)."""


class RecordLike(Protocol):
    """The fields of a Kafka record the pipeline reads (aiokafka's ConsumerRecord has them)."""

    @property
    def offset(self) -> int: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def timestamp(self) -> int | None: ...


@dataclass(frozen=True)
class BatchOutput:
    """What one batch (or close, or flush) produced: partials to publish, dead letters to park, and the
    period-state deltas (`contribution.max_windows`, `max_per_period`) of the windows closed (persisted
    before progress passes them)."""

    partials: list[WindowPartial]
    dead_letters: list[DeadLetter]
    counted: list[CountDelta] = field(default_factory=list)


class PartitionPipeline:
    """Bounding, windowing and partial aggregation of every metric of one source, on one partition."""

    def __init__(
        self,
        topology: Topology,
        source: str,
        partition: int,
        *,
        schedule_start: int,
        topic: str | None = None,
        partitions: int = 1,
        resume: Mapping[str, int] | None = None,
        start_offset: int | None = None,
        until: int | None = None,
        check_keys: bool = False,
        event_range: tuple[float, float] | None = None,
        counted: Iterable[CountDelta] | None = None,
    ) -> None:
        """`schedule_start`: the schedule start S; `partitions`: how many partitions the source
        has (every partial says so, the merger checks it); `resume`: metric → next window start to
        emit, from the last commit's metadata; `start_offset`: where consumption (re)starts;
        `until`: replay's end of schedule; `check_keys`: dead-letter records whose Kafka key is
        not their unit (`key_mismatch`) and, for a `keyed_by_unit` source, records not in the
        partition their key hashes to under the source's partitioner over `partitions`
        (`wrong_partition`); `event_range`: replay's [from, to) for event times; `counted`: the
        period-state deltas (`contribution.max_windows`, `max_per_period`) this partition persisted (any
        order, duplicates and other metrics' included), required when such a metric resumes past its
        period's first window."""
        self.source = topology.sources[source]
        self.topic = topic or self.source.topic
        self.partition = partition
        self.partitions = partitions
        self.schedule_start = int(schedule_start)
        metrics = [m for m in topology.metrics.values() if m.source == source]
        resume = resume or {}
        self._units = Codes()
        """The partition's unit codes, shared by its metrics' open windows."""
        self._accs = [
            MetricAccumulator(
                m,
                self.source,
                # max of an int and -inf is that int
                int(max(Schedule.of(m, schedule_start).first_window(), resume.get(m.name, -math.inf))),
                until=until,
                period_s=topology.budgets[m.budget].period_s,
                units=self._units,
            )
            for m in metrics
        ]
        self._restore_caps(list(counted) if counted is not None else None)
        self._parser = EventParser(
            self.source,
            value_fields=[m.value for m in metrics if m.value],
            key_fields=[m.group_by for m in metrics if m.group_by],
        )
        self._lateness = float(self.source.allowed_lateness_s)
        self._max_future = float(self.source.max_future_s)
        self._check_keys = check_keys and not self.source.event_level
        # a keyed_by_unit source read as is: each unit's records must all be in its key's partition,
        # else the unit is bounded once per partition it is on (the merger would add the partials)
        keyed_here = self._check_keys and self.source.keyed_by_unit and self.topic == self.source.topic
        self._home = home_partition(self.source.partitioner, partitions) if keyed_here else None
        # unit ids are keyed-hashed here, before bounding, unless the repartition hop already did (its topic)
        self._hash_unit = unit_hasher(self.source) if self.topic == self.source.topic else None
        self._event_range = event_range if event_range is not None else (-math.inf, math.inf)
        # a by-unit topic may hold two copies of one source record (the hop died before its commit)
        self.seen_copies = SeenCopies() if self.topic != self.source.topic else None
        self.last_offset: int | None = None if start_offset is None else start_offset - 1
        self._marks: list[tuple[float, int]] = []
        """(wall-clock time T, end offset read at T) not yet reached by consumption."""
        self.counts = EventCounts()

    def _restore_caps(self, counted: list[CountDelta] | None) -> None:
        """Rebuild each period-bounded metric's per-unit state from the persisted deltas; without them,
        refuse to resume such a metric past the first window of its period in the schedule (its state
        would restart at zero and let a unit count in more than max_windows windows, or add more than
        max_per_period)."""
        for acc in self._accs:
            caps = acc.caps
            if caps is None:
                continue
            period = acc.first_start // caps.period_s * caps.period_s
            first_of_period = Schedule.of(acc.metric, self.schedule_start).starts(since=period)
            if counted is None:
                if acc.first_start != next(first_of_period):
                    raise ConfigError(
                        f"metric '{acc.metric.name}': contribution.{caps.option}: partition {self.partition} "
                        f"resumes at window {acc.first_start} inside its period without the persisted per-unit "
                        "state; give the pipeline its deltas (counted=...) or restart from the period's start"
                    )
                continue
            caps.restore(counted, acc.first_start)

    # -- hot path ----------------------------------------------------------------------
    def process_batch(self, records: Iterable[RecordLike]) -> BatchOutput:
        """Consume records in offset order; return dead letters and the partials of windows that
        closed because consumption reached a pending end-offset mark.

        The batch is decided column by column: decoded and validated at once (`parse_batch`), its
        dead letters in record order with their reasons, then handed to every metric as one
        `EventBatch`; per-event Python work does not grow with the number of metrics."""
        recs = records if isinstance(records, list) else list(records)
        dead: list[DeadLetter] = []
        for first in range(0, len(recs), CHUNK_RECORDS):
            self._consume(recs[first : first + CHUNK_RECORDS], dead)
        return self._output(self._close_reached(), dead)

    def _consume(self, recs: list[RecordLike], dead: list[DeadLetter]) -> None:
        """Validate, count and add one non-empty batch; dead letters go to `dead`, in record order."""
        n = len(recs)
        offsets = [r.offset for r in recs]
        raws = [r.value for r in recs]
        stamps = [r.timestamp for r in recs]
        parsed = self._parser.parse_batch(raws, stamps, offsets)
        reasons = dict(parsed.invalid)
        index, units, ts = parsed.valid, parsed.units, parsed.time
        ok = np.ones(len(index), bool)
        if self._check_keys:
            for j, problem in self._key_problems([recs[i] for i in index.tolist()], units):
                reasons[int(index[j])], ok[j] = problem, False
        if self._hash_unit is not None:
            hashed = {u: self._hash_unit(u) for u in dict.fromkeys(units)}
            units = [hashed[u] for u in units]
        # arrival: the record's append time; a file line (replay) arrives at its own event time
        if stamps.count(None) == n:
            arrival = ts
        else:
            every = stamps if None not in stamps else [math.nan if t is None else t for t in stamps]
            record = np.array(every, np.float64)[index]
            arrival = np.where(np.isnan(record), ts, record / 1000.0)
        lo, hi = self._event_range
        for reason, bad in (
            ("out_of_range", ok & ~((lo <= ts) & (ts < hi))),
            ("future_timestamp", ok & (ts > arrival + self._max_future)),
        ):
            if bad.any():
                for j in np.flatnonzero(bad).tolist():
                    reasons[int(index[j])] = reason
                ok &= ~bad
        positions = self._copies(recs, index, ok, ts, reasons) if self.seen_copies is not None else None
        for i in sorted(reasons):
            self._dead_letter(dead, reasons[i], offsets[i], raws[i])
        self.last_offset = offsets[-1]
        accepted = int(np.count_nonzero(ok))
        self.counts.accepted += accepted
        use = ok & (ts >= self.schedule_start)  # before the schedule start S: no window of the schedule holds it
        late = accepted - int(np.count_nonzero(use))
        if use.any():
            picked = np.flatnonzero(use)
            rows = index[picked]
            offset = np.array(offsets, np.int64)[rows]
            order = None
            if any(acc.uses_order for acc in self._accs):
                order = self._order(
                    arrival[picked], offset, None if positions is None else [positions[i] for i in rows.tolist()]
                )
            everyone = len(picked) == len(units)
            chosen = picked.tolist()
            batch = EventBatch.of(
                units if everyone else [units[j] for j in chosen],
                ts[picked],
                arrival[picked] - self._lateness,
                offset,
                (),
                order,
                parsed.columns if everyone else {k: [c[j] for j in chosen] for k, c in parsed.columns.items()},
            )
            missed = np.zeros(len(batch), bool)
            for acc in self._accs:
                missed |= acc.add_batch(batch)
            late += int(np.count_nonzero(missed))
        self.counts.late += late

    def _order(
        self, arrival: np.ndarray, offset: np.ndarray, positions: list[bytes | None] | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """L∞ order key columns: (source append time, source partition, source offset), a function of the
        record: a source read as is: the record's own position; a hop copy: its source position (a
        header not the hop's: -1 and this offset)."""
        if positions is None or all(p is None for p in positions):
            return arrival, np.full(len(offset), self.partition, np.int64), offset
        pairs = [
            (self.partition, o) if p is None else position_order(p, (-1, o))
            for p, o in zip(positions, offset.tolist(), strict=True)
        ]
        return arrival, np.array([p for p, _ in pairs], np.int64), np.array([o for _, o in pairs], np.int64)

    def _copies(
        self, recs: list[RecordLike], index: np.ndarray, ok: np.ndarray, ts: np.ndarray, reasons: dict[int, str]
    ) -> list[bytes | None]:
        """A by-unit topic: skip each second copy of a source record counted already (here or earlier in
        the batch; skipped before any check, so it is neither accepted nor dead-lettered); remember the
        positions of the accepted events. Returns every record's source position."""
        seen = self.seen_copies
        assert seen is not None
        positions = [source_position_of(r) for r in recs]
        valid = dict(zip(index.tolist(), range(len(index)), strict=True))
        counted: list[tuple[bytes, float]] = []
        now: set[bytes] = set()
        for i, position in enumerate(positions):
            if position is None:
                continue
            j = valid.get(i)
            if position in seen or position in now:
                seen.skipped += 1
                reasons.pop(i, None)
                if j is not None:
                    ok[j] = False
            elif j is not None and ok[j]:
                now.add(position)
                counted.append((position, float(ts[j])))
        for position, t in counted:
            seen.add(position, t)
        return positions

    def _key_problems(self, recs: list[RecordLike], units: list[str]) -> list[tuple[int, str]]:
        """With `check_keys`: (index, problem) of each record whose Kafka key is not its event's unit
        (`key_mismatch`), or, for a `keyed_by_unit` source, whose key hashes to another partition
        (`wrong_partition`). Decided per batch: most batches have no problem at all."""
        keys = [rec.key for rec in recs]  # type: ignore[attr-defined]  # check_keys only on Kafka records
        wanted = [unit.encode() for unit in units]
        problems: list[tuple[int, str]] = []
        if keys != wanted:
            problems = [(j, "key_mismatch") for j, (k, w) in enumerate(zip(keys, wanted, strict=True)) if k != w]
        home, here = self._home, self.partition
        if home is not None and (problems or list(map(home, keys)).count(here) != len(keys)):
            mismatched = {j for j, _ in problems}
            placed = [(j, "wrong_partition") for j, k in enumerate(keys) if j not in mismatched and home(k) != here]
            problems = sorted(problems + placed)
        return problems

    def _dead_letter(self, dead: list[DeadLetter], reason: str, offset: int, raw: bytes | None) -> None:
        self.counts.invalid[reason] += 1
        dead.append(DeadLetter(reason, self.source.name, self.topic, self.partition, offset, raw or b""))

    # -- closing -----------------------------------------------------------------------
    def next_close_time(self) -> float | None:
        """The earliest C(w) of a window not yet emitted here (None when every schedule ended)."""
        times = [t for t in (acc.next_close_time() for acc in self._accs) if t is not None]
        return min(times) if times else None

    def mark_end(self, read_at: float, end_offset: int) -> BatchOutput:
        """The partition's end offset was `end_offset` when read at wall-clock `read_at`: once
        consumption reaches it, every record appended up to `read_at` is in, and every window with
        C(w) ≤ read_at closes. Returns what closes now (consumption may already be there)."""
        due = self.next_close_time()
        if due is not None and read_at >= due and (not self._marks or read_at > self._marks[-1][0]):
            self._marks.append((read_at, end_offset))
        return self._output(self._close_reached(), [])

    def next_offset(self) -> int:
        """The offset of the next record this pipeline expects (where consumption resumes for it)."""
        return 0 if self.last_offset is None else self.last_offset + 1

    def _close_reached(self) -> list[WindowPartial]:
        position = self.next_offset()
        through = None
        while self._marks and position >= self._marks[0][1]:
            through = self._marks.pop(0)[0]
        if through is None:
            return []
        out = self.close_through(through)
        due = self.next_close_time()
        if due is not None and due <= through:  # more than one close call's worth: continue next time
            self._marks.insert(0, (through, 0))
        return out

    def close_through(self, t: float) -> list[WindowPartial]:
        """Emit every window with C(w) ≤ t, in schedule order (at most MAX_WINDOWS_PER_CLOSE per
        metric); only for a caller that knows every record appended up to t was consumed."""
        out: list[WindowPartial] = []
        for acc in self._accs:
            out.extend(self._partial(acc, s, v) for s, v in acc.close_through(t, MAX_WINDOWS_PER_CLOSE))
        if self.seen_copies is not None and out:
            self.seen_copies.forget_before(min(acc.next_start for acc in self._accs))
        return out

    def flush(self) -> BatchOutput:
        """End of a finite stream (replay): every window of the schedule up to its end (`until`)
        closes; without an end, every window up to the last one holding data."""
        through = math.inf
        if any(acc.until is None for acc in self._accs):
            opened = [acc.close_time(max(acc.windows)) for acc in self._accs if acc.windows]
            if not opened:
                return BatchOutput([], [])
            through = max(opened)
        out: list[WindowPartial] = []
        while True:
            got = self.close_through(through)
            if not got:
                return self._output(out, [])
            out.extend(got)

    def _output(self, partials: list[WindowPartial], dead: list[DeadLetter]) -> BatchOutput:
        """A batch's output with the period-state deltas of every window closed since the last one."""
        return BatchOutput(partials, dead, [d for acc in self._accs if acc.caps is not None for d in acc.take_deltas()])

    # -- commit ------------------------------------------------------------------------
    def safe_offset(self) -> int | None:
        """Offset to commit: the first event of the oldest open window, else the next record.

        None before any record position is known (nothing to commit).
        """
        firsts = [o for o in (acc.first_open_offset() for acc in self._accs) if o is not None]
        if firsts:
            return min(firsts)
        return None if self.last_offset is None else self.last_offset + 1

    def progress(self) -> dict[str, int]:
        """metric → next window start to emit (the commit metadata a restarted owner resumes from)."""
        return {acc.metric.name: acc.next_start for acc in self._accs}

    def refresh_counts(self) -> EventCounts:
        """Fold the per-metric cap / clamp / skip tallies into `counts` and return it (skips also per
        (metric, reason), every reason of every metric of the source, zeros included)."""
        c = self.counts
        c.capped = sum(a.capped for a in self._accs)
        for a in self._accs:
            if a.metric.contribution.max_windows is not None:
                c.capped_windows[a.metric.name] = a.capped_windows
            if a.metric.contribution.max_per_period is not None:
                c.capped_period[a.metric.name] = a.capped_period
        c.clamped = sum(a.clamped for a in self._accs)
        c.skipped = sum(a.skipped for a in self._accs)
        for a in self._accs:
            for reason, n in a.skip_counts().items():
                c.skips[(a.metric.name, reason)] = n
        return c

    # -- internals ---------------------------------------------------------------------
    def _partial(self, acc: MetricAccumulator, start: int, values: dict) -> WindowPartial:
        return WindowPartial(
            acc.metric.name,
            start,
            start + acc.size,
            self.source.name,
            self.topic,
            self.partition,
            values,
            partitions=self.partitions,
        )
