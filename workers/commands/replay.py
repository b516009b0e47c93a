"""`dpstream replay FILE EVENTS.jsonl`: the worker's core over a file — no Kafka, in-process ledger.

Each line of EVENTS is one event (JSON object) of the source; events are spread over
`--partitions` partitions by a hash of their privacy unit, exactly as a keyed topic would, and run
through the same bounding, windowing, merging, noise and ledger code as the worker. The release
schedule is public: every window in [--from, --to) is released, empty or not (both flags are
required: the schedule never comes from the events); events outside it are dead-lettered
(`out_of_range`). A file line has no broker append time: each event counts as arrived at its own
event time (never late). Release records (the ledger's stored bytes) go out as JSON lines.
"""

from __future__ import annotations

__all__ = ["register", "parse_utc", "replay_lines"]

import argparse
import asyncio
import sys
from datetime import UTC, datetime, timedelta
from typing import BinaryIO

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Topology
from dpstream.workers.commands.budget import default_actor
from dpstream.workers.ledger import open_ledger
from dpstream.workers.ledger.identity import NO_LEDGER_NOTE
from dpstream.workers.pipeline.unit_ids import check_unit_hashing
from dpstream.workers.release.record import iso_utc
from dpstream.workers.runtime.replay import replay_lines

# This module is the command line only (arguments, files, the ledger, printing). The engine lives in
# dpstream.workers.runtime.replay; `replay_lines` stays importable from here for callers written
# against the old location (tests/privacy/_neighbours.py).


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
        raise ConfigError(
            f"{flag} {text!r}: not a time; give ISO-8601 UTC (2026-11-30T00:00:00Z), a date or epoch seconds"
        ) from None
    if parsed.tzinfo is None:
        if len(value) == 10:  # a plain date: midnight UTC
            parsed = parsed.replace(tzinfo=UTC)
        else:
            raise ConfigError(f"{flag} {text!r}: no UTC offset; add Z (e.g. {value}Z)")
    if parsed.utcoffset() != timedelta(0):
        raise ConfigError(f"{flag} {text!r}: not UTC; give the time with Z or +00:00")
    return int(parsed.timestamp())


async def _run(args: argparse.Namespace) -> int:
    from dpstream.topology.loader import load_topology

    topology = load_topology(args.file)
    check_unit_hashing(topology)  # before the ledger registers anything
    if args.partitions < 1:
        raise ConfigError(f"--partitions {args.partitions}: need at least 1")
    span = _schedule(args, topology)
    try:
        events: BinaryIO = open(args.events, "rb")  # noqa: SIM115 - closed by `with events:` below
    except OSError as exc:
        raise ConfigError(f"{args.events}: cannot read events file ({exc.strerror}); give a JSON-lines file") from None
    out: BinaryIO = sys.stdout.buffer if args.out in (None, "-") else open(args.out, "wb")  # noqa: SIM115 - closed in finally
    # the replay's schedule starts at --from: its ledger prices that first period from there
    ledger = await open_ledger(args.ledger, topology, actor=args.actor, schedule_start=span[0])

    async def publish(value: bytes, key: bytes) -> None:
        out.write(value + b"\n")

    try:
        with events:
            summary = await replay_lines(
                topology,
                events,
                ledger,
                publish,
                start=span[0],
                end=span[1],
                source=args.source,
                partitions=args.partitions,
                actor=args.actor,
            )
    finally:
        await ledger.close()
        if out is not sys.stdout.buffer:
            out.close()
        else:
            out.flush()
    for line in summary.lines():
        print(f"dpstream replay: {line}", file=sys.stderr)
    if ledger.ledger_id is None:
        print(f"dpstream replay: {NO_LEDGER_NOTE}", file=sys.stderr)
    return 0


def _schedule(args: argparse.Namespace, topology: Topology) -> tuple[int, int]:
    """[from, to) of the replay, from the flags only: the release schedule is public, so nothing here
    looks at the events (a range taken from them would let one unit's timestamp add releases)."""
    if args.start is None or args.end is None:
        raise ConfigError(
            "replay: --from and --to are both required: the public schedule of the releases "
            "(e.g. --from 2026-11-30 --to 2026-12-01, UTC)"
        )
    given = parse_utc(args.start, "--from"), parse_utc(args.end, "--to")
    for line in _cut_windows(topology, given[0]):
        print(f"dpstream replay: note: {line}", file=sys.stderr)
    return given


def _cut_windows(topology: Topology, start: int) -> list[str]:
    """One line per metric whose window grid --from does not fall on: the schedule starts at --from,
    so the window it cuts is not released (as a worker deployed at that moment would not)."""
    out = []
    for metric in topology.metrics.values():
        every = metric.window.every_s
        if start % every:
            first = start + every - start % every
            out.append(
                f"--from {iso_utc(start)} is not on {metric.name}'s window grid (every {every} s): its first "
                f"release is the window starting {iso_utc(first)}; give a --from on the grid to include the one it cuts"
            )
    return out


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `replay`."""
    parser = subparsers.add_parser(
        "replay",
        help="run the pipeline over a JSON-lines file of events (no Kafka; in-process ledger by default)",
        description=__doc__,
    )
    parser.add_argument("file", help="topology YAML")
    parser.add_argument("events", help="JSON-lines file, one event per line")
    parser.add_argument(
        "--ledger",
        "--redis",
        dest="ledger",
        default="memory",
        help="memory (default) or a Redis ledger URL (redis://host:port/db): the replayed period can then be "
        "reviewed with `dpstream budget report --redis URL`",
    )
    parser.add_argument(
        "--actor",
        default=f"replay:{default_actor()}",
        help="who runs it, for the ledger's audit trail when --ledger is a shared Redis (default replay:$USER)",
    )
    parser.add_argument("--out", default=None, help="where to write release records (JSON lines; default stdout)")
    parser.add_argument("--partitions", type=int, default=1, help="partitions to spread units over (default 1)")
    parser.add_argument("--source", default=None, help="source of the events (needed when the topology has several)")
    parser.add_argument(
        "--from",
        dest="start",
        default=None,
        help="first window start, UTC (ISO-8601 with Z, a date, or epoch s; required); events before it "
        "are dead-lettered as out_of_range",
    )
    parser.add_argument(
        "--to",
        dest="end",
        default=None,
        help="end of the last window, UTC (required, as --from is: the schedule never comes from the events)",
    )
    parser.set_defaults(func=lambda args: asyncio.run(_run(args)))
