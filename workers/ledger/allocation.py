"""The adaptive allowance (see dpstream.workers.ledger) applied to a ledger snapshot, in exact units.

The allowance is `topology.allocation`'s rule, L × c_m·h / Σ_j c_j·n_j (h, n weighted by a metric's
budget schedule; 1 and plain counts without one), on the scope's exact rates
(`ScopeConfig.pricing_rates`) and the pool left in units, floored to a unit: on plan the grants
equal the static plan to the unit and the last release of a period takes exactly what is left.
"""

from __future__ import annotations

__all__ = ["Backlog", "Snapshot", "out_of_order", "state_of", "price", "price_in_order", "room"]

import math
from bisect import bisect_left, insort
from collections.abc import Collection, Mapping
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
    charged_before: Mapping[str, int] = {}
    """Per metric: releases already charged this period whose window ends before the priced one."""
    charged_at: Mapping[str, int] = {}
    """Per metric: releases already charged this period whose window ends where the priced one does."""


class Backlog(NamedTuple):
    """A period's charges out of the canonical order (window end, P(w), metric), seen from one priced
    release: what `price_in_order` needs to price it as if every release had been charged in order.

    The timeline starts at the first release of the schedule before the priced one that is not charged
    yet (a gap), or at the priced release when there is none. Every charge after that start is taken out
    of the snapshot; the steps then replay the timeline up to the priced release: a charge at what it
    was charged (under `max_windows`, what it raises the m largest by at its place), a gap priced at its own
    window end from the steps before it."""

    taken_out: tuple[tuple[str, int, int], ...]
    """(metric, own units, units the period paid) of every charge after the timeline's start, the latest first."""
    kept_own: Mapping[str, tuple[int, ...]]
    """Per metric under `max_windows` (or a running total's steps: `ScopeConfig.capped`) with a charge
    taken out: the own units of all its charges before the timeline's start. What the period paid for a
    charge of such a metric depends on the charges before it, so its largest charges at the start are
    rebuilt from these."""
    steps: tuple[tuple[str, int, int, int | None, int | None], ...]
    """(metric, window start, window end, own units, paid units) from the timeline's start up to the
    priced release (excluded), in canonical order; own and paid are None for a gap."""
    ends: Mapping[str, tuple[int, ...]]
    """Per metric, in order: the window ends of its charges of the period left in the snapshot (before the
    timeline's start)."""


def _units_of(pool_units: int, share: Fraction) -> int:
    """floor(pool_units × share): a share of the pool in whole units (never more than the share)."""
    return pool_units * share.numerator // share.denominator


_chargeable = lru_cache(maxsize=4096)(chargeable_float)
"""`chargeable_float(units)`, memoised (on plan a period's releases are allowed one or two unit counts)."""


def out_of_order(
    cfg: ScopeConfig,
    snap: Snapshot,
    period_start: int,
    window_end: int,
    schedule_start: int | None,
    before: Collection[str] = (),
) -> int | None:
    """None when the period's charges are exactly the releases of the schedule that come before this
    one in the canonical order (window end, P(w), metric): every window ending earlier, and of this
    close the ones of `before` (the metrics whose release of this close comes first), none after.
    Otherwise (partials of one metric late behind another's, a window retried after a failure, a
    window thinned or refused, another process ahead) the release is priced with the period's
    `Backlog`, which the caller reads from the window end returned: this one's when every window
    ending earlier is charged (only this close or later ones are out of order), else the period's start."""
    charged_before, charged_at, charged_after = snap.charged_before, snap.charged_at, snap.charged_after
    since: int | None = None
    for name, size, grid in cfg.schedules(schedule_start):
        # the windows touching the period (a straddling one is charged to each period) ending before this one
        if charged_before.get(name, 0) != grid.starts_in(period_start - size + 1, window_end - size):
            return period_start
        at = charged_at.get(name, 0)
        if at != (1 if name in before else 0) or charged_after.get(name, 0) != at:
            since = window_end
    return since


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
        name: schedule.left(period_start, period_s, window_end) - charged.get(name, 0)
        for name, _, schedule in cfg.schedules(schedule_start)
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
    backlog: Backlog | None = None,
) -> Quote:
    """`price` in the canonical order of the period's releases (window end, then P(w), then metric), so
    what a release costs never depends on which releases happened to be charged first.

    Without a `backlog` the snapshot is taken to hold exactly the charges that come before this release
    (`out_of_order` tells when it does not). With one, the snapshot is first brought to that state: the
    charges after the backlog's start taken out, then its steps replayed in order, the releases not
    charged yet priced as if they were (`Backlog`). The quote's `ratio_after` is the period's spend
    after it over the cap, in that order (the record's `budget.ratio_after`). The spend version is the
    snapshot's, so a charge that landed since still answers STALE_QUOTE."""
    real = snap
    if backlog is not None:
        snap = _replayed(cfg, snap, period_id, period_start, window_end, schedule_start, backlog)
    quote = price(cfg, snap, metric, period_id, period_start, window_start, window_end, schedule_start, with_ratio=True)
    return _withinroom(cfg, real, metric, period_id, quote)


def _ends_at_or_after(ends: Mapping[str, list[int]], end: int) -> dict[str, int]:
    """Per metric, how many of `ends` (sorted) are at or after `end`: a snapshot's `charged_after` there."""
    return {name: len(e) - bisect_left(e, end) for name, e in ends.items()}


def _replayed(
    cfg: ScopeConfig,
    snap: Snapshot,
    period_id: str,
    period_start: int,
    window_end: int,
    schedule_start: int | None,
    backlog: Backlog,
) -> Snapshot:
    """The snapshot as the canonical order has it when the release ending at `window_end` is priced: the
    charges after the timeline's start taken out, then its steps replayed (see `Backlog`)."""
    capped = cfg.capped
    spent = snap.spent_units - sum(paid for name, _, paid in backlog.taken_out if name not in capped)
    tops = dict(snap.tops)
    for name in {name for name, _, _ in backlog.taken_out if name in capped}:  # their m largest at the start
        start_top = tuple(sorted(backlog.kept_own.get(name, ()), reverse=True)[: capped[name][0]])
        spent -= sum(tops.get(name, ())) - sum(start_top)
        tops[name] = start_top
    snap = snap._replace(spent_units=max(0, spent), tops=tops)
    ends = {name: list(e) for name, e in backlog.ends.items()}
    for name, start, end, own, _paid in backlog.steps:
        if own is None:
            at = snap._replace(charged_after=_ends_at_or_after(ends, end))
            quote = price(cfg, at, name, period_id, period_start, start, end, schedule_start)
            if not quote.ok:
                continue
            own = quote.cost_units
        snap = _counted_in(cfg, snap, name, own)  # under max_windows: what it raises the m largest by, in order
        insort(ends.setdefault(name, []), end)
    return snap._replace(charged_after=_ends_at_or_after(ends, window_end))


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
