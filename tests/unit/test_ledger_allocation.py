"""Adaptive grants (DESIGN §5) on the in-process ledger: static plan on plan, shares left to the rest, never over."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from dpstream.topology.loader import load_topology
from dpstream.topology.periods import period_id, periods_touched
from dpstream.workers.ledger import Outcome, ReleaseRequest, open_ledger
from dpstream.workers.ledger.testing import ManualClock, one_scope_topology

DAY = 86_400
P0 = (1_796_000_000 // DAY) * DAY


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def test_on_plan_grants_equal_the_static_plan() -> None:
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
            assert r.outcome is Outcome.GRANTED
        hist = await ledger.history("s")
        assert pool_units - 36 <= hist[0].spent_units <= pool_units

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
            assert r.outcome is Outcome.GRANTED
            largest = max(largest, r.cost_units)
        summary = next(h for h in await ledger.history("web-daily") if h.period_id == period_id(DAY, P0))
        pool = summary.cap_units - summary.reserve_units
        assert summary.spent_units <= pool
        assert pool - summary.spent_units <= largest
        assert summary.period_id == period_id(DAY, P0)

    run(body())
