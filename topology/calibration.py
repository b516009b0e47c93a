"""Noise calibration: from a release's cost (in its scope's currency) to mechanism scales.

The inverse of `topology.accounting`: given the cost a release is granted, each noisy part of
the release gets the scale that makes it cost exactly its share. A mean without a public
denominator splits its cost evenly between its noisy sum and noisy count.
"""

from __future__ import annotations

__all__ = ["NoiseComponent", "calibrate", "MEAN_SUM_SHARE", "Z95", "continuous_ci_half_width"]

import math
from dataclasses import dataclass

from dpstream.topology import accounting as acc
from dpstream.topology.errors import InternalError
from dpstream.topology.model import Accounting, Aggregate, Mechanism, Metric
from dpstream.topology.selection import TOP_K_SELECTION_SHARE
from dpstream.topology.sensitivity import Sensitivity, release_sensitivities

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


def calibrate(metric: Metric, accounting: Accounting, cost: float) -> tuple[NoiseComponent, ...]:
    """Noise components of one release of `metric` that together cost exactly `cost`.

    A top-k over data-derived keys is two parts: 'selection' (a thresholded noisy count of the
    candidate keys, Gaussian in zCDP scopes and Laplace in pure ones) and 'value' (the noisy
    top-k among the survivors), splitting the cost by `TOP_K_SELECTION_SHARE`.
    """
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
