"""The δ a scope sets aside for DP partition selection, and the cap that is left for the rest.

Keys that come from the data (group-by without declared keys, top-k candidates) are released
only if their noisy count passes a threshold (OpenDP's Laplace/Gaussian threshold), which is
(ε, δ)-DP, not pure or plain zCDP. Its δ must come out of the scope's δ, not on top of it:

- zCDP scope with such metrics: a tenth of the scope's δ goes to selection, and ρ* is computed
  at the other 0.9δ. The whole period is then (ε(Σρ, 0.9δ), 0.9δ + Σ δ_selection) ⊆ (ε, δ)-DP.
- pure scope: ε adds up as usual; the declared δ is spent on selection only (δ = 0 with
  data-derived keys is a configuration error: declare the keys, or give δ).
- Each selecting metric gets an equal part of the selection δ, spread over every release that
  can touch one period (a hopping window straddling a boundary counts in both periods).
"""

from __future__ import annotations

__all__ = [
    "SELECTION_DELTA_SHARE",
    "TOP_K_SELECTION_SHARE",
    "selection_delta_total",
    "conversion_delta",
    "selection_delta_per_release",
    "scope_cap",
]

from collections.abc import Sequence

from dpstream.topology import accounting as acc
from dpstream.topology.model import Accounting, Budget, Metric

SELECTION_DELTA_SHARE = acc.SELECTION_DELTA_SHARE
"""Fraction of a zCDP scope's δ set aside for partition selection (`accounting.SELECTION_DELTA_SHARE`)."""

TOP_K_SELECTION_SHARE = 0.5
"""Fraction of a data-derived top-k release's cost spent on selecting its candidate keys."""


def _selecting(budget: Budget, metrics: Sequence[Metric]) -> list[Metric]:
    return [m for m in metrics if m.budget == budget.name and m.needs_partition_selection]


def selection_delta_total(budget: Budget, metrics: Sequence[Metric]) -> float:
    """δ per period that the scope's partition selections may use together (0 if none select)."""
    if not _selecting(budget, metrics):
        return 0.0
    if budget.accounting is Accounting.PURE:
        return budget.delta
    return budget.delta * SELECTION_DELTA_SHARE  # so conversion_delta is exactly delta − this


def conversion_delta(budget: Budget, metrics: Sequence[Metric]) -> float:
    """The δ at which a zCDP scope's ρ is converted to ε (`accounting.conversion_delta`): the scope's
    δ minus the selection δ; 0 in a pure scope."""
    return acc.conversion_delta(budget.accounting is Accounting.ZCDP, budget.delta, bool(_selecting(budget, metrics)))


def selection_delta_per_release(metric: Metric, budget: Budget, metrics: Sequence[Metric]) -> float:
    """δ of one partition selection of `metric` (0 when its keys are declared)."""
    selecting = _selecting(budget, metrics)
    if metric not in selecting:
        return 0.0
    releases_touching_a_period = metric.window.releases_per_period(budget.period_s) + metric.window.overlap - 1
    return selection_delta_total(budget, metrics) / len(selecting) / releases_touching_a_period


def scope_cap(budget: Budget, metrics: Sequence[Metric]) -> float:
    """The scope's cap in its currency: ρ* at the conversion δ (zCDP), or ε (pure)."""
    if budget.accounting is Accounting.PURE:
        return budget.epsilon
    return acc.rho_cap(budget.epsilon, conversion_delta(budget, metrics))
