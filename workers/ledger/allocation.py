"""The adaptive allowance (see dpstream.workers.ledger) applied to a ledger snapshot, in exact units.

The allowance is `topology.allocation`'s rule, L × c_m·h / Σ_j c_j·n_j (h, n weighted by a metric's
budget schedule; 1 and plain counts without one), on the scope's exact rates
(`ScopeConfig.pricing_rates`) and the pool left in units, floored to a unit: on plan the grants
equal the static plan to the unit and the last release of a period takes exactly what is left.
"""

from __future__ import annotations

__all__ = ["Snapshot", "state_of", "price", "price_in_order", "room"]

import math
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from functools import lru_cache
from typing import NamedTuple

from dpstream.topology.allocation import (
    release_share_terms,
    thinned_out,
    warning_cost_factor,
    weighted_windows,
    window_weight,
)
from dpstream.topology.model import Window
from dpstream.topology.schedule import Schedule
from dpstream.workers.ledger import topm
from dpstream.workers.ledger.config import MetricShare, ScopeConfig
from dpstream.workers.ledger.decision import spend_limit, state_of
from dpstream.workers.ledger.types import BreakerInfo, Quote, State
from dpstream.workers.ledger.units import chargeable_float


class Snapshot(NamedTuple):
    """One consistent read of a scope's period block, as stored.

    A tuple, not a frozen dataclass: one is built per quote, and a frozen dataclass's per-field
    `object.__setattr__` makes it several times dearer to build."""

    cap_units: int
    reserve_units: int
    warn_units: int
    spent_units: int
    grant_units: int
    breaker: BreakerInfo | None
    """The breaker holding this period open (manual, or automatic for this period), if any."""
    charged_after: Mapping[str, int]
    """Per metric: releases already charged this period whose window ends at or after the priced one."""
    version: int = 0
    """The period block's spend version (bumped by every charge and grant of the period)."""
    tops: Mapping[str, tuple[int, ...]] = {}
    """Per metric under `max_windows`: its largest charges this period, largest first (`topm`)."""


def _units_of(pool_units: int, share: Fraction) -> int:
    """floor(pool_units × share): a share of the pool in whole units (never more than the share)."""
    return pool_units * share.numerator // share.denominator


_chargeable = lru_cache(maxsize=4096)(chargeable_float)
"""`chargeable_float(units)`, memoised (on plan a period's releases are allowed one or two unit counts)."""


@lru_cache(maxsize=256)
def _schedules_of(
    windows: tuple[tuple[str, Window], ...], schedule_start: int | None
) -> tuple[tuple[str, Callable[[int, int, int], int]], ...]:
    """(name, `Schedule.left` of the metric's schedule from S) per metric (the bound method, so the
    quote's loop looks nothing up); one S per deployment, so a few entries."""
    return tuple((name, Schedule.of_window(window, schedule_start).left) for name, window in windows)


def _releases_left(
    cfg: ScopeConfig,
    snap: Snapshot,
    metric: str,
    period_start: int,
    window_end: int,
    schedule_start: int | None = None,
    window_start: int = 0,
) -> dict[str, int]:
    """n_j per metric: the windows of its public schedule still to come (`Schedule.left`) less those
    already charged (W_j, weighted, for a shaped metric: `_weigh_left`); the priced metric counts at
    least its own release, of its weight (if charged already, reserve answers DUPLICATE)."""
    charged = snap.charged_after
    period_s = cfg.period_s
    left = {
        name: windows_left(period_start, period_s, window_end) - charged.get(name, 0)
        for name, windows_left in _schedules_of(cfg.pricing_windows, schedule_start)
    }
    for name, (m, _) in cfg.capped.items():  # under max_windows only the first m charges are paid
        left[name] = min(left[name], m - len(snap.tops.get(name, ())))
    if cfg.shaped:
        _weigh_left(cfg, snap, left, period_start, window_end, schedule_start)
    own = window_weight(cfg.shaped.get(metric), window_start)
    if left[metric] < own:
        left[metric] = own
    return left


def _weigh_left(
    cfg: ScopeConfig,
    snap: Snapshot,
    left: dict[str, int],
    period_start: int,
    window_end: int,
    schedule_start: int | None,
) -> None:
    """W_j for the shaped metrics, in place of n_j: the weighted count of their windows still to come
    (`topology.allocation.weighted_windows`). The charged ones are taken to be the earliest of those
    (windows close in order); under `max_windows` only the heaviest still paid count."""
    period_end = period_start + cfg.period_s
    for name, hours in cfg.shaped.items():
        if left[name] <= 0:
            left[name] = 0
            continue
        window = cfg.plans[name].window
        lo = max(window_end - window.size_s, period_start)
        if schedule_start is not None and schedule_start > lo:
            lo = schedule_start
        every = window.every_s
        lo = -(-lo // every) * every + snap.charged_after.get(name, 0) * every
        counts = Schedule(window.size_s, every).starts_by_hour(lo, period_end)
        paid = None if name not in cfg.capped else cfg.capped[name][0] - len(snap.tops.get(name, ()))
        left[name] = weighted_windows(counts, hours, paid)


def _adaptive_units(
    cfg: ScopeConfig,
    snap: Snapshot,
    metric: str,
    period_start: int,
    window_end: int,
    pool_left: int,
    schedule_start: int | None = None,
    window_start: int = 0,
) -> int:
    """The allowance in units from `pool_left` units: floor(pool_left × `release_share`), 0 when nothing is left."""
    if pool_left <= 0:
        return 0
    left = _releases_left(cfg, snap, metric, period_start, window_end, schedule_start, window_start)
    weight = window_weight(cfg.shaped.get(metric), window_start)
    rate, total = release_share_terms(metric, cfg.pricing_rates, left, weight)
    return pool_left * rate // total if total > 0 else 0


def _quote(
    cfg: ScopeConfig,
    plan: MetricShare,
    period_id: str,
    snap: Snapshot,
    state: State,
    units: int,
    with_ratio: bool,
    thinned: bool = False,
    stretched: bool = False,
    refused_reason: str | None = None,
    paid: int | None = None,
) -> Quote:
    """The quote at `units`; with `with_ratio`, its `ratio_after` is the snapshot's spend after a
    charge of `units` (of which the period pays `paid`, if given), over the cap (None without a cap)."""
    spent_after = snap.spent_units + (units if paid is None else paid)
    ratio = spent_after / snap.cap_units if with_ratio and snap.cap_units > 0 else None
    return Quote(
        plan.name,
        cfg.name,
        period_id,
        _chargeable(units),
        units,
        state,
        thinned,
        stretched,
        refused_reason,
        plan.may_use_reserve,
        snap.version,
        False,
        ratio,
    )


def price(
    cfg: ScopeConfig,
    snap: Snapshot,
    metric: str,
    period_id: str,
    period_start: int,
    window_start: int,
    window_end: int,
    schedule_start: int | None = None,
    *,
    with_ratio: bool = False,
) -> Quote:
    """The allowance for the release of `metric` over [window_start, window_end) in this period, at the
    snapshot's spend version (`with_ratio`: with the period's `ratio_after` it, see `_quote`).

    `schedule_start` is the schedule start S: windows starting before it are never released
    (the public schedule), so they are not counted among the releases still to come; None (or S at
    or before the period start) prices every window of the period's grid, as a whole period. A
    window that itself starts before S is not in the schedule (the release side's warm-up quotes
    one): it is priced as in a whole period, never as the last window left of it."""
    if schedule_start is not None and window_start < schedule_start:
        schedule_start = None
    plan = cfg.plans.get(metric) or cfg.metric(metric)
    cap, reserve, warn, spent, grant, breaker = snap[:6]
    if breaker is not None:
        kind = "manual" if breaker.manual else "automatic"
        reason = f"breaker open ({kind}): {breaker.reason}"
        return _quote(cfg, plan, period_id, snap, State.OPEN, 0, with_ratio, refused_reason=reason)
    state = state_of(spent, warn, False)  # the breaker is closed here
    if metric in cfg.capped:
        m, top = cfg.capped[metric][0], snap.tops.get(metric, ())
        if len(top) >= m:  # m paid already: priced at the m-th largest, which raises their sum by 0
            return _quote(cfg, plan, period_id, snap, state, top[m - 1], with_ratio, paid=0)
    pool_left = room(snap, False)
    units = _adaptive_units(cfg, snap, metric, period_start, window_end, pool_left, schedule_start, window_start)
    if plan.may_use_reserve:
        static = _units_of(
            cap - reserve, cfg.planned_shares[metric] * window_weight(cfg.shaped.get(metric), window_start)
        )
        units = min(room(snap, True), max(units, static))
    elif units > pool_left:
        units = pool_left
    stretched = False
    if state is State.WARNING:
        if cfg.on_warning.thin > 1 and thinned_out(cfg.on_warning, window_start, plan.window):
            return _quote(cfg, plan, period_id, snap, state, 0, with_ratio, thinned=True)
        if cfg.on_warning.stretch != 1.0:
            units = math.floor(units * Fraction(warning_cost_factor(cfg.on_warning, cfg.accounting)))
            stretched = True
    if units <= 0:
        return _exhausted(cfg, plan, period_id, snap, state, with_ratio)
    return _quote(cfg, plan, period_id, snap, state, units, with_ratio, stretched=stretched)


def room(snap: Snapshot, may_use_reserve: bool) -> int:
    """What one more charge may take of the period: its `spend_limit` less the spend (never below 0)."""
    cap, reserve, _, spent, grant = snap[:5]
    return max(0, spend_limit(cap, reserve, grant, may_use_reserve) - spent)


def _exhausted(
    cfg: ScopeConfig, plan: MetricShare, period_id: str, snap: Snapshot, state: State, with_ratio: bool
) -> Quote:
    """The refusal of a release that nothing is left for."""
    reason = (
        "budget exhausted: nothing left of the cap"
        if plan.may_use_reserve
        else "pool exhausted: only may_use_reserve metrics or an operator grant draw on the reserve"
    )
    return _quote(cfg, plan, period_id, snap, state, 0, with_ratio, refused_reason=reason)


def price_in_order(
    cfg: ScopeConfig,
    snap: Snapshot,
    metric: str,
    period_id: str,
    period_start: int,
    window_start: int,
    window_end: int,
    schedule_start: int | None = None,
    before: Sequence[tuple[str, int]] = (),
    charged: Mapping[str, tuple[int, int]] | None = None,
) -> Quote:
    """`price` with the releases of one close time in their canonical (P(w), metric) order, so
    what a release costs never depends on which of them happened to be charged first.

    `charged` (metric → (its own cost, what its period paid for it), in units) are the releases of this
    close (same scope, period and window end) already charged, in whatever order they ran: they are
    taken out of the snapshot. `before` ((metric, window start), in canonical order) are the releases
    of this close that come before this one: each is priced from the snapshot so far and, if it would
    be charged, counted in it as the ledger would count it (under `max_windows` and for a running
    total's later steps, by what it raises the metric's largest charges by: `topm`). Then this release
    is priced. The quote's `ratio_after` is the period's spend after it over the cap, in that order
    (the record's `budget.ratio_after`). The spend version is the snapshot's, so a charge that landed
    since still answers STALE_QUOTE."""
    real = snap
    if charged:
        snap = _taken_out(cfg, snap, charged)
    for name, start in before:
        earlier = price(cfg, snap, name, period_id, period_start, start, window_end, schedule_start)
        if earlier.ok:
            snap = _counted_in(cfg, snap, name, earlier.cost_units)
    quote = price(cfg, snap, metric, period_id, period_start, window_start, window_end, schedule_start, with_ratio=True)
    return _withinroom(cfg, real, metric, period_id, quote)


def _withinroom(cfg: ScopeConfig, real: Snapshot, metric: str, period_id: str, quote: Quote) -> Quote:
    """`quote`, cut to what the period really has left (`room` of the snapshot as read). Priced as if the
    releases of its close that come after it had not charged yet, it can ask for more than the ledger holds
    once they have, which the charge would refuse: a metric late with a backlog at a period's end, whose
    windows the others' releases (not counting them) priced the pool away from. It then gets what is left,
    and the order of the charges decides who gets it."""
    if not quote.ok:
        return quote
    plan = cfg.plans.get(metric) or cfg.metric(metric)
    units = quote.cost_units
    paid = topm.raised(real.tops.get(metric, ()), cfg.capped[metric][0], units)[0] if metric in cfg.capped else units
    over = paid - room(real, plan.may_use_reserve)
    if over <= 0:
        return quote
    if units - over <= 0:
        return _exhausted(cfg, plan, period_id, real, quote.state, True)
    cut = units - over
    return _quote(cfg, plan, period_id, real, quote.state, cut, True, stretched=quote.stretched, paid=paid - over)


def _counted_in(cfg: ScopeConfig, snap: Snapshot, name: str, units: int) -> Snapshot:
    """The snapshot after a charge of `units` to `name`, as the ledger's decision counts it."""
    counts = dict(snap.charged_after)
    counts[name] = counts.get(name, 0) + 1
    if name not in cfg.capped:
        return snap._replace(spent_units=snap.spent_units + units, charged_after=counts)
    paid, top = topm.raised(snap.tops.get(name, ()), cfg.capped[name][0], units)
    return snap._replace(spent_units=snap.spent_units + paid, charged_after=counts, tops={**snap.tops, name: top})


def _taken_out(cfg: ScopeConfig, snap: Snapshot, charged: Mapping[str, tuple[int, int]]) -> Snapshot:
    """The snapshot before the charges of `charged` (metric → (own units, units its period paid))."""
    counts, tops, spent = dict(snap.charged_after), dict(snap.tops), snap.spent_units
    for name, (own, paid) in charged.items():
        counts[name] = max(0, counts.get(name, 0) - 1)
        spent -= paid
        if name in tops:
            tops[name] = topm.lowered(tops[name], own, paid)
    return snap._replace(spent_units=max(0, spent), charged_after=counts, tops=tops)
