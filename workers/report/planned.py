"""What the plan expects of each metric in the reported period: releases, per-release cost and σ.

A whole period is the static plan (`topology.plan`). In a deployment's first period (the deployment
start S after the period start) only windows starting at or after S are released (the public schedule)
and the ledger spends the whole pool on them: the plan's releases and costs over those windows alone
(`ScopePlan.planned_from`, the rule the ledger prices by and the plan gauges count with). The advice
prices its plans the same way, so plan is compared with plan over one span.
"""

from __future__ import annotations

__all__ = ["Planned", "Span", "planned_of_plan", "span_of"]

import math
from dataclasses import dataclass

from dpstream.topology.model import Accounting
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


def planned_of_plan(span: Span, plan: Plan, scope: str) -> dict[str, Planned]:
    """Per metric of `scope` in a built plan, its planned figures over `span`."""
    scope_plan = plan.scope(scope)
    zcdp = scope_plan.accounting is Accounting.ZCDP
    planned = scope_plan.planned_from(span.period_start, span.period_start + span.period_s, span.start)
    out = {}
    for p in scope_plan.metrics:
        releases, cost = planned[p.name]
        sigma = _sigma(p)
        if sigma is not None and cost != p.per_release_cost:
            # σ of a noise scale calibrated to a cost: ∝ 1/√ρ (zCDP Gaussian), ∝ 1/ε (pure Laplace)
            factor = cost / p.per_release_cost
            sigma *= 1.0 / math.sqrt(factor) if zcdp else 1.0 / factor
        out[p.name] = Planned(releases, cost, sigma)
    return out
