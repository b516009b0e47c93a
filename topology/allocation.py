"""Budget allocation: the one pricing rule, for the static plan and the ledger's adaptive allowance.

All amounts are in the scope's currency (ρ for zCDP scopes, ε for pure ones). The reserve is
never part of the pool: pool = cap × (1 − reserve).

The rule: the next release of metric m gets
    L × c_m / Σ_j c_j·n_j,   c_j = w_j / N_j
where L is the pool left, w_j a metric's weight, N_j its releases per period and n_j its releases
still to come (the one priced included; metrics with none left drop out). With every release to
come (n_j = N_j) it is the static plan pool × (w_m / Σw) / N_m; a skipped or cheaper release leaves
its share to the rest.

A deployment that starts at S inside a period releases only the windows starting at or after S
(the public schedule), so in that first period n_j counts only those: a metric with no such window
gets no share, and the others share the whole pool (on plan each release then costs
pool × c_m / Σ_j c_j·n_j⁰, with n_j⁰ the windows the first period releases).

The rule is evaluated exactly: the c_j as integers over one common denominator (`release_rates`,
computed once per scope), the share c_m / Σ_j c_j·n_j as a Fraction (`release_share`). The ledger
floors L_units × share to its units; the plan, the gauges and the report multiply a float pool by it.
"""

from __future__ import annotations

__all__ = [
    "MetricDemand",
    "release_rates",
    "release_share",
    "release_share_terms",
    "adaptive_release_cost",
    "planned_release_costs",
    "windows_left",
    "warning_cost_factor",
    "thinned_out",
]

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from dpstream.topology.errors import InternalError
from dpstream.topology.model import Accounting, WarningPolicy, Window
from dpstream.topology.schedule import Schedule


@dataclass(frozen=True)
class MetricDemand:
    """What one metric of a scope still wants this period."""

    weight: float | Fraction
    """w: as a float (the topology's) or an exact Fraction (the ledger's decimal reading)."""
    per_period: int
    """N: the metric's releases in a whole period."""
    left: int
    """n: releases still to come, the one being priced included."""


def release_rates(demands: Mapping[str, MetricDemand]) -> dict[str, int]:
    """k_j = (w_j / N_j) × the lcm of their denominators: each metric's c_j, exact, over one common
    denominator (the rule only compares them, so any common scale prices the same). `left` is not used."""
    rates: dict[str, Fraction] = {}
    for name, d in demands.items():
        if d.per_period < 1:
            raise InternalError(f"metric {name!r} is priced with no release in a whole period")
        rates[name] = Fraction(d.weight) / d.per_period
    lcm = math.lcm(*(r.denominator for r in rates.values()))
    return {name: r.numerator * (lcm // r.denominator) for name, r in rates.items()}


def release_share(metric: str, rates: Mapping[str, int], left: Mapping[str, int]) -> Fraction:
    """The rule: the part of the pool left that the next release of `metric` gets, c_m / Σ_j c_j·n_j
    over the metrics with releases left (`rates` from `release_rates`, `left` the n_j; 0 when none has).

    At most 1 when `metric` has a release left itself."""
    rate, total = release_share_terms(metric, rates, left)
    return Fraction(rate, total) if total > 0 else Fraction(0)


def release_share_terms(metric: str, rates: Mapping[str, int], left: Mapping[str, int]) -> tuple[int, int]:
    """`release_share` as (c_m, Σ_j c_j·n_j), integers (the ledger floors pool × c_m / Σ in whole
    units without building the Fraction: 1.5 µs of a release's quote)."""
    total = 0
    for name, k in rates.items():
        n = left.get(name, 0)
        if n > 0:
            total += k * n
    return rates[metric], total


def adaptive_release_cost(pool_left: float, metric: str, demands: Mapping[str, MetricDemand]) -> float:
    """The allowance (cost) of the next release of `metric` from what is left of the pool (`release_share`).

    Returns 0 when nothing is left; never more than `pool_left`.
    """
    if demands[metric].left < 1:
        raise InternalError(f"metric {metric!r} is priced with no release left in the period")
    if pool_left <= 0:
        return 0.0
    share = release_share(metric, release_rates(demands), {name: d.left for name, d in demands.items()})
    return min(pool_left, pool_left * share)


def planned_release_costs(pool: float, demands: Mapping[str, MetricDemand]) -> dict[str, float]:
    """Each metric's per-release cost on plan when the releases `left` all happen from a full `pool`
    (`release_share`): with left = N the static plan, pool × (w_m / Σw) / N_m. A metric with none left
    gets what one release would cost at the others' rate."""
    rates = release_rates(demands)
    left = {name: d.left for name, d in demands.items()}
    return {name: pool * release_share(name, rates, left) for name in demands}


def windows_left(
    window: Window, period_start: int, period_s: int, current_end: int, schedule_start: int | None = None
) -> int:
    """Windows starting inside the period [period_start, +period_s) whose end is ≥ current_end.

    These are the metric's releases still to come when a window ending at `current_end` is priced.
    With the schedule start S (`schedule_start`), windows starting before S are not counted: the
    public schedule never releases them. S at or before the period start changes nothing.
    (`Schedule.left`, the one rule.)
    """
    return Schedule(window.size_s, window.every_s, schedule_start).left(period_start, period_s, current_end)


def warning_cost_factor(policy: WarningPolicy, accounting: Accounting) -> float:
    """Factor applied to an allowance in the warning state when noise is stretched by s.

    σ (or b) × s divides ρ by s² in a zCDP scope and ε by s in a pure one.
    """
    if accounting is Accounting.ZCDP:
        return 1.0 / policy.stretch**2
    return 1.0 / policy.stretch


def thinned_out(policy: WarningPolicy, window_start: int, window: Window) -> bool:
    """True when thinning (`thin: n`) skips this window: only every n-th window is released."""
    return (window_start // window.every_s) % policy.thin != 0
