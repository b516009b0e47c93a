"""What noise a release should carry at this point of its budget period, and why it differs from the plan.

`dpstream plan` prices every release as if the period were spent evenly from its start: pool × share / N.
The ledger grants adaptively instead (`topology.allocation.adaptive_release_cost`): what is left
of the pool, divided over the windows still to come, in proportion to each metric's planned spend. On plan
that grant stays the same release after release. A demo whose schedule starts 40 minutes into an hour finds
the pool untouched and a third of the windows left, so each release gets 3× the planned ρ and σ/√3; after
the hour rolls over, a fresh pool meets a whole period of windows and the plan's figure returns. The demo
predicts the grant by that rule for the point where its schedule starts (and for each new period), prints it
beside the plan's, and flags any release whose cost is not what was predicted.
"""

from __future__ import annotations

__all__ = ["Expectation", "expect", "explain_release"]

import math
from dataclasses import dataclass

from dpstream.topology.allocation import MetricDemand, adaptive_release_cost, warning_cost_factor, windows_left
from dpstream.topology.calibration import NoiseComponent, calibrate, running_total_component
from dpstream.topology.model import Budget, Metric, Topology, charged_windows
from dpstream.topology.periods import period_id, period_start
from dpstream.topology.plan import Plan
from dpstream.topology.schedule import Schedule
from dpstream.workers.demo.sizing import Typical, ci_for

_TOLERANCE = 0.02
"""A release whose cost is within 2 % of the prediction is 'as predicted': integer flooring and the extra charge
of a window straddling the period boundary move it by well under that on an hourly period (windows that start
before the schedule are not counted by the ledger either: it prices from the schedule start)."""


@dataclass(frozen=True)
class Expectation:
    """The grant predicted for a metric's releases from some point of a period on, beside the plan's."""

    metric: str
    period_id: str
    planned_cost: float
    expected_cost: float
    planned_ci: float | None
    expected_ci: float | None
    stretched: bool
    stretch: float
    period_left: float
    """Fraction of the period from the point of prediction to its end."""
    pool_left: float
    """Fraction of the period's pool not yet spent at that point."""
    steps: int | None = None
    """A running total: its steps from the point of prediction to the period's end (its CIs are of the
    total at the last of them, the plan's at the period's last step); None for other metrics."""
    first_step_ci: float | None = None
    """A running total: the 95 % CI of its first step's total at the predicted lump (σ·1.96)."""

    @property
    def ratio(self) -> float:
        """expected / planned cost (σ scales by 1/√ratio in a zCDP scope)."""
        return self.expected_cost / self.planned_cost if self.planned_cost else math.nan

    def reason(self) -> str:
        """Why the grant differs from the plan, in one clause (empty when it does not)."""
        if self.stretched:
            return (
                f"the scope is past warn_at, so on_warning stretches σ ×{self.stretch:g} (ρ ×{1 / self.stretch**2:.2f})"
            )
        if abs(self.ratio - 1.0) <= _TOLERANCE:
            return ""
        return (
            f"{100 * self.pool_left:.0f} % of this period's pool is left for the last "
            f"{100 * self.period_left:.0f} % of it: the ledger re-divides what is left over the windows "
            "to come (adaptive allocation)"
        )


def expect(
    topology: Topology,
    plan: Plan,
    metric: Metric,
    typical: Typical | None,
    from_ts: int,
    spent: float,
    warning: bool = False,
) -> Expectation:
    """The grant of `metric`'s releases in the period holding `from_ts`, if the scope had spent `spent` of it
    by then and its schedule from `from_ts` to the period end goes as planned (every window released once).
    A metric under `contribution.max_windows` m is taken to have paid none of its m windows yet, and a running
    total not its lump: true at the points the demo predicts at (its schedule start, each period start)."""
    budget = topology.budgets[metric.budget]
    scope = plan.scope(budget.name)
    pstart = period_start(budget.period_s, from_ts)
    demands = {}
    for m in topology.metrics.values():
        if m.budget != budget.name:
            continue
        w = m.window
        first = Schedule.of(m).first_start_at_or_after(max(from_ts, pstart))
        # under max_windows m only m windows a period are paid for; a running total pays one, its lump
        demands[m.name] = MetricDemand(
            weight=m.weight,
            per_period=m.charged_per_period(budget.period_s),
            left=charged_windows(windows_left(w, pstart, budget.period_s, first + w.size_s), m.paid_windows),
        )
    pool_left = max(0.0, scope.pool - spent)
    cost = adaptive_release_cost(pool_left, metric.name, demands) if demands[metric.name].left else 0.0
    stretched = warning and budget.on_warning.stretch != 1.0
    if stretched:
        cost *= warning_cost_factor(budget.on_warning, budget.accounting)
    mp = plan.metric(metric.name)
    priced = cost if cost > 0 else mp.per_release_cost
    parts = _components(metric, budget, priced)
    steps = None
    if metric.running_total:  # its steps left this period, numbered from the period's first at or after S
        w = metric.window
        first = Schedule.of(metric).first_start_at_or_after(max(from_ts, pstart))
        steps = windows_left(w, pstart, budget.period_s, first + w.size_s)
    return Expectation(
        metric=metric.name,
        period_id=period_id(budget.period_s, pstart),
        planned_cost=mp.per_release_cost,
        expected_cost=cost,
        planned_ci=ci_for(metric, mp.components, typical) if typical else None,
        expected_ci=ci_for(metric, parts, typical, steps) if typical and steps != 0 else None,
        stretched=stretched,
        stretch=budget.on_warning.stretch,
        period_left=max(0.0, (pstart + budget.period_s - from_ts) / budget.period_s),
        pool_left=pool_left / scope.pool if scope.pool else 0.0,
        steps=steps,
        first_step_ci=ci_for(metric, parts, typical, 1) if typical and metric.running_total else None,
    )


def _components(metric: Metric, budget: Budget, cost: float) -> tuple[NoiseComponent, ...]:
    """The noisy parts of a release at `cost`: a running total's is its period's one Gaussian at the
    lump `cost` (`calibrate` prices one window's release and refuses it)."""
    if metric.running_total:
        return (running_total_component(metric, budget.period_s, cost),)
    return calibrate(metric, budget.accounting, cost)


def explain_release(cost: float, expected: Expectation | None) -> str:
    """A note for a release whose cost is not the predicted grant ('' when it is, or nothing was predicted)."""
    if expected is None or not expected.expected_cost or not cost:
        return ""
    ratio = cost / expected.expected_cost
    if abs(ratio - 1.0) <= _TOLERANCE:
        return ""
    sigma = 1.0 / math.sqrt(ratio)
    stretch = expected.stretch
    if not expected.stretched and stretch != 1.0 and abs(ratio * stretch**2 - 1.0) <= _TOLERANCE:
        return f"σ ×{sigma:.2f} vs the prediction: stretched by on_warning (the scope is drawing its reserve)"
    if ratio > 1:
        return f"σ ×{sigma:.2f} vs the prediction: spend elsewhere in the scope fell behind plan and is re-divided"
    return f"σ ×{sigma:.2f} vs the prediction: the scope spent faster than planned, less is left per window"
