"""What the demo's numbers should look like: typical true values of its synthetic feed and the plan's 95 % CI.

The typical values come from running the demo's own generator (same population, same rate) for a
stretch of simulated time through the worker's own bounding and windowing code
(`pipeline.MetricAccumulator`), so they are what an un-noised worker would aggregate, heavy users
already cut to the contribution bounds. Nothing here is hard-coded: change the population or the
topology and the figures follow. `dpstream demo` prints them before the feed starts, and
tests/unit/test_demo_topology.py holds the demo topology to "95 % CI ≤ 10 % of the typical value".
"""

from __future__ import annotations

__all__ = ["DemoPopulation", "Typical", "ci_for", "planned_ci", "relative_ci", "typical_values"]

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpstream.topology.calibration import Z95, quantile_rank_error
from dpstream.topology.model import Aggregate, Metric, Topology
from dpstream.topology.plan import MetricPlan
from dpstream.workers.pipeline.accumulator import MetricAccumulator
from dpstream.workers.pipeline.batch import EventBatch
from dpstream.workers.synthetic.generator import EventGenerator, GeneratorConfig


@dataclass(frozen=True)
class DemoPopulation:
    """The synthetic audience of the demo: how many users, how skewed, how fast they click."""

    users: int = 100_000
    zipf_s: float = 0.5
    """Activity of user rank r ∝ r^-s: 0.5 gives a few busy users (the busiest ~3 events/s at
    2,000 events/s) and many light ones; contribution bounding cuts the busy ones."""
    rate: float = 2000.0
    """Events per wall-clock second."""
    malformed: float = 0.001
    """Fraction of broken events (they go to the dead-letter topic, never into a value)."""

    def generator_config(self, seed: int | None = None, start_ts: float | None = None) -> GeneratorConfig:
        """The generator settings of this population (speed-up 1: event time is wall-clock time)."""
        return GeneratorConfig(
            users=self.users, zipf_s=self.zipf_s, malformed=self.malformed, seed=seed, start_ts=start_ts
        )


@dataclass(frozen=True)
class Typical:
    """A metric's typical true value per window (for a grouped metric: its smallest key's) and,
    for a noisy mean, the typical number of values behind it."""

    value: float
    count: float | None = None


def typical_values(
    topology: Topology, population: DemoPopulation, seconds: int = 30, seed: int = 7
) -> dict[str, Typical]:
    """Median over the complete windows of `seconds` of simulated feed, per metric (the smallest key
    of a grouped metric: the one whose CI is relatively widest)."""
    source = next(iter(topology.sources.values()))
    t0 = 1_800_000_000  # a whole minute: every window grid of the demo starts here
    generator = EventGenerator(
        topology,
        source.name,
        GeneratorConfig(users=population.users, zipf_s=population.zipf_s, seed=seed, start_ts=float(t0)),
    )
    metrics = [m for m in topology.metrics.values() if m.source == source.name]
    accumulators = {
        m.name: MetricAccumulator(m, source, t0, period_s=topology.budgets[m.budget].period_s) for m in metrics
    }
    unit_field = source.privacy_unit
    sent: list[tuple[int, float, dict[str, Any]]] = [
        (offset, event.ts, event.fields)
        for offset, event in enumerate(generator.events(int(population.rate * seconds), rate=population.rate))
        if event.fields is not None  # malformed: dead-lettered, in no window
    ]
    if sent:
        times = np.array([ts for _, ts, _ in sent], np.float64)
        batch = EventBatch.of(
            [fields[unit_field] for _, _, fields in sent],
            times,
            times,
            np.array([offset for offset, _, _ in sent], np.int64),
            [fields for _, _, fields in sent],
        )
        for acc in accumulators.values():
            acc.add_batch(batch)
    out: dict[str, Typical] = {}
    for m in metrics:
        acc = accumulators[m.name]
        closed = acc.close_through(t0 + seconds + acc.size + acc.lateness)
        windows = [agg for start, agg in closed if start + acc.size <= t0 + seconds]
        out[m.name] = _typical(m, windows, acc.exponent)
    return out


def _typical(metric: Metric, windows: list[dict], exponent: int) -> Typical:
    scale = math.ldexp(1.0, -exponent)
    if metric.aggregate is Aggregate.QUANTILE:  # its rank error is read against the values per window
        n = statistics.median(sum(w.get("", ())) for w in windows) if windows else 0.0
        return Typical(float(n), float(n))
    if metric.aggregate is Aggregate.MEAN and metric.denominator is None:
        pairs = [min(w.values(), key=lambda p: p[1]) for w in windows if w]
        return Typical(statistics.median(s * scale / n for s, n in pairs), statistics.median(n for _, n in pairs))
    keys = metric.keys if metric.keys is not None else None
    lows = []
    for w in windows:
        values = [w.get(k, 0) for k in keys] if keys is not None else list(w.values()) or [0]
        lows.append(min(values) * (scale if metric.aggregate is Aggregate.SUM else 1))
    return Typical(statistics.median(lows) if lows else 0.0)


def ci_for(metric: Metric, components: Iterable[Any], typical: Typical) -> float | None:
    """The 95 % CI half-width of a release whose noise parts are `components` (the plan's, or
    `calibration.calibrate` at any cost), around `typical`.

    Counts and sums: the value part's half-width. A noisy mean (sum / count): the half-width the
    mechanism itself reports, 1.96·√(σ_sum² + (centred mean · σ_count)²) / count. Top-k: None.
    Quantiles: their error statement, the 95 % rank error (in values; `typical` is the values per window).
    """
    parts = {c.component: c for c in components}
    if metric.aggregate is Aggregate.TOP_K:
        return None
    if metric.aggregate is Aggregate.QUANTILE:
        grid = len(metric.candidates or ())
        return max(quantile_rank_error(c.scale, grid) for c in parts.values())
    if metric.aggregate is Aggregate.MEAN and metric.denominator is None:
        assert metric.bounds is not None and typical.count
        mid = (metric.bounds.lower + metric.bounds.upper) / 2.0
        s_sum, s_count = parts["sum"].stddev or 0.0, parts["count"].stddev or 0.0
        return Z95 * math.hypot(s_sum, (typical.value - mid) * s_count) / typical.count
    return float(parts["value"].ci95_half_width)


def planned_ci(metric: Metric, plan: MetricPlan, typical: Typical) -> float | None:
    """`ci_for` at the metric's planned per-release cost."""
    return ci_for(metric, plan.components, typical)


def relative_ci(metric: Metric, plan: MetricPlan, typical: Typical) -> float | None:
    """planned_ci / typical value (None for top-k or a zero typical value)."""
    ci = planned_ci(metric, plan, typical)
    if ci is None or not typical.value:
        return None
    return ci / abs(typical.value)
