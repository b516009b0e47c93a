"""Noise calibration: from a release's cost (in its scope's currency) to mechanism scales.

The inverse of `topology.accounting`: given a release's allowance (its cost), each noisy part of
the release gets the scale that makes it cost exactly its share. A mean without a public
denominator splits its cost evenly between its noisy sum and noisy count.
"""

from __future__ import annotations

__all__ = [
    "NoiseComponent",
    "calibrate",
    "running_total_component",
    "MEAN_SUM_SHARE",
    "QUANTILE_LEVEL",
    "Z95",
    "continuous_ci_half_width",
    "quantile_cost",
    "quantile_rank_error",
    "quantile_scale",
]

import math
from dataclasses import dataclass

from dpstream.topology import accounting as acc
from dpstream.topology import running_total
from dpstream.topology.errors import InternalError
from dpstream.topology.model import Accounting, Aggregate, Mechanism, Metric
from dpstream.topology.selection import TOP_K_SELECTION_SHARE
from dpstream.topology.sensitivity import Sensitivity, quantile_d_in, release_sensitivities

MEAN_SUM_SHARE = 0.5
"""Share of a noisy mean's cost spent on its sum (the rest goes to its count)."""

Z95 = 1.959963984540054
"""Two-sided 95 % quantile of the standard normal."""


@dataclass(frozen=True)
class NoiseComponent:
    """One noisy part of a release: its mechanism, sensitivity, scale and cost share."""

    component: str
    mechanism: Mechanism
    sensitivity: Sensitivity
    cost: float
    """Cost of this part in the scope's currency (ρ or ε)."""
    scale: float
    """OpenDP's `scale`: Laplace b, Gaussian σ, or the Gumbel scale of top-k, in value units."""
    epsilon: float | None
    """Pure ε of this part for Laplace / exponential (None for Gaussian)."""

    @property
    def stddev(self) -> float:
        """Standard deviation of the added noise (continuous approximation; 0 for top-k's keys)."""
        if self.mechanism is Mechanism.GAUSSIAN:
            return self.scale
        if self.mechanism is Mechanism.LAPLACE:
            return math.sqrt(2.0) * self.scale
        return 0.0

    @property
    def ci95_half_width(self) -> float:
        """Half-width of the 95 % interval of the noise (continuous approximation)."""
        return continuous_ci_half_width(self.mechanism, self.scale, 0.95)


def continuous_ci_half_width(mechanism: Mechanism, scale: float, level: float) -> float:
    """Half-width h with P(|noise| ≤ h) = level for continuous Laplace / Gaussian noise."""
    if mechanism is Mechanism.LAPLACE:
        return scale * math.log(1.0 / (1.0 - level))
    if mechanism is Mechanism.GAUSSIAN:
        z = Z95 if level == 0.95 else normal_quantile((1.0 + level) / 2.0)
        return z * scale
    return 0.0


def normal_quantile(p: float) -> float:
    """The smallest float z with Φ(z) ≥ p: the standard normal quantile, rounded up, so an interval
    built from it covers at least the stated level (bisection on erfc, exact to the last float)."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if 0.5 * math.erfc(-mid / math.sqrt(2.0)) < p:
            lo = mid
        else:
            hi = mid
    return hi


def _component(sens: Sensitivity, mechanism: Mechanism, accounting: Accounting, cost: float, k: int) -> NoiseComponent:
    if cost <= 0:
        raise InternalError(f"component {sens.component!r} calibrated with non-positive cost {cost}")
    if mechanism is Mechanism.GAUSSIAN:
        if accounting is not Accounting.ZCDP:
            raise InternalError("Gaussian noise in a pure scope passed validation")
        return NoiseComponent(sens.component, mechanism, sens, cost, acc.gaussian_sigma_for_rho(sens.l2, cost), None)
    if mechanism is Mechanism.LAPLACE:
        eps = cost if accounting is Accounting.PURE else acc.rho_to_pure(cost)
        return NoiseComponent(sens.component, mechanism, sens, cost, acc.laplace_scale_for_epsilon(sens.l1, eps), eps)
    if mechanism is Mechanism.EXPONENTIAL:
        eps = cost if accounting is Accounting.PURE else acc.top_k_epsilon_for_rho(k, cost)
        return NoiseComponent(
            sens.component, mechanism, sens, cost, acc.top_k_scale_for_epsilon(k, sens.linf, eps), eps
        )
    raise InternalError(f"no calibration for mechanism {mechanism!r}")


def running_total_component(metric: Metric, period_s: int, cost: float) -> NoiseComponent:
    """A running total's one Gaussian over its period, costing `cost` (ρ): scale σ = L‖c‖₂/√(2ρ) of
    each noisy y (the released total at step t has std σ·‖c_{<t}‖₂, `running_total.total_stddev`).
    The noise path nudges σ up by ulps until OpenDP's rounded map fits (`prefix_sum.sigma_for_rho`)."""
    if cost <= 0:
        raise InternalError(f"running total {metric.name!r} calibrated with non-positive cost {cost}")
    l2 = running_total.period_sensitivity(metric, period_s)
    bound = float(metric.contribution.max_per_period or 0)
    sens = Sensitivity("value", bound, l2, bound)
    return NoiseComponent("value", Mechanism.GAUSSIAN, sens, cost, acc.gaussian_sigma_for_rho(l2, cost), None)


QUANTILE_LEVEL = 0.95
"""Probability the rank-error bound of a released quantile holds with (`quantile_rank_error`)."""


def quantile_cost(alpha: float, d_in: int, scale: float, accounting: Accounting) -> float:
    """What OpenDP's private quantile at level α costs at `scale` and symmetric distance d_in:
    ε = 2·max(α, 1 − α)·d_in / scale (pure), ρ = ε² / 8 (zCDP, the Gumbel noisy max)."""
    eps = 2.0 * max(alpha, 1.0 - alpha) * d_in / scale
    return eps if accounting is Accounting.PURE else eps * eps / 8.0


def quantile_scale(quantiles: tuple[float, ...], d_in: int, accounting: Accounting, cost: float) -> float:
    """The one scale at which the quantiles of a release together cost `cost` (they compose: the
    sum of `quantile_cost` over the levels), so p99 costs (0.99 / 0.5)² = 3.92× p50 in ρ."""
    spread = [2.0 * max(a, 1.0 - a) * d_in for a in quantiles]
    if accounting is Accounting.PURE:
        return sum(spread) / cost
    return math.sqrt(sum(x * x for x in spread) / (8.0 * cost))


def quantile_rank_error(scale: float, candidates: int, level: float = QUANTILE_LEVEL) -> float:
    """r (in ranks) such that, with probability ≥ `level`, the released candidate's rank error is at
    most r above the smallest rank error of the grid's candidates. The rank error of candidate c is
    OpenDP's quantile score |(1 − α)·#(x < c) − α·#(x > c)|: |#(x < c) − α·n| when no value equals c
    (its distance in ranks from the α-quantile), and never below the distance from α·n to c's rank
    range [#(x < c), #(x ≤ c)].

    The noisy max picks a candidate whose score exceeds the best by x with probability at most
    e^(-x/scale) each (Gumbel and permute-and-flip alike), so by the union over the other m − 1
    candidates P(any is picked) ≤ (m − 1)·e^(-r/scale) = 1 − level. It depends on the scale and the
    grid's size only, never on the data."""
    if candidates < 2:
        return 0.0
    return scale * math.log((candidates - 1) / (1.0 - level))


def _quantile_components(metric: Metric, accounting: Accounting, cost: float) -> tuple[NoiseComponent, ...]:
    """One exponential-mechanism part per quantile level, all at the one scale that spends `cost`."""
    levels = metric.quantiles or ()
    d_in = quantile_d_in(metric)
    scale = quantile_scale(levels, d_in, accounting, cost)
    return tuple(
        NoiseComponent(
            sens.component,
            Mechanism.EXPONENTIAL,
            sens,
            quantile_cost(alpha, d_in, scale, accounting),
            scale,
            quantile_cost(alpha, d_in, scale, Accounting.PURE),
        )
        for sens, alpha in zip(release_sensitivities(metric), levels, strict=True)
    )


def calibrate(metric: Metric, accounting: Accounting, cost: float) -> tuple[NoiseComponent, ...]:
    """Noise components of one release of `metric` that together cost exactly `cost`.

    A top-k over data-derived keys is two parts: 'selection' (a thresholded noisy count of the
    candidate keys, Gaussian in zCDP scopes and Laplace in pure ones) and 'value' (the noisy
    top-k among the survivors), splitting the cost by `TOP_K_SELECTION_SHARE`. A quantile release
    is one part per level ('p50', 'p90', ...) at one common scale (in ranks), each costing its own
    `quantile_cost`; together exactly `cost`.
    """
    if metric.running_total:
        raise InternalError(f"metric {metric.name!r}: a running total is calibrated per period, not per release")
    if metric.aggregate is Aggregate.QUANTILE:
        if cost <= 0:
            raise InternalError(f"metric {metric.name!r} calibrated with non-positive cost {cost}")
        return _quantile_components(metric, accounting, cost)
    parts = release_sensitivities(metric)
    k = metric.k or 1
    if metric.aggregate is Aggregate.TOP_K and metric.needs_partition_selection:
        (top,) = parts
        c = metric.contribution
        counts = Sensitivity("selection", c.max_keys * top.linf, math.sqrt(c.max_keys) * top.linf, top.linf)
        select_mechanism = Mechanism.GAUSSIAN if accounting is Accounting.ZCDP else Mechanism.LAPLACE
        return (
            _component(counts, select_mechanism, accounting, cost * TOP_K_SELECTION_SHARE, k),
            _component(top, metric.mechanism, accounting, cost * (1.0 - TOP_K_SELECTION_SHARE), k),
        )
    if len(parts) == 1:
        return (_component(parts[0], metric.mechanism, accounting, cost, k),)
    sum_part, count_part = parts
    return (
        _component(sum_part, metric.mechanism, accounting, cost * MEAN_SUM_SHARE, k),
        _component(count_part, metric.mechanism, accounting, cost * (1.0 - MEAN_SUM_SHARE), k),
    )
