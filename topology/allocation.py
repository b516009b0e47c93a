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

A budget schedule (`schedule:`, `model.HourlyShape`) shapes a metric's share over its windows: a
window weighs h(w), the weight of the UTC hour of day it starts in (`hour_weights`: integers, exact),
the counts become weighted counts W_j = Σ over the windows left of h, and the next window w gets
    L × c_m·h(w) / Σ_j c_j·W_j,   c_j = w_j / W_j(whole period)
so on plan each window of m costs pool × (w_m / Σw) × h(w) / W_m(period): peak windows weighted 2
cost twice the others, and the period still spends exactly the pool. A flat metric has h ≡ 1, so
W_j = n_j and c_j = w_j / N_j: the same integers as without a schedule, the same prices.
Under `contribution.max_windows` m only the m costliest windows are paid (`model.charged_windows`); shaped,
the weighted count keeps the m' heaviest windows left (`weighted_windows`), which is min(n, m')
when flat. With m or more windows at the top weight the paid windows cost what they cost flat
(`topology.lint` warns): up-weighting helps only when fewer than m windows are up-weighted.

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
    "hour_weights",
    "window_weight",
    "weighted_windows",
    "period_weighted_windows",
    "adaptive_release_cost",
    "planned_release_costs",
    "windows_left",
    "warning_cost_factor",
    "thinned_out",
]

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from dpstream.topology.errors import InternalError
from dpstream.topology.model import Accounting, HourlyShape, WarningPolicy, Window, charged_windows
from dpstream.topology.schedule import Schedule


@dataclass(frozen=True)
class MetricDemand:
    """What one metric of a scope still wants this period."""

    weight: float | Fraction
    """w: as a float (the topology's) or an exact Fraction (the ledger's decimal reading)."""
    per_period: int
    """N: the metric's releases in a whole period (shaped: their weighted count W, `weighted_windows`)."""
    left: int
    """n: releases still to come, the one being priced included (shaped: their weighted count)."""


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


def hour_weights(shape: HourlyShape | None) -> tuple[int, ...] | None:
    """A schedule's 24 weights as the rule uses them: read exactly (the decimal written,
    `Fraction(repr(w))`), scaled to integers by their common denominator and divided by their gcd
    (so 2:1 and 1:0.5 are the same shape). None for no schedule or a flat one (every h = 1)."""
    if shape is None:
        return None
    exact = [Fraction(repr(float(w))) for w in shape.hours]
    if any(w <= 0 for w in exact):
        raise InternalError(f"a schedule weight must be > 0, got {shape.hours!r}")
    lcm = math.lcm(*(w.denominator for w in exact))
    scaled = [w.numerator * (lcm // w.denominator) for w in exact]
    gcd = math.gcd(*scaled)
    weights = tuple(w // gcd for w in scaled)
    return None if all(w == 1 for w in weights) else weights


def window_weight(weights: Sequence[int] | None, window_start: int) -> int:
    """h(w): the integer weight of the window starting at `window_start` (1 with no schedule)."""
    return 1 if weights is None else weights[(window_start % 86_400) // 3_600]


def weighted_windows(counts: Sequence[int], weights: Sequence[int] | None, paid: int | None = None) -> int:
    """W: the weighted count of windows counted per UTC hour of day (`Schedule.starts_by_hour`),
    Σ_h counts[h]·h; with `paid` (under `max_windows`, the windows a period still pays for) only the
    `paid` heaviest count. With no schedule: Σ counts, at most `paid` (`model.charged_windows`)."""
    if weights is None:
        return charged_windows(sum(counts), paid)
    if paid is None:
        return sum(n * h for n, h in zip(counts, weights, strict=True))
    total, take = 0, paid
    for h, n in sorted(zip(weights, counts, strict=True), reverse=True):
        if take <= 0:
            break
        total += h * min(n, take)
        take -= n
    return total


def period_weighted_windows(window: Window, period_s: int, weights: Sequence[int] | None, paid: int | None) -> int:
    """W_j(whole period): the windows a whole period pays for, weighted (`weighted_windows`); with no
    schedule exactly `charged_windows(releases per period, paid)`. Every period weighs alike: a shaped
    metric's period is whole days and its step divides a day (the loader checks)."""
    if weights is None:
        return charged_windows(window.releases_per_period(period_s), paid)
    return weighted_windows(Schedule(window.size_s, window.every_s).starts_by_hour(0, period_s), weights, paid)


def release_share(metric: str, rates: Mapping[str, int], left: Mapping[str, int], next_weight: int = 1) -> Fraction:
    """The rule: the part of the pool left that the next release of `metric` gets, c_m·h / Σ_j c_j·n_j
    over the metrics with releases left (`rates` from `release_rates`, `left` the n_j, weighted counts
    W_j for shaped metrics; `next_weight` h, the priced window's weight, 1 unshaped; 0 when none has).

    At most 1 when `metric` has a release left itself (its W counts the priced window's weight)."""
    rate, total = release_share_terms(metric, rates, left, next_weight)
    return Fraction(rate, total) if total > 0 else Fraction(0)


def release_share_terms(
    metric: str, rates: Mapping[str, int], left: Mapping[str, int], next_weight: int = 1
) -> tuple[int, int]:
    """`release_share` as (c_m·h, Σ_j c_j·n_j), integers (the ledger floors pool × c_m·h / Σ in whole
    units without building the Fraction: 1.5 µs of a release's quote)."""
    total = 0
    for name, k in rates.items():
        n = left.get(name, 0)
        if n > 0:
            total += k * n
    return rates[metric] * next_weight, total


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
    gets what one release would cost at the others' rate. For a shaped metric (counts weighted) it is
    the cost of a window of weight 1: a window of weight h costs h times it."""
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
