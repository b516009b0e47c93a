"""`dpstream bench replay`: `dpstream replay`'s engine against PipelineDP's LocalBackend, same events.

The reference shape: a JSON-lines file of 10 days (`--days`), ~842,300 events (`--events`, by
default 84,230 a day) of Zipf-skewed users, one one-minute count metric (L∞ = 1 per window) in a
zCDP scope of ε = 1, δ = 1e-6 per day at the default reserve: 1,440 releases a day, every window
of the public schedule [start, start + days). Synthetic data: numpy's RNG is fine here (a bench
module; nothing generated here is ever published).

- dpstream: `replay_lines` on the file as `dpstream replay` runs it (in-process ledger, one
  partition; reading, JSON parsing, bounding, windowing, noise, pricing, the ledger and the
  record bytes all timed; the release records are kept in memory, not written).
- PipelineDP (optional, `pip install 'dpstream[bench]'`): the same file read and parsed with the
  same JSON decoder, then per budget period (day) one `DPEngine.aggregate` COUNT on
  `LocalBackend` with the day's windows as public partitions, Gaussian noise, a user in at most
  every window (max_partitions_contributed = 1,440) once each (max_contributions_per_partition =
  1), and the day's whole (ε, δ) in one `NaiveBudgetAccountant` — its batch optimum: one
  analytic-Gaussian release of all 1,440 counts, L2 sensitivity √1440.

Figures are CPU seconds (`time.process_time`; wall time is shown too): events/s of both, their
ratio (target ≥ 1.5×), and the σ ratio, dpstream's per-release noise σ over PipelineDP's
(target ≤ 1.25×). Without PipelineDP the bench says so and reports dpstream's figures alone.
Needs only the package (and PipelineDP for the comparison).
"""

from __future__ import annotations

__all__ = ["register", "run", "measure", "write_events"]

import argparse
import asyncio
import json
import re
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import load_topology_text
from dpstream.workers.ledger import open_ledger
from dpstream.workers.pipeline.events import decode_json
from dpstream.workers.runtime.replay import replay_lines

DAY_S = 86_400
WINDOW_S = 60
START = 1_764_460_800
"""2025-11-30T00:00:00Z: the first window of the schedule starts a budget period."""
EVENTS_PER_DAY = 84_230
"""The reference file's rate: 842,300 events over 10 days."""
EPSILON, DELTA = 1.0, 1e-6

TOPOLOGY = f"""\
version: 1
sources:
  events: {{topic: bench.events, privacy_unit: user_id, timestamp: ts}}
budgets:
  daily: {{epsilon: {EPSILON}, delta: {DELTA}, accounting: zcdp, period: 1d}}
metrics:
  per_minute:
    source: events
    budget: daily
    weight: 1
    window: {{tumbling: {WINDOW_S}s}}
    aggregate: count
    contribution: {{max_per_key: 1}}
    mechanism: gaussian
sinks: {{releases: bench.releases, dead_letter: bench.dead}}
"""


@dataclass(frozen=True)
class Side:
    """One engine's run over the file."""

    engine: str
    cpu_s: float
    wall_s: float
    events_per_s: float
    """Events over CPU seconds."""
    releases: int
    sigma: float
    """Noise standard deviation of one release (one window's count)."""


@dataclass(frozen=True)
class Result:
    """Both sides and their ratios (PipelineDP's fields None when it is not installed)."""

    days: int
    events: int
    dpstream: Side
    pipelinedp: Side | None
    pipelinedp_missing: str | None
    speed_ratio: float | None
    """dpstream events/s over PipelineDP's (target ≥ 1.5)."""
    sigma_ratio: float | None
    """dpstream's per-release σ over PipelineDP's (target ≤ 1.25)."""


def write_events(path: Path, days: int, events: int, users: int = 20_000, seed: int = 0) -> None:
    """A JSON-lines file of `events` events over `days` days from START, in time order."""
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.uniform(START, START + days * DAY_S, events))
    ranks = rng.zipf(1.3, events) % users
    with open(path, "wb") as fh:
        for lo in range(0, events, 65_536):
            hi = min(events, lo + 65_536)
            lines = (b'{"user_id":"u%d","ts":%.3f}\n' % (u, t) for u, t in zip(ranks[lo:hi], ts[lo:hi], strict=True))
            fh.write(b"".join(lines))


async def _dpstream(path: Path, days: int, events: int) -> Side:
    topology = load_topology_text(TOPOLOGY)
    records: list[bytes] = []

    async def publish(value: bytes, key: bytes) -> None:
        records.append(value)

    c0, w0 = time.process_time(), time.perf_counter()
    ledger = await open_ledger("memory", topology, actor="bench")
    try:
        with open(path, "rb") as fh:
            summary = await replay_lines(topology, fh, ledger, publish, start=START, end=START + days * DAY_S)
    finally:
        await ledger.close()
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    if summary.events.accepted != events:
        raise RuntimeError(f"bench replay: {summary.events.accepted} of {events} events accepted")
    sigmas = [float(json.loads(r)["noise"]["stddev"]) for r in records]
    return Side("dpstream replay", cpu, wall, events / cpu, len(records), statistics.median(sigmas))


def _pipelinedp(path: Path, days: int, events: int) -> Side:
    import pipeline_dp
    from pipeline_dp.report_generator import ExplainComputationReport

    windows_per_day = DAY_S // WINDOW_S
    c0, w0 = time.process_time(), time.perf_counter()
    by_day: dict[int, list[tuple[str, int]]] = {}
    with open(path, "rb") as fh:
        for line in fh:
            event = decode_json(line)
            ts = float(event["ts"])
            by_day.setdefault(int(ts // DAY_S), []).append((event["user_id"], int(ts // WINDOW_S) * WINDOW_S))
    releases, reports = 0, []
    for day in range(START // DAY_S, START // DAY_S + days):
        accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=EPSILON, total_delta=DELTA)
        engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
        params = pipeline_dp.AggregateParams(
            noise_kind=pipeline_dp.NoiseKind.GAUSSIAN,
            metrics=[pipeline_dp.Metrics.COUNT],
            max_partitions_contributed=windows_per_day,
            max_contributions_per_partition=1,
        )
        extractors = pipeline_dp.DataExtractors(
            privacy_id_extractor=lambda row: row[0],
            partition_extractor=lambda row: row[1],
            value_extractor=lambda row: 0,
        )
        report = ExplainComputationReport()
        public = list(range(day * DAY_S, (day + 1) * DAY_S, WINDOW_S))
        result = engine.aggregate(
            by_day.get(day, []), params, extractors, public_partitions=public, out_explain_computation_report=report
        )
        accountant.compute_budgets()
        releases += sum(1 for _ in result)
        reports.append(report)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    match = re.search(r"Gaussian mechanism:\s+parameter=([0-9.eE+-]+)", reports[0].text())
    if match is None:
        raise RuntimeError("bench replay: PipelineDP's computation report names no Gaussian parameter")
    return Side("PipelineDP LocalBackend", cpu, wall, events / cpu, releases, float(match.group(1)))


def measure(days: int, events: int, users: int = 20_000, seed: int = 0, workdir: Path | None = None) -> Result:
    """Generate the file, run both engines on it, and compare."""
    with tempfile.TemporaryDirectory(prefix="dpstream-bench-replay-", dir=workdir) as tmp:
        path = Path(tmp) / "events.jsonl"
        write_events(path, days, events, users, seed)
        ours = asyncio.run(_dpstream(path, days, events))
        try:
            import pipeline_dp  # noqa: F401  # only to know whether the comparison can run
        except ImportError as exc:
            missing: str | None = f"PipelineDP is not installed ({exc}); pip install 'dpstream[bench]' to compare"
            theirs = None
        else:
            missing = None
            theirs = _pipelinedp(path, days, events)
    return Result(
        days,
        events,
        ours,
        theirs,
        missing,
        ours.events_per_s / theirs.events_per_s if theirs else None,
        ours.sigma / theirs.sigma if theirs else None,
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench replay`."""
    parser = subparsers.add_parser("replay", help="replay events/s and noise σ vs PipelineDP's LocalBackend")
    parser.add_argument("--days", type=int, default=10, help="days of events (default 10)")
    parser.add_argument(
        "--events",
        type=int,
        default=None,
        help=f"events in the file (default {EVENTS_PER_DAY:,} per day: 842,300 for 10 days)",
    )
    parser.add_argument("--users", type=int, default=20_000, help="distinct users (default 20000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic events (default 0)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print both engines' figures and the ratios (or JSON)."""
    events = args.events if args.events is not None else EVENTS_PER_DAY * args.days
    if args.days < 1 or events < 1 or args.users < 1:
        raise ConfigError("--days/--events/--users: need at least 1")
    result = measure(args.days, events, args.users, args.seed)
    if args.json:
        doc: dict[str, Any] = asdict(result)
        doc["clock"] = "process_time"
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"replay bench: {result.events:,} events over {result.days} days, one 1-minute count metric, "
        f"ε = {EPSILON} and δ = {DELTA:g} per day"
    )
    print(f"{'engine':<24} {'CPU s':>7} {'wall s':>7} {'events/s':>10} {'releases':>9} {'σ':>8}")
    for side in (result.dpstream, result.pipelinedp):
        if side is not None:
            print(
                f"{side.engine:<24} {side.cpu_s:>7.2f} {side.wall_s:>7.2f} {side.events_per_s:>10,.0f} "
                f"{side.releases:>9,} {side.sigma:>8.2f}"
            )
    if result.pipelinedp_missing:
        print(f"PipelineDP comparison skipped: {result.pipelinedp_missing}")
    else:
        print(f"speed ratio dpstream / PipelineDP = {result.speed_ratio:.2f}x (target >= 1.5x, CPU events/s)")
        print(
            f"σ ratio dpstream / PipelineDP = {result.sigma_ratio:.3f}x (target <= 1.25x; dpstream at the default "
            "reserve 0.2, PipelineDP's batch optimum)"
        )
    return 0
