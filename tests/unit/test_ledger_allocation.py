"""Adaptive allowances on the in-process ledger: static plan on plan, shares left to the rest, never over."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine
from typing import Any

from dpstream.topology.loader import load_topology
from dpstream.topology.periods import period_id, periods_touched
from dpstream.workers.ledger import Outcome, ReleaseRequest, open_ledger
from dpstream.workers.ledger.config import scope_configs
from dpstream.workers.ledger.testing import ManualClock, one_scope_topology

DAY = 86_400
P0 = (1_796_000_000 // DAY) * DAY


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def test_on_plan_allowances_equal_the_static_plan() -> None:
    """Releasing every window at its quote gives each metric pool × w/Σw / N per release (to a few 1e-12 units)."""

    async def body() -> None:
        topo = one_scope_topology(metrics=(("a", 3.0, 3600, 3600, False), ("b", 1.0, 7200, 7200, False)))
        ledger = await open_ledger("memory", topo, clock=ManualClock(P0))
        pool_units = 800_000_000_000
        windows = sorted(
            [(s + 3600, "a", s) for s in range(P0, P0 + DAY, 3600)]
            + [(s + 7200, "b", s) for s in range(P0, P0 + DAY, 7200)]
        )
        for end, m, start in windows:
            q = await ledger.quote(m, start, end)
            static = pool_units * (3 if m == "a" else 1) // 4 // (24 if m == "a" else 12)
            assert abs(q.cost_units - static) <= len(windows)  # flooring leaves ≤ 1 unit per release to the rest
            r = await ledger.charge(ReleaseRequest(f"{m}{start}", "s", q.period_id, m, start, end, q.cost, b""))
            assert r.outcome is Outcome.CHARGED
        hist = await ledger.history("s")
        assert pool_units - 36 <= hist[0].spent_units <= pool_units

    run(body())


def test_first_grants_of_a_period_are_the_plans_static_cost_to_the_unit() -> None:
    """At a fresh period's first close every release is still to come: each grant is exactly the plan's
    static cost, floor(pool × (w/Σw) / N) in units, and the plan's float cost is that within a unit."""
    from fractions import Fraction

    from dpstream.topology.plan import build_plan

    async def body() -> None:
        metrics = (("a", 3.0, 3600, 3600, False), ("b", 0.333, 3600, 1800, False), ("c", 1.5, 3600, 600, False))
        topo = one_scope_topology(metrics=metrics)
        scope = build_plan(topo).scope("s")
        ledger = await open_ledger("memory", topo, clock=ManualClock(P0))
        cfg = scope_configs(topo)["s"]
        pool = cfg.cap_units - cfg.reserve_units
        total = sum(Fraction(repr(w)) for _, w, *_ in metrics)
        for (name, w, size, every, _), planned in zip(metrics, scope.metrics, strict=True):
            q = await ledger.quote(name, P0, P0 + size)
            static = pool * Fraction(repr(w)) / total / (DAY // every)
            assert q.cost_units == math.floor(static), name  # quotes charge nothing: each sees the fresh period
            assert abs(planned.per_release_cost * 10**12 - static) <= 1, name

    run(body())


def test_skipped_release_leaves_its_share_to_the_rest() -> None:
    """After metric a skips a window, b's next grant is larger than its static share."""

    async def body() -> None:
        topo = one_scope_topology(metrics=(("a", 1.0, 3600, 3600, False), ("b", 1.0, 3600, 3600, False)))
        ledger = await open_ledger("memory", topo, clock=ManualClock(P0))
        first = await ledger.quote("b", P0, P0 + 3600)
        await ledger.charge(ReleaseRequest("b0", "s", first.period_id, "b", P0, P0 + 3600, first.cost, b""))
        later = await ledger.quote("b", P0 + 3600, P0 + 7200)  # a's first window was never released
        assert later.cost > first.cost

    run(body())


def test_simulated_day_with_skips_and_cheaper_releases_ends_at_the_pool() -> None:
    """web-analytics over one day, some releases skipped or cheaper: spend ends within one release of
    cap − reserve, never above."""

    async def body() -> None:
        topo = load_topology("topology/examples/web-analytics.yaml")
        ledger = await open_ledger("memory", topo, clock=ManualClock(P0))
        windows = sorted(
            (start + m.window.size_s, name, start)
            for name, m in topo.metrics.items()
            for start in range(P0, P0 + DAY, m.window.every_s)
        )
        largest = 0
        for k, (end, name, start) in enumerate(windows):
            q = await ledger.quote(name, start, end)
            if not q.ok or k % 11 == 0:  # skipped (failed window) every 11th
                continue
            cost = q.cost / 2 if k % 7 == 0 else q.cost  # cheaper release every 7th
            later = tuple((period_id(DAY, p), p) for p in periods_touched(DAY, start, end)[1:])  # straddles midnight
            r = await ledger.charge(
                ReleaseRequest(
                    f"{name}-{start}", q.scope, q.period_id, name, start, end, cost, b"", extra_periods=later
                )
            )
            assert r.outcome is Outcome.CHARGED
            largest = max(largest, r.cost_units)
        summary = next(h for h in await ledger.history("web-daily") if h.period_id == period_id(DAY, P0))
        pool = summary.cap_units - summary.reserve_units
        assert summary.spent_units <= pool
        assert pool - summary.spent_units <= largest
        assert summary.period_id == period_id(DAY, P0)

    run(body())


# ---- a deployment that starts inside a period (DESIGN §1 rule 2: no window before S is released) ----

HOUR = 3_600
S_MID = P0 + 6 * HOUR + 1800  # 06:30 UTC

_MIXED = """
version: 1
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts, allowed_lateness: 30s}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d, reserve: 0.2, warn_at: 0.8}
metrics:
  hourly: {source: s, budget: b, weight: 1, window: {tumbling: 1h}, aggregate: count, mechanism: gaussian}
  daily: {source: s, budget: b, weight: 3, window: {tumbling: 1d}, aggregate: count, mechanism: gaussian}
  sliding: {source: s, budget: b, weight: 2, window: {hopping: 2h, every: 1h}, aggregate: count, mechanism: gaussian}
sinks: {releases: r, dead_letter: d}
"""


def _mixed():
    from dpstream.topology.loader import load_topology_text

    return load_topology_text(_MIXED)


def _schedule(topo, start: int, until: int) -> list[tuple[int, str, int]]:
    """(end, metric, start) of every window of the public schedule from `start` whose start is before `until`,
    in close order."""
    out = []
    for name, m in topo.metrics.items():
        first = -(-start // m.window.every_s) * m.window.every_s
        out.extend((s + m.window.size_s, name, s) for s in range(first, until, m.window.every_s))
    order = list(topo.metrics)
    return sorted(out, key=lambda w: (w[0], order.index(w[1]), w[2]))


async def _charge_all(ledger, windows) -> list[int]:
    """Quote and charge every window at its quote; the charged units, in order."""
    out = []
    for end, name, start in windows:
        q = await ledger.quote(name, start, end)
        later = tuple((period_id(DAY, p), p) for p in periods_touched(DAY, start, end)[1:])
        r = await ledger.charge(
            ReleaseRequest(f"{name}-{start}", q.scope, q.period_id, name, start, end, q.cost, b"", extra_periods=later)
        )
        assert r.outcome is Outcome.CHARGED, r
        out.append(r.cost_units)
    return out


def test_a_metric_whose_only_window_starts_before_s_gets_no_share() -> None:
    """S at 06:30: the daily window [00:00, 24:00) is never released, so it takes no share; hourly and
    sliding (17 windows each from 07:00) share the whole pool: pool × (w/N) / Σ_j w_j·n_j/N_j."""
    from fractions import Fraction

    async def body() -> None:
        topo = _mixed()
        ledger = await open_ledger("memory", topo, clock=ManualClock(S_MID), schedule_start=S_MID)
        assert ledger.schedule_start == S_MID
        cfg = scope_configs(topo)["b"]
        pool = cfg.cap_units - cfg.reserve_units
        shares = Fraction(1, 24) * 17 + Fraction(2, 24) * 17  # hourly and sliding; daily has no window left
        q = await ledger.quote("hourly", P0 + 7 * HOUR, P0 + 8 * HOUR)
        assert abs(q.cost_units - pool * Fraction(1, 24) / shares) <= 1
        # priced at 09:00 with nothing charged: hourly's 07:00 window is over, 16 of its windows are left
        q = await ledger.quote("sliding", P0 + 7 * HOUR, P0 + 9 * HOUR)
        assert abs(q.cost_units - pool * Fraction(2, 24) / (Fraction(1, 24) * 16 + Fraction(2, 24) * 17)) <= 1
        # the same quote without S counts the daily window and the sliding window of 06:00 as still to come
        plain = await open_ledger("memory", topo, clock=ManualClock(S_MID))
        q0 = await plain.quote("hourly", P0 + 7 * HOUR, P0 + 8 * HOUR)
        assert abs(q0.cost_units - pool * Fraction(1, 24) / (Fraction(1, 24) * 17 + Fraction(2, 24) * 18 + 3)) <= 1

    run(body())


def test_a_start_at_or_before_the_period_start_prices_exactly_as_without_one() -> None:
    """Every grant of two whole periods is the same unit for unit with no S, S at the period start and S
    five hours before it; and S inside the first period leaves the second period's allowances unchanged."""

    async def body() -> None:
        topo = _mixed()
        windows = _schedule(topo, P0, P0 + 2 * DAY)
        want = await _charge_all(await open_ledger("memory", topo, clock=ManualClock(P0)), windows)
        for start in (P0, P0 - 5 * HOUR):
            ledger = await open_ledger("memory", topo, clock=ManualClock(P0), schedule_start=start)
            assert await _charge_all(ledger, windows) == want
        second = _schedule(topo, P0 + DAY, P0 + 2 * DAY)
        base = await _charge_all(await open_ledger("memory", topo, clock=ManualClock(P0)), second)
        mid = await open_ledger("memory", topo, clock=ManualClock(P0), schedule_start=S_MID)
        assert await _charge_all(mid, second) == base

    run(body())


def test_use_schedule_start_takes_whole_epoch_seconds_only() -> None:
    """A schedule start that is not whole seconds >= 0 is a bug, refused before it prices anything."""
    import pytest

    from dpstream.topology.errors import InternalError

    async def body() -> None:
        ledger = await open_ledger("memory", _mixed(), clock=ManualClock(P0))
        assert ledger.schedule_start is None
        for bad in (-1, 1.5, True, "0"):
            with pytest.raises(InternalError, match="whole epoch seconds"):
                ledger.use_schedule_start(bad)  # type: ignore[arg-type]  # the wrong types are the point
        assert ledger.schedule_start is None

    run(body())


def test_a_window_before_s_is_priced_as_in_a_whole_period() -> None:
    """A window that starts before S is not in the schedule (only the release side's warm-up quotes one):
    it gets a whole period's grant, not the pool left for windows that will never come."""

    async def body() -> None:
        topo = _mixed()
        late = P0 + DAY - 1800  # S at 23:30: no window of the day starts at or after it
        mid = await open_ledger("memory", topo, clock=ManualClock(late), schedule_start=late)
        plain = await open_ledger("memory", topo, clock=ManualClock(late))
        for name, start, end in (("hourly", P0 + 23 * HOUR, P0 + DAY), ("daily", P0, P0 + DAY)):
            assert (await mid.quote(name, start, end)).cost_units == (await plain.quote(name, start, end)).cost_units

    run(body())
