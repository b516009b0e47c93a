"""What the plan expects of each metric in the reported period: releases, per-release cost and σ.

A whole period is the static plan (`topology.plan`). In a deployment's first period (the deployment
start S after the period start) only windows starting at or after S are released (the public schedule)
and the ledger spends the whole pool on them: metric m releases n_m windows of the grid
from S, each costing c_m · pool / Σ_j c_j·n_j (c the static per-release cost), as the ledger's split
(`topology.allocation.windows_left`) and the plan gauges (`telemetry.budget.planned_spent`) count.
The advice prices its plans the same way (`planned_over`), so plan is compared with plan over one span.
"""

from __future__ import annotations

__all__ = ["Planned", "Span", "planned_of_plan", "planned_over", "span_of"]

import math
from dataclasses import dataclass

from dpstream.topology.allocation import windows_left
from dpstream.topology.model import Accounting, Topology
from dpstream.topology.plan import MetricPlan, Plan
from dpstream.workers.report.collect import PeriodData


@dataclass(frozen=True)
class Planned:
    """One metric's planned figures for the reported period."""

    releases: int
    cost: float
    sigma: float | None
    """σ of the plan's first noisy component (None when it has none)."""


@dataclass(frozen=True)
class Span:
    """The part of a period its plan spends on: [start, period end) in a deployment's first period
    (`start` = S), the whole period [period_start, +period_s) when `start` is None."""

    period_start: int
    period_s: int
    start: int | None = None


def span_of(data: PeriodData) -> Span:
    """The span the reported period's plan spends on (from S in the deployment's first period)."""
    return Span(data.period_start, data.period_s, data.first_release_start)


def _sigma(plan: MetricPlan) -> float | None:
    parts = [c for c in plan.components if c.stddev is not None and c.stddev > 0]
    return parts[0].stddev if parts else None


def planned_over(
    span: Span, topology: Topology, plans: dict[str, MetricPlan], pool: float, accounting: Accounting
) -> dict[str, Planned]:
    """Per metric of `plans` (every metric of one scope, whose pool is `pool`), its planned figures over `span`."""
    start = span.start
    if start is None:
        return {name: Planned(p.releases_per_period, p.per_release_cost, _sigma(p)) for name, p in plans.items()}
    metrics = topology.metrics
    n = {
        name: windows_left(metrics[name].window, span.period_start, span.period_s, span.period_start, start)
        for name in plans
    }
    released = math.fsum(p.per_release_cost * n[name] for name, p in plans.items())
    factor = pool / released if released > 0 else 1.0  # no window released: nothing is spent, costs moot
    # σ of a noise scale calibrated to a cost: ∝ 1/√ρ (zCDP Gaussian), ∝ 1/ε (pure Laplace)
    noise = 1.0 / math.sqrt(factor) if accounting is Accounting.ZCDP else 1.0 / factor
    out = {}
    for name, p in plans.items():
        sigma = _sigma(p)
        out[name] = Planned(n[name], p.per_release_cost * factor, None if sigma is None else sigma * noise)
    return out


def planned_of_plan(span: Span, topology: Topology, plan: Plan, scope: str) -> dict[str, Planned]:
    """`planned_over` for the metrics of `scope` in a built plan (its pool and metric plans)."""
    scope_plan = next(s for s in plan.scopes if s.name == scope)
    accounting = topology.budgets[scope].accounting
    return planned_over(span, topology, {m.name: m for m in scope_plan.metrics}, scope_plan.pool, accounting)
