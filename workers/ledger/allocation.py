"""The adaptive grant of DESIGN §5 applied to a ledger snapshot: the pure rule, in exact units.

`topology.allocation.adaptive_release_cost` is evaluated on exact fractions (pool left in units
/ 1e12, weights as written), so on plan the grants equal the static plan to the unit and the
last release of a period takes exactly what is left.
"""

from __future__ import annotations

__all__ = ["Snapshot", "state_of", "price"]

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from dpstream.topology.allocation import (
    MetricDemand,
    adaptive_release_cost,
    static_release_cost,
    thinned_out,
    warning_cost_factor,
    windows_left,
)

from dpstream.workers.ledger.config import ScopeConfig
from dpstream.workers.ledger.types import BreakerInfo, Quote, State
from dpstream.workers.ledger.units import UNITS_PER_CURRENCY, grantable_float


@dataclass(frozen=True)
class Snapshot:
    """One consistent read of a scope's period block, as stored."""

    cap_units: int
    reserve_units: int
    warn_units: int
    spent_units: int
    grant_units: int
    breaker: BreakerInfo | None
    """The breaker holding this period open (manual, or automatic for this period), if any."""
    charged_after: Mapping[str, int]
    """Per metric: releases already charged this period whose window ends at or after the priced one."""


def state_of(spent_units: int, warn_units: int, is_open: bool) -> State:
    """normal / warning / open, from the spend and the breaker (the same rule as charge.lua)."""
    if is_open:
        return State.OPEN
    return State.WARNING if spent_units >= warn_units else State.NORMAL


def _units(amount: Fraction | float) -> int:
    return max(0, math.floor(Fraction(amount) * UNITS_PER_CURRENCY))


def price(
    cfg: ScopeConfig,
    snap: Snapshot,
    metric: str,
    period_id: str,
    period_start: int,
    window_start: int,
    window_end: int,
) -> Quote:
    """The grant for the release of `metric` over [window_start, window_end) in this period."""
    plan = cfg.metric(metric)
    state = state_of(snap.spent_units, snap.warn_units, snap.breaker is not None)

    def quote(units: int, **kw: object) -> Quote:
        return Quote(
            metric, cfg.name, period_id, grantable_float(units), units, state,
            may_use_reserve=plan.may_use_reserve, **kw,  # type: ignore[arg-type]
        )

    if snap.breaker is not None:
        kind = "manual" if snap.breaker.manual else "automatic"
        return quote(0, refused_reason=f"breaker open ({kind}): {snap.breaker.reason}")
    demands: dict[str, MetricDemand] = {}
    for p in cfg.metrics:
        left = windows_left(p.window, period_start, cfg.period_s, window_end) - snap.charged_after.get(p.name, 0)
        demands[p.name] = MetricDemand(weight=p.weight, per_period=p.per_period, left=max(0, left))  # type: ignore[arg-type]
    if demands[metric].left < 1:  # already charged: reserve will answer DUPLICATE
        demands[metric] = MetricDemand(weight=plan.weight, per_period=plan.per_period, left=1)  # type: ignore[arg-type]
    pool_cap = min(snap.cap_units, snap.cap_units - snap.reserve_units + snap.grant_units)
    pool_left = max(0, pool_cap - snap.spent_units)
    units = _units(adaptive_release_cost(Fraction(pool_left, UNITS_PER_CURRENCY), metric, demands))  # type: ignore[arg-type]
    if plan.may_use_reserve:
        pool = Fraction(snap.cap_units - snap.reserve_units, UNITS_PER_CURRENCY)
        static = _units(static_release_cost(pool, metric, demands))  # type: ignore[arg-type]
        units = min(snap.cap_units - snap.spent_units, max(units, static))
    units = min(units, pool_left if not plan.may_use_reserve else snap.cap_units - snap.spent_units)
    thinned = stretched = False
    if state is State.WARNING:
        if cfg.on_warning.thin > 1 and thinned_out(cfg.on_warning, window_start, plan.window):
            return quote(0, thinned=True)
        if cfg.on_warning.stretch != 1.0:
            units = math.floor(units * Fraction(warning_cost_factor(cfg.on_warning, cfg.accounting)))
            stretched = True
    if units <= 0:
        reason = (
            "budget exhausted: nothing left of the cap"
            if plan.may_use_reserve
            else "pool exhausted: only may_use_reserve metrics or an operator grant draw on the reserve"
        )
        return quote(0, refused_reason=reason)
    return quote(units, thinned=thinned, stretched=stretched)
