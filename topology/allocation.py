"""Budget allocation: static plan and adaptive re-division of what is left.

All amounts are in the scope's currency (ρ for zCDP scopes, ε for pure ones). The reserve is
never part of the pool: pool = cap × (1 − reserve).

Adaptive rule: the next release of metric m gets
    L × (w_m·f_m / Σ_j w_j·f_j) / n_m  =  L × (w_m / N_m) / Σ_j (w_j · n_j / N_j)
where L is the pool left, N_j a metric's releases per period, n_j its releases still to come
(the current one included) and f_j = n_j / N_j. On plan this equals the static
pool × (w_m / Σw) / N_m; a skipped or cheaper release leaves its share to the rest.

A deployment that starts at S inside a period releases only the windows starting at or after S
(the public schedule), so in that first period n_j counts only those: a metric with no such window
gets no share, and the others share the whole pool (on plan each release then costs
pool × (w_m / N_m) / Σ_j (w_j · n_j⁰ / N_j), with n_j⁰ the windows the first period releases).
"""

from __future__ import annotations

__all__ = [
    "MetricDemand",
    "static_release_cost",
    "adaptive_release_cost",
    "windows_left",
    "warning_cost_factor",
    "thinned_out",
]

from collections.abc import Mapping
from dataclasses import dataclass

from dpstream.topology.errors import InternalError
from dpstream.topology.model import Accounting, WarningPolicy, Window
from dpstream.topology.schedule import Schedule


@dataclass(frozen=True)
class MetricDemand:
    """What one metric of a scope still wants this period."""

    weight: float
    per_period: int
    """N: the metric's releases in a whole period."""
    left: int
    """n: releases still to come, the one being priced included."""


def static_release_cost(pool: float, metric: str, demands: Mapping[str, MetricDemand]) -> float:
    """Planned per-release cost: pool × (w_m / Σ w) / N_m."""
    total_weight = sum(d.weight for d in demands.values())
    demand = demands[metric]
    return pool * (demand.weight / total_weight) / demand.per_period


def adaptive_release_cost(pool_left: float, metric: str, demands: Mapping[str, MetricDemand]) -> float:
    """Cost granted to the next release of `metric` from what is left of the pool.

    Returns 0 when nothing is left; never more than `pool_left`.
    """
    demand = demands[metric]
    if demand.left < 1:
        raise InternalError(f"metric {metric!r} is priced with no release left in the period")
    if pool_left <= 0:
        return 0.0
    planned_left = sum(d.weight * d.left / d.per_period for d in demands.values() if d.left > 0)
    return min(pool_left, pool_left * (demand.weight / demand.per_period) / planned_left)


def windows_left(
    window: Window, period_start: int, period_s: int, current_end: int, schedule_start: int | None = None
) -> int:
    """Windows starting inside the period [period_start, +period_s) whose end is ≥ current_end.

    These are the metric's releases still to come when a window ending at `current_end` is priced.
    With the deployment start S (`schedule_start`), windows starting before S are not counted: the
    public schedule never releases them. S at or before the period start changes nothing.
    (`Schedule.left`, the one rule.)
    """
    return Schedule(window.size_s, window.every_s, schedule_start).left(period_start, period_s, current_end)


def warning_cost_factor(policy: WarningPolicy, accounting: Accounting) -> float:
    """Factor applied to a granted cost in the warning state when noise is stretched by s.

    σ (or b) × s divides ρ by s² in a zCDP scope and ε by s in a pure one.
    """
    if accounting is Accounting.ZCDP:
        return 1.0 / policy.stretch**2
    return 1.0 / policy.stretch


def thinned_out(policy: WarningPolicy, window_start: int, window: Window) -> bool:
    """True when thinning (`thin: n`) skips this window: only every n-th window is released."""
    return (window_start // window.every_s) % policy.thin != 0
