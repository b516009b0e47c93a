"""`dpstream replay FILE EVENTS.jsonl`: the worker's core over a file — no Kafka, in-process ledger.

Each line of EVENTS is one event (JSON object) of the source; events are spread over
`--partitions` partitions by a hash of their privacy unit, exactly as a keyed topic would, and run
through the same bounding, windowing, merging, noise and ledger code as the worker. The release
schedule is public: every window in [--from, --to) is released, empty or not; events outside it
are dead-lettered (`out_of_range`). A file line has no broker append time: each event counts as
arrived at its own event time (never late). Release records (the ledger's stored bytes) go out as
JSON lines.
"""

from __future__ import annotations

__all__ = ["register", "ReplayRecord", "ReplaySummary", "replay_lines", "data_range", "parse_utc"]

import argparse
import asyncio
import inspect
import sys
import zlib
from datetime import datetime, timedelta, timezone
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from dpstream.topology.errors import ConfigError, EventError
from dpstream.topology.model import Topology
from dpstream.topology.periods import period_start
from dpstream.workers.pipeline import BatchOutput, PartialMerger, PartitionPipeline
from dpstream.workers.pipeline.counters import EventCounts
from dpstream.workers.pipeline.events import EventParser, decode_json
from dpstream.workers.release.record import iso_utc
from dpstream.workers.release import ReleaseCounts, Releaser, ReleaseResult

_BATCH_LINES = 8192


@dataclass(frozen=True, slots=True)
class ReplayRecord:
    """A file line dressed as a Kafka record (no record time: events need their own timestamp)."""

    offset: int
    value: bytes
    timestamp: int | None = None


@dataclass
class ReplaySummary:
    """Totals of one replay (no values): events by outcome, releases by outcome, the results."""

    events: EventCounts = field(default_factory=EventCounts)
    releases: ReleaseCounts = field(default_factory=ReleaseCounts)
    results: list[ReleaseResult] = field(default_factory=list)

    def lines(self) -> list[str]:
        """Human summary for stderr: counts and reasons only."""
        ev = self.events.snapshot()
        rel = self.releases.snapshot()
        out = ["events: " + ", ".join(f"{k}={v}" for k, v in ev.items())]
        out.append("releases: " + ", ".join(f"{k}={v}" for k, v in rel.items()))
        if self.releases.reasons:
            out.append("not published: " + ", ".join(f"{r}={n}" for r, n in sorted(self.releases.reasons.items())))
        return out


def _partition_of(raw: bytes, unit_field: str, partitions: int) -> int:
    """Partition by crc32 of the privacy unit; unparsable lines go to 0 (they dead-letter there)."""
    if partitions == 1:
        return 0
    try:
        obj = decode_json(raw)
        unit = obj.get(unit_field) if isinstance(obj, dict) else None
    except (ValueError, TypeError):
        unit = None
    if unit is None:
        return 0
    return zlib.crc32(str(unit).encode()) % partitions


async def replay_lines(
    topology: Topology,
    lines: Iterable[bytes],
    ledger: Any,
    publish: Callable[[bytes, bytes], Awaitable[Any]],
    *,
    start: int,
    end: int,
    source: str | None = None,
    partitions: int = 1,
    mechanism_factory: Callable[..., Any] | None = None,
) -> ReplaySummary:
    """Run `lines` (events of one source) through the whole core over the public schedule
    [start, end) (epoch seconds); `publish` gets each stored record."""
    if end <= start:
        raise ConfigError(f"replay range [{start}, {end}): --to must be after --from")
    src = _pick_source(topology, source)
    pipes = [
        PartitionPipeline(topology, src, p, schedule_start=start, until=end, partitions=partitions,
                          event_range=(start, end))
        for p in range(partitions)
    ]
    metrics = [m for m in topology.metrics.values() if m.source == src]
    mergers = {m.name: PartialMerger(m.name, range(partitions)) for m in metrics}
    releaser = Releaser(topology, ledger, mechanism_factory=mechanism_factory)
    summary = ReplaySummary(releases=releaser.counts)
    unit_field = topology.sources[src].privacy_unit
    offsets = [0] * partitions
    dead_letters = 0

    async def handle(out: BatchOutput) -> None:
        nonlocal dead_letters
        dead_letters += len(out.dead_letters)
        for partial in out.partials:
            for merged in mergers[partial.metric].add(partial):
                summary.results.append(await releaser.release_merged(merged, publish))

    batches: list[list[ReplayRecord]] = [[] for _ in range(partitions)]
    pending = 0
    for raw in lines:
        raw = raw.rstrip(b"\r\n")
        if not raw.strip():
            continue
        p = _partition_of(raw, unit_field, partitions)
        batches[p].append(ReplayRecord(offsets[p], raw))
        offsets[p] += 1
        pending += 1
        if pending >= _BATCH_LINES:
            for p, batch in enumerate(batches):
                await handle(pipes[p].process_batch(batch))
            batches = [[] for _ in range(partitions)]
            pending = 0
    for p, batch in enumerate(batches):
        await handle(pipes[p].process_batch(batch))
    for pipe in pipes:
        await handle(pipe.flush())
    for merger in mergers.values():
        for merged in merger.drain():
            summary.results.append(await releaser.release_merged(merged, publish))
    for pipe in pipes:
        c = pipe.refresh_counts()
        e = summary.events
        e.accepted += c.accepted
        e.late += c.late
        e.capped += c.capped
        e.clamped += c.clamped
        e.skipped += c.skipped
        e.invalid.update(c.invalid)
    return summary


def data_range(topology: Topology, lines: Iterable[bytes], source: str | None = None) -> tuple[int, int] | None:
    """The whole budget periods spanned by the valid events' times (the longest period of the
    source's scopes), or None when no line is a valid event. Derived from the data: a fallback for
    `replay` without --from/--to, not a public schedule."""
    src = _pick_source(topology, source)
    parser = EventParser(topology.sources[src])
    lo = hi = None
    for raw in lines:
        raw = raw.strip()
        if not raw:
            continue
        try:
            ts = parser.parse(raw).time
        except EventError:
            continue
        lo = ts if lo is None or ts < lo else lo
        hi = ts if hi is None or ts > hi else hi
    if lo is None or hi is None:
        return None
    period = max(topology.budgets[m.budget].period_s for m in topology.metrics.values() if m.source == src)
    return period_start(period, lo), period_start(period, hi) + period


def parse_utc(text: str, flag: str) -> int:
    """Epoch seconds from `--from/--to`: ISO-8601 with Z/+00:00, a date (midnight UTC), or epoch seconds."""
    value = text.strip()
    try:
        return int(value)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: not a time; give ISO-8601 UTC (2026-11-30T00:00:00Z), a date or epoch seconds") from None
    if parsed.tzinfo is None:
        if len(value) == 10:  # a plain date: midnight UTC
            parsed = parsed.replace(tzinfo=timezone.utc)
        else:
            raise ConfigError(f"{flag} {text!r}: no UTC offset; add Z (e.g. {value}Z)")
    if parsed.utcoffset() != timedelta(0):
        raise ConfigError(f"{flag} {text!r}: not UTC; give the time with Z or +00:00")
    return int(parsed.timestamp())


def _pick_source(topology: Topology, source: str | None) -> str:
    if source is not None:
        if source not in topology.sources:
            raise ConfigError(
                f"{topology.path or 'topology'}: --source {source!r} is not a source; choose one of "
                f"{', '.join(sorted(topology.sources))}"
            )
        return source
    if len(topology.sources) != 1:
        raise ConfigError(
            f"{topology.path or 'topology'}: has sources {', '.join(sorted(topology.sources))}; "
            "name the one the events belong to with --source"
        )
    return next(iter(topology.sources))


async def _open_ledger(spec: str, topology: Topology) -> Any:
    from dpstream.workers.ledger import open_ledger

    ledger = open_ledger(spec, topology)
    return await ledger if inspect.isawaitable(ledger) else ledger


async def _close(ledger: Any) -> None:
    for name in ("aclose", "close"):
        fn = getattr(ledger, name, None)
        if fn is not None:
            res = fn()
            if inspect.isawaitable(res):
                await res
            return


async def _run(args: argparse.Namespace) -> int:
    from dpstream.topology.loader import load_topology

    topology = load_topology(args.file)
    if args.partitions < 1:
        raise ConfigError(f"--partitions {args.partitions}: need at least 1")
    span = _schedule(args, topology)
    try:
        events: BinaryIO = open(args.events, "rb")
    except OSError as exc:
        raise ConfigError(f"{args.events}: cannot read events file ({exc.strerror}); give a JSON-lines file") from None
    out: BinaryIO = sys.stdout.buffer if args.out in (None, "-") else open(args.out, "wb")
    ledger = await _open_ledger(args.ledger, topology)

    async def publish(value: bytes, key: bytes) -> None:
        out.write(value + b"\n")

    try:
        with events:
            summary = await replay_lines(
                topology, events, ledger, publish, start=span[0], end=span[1], source=args.source,
                partitions=args.partitions,
            )
    finally:
        await _close(ledger)
        if out is not sys.stdout.buffer:
            out.close()
        else:
            out.flush()
    for line in summary.lines():
        print(f"dpstream replay: {line}", file=sys.stderr)
    return 0


def _schedule(args: argparse.Namespace, topology: Topology) -> tuple[int, int]:
    """[from, to) of the replay: the flags, or (said so on stderr) the periods the events span."""
    if args.start is not None and args.end is not None:
        return parse_utc(args.start, "--from"), parse_utc(args.end, "--to")
    if args.start is not None or args.end is not None:
        raise ConfigError("--from/--to: give both (the public schedule of the replay), or neither")
    try:
        with open(args.events, "rb") as fh:
            span = data_range(topology, fh, args.source)
    except OSError as exc:
        raise ConfigError(f"{args.events}: cannot read events file ({exc.strerror}); give a JSON-lines file") from None
    if span is None:
        raise ConfigError(f"{args.events}: no valid event to derive a range from; give --from and --to")
    print(
        f"dpstream replay: no --from/--to: releasing [{iso_utc(span[0])}, {iso_utc(span[1])}), the whole budget "
        "periods the events span; this range is derived from the data (give --from/--to for a public schedule)",
        file=sys.stderr,
    )
    return span


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `replay`."""
    parser = subparsers.add_parser(
        "replay",
        help="run the pipeline over a JSON-lines file of events (no Kafka; in-process ledger by default)",
        description=__doc__,
    )
    parser.add_argument("file", help="topology YAML")
    parser.add_argument("events", help="JSON-lines file, one event per line")
    parser.add_argument("--ledger", default="memory", help="memory (default) or redis://host:port/db")
    parser.add_argument("--out", default=None, help="where to write release records (JSON lines; default stdout)")
    parser.add_argument("--partitions", type=int, default=1, help="partitions to spread units over (default 1)")
    parser.add_argument("--source", default=None, help="source of the events (needed when the topology has several)")
    parser.add_argument("--from", dest="start", default=None,
                        help="first window start, UTC (ISO-8601 with Z, a date, or epoch s); events before it are "
                        "dead-lettered as out_of_range")
    parser.add_argument("--to", dest="end", default=None,
                        help="end of the last window, UTC; without --from/--to the whole budget periods the events "
                        "span are used (derived from the data, and said so)")
    parser.set_defaults(func=lambda args: asyncio.run(_run(args)))
