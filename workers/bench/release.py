"""`dpstream bench release`: CPU per release on the in-process path against a bare OpenDP sample.

One zCDP scope (ε = 1 per day, δ = 1e-6, default reserve) and a one-minute count metric with
discrete Gaussian noise, released window after window through `Releaser.release` on the
in-process ledger (quote → noise → record → charge → commit; the publish is a no-op, so it is
excluded). Twice in one run: one ungrouped key, and 1,000 declared keys. The baseline is a bare
OpenDP call of the same distribution: `make_gaussian` on an i64 vector at the release's scale,
invoked on as many keys right after each release (interleaved, so that other load on the
machine weighs on both alike). Each release then starts with caches the OpenDP call has just
used (as a worker's release starts after its event path): the cold figure. A second pass times
the release stream as `replay` runs it, a block of releases back to back, then as many bare
calls (blocks alternating): the warm figure. Figures are `time.process_time` per release (CPU,
so that load inflates them less than wall time would). Needs only the package.
"""

from __future__ import annotations

__all__ = ["register", "run", "measure"]

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import opendp.prelude as dp

from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import Metric, Topology
from dpstream.workers.ledger import open_ledger
from dpstream.workers.release import ReleaseOutcome, Releaser

_T0 = 1_796_083_200
"""A UTC midnight: the first window of the run starts a budget period."""

_YAML = """\
version: 1
sources:
  s: {{topic: bench.events, privacy_unit: user_id, timestamp: ts}}
budgets:
  daily: {{epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}}
metrics:
  per_minute:
    source: s
    budget: daily
    weight: 1
    window: {{tumbling: 1m}}
    aggregate: count
{grouping}    contribution: {{max_keys: 1, max_per_key: 1}}
    mechanism: gaussian
sinks: {{releases: bench.releases, dead_letter: bench.dead}}
"""


@dataclass(frozen=True)
class Row:
    """One width: CPU µs per release (dpstream) and per bare OpenDP sample of the same shape."""

    keys: int
    releases: int
    release_us: float
    """Median over the rounds of the CPU µs per release."""
    baseline_us: float
    """Median over the rounds of the CPU µs per bare OpenDP call."""
    ratio: float
    """Median over the rounds of release / bare."""
    overhead_us: float
    """release_us − baseline_us: what pricing, the record and the ledger add to the noise."""
    best_release_us: float
    """The least-loaded round's µs per release (min over rounds, as timeit reports)."""
    best_baseline_us: float
    price_noise_us: float
    """Median over the rounds of the CPU µs to quote a window and noise it at the quoted cost (the
    releaser's mechanism for that cost, its drawn-ahead noise), without the record and the charge."""
    scale: float
    """The discrete Gaussian σ parameter the releases used (integer units)."""
    stream_release_us: float
    """Median over the rounds of the CPU µs per release in a block of releases run back to back."""
    stream_baseline_us: float
    """Median over the rounds of the CPU µs per bare OpenDP call in a block of as many calls."""
    stream_ratio: float
    """Median over the rounds of stream release / stream bare."""


def _topology(keys: int) -> Topology:
    grouping = ""
    if keys > 1:
        names = ", ".join(f"k{i}" for i in range(keys))
        grouping = f"    group_by: page\n    keys: [{names}]\n"
    return load_topology_text(_YAML.format(grouping=grouping))


async def _no_publish(value: bytes, key: bytes) -> None:
    """The publish is excluded from the figure: nothing is sent anywhere."""


def _bare(keys: int, scale: float) -> tuple[Any, list[int]]:
    """The baseline: OpenDP's discrete Gaussian on an i64 vector at `scale`, and `keys` values for it."""
    dp.enable_features("contrib")
    meas = dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T=float), scale=scale)
    return meas, [(i * 7919) % 97 for i in range(keys)]


async def _measure_width(keys: int, releases: int, warmup: int, rounds: int) -> Row:
    """`releases` consecutive windows after `warmup`, each followed by one bare OpenDP call of the
    same shape, so that load on the machine weighs on both alike; timed in `rounds` rounds."""
    topology = _topology(keys)
    metric = next(iter(topology.metrics.values()))
    ledger = await open_ledger("memory", topology, actor="bench")
    releaser = Releaser(topology, ledger)
    names = [""] if keys == 1 else [f"k{i}" for i in range(keys)]
    values = {k: (i * 7919) % 97 for i, k in enumerate(names)}
    try:
        for i in range(warmup):
            res = await releaser.release(metric, (_T0 + 60 * i, _T0 + 60 * i + 60), values, _no_publish)
        scale = float(json.loads(res.payload)["noise"]["scale"])
        meas, bare_values = _bare(keys, scale)
        meas(bare_values)
        per_round = max(1, releases // rounds)
        rows: list[tuple[float, float]] = []
        window = _T0 + 60 * warmup
        for _ in range(rounds):
            ours = theirs = 0.0
            for _ in range(per_round):
                t0 = time.process_time()
                await releaser.release(metric, (window, window + 60), values, _no_publish)
                t1 = time.process_time()
                meas(bare_values)
                t2 = time.process_time()
                ours, theirs = ours + (t1 - t0), theirs + (t2 - t1)
                window += 60
            rows.append((ours / per_round * 1e6, theirs / per_round * 1e6))
        priced = [await _price_and_noise(releaser, metric, window, values, per_round) for _ in range(rounds)]
        streams: list[tuple[float, float]] = []
        for _ in range(rounds):
            t0 = time.process_time()
            for _ in range(per_round):
                await releaser.release(metric, (window, window + 60), values, _no_publish)
                window += 60
            t1 = time.process_time()
            for _ in range(per_round):
                meas(bare_values)
            t2 = time.process_time()
            streams.append(((t1 - t0) / per_round * 1e6, (t2 - t1) / per_round * 1e6))
    finally:
        await ledger.close()
    if releaser.counts.by_outcome[ReleaseOutcome.PUBLISHED] != warmup + 2 * per_round * rounds:
        raise RuntimeError(f"bench release: expected every release published, got {releaser.counts.snapshot()}")
    us = statistics.median(r[0] for r in rows)
    base = statistics.median(r[1] for r in rows)
    ratio = statistics.median(r[0] / r[1] for r in rows)
    return Row(
        keys,
        per_round * rounds,
        us,
        base,
        ratio,
        us - base,
        min(r[0] for r in rows),
        min(r[1] for r in rows),
        statistics.median(priced),
        scale,
        statistics.median(r[0] for r in streams),
        statistics.median(r[1] for r in streams),
        statistics.median(r[0] / r[1] for r in streams),
    )


async def _price_and_noise(releaser: Releaser, metric: Metric, window: int, values: dict[str, int], n: int) -> float:
    """CPU µs per quote → mechanism at the quoted cost → noisy values, `n` times for one window (nothing
    is charged, so every quote prices the same window; the noise comes from the pool as in a release)."""
    budget = releaser.topology.budgets[metric.budget]
    delta = releaser._selection_delta(metric, budget)  # noqa: SLF001 - the bench times the releaser's own steps
    t0 = time.process_time()
    for _ in range(n):
        quote = await releaser.ledger.quote(metric.name, window, window + 60)
        releaser._mechanism(metric, budget, quote.cost, delta).release(values)  # noqa: SLF001 - as above
    return (time.process_time() - t0) / n * 1e6


def measure(releases: int, wide_releases: int, wide_keys: int = 1000, rounds: int = 5) -> list[Row]:
    """The two rows (1 key, `wide_keys` keys), each against its bare-OpenDP baseline."""
    return [
        asyncio.run(_measure_width(keys, n, warmup=3, rounds=rounds))
        for keys, n in ((1, releases), (wide_keys, wide_releases))
    ]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench release`."""
    parser = subparsers.add_parser("release", help="CPU per release (1 and 1000 keys) vs a bare OpenDP sample")
    parser.add_argument("--releases", type=int, default=2000, help="timed 1-key releases (default 2000)")
    parser.add_argument("--wide-releases", type=int, default=40, help="timed 1000-key releases (default 40)")
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds: medians and the best shown (default 5)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print per-release CPU, the baseline and their ratio (or JSON)."""
    if args.releases < 1 or args.wide_releases < 1 or args.rounds < 1:
        raise ConfigError("--releases/--wide-releases/--rounds: need at least 1")
    rows = measure(args.releases, args.wide_releases, rounds=args.rounds)
    doc: dict[str, Any] = {"clock": "process_time", "rows": [asdict(r) for r in rows]}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"release bench: CPU per release on the in-process path (memory ledger, publish excluded), "
        f"median of {args.rounds} rounds (best round in brackets)"
    )
    print(
        f"{'keys':>6} {'releases':>9} {'σ':>8} | {'release µs':>20} {'bare OpenDP µs':>20} | {'ratio':>6} "
        f"{'overhead µs':>12} | {'price+noise µs':>14} | {'stream µs':>10} {'bare':>10} {'ratio':>6}"
    )
    for r in rows:
        ours = f"{r.release_us:.1f} [{r.best_release_us:.1f}]"
        bare = f"{r.baseline_us:.1f} [{r.best_baseline_us:.1f}]"
        print(
            f"{r.keys:>6} {r.releases:>9} {r.scale:>8.1f} | {ours:>20} {bare:>20} | {r.ratio:>6.2f} "
            f"{r.overhead_us:>12.1f} | {r.price_noise_us:>14.1f} | {r.stream_release_us:>10.1f} "
            f"{r.stream_baseline_us:>10.1f} {r.stream_ratio:>6.2f}"
        )
    print(
        "ratio = release / one bare OpenDP make_gaussian call on the same keys at the same σ, timed right after "
        "each release; overhead = release − bare; price+noise = quote → mechanism at the quoted cost → noisy "
        "values (the release without its record and charge); stream = the same in blocks: releases back to "
        "back, then as many bare calls (warm caches, as in replay)"
    )
    return 0
