"""`dpstream validate FILE [--json] [--sample EVENTS.jsonl [--source NAME]]`: check a topology file; exit 0
(with warnings) or 2 with one line per mistake (all of them, in file order).

`--sample` also runs a sample of one source's events (JSON lines) through the worker's own parser and
accumulators (`PartitionPipeline`, one partition, each event arriving at its own event time) and says,
per metric, how many events it would use and why it would not use the others: the skip reasons of
`dpstream_events_skipped_total` (a mis-named value or group field, a key outside `keys`) and the
dead-letter reasons of invalid events. Counts only, no values; exact, so curator-only.
"""

from __future__ import annotations

__all__ = ["register", "run", "SampleUse", "sample_use"]

import argparse
import json
import sys
from dataclasses import dataclass

from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import load_with_warnings
from dpstream.topology.model import Topology
from dpstream.topology.validation import TopologyError

SAMPLE_NOTE = "curator-only: exact counts of the sample, not for publication"
"""What the `--sample` report is: un-noised counts of the owner's own events."""


@dataclass(frozen=True)
class SampleUse:
    """Per metric of the sample's source: events it would use, and the others by reason (counts only)."""

    path: str
    source: str
    events: int
    """Non-blank lines of the sample."""
    accepted: int
    invalid: dict[str, int]
    """Dead-letter reason → lines the parser refused (no metric uses them)."""
    used: dict[str, int]
    """metric → accepted events it would use (every metric of the source, in topology order)."""
    skipped: dict[str, dict[str, int]]
    """metric → {skip reason: accepted events it would leave out} (metrics and reasons with none left out)."""


def sample_use(topology: Topology, path: str, source: str | None = None) -> SampleUse:
    """Run the sample at `path` through a fresh `PartitionPipeline` and read its event counters: the same
    parsing and matching as a worker (no second rule here). ConfigError for an unreadable file or an
    unknown / ambiguous source."""
    from dpstream.workers.commands._typical import _pick_source, _read_lines
    from dpstream.workers.pipeline import PartitionPipeline
    from dpstream.workers.runtime.replay import ReplayRecord

    src = _pick_source(topology, source, path)
    lines = _read_lines(path)
    # S = 0: every valid event lies in the schedule, so each one reaches every metric's accumulator
    pipe = PartitionPipeline(topology, src, 0, schedule_start=0)
    pipe.process_batch(ReplayRecord(i, raw) for i, raw in enumerate(lines))
    counts = pipe.refresh_counts()
    skipped = counts.skips_by_metric()
    metrics = [m.name for m in topology.metrics.values() if m.source == src]
    return SampleUse(
        path=path,
        source=src,
        events=len(lines),
        accepted=counts.accepted,
        invalid=dict(sorted(counts.invalid.items())),
        used={m: counts.accepted - sum(skipped.get(m, {}).values()) for m in metrics},
        skipped=skipped,
    )


def _sample_lines(use: SampleUse) -> list[str]:
    """The human report: a head line, then one line per metric."""
    invalid = sum(use.invalid.values())
    head = (
        f"sample {use.path}, source {use.source} ({SAMPLE_NOTE}): {use.events} events, {use.accepted} valid, "
        f"{invalid} invalid"
    )
    if use.invalid:
        head += " (" + ", ".join(f"{r}={n}" for r, n in use.invalid.items()) + ")"
    out = [head]
    for metric, used in use.used.items():
        reasons = {**use.skipped.get(metric, {}), **{f"invalid:{r}": n for r, n in use.invalid.items()}}
        line = f"  {metric}: uses {used} of {use.events}"
        if reasons:
            line += f"; not {use.events - used}: " + ", ".join(f"{r}={n}" for r, n in reasons.items())
        out.append(line)
    return out


def _sample_doc(use: SampleUse) -> dict:
    return {
        "note": SAMPLE_NOTE,
        "file": use.path,
        "source": use.source,
        "events": use.events,
        "accepted": use.accepted,
        "invalid": use.invalid,
        "metrics": {
            m: {"used": used, "not_used": use.events - used, "skipped": use.skipped.get(m, {})}
            for m, used in use.used.items()
        },
    }


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `validate` subcommand."""
    parser = subparsers.add_parser(
        "validate",
        help="check a topology file (exit 2 with one FILE:LINE: line per mistake)",
        description="Check a topology file: every mistake is one line naming FILE:LINE, the entity, "
        "the field, the bad value and the fix (exit 2); warnings are printed and exit 0.",
    )
    parser.add_argument("file", metavar="FILE", help="topology YAML file")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    parser.add_argument(
        "--sample",
        metavar="EVENTS.jsonl",
        default=None,
        help="also report, per metric, how many of these events (JSON lines of one source) it would use and "
        "why not the others (curator-only counts)",
    )
    parser.add_argument(
        "--source", metavar="NAME", default=None, help="the source the --sample events belong to (if FILE has several)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load and lint `args.file`; print the summary (or JSON). Every mistake of the topology is one
    stderr line (exit 2); any other ConfigError (no such file) propagates to the CLI (exit 2)."""
    try:
        topology, warnings = load_with_warnings(args.file)
    except ConfigError as exc:
        problems = exc.problems if isinstance(exc, TopologyError) else (str(exc),)
        if args.json:
            json.dump({"ok": False, "file": args.file, "error": str(exc), "errors": list(problems)}, sys.stdout)
            print()
        if not isinstance(exc, TopologyError):
            raise
        for problem in problems:
            print(f"dpstream: error: {problem}", file=sys.stderr)
        return 2
    if args.source is not None and args.sample is None:
        raise ConfigError("--source: only with --sample EVENTS.jsonl (the source the sample's events belong to)")
    use = sample_use(topology, args.sample, args.source) if args.sample is not None else None
    if args.json:
        doc = {
            "ok": True,
            "file": args.file,
            "topology_version": topology.topology_version,
            "sources": len(topology.sources),
            "budgets": len(topology.budgets),
            "metrics": len(topology.metrics),
            "warnings": [{"where": w.where, "message": w.message} for w in warnings],
        }
        if use is not None:
            doc["sample"] = _sample_doc(use)
        json.dump(doc, sys.stdout, indent=2, ensure_ascii=False)
        print()
        return 0
    print(
        f"ok: {args.file}: {len(topology.sources)} sources, {len(topology.budgets)} budgets, "
        f"{len(topology.metrics)} metrics (topology_version {topology.topology_version})"
    )
    for warning in warnings:
        print(warning)
    for line in _sample_lines(use) if use is not None else []:
        print(line)
    return 0
