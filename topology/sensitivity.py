"""Sensitivity of one release, from the declared contribution bounds only (never from data).

Neighbouring streams differ by every event of one privacy unit in the window. Per (unit,
window) the unit touches at most `max_keys` keys (L0) with at most `max_per_key` events per key
(L∞), each value clamped to `bounds`. Each window is charged as its own release, so a hopping
window's overlap is accounted by composing its releases, not by inflating this sensitivity.
"""

from __future__ import annotations

__all__ = ["Sensitivity", "quantile_d_in", "quantile_sensitivities", "release_sensitivities"]

import math
from dataclasses import dataclass

from dpstream.topology.errors import InternalError
from dpstream.topology.model import Aggregate, Metric


@dataclass(frozen=True)
class Sensitivity:
    """How far one unit can move one released vector, in the norms the mechanisms need."""

    component: str
    """Which part of the release: 'value' (the whole release), or 'sum' / 'count' of a noisy mean."""
    l1: float
    l2: float
    linf: float


def _grouped(metric: Metric) -> bool:
    return metric.group_by is not None


def _vector(component: str, per_key: float, keys_touched: int) -> Sensitivity:
    """A unit adds at most `per_key` to each of at most `keys_touched` coordinates."""
    return Sensitivity(component, keys_touched * per_key, math.sqrt(keys_touched) * per_key, per_key)


def release_sensitivities(metric: Metric) -> tuple[Sensitivity, ...]:
    """The sensitivities of the noisy parts of one release of `metric`.

    count: max_per_key per key; count_units: 1 per key; sum: max_per_key × max|bound| per key;
    mean over a public n: the sum's, divided by n; mean without n: a centred sum
    (max_per_key × (upper − lower) / 2) and a count (max_per_key); top-k: the score vector's
    L∞ = max_per_key; quantile: per level α, the rank score's max(α, 1 − α)·d_in (`quantile_sensitivities`).
    """
    c = metric.contribution
    keys_touched = c.max_keys if _grouped(metric) else 1
    aggregate = metric.aggregate
    if aggregate is Aggregate.COUNT:
        return (_vector("value", float(c.max_per_key), keys_touched),)
    if aggregate is Aggregate.COUNT_UNITS:
        return (_vector("value", 1.0, keys_touched),)
    if aggregate is Aggregate.TOP_K:
        return (_vector("value", float(c.max_per_key), c.max_keys),)
    if aggregate is Aggregate.QUANTILE:
        return quantile_sensitivities(metric)
    if metric.bounds is None:
        raise InternalError(f"metric {metric.name!r}: {aggregate.value} without bounds passed validation")
    if aggregate is Aggregate.SUM:
        return (_vector("value", c.max_per_key * metric.bounds.magnitude, keys_touched),)
    if aggregate is Aggregate.MEAN:
        if metric.denominator is not None:
            per_key = c.max_per_key * metric.bounds.magnitude / metric.denominator
            return (_vector("value", per_key, keys_touched),)
        half_range = (metric.bounds.upper - metric.bounds.lower) / 2.0
        return (
            _vector("sum", c.max_per_key * half_range, keys_touched),
            _vector("count", float(c.max_per_key), keys_touched),
        )
    raise InternalError(f"no sensitivity rule for aggregate {aggregate!r}")


def quantile_d_in(metric: Metric) -> int:
    """The symmetric distance one unit moves a quantile metric's bounded value multiset:
    max_keys · max_per_key values added or removed (max_keys is 1 for an ungrouped metric)."""
    c = metric.contribution
    return (c.max_keys if _grouped(metric) else 1) * c.max_per_key


def quantile_sensitivities(metric: Metric) -> tuple[Sensitivity, ...]:
    """One part per quantile level α (named 'p50', 'p90', ...): OpenDP's quantile score
    |(1 − α)·#below − α·#above| moves by at most max(α, 1 − α) per value added or removed, so by
    max(α, 1 − α)·d_in per unit (in ranks; an unknown-size input, so no tighter bound)."""
    d_in = quantile_d_in(metric)
    return tuple(
        Sensitivity(label, score, score, score)
        for label, alpha in zip(metric.quantile_labels, metric.quantiles or (), strict=True)
        for score in (max(alpha, 1.0 - alpha) * d_in,)
    )
