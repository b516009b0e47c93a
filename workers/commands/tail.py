"""`dpstream tail TOPOLOGY [--metric M] [--from T] [--json]`: the public feed, read from the releases topic.

Reads every partition of the topology's releases topic and follows it. By default each metric's
releases are shown from the first window of its scope's current budget period (the topology's public
schedule, `workers.feed.start`), so today's feed shows at once; `--from T` shows the windows starting at
or after T instead. Records are deduped by release_id (`workers.feed.Dedupe`: the first wins, a later
one that differs is a conflict, said on stderr and never shown). Each release prints as the worker's
INFO line (`release.display.release_line`), or as its record, one JSON line each, with `--json`.
SIGINT, SIGTERM and a closed stdout (`| head -1`) end it with exit 0.

It is the reference consumer of the feed: it needs nothing but the topic (no ledger, no group).
"""

from __future__ import annotations

__all__ = ["register", "Tail"]

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, TextIO

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Topology
from dpstream.workers.feed import Dedupe, Verdict, feed_starts, read_releases, seek_time
from dpstream.workers.release.display import release_line
from dpstream.workers.runtime.kafka_security import KafkaSecurity


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `tail` sub-command."""
    parser = subparsers.add_parser(
        "tail",
        help="print the releases of the topology's releases topic and follow it (deduped by release_id)",
        description="Reads the public releases topic from the start of each metric's current budget period "
        "(or --from), then follows it; each release once (the first record of its release_id).",
    )
    parser.add_argument("topology", metavar="TOPOLOGY", help="topology YAML: its releases topic, Kafka and schedule")
    parser.add_argument(
        "--metric", action="append", default=None, metavar="M", help="only this metric (repeat for more)"
    )
    parser.add_argument(
        "--from",
        dest="since",
        default=None,
        metavar="T",
        help="show windows starting at or after T (ISO-8601 UTC, a date or epoch seconds; default: the start "
        "of each metric's current budget period)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON line per release: its record")
    parser.add_argument("--bootstrap", default=None, metavar="HOST:PORT", help="Kafka (default: the topology's)")
    parser.set_defaults(func=_run)


class Tail:
    """What `dpstream tail` prints of each record read: first records of the chosen metrics' windows
    from their start, once each; conflicts said on `err`."""

    def __init__(self, starts: dict[str, int], *, as_json: bool, out: TextIO, err: TextIO) -> None:
        self.starts = starts
        self.as_json = as_json
        self.out = out
        self.err = err
        self.dedupe = Dedupe()

    def offer(self, payload: bytes) -> None:
        """Print the record when it is a release to show (raises BrokenPipeError when stdout is gone)."""
        seen = self.dedupe.offer(payload)
        if seen.metric not in self.starts:
            return
        if seen.verdict is Verdict.CONFLICT:
            print(
                f"dpstream tail: conflict: release {seen.release_id} of {seen.metric} published again with "
                "other bytes; the first record stands (not shown)",
                file=self.err,
                flush=True,
            )
            return
        record = seen.record
        if seen.verdict is not Verdict.FIRST or record is None or not self._shown(record):
            return
        line = payload.decode() if self.as_json else release_line(record)
        if line is not None:
            self.out.write(line + "\n")
            self.out.flush()

    def _shown(self, record: dict[str, Any]) -> bool:
        """A release of a window at or after its metric's start (a charge-only marker is no release)."""
        if record.get("charge_only"):
            return False
        start = (record.get("window") or {}).get("start_epoch")
        return isinstance(start, int) and start >= self.starts[record["metric"]]


def _metrics(topology: Topology, chosen: list[str] | None) -> list[str]:
    """The metrics to show: `--metric`'s (each must be the topology's), else all of them."""
    if not chosen:
        return sorted(topology.metrics)
    unknown = [m for m in chosen if m not in topology.metrics]
    if unknown:
        known = ", ".join(sorted(topology.metrics))
        raise ConfigError(f"--metric {unknown[0]}: not a metric of the topology; give one of {known}")
    return sorted(set(chosen))


async def _follow(topology: Topology, bootstrap: str, security: KafkaSecurity, tail: Tail) -> None:
    def waiting() -> None:
        print(f"dpstream tail: waiting for topic {topology.sinks.releases} on {bootstrap}", file=sys.stderr, flush=True)

    async for payload in read_releases(
        bootstrap, topology.sinks.releases, security, seek_time(tail.starts), on_waiting=waiting
    ):
        tail.offer(payload)


async def _until_signal(work: Callable[[], Any]) -> None:
    """Run `work()` until it ends or SIGINT/SIGTERM arrives (then it is cancelled)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    task = asyncio.ensure_future(work())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    task.cancel()  # nothing when it ended by itself
    with contextlib.suppress(asyncio.CancelledError):
        await task  # raises what `work()` raised (a closed stdout, Kafka unreachable)


def _stdout_gone() -> int:
    """Stdout's reader went away: stop quietly (exit 0), with stdout on /dev/null so that the
    interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


def _run(args: argparse.Namespace) -> int:
    import logging
    import time

    from dpstream.topology.loader import load_topology
    from dpstream.workers.commands.replay import parse_utc

    logging.getLogger("aiokafka").addHandler(logging.NullHandler())  # its failures come back as one line
    topology = load_topology(args.topology)
    since = parse_utc(args.since, "--from") if args.since is not None else None
    starts = feed_starts(topology, _metrics(topology, args.metric), time.time(), since=since)
    security = KafkaSecurity.from_env(kafka=topology.kafka)
    bootstrap = args.bootstrap or topology.kafka.bootstrap
    tail = Tail(starts, as_json=args.json, out=sys.stdout, err=sys.stderr)
    try:
        asyncio.run(_until_signal(lambda: _follow(topology, bootstrap, security, tail)))
    except BrokenPipeError:
        return _stdout_gone()
    except KeyboardInterrupt:  # a SIGINT before the handler was installed
        return 0
    return 0
