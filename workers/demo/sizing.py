"""What the demo's numbers should look like: typical true values of its synthetic feed and the plan's 95 % CI.

The typical values come from running the demo's own generator (same population, same rate) for a
stretch of simulated time through the worker's own bounding and windowing code
(`pipeline.MetricAccumulator`), so they are what an un-noised worker would aggregate, heavy users
already cut to the contribution bounds. Nothing here is hard-coded: change the population or the
topology and the figures follow. `dpstream demo` prints them before the feed starts, and
tests/unit/test_demo_topology.py holds the demo topology to "95 % CI ≤ 10 % of the typical value".
"""

from __future__ import annotations

__all__ = [
    "DemoPopulation",
    "Typical",
    "ci_for",
    "first_useful_step",
    "planned_ci",
    "relative_ci",
    "typical_values",
]

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpstream.topology.calibration import Z95, quantile_rank_error
from dpstream.topology.model import Aggregate, Metric, Topology
from dpstream.topology.plan import MetricPlan
from dpstream.topology.running_total import steps_per_period, total_stddev
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
    for a noisy mean, the typical number of values behind it. For a running total (`steps` set) `value` is
    the typical total at its period's last step, `per_step` the typical increment a step adds."""

    value: float
    count: float | None = None
    steps: int | None = None
    """A running total's steps a period, T (None for any other metric)."""
    per_step: float | None = None
    """A running total's typical per-window increment (its smallest key's): the total at step t is t times it."""

    def total_at(self, step: int) -> float:
        """A running total's typical total at `step` (1-based): `per_step` × step."""
        if self.per_step is None:
            raise ValueError("total_at is for a running total's typical value")
        return self.per_step * step


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
        typical = _typical(m, windows, acc.exponent)
        if m.running_total:  # a step's increment is a window's sum or count; the total grows by it each step
            steps = steps_per_period(m, topology.budgets[m.budget].period_s)
            typical = Typical(typical.value * steps, steps=steps, per_step=typical.value)
        out[m.name] = typical
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


def ci_for(metric: Metric, components: Iterable[Any], typical: Typical, step: int | None = None) -> float | None:
    """The 95 % CI half-width of a release whose noise parts are `components` (the plan's, or
    `calibration.calibrate` at any cost), around `typical`.

    A running total (`calibration.running_total_component`: its scale is each step's σ): the half-width
    of its total at `step`, 1.96·σ·‖c_<step‖₂ (default: the period's last step, `typical.steps`).
    Counts and sums: the value part's half-width. A noisy mean (sum / count): the half-width the
    mechanism itself reports, 1.96·√(σ_sum² + (centred mean · σ_count)²) / count. Top-k: None.
    Quantiles: their error statement, the 95 % rank error (in values; `typical` is the values per window).
    """
    parts = {c.component: c for c in components}
    if metric.running_total:
        t = step if step is not None else typical.steps
        if t is None:
            raise ValueError(f"running total {metric.name!r}: no step to read its CI at")
        return Z95 * total_stddev(t, float(parts["value"].scale))
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


def planned_ci(metric: Metric, plan: MetricPlan, typical: Typical, step: int | None = None) -> float | None:
    """`ci_for` at the metric's planned per-release cost (a running total's: its lump; at `step`, default
    its period's last)."""
    return ci_for(metric, plan.components, typical, step)


def relative_ci(metric: Metric, plan: MetricPlan, typical: Typical, step: int | None = None) -> float | None:
    """planned_ci / typical value (None for top-k or a zero typical value); for a running total, of its
    total at `step` (default the period's last) over the typical total there."""
    ci = planned_ci(metric, plan, typical, step)
    value = typical.total_at(step) if step is not None and typical.per_step is not None else typical.value
    if ci is None or not value:
        return None
    return ci / abs(value)


def first_useful_step(metric: Metric, plan: MetricPlan, typical: Typical, target: float = 0.10) -> int | None:
    """A running total's first step whose planned 95 % CI is at most `target` of its typical total there
    (the CI grows as ‖c_<t‖₂, about √(log t), the total as t); None if no step of the period reaches it."""
    if typical.steps is None or typical.per_step is None:
        return None
    for t in range(1, typical.steps + 1):
        rel = relative_ci(metric, plan, typical, t)
        if rel is not None and rel <= target:
            return t
    return None
