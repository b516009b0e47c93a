"""`contribution.max_windows: m` in the ledger, on both backends: a period pays only the metric's m
largest charges (per topology version), charged atomically by how much each release raises them."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.topology.model import WarningPolicy
from dpstream.topology.periods import period_id
from dpstream.workers.ledger import Ledger, Outcome, ReleaseRequest, State, open_ledger
from dpstream.workers.ledger.testing import ManualClock, one_scope_topology
from dpstream.workers.ledger.units import cost_to_units, units_to_float

DAY, HOUR = 86_400, 3_600
T0 = 1_796_000_000
P0 = (T0 // DAY) * DAY
RECORD = b'{"release_id":"%s","budget":{"scope":"s","ratio_after":null}}'
HOURLY = (("m", 1.0, HOUR, HOUR, False),)


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


@pytest.fixture(params=["memory", "redis"])
def where(request: pytest.FixtureRequest) -> str:
    """'memory' or the fresh session Redis."""
    if request.param == "memory":
        return "memory"
    return request.getfixturevalue("fresh_redis").url


async def _open(where: str, m: int = 3, version: int = 1, epsilon: float = 1.0) -> Ledger:
    topology = one_scope_topology(epsilon=epsilon, metrics=HOURLY, max_windows={"m": m}, topology_version=version)
    return await open_ledger(where, topology, clock=ManualClock(T0))


def _req(i: int, cost: float, version: int = 1) -> ReleaseRequest:
    rid = f"v{version}-w{i}"
    start = P0 + i * HOUR
    return ReleaseRequest(rid, "s", period_id(DAY, P0), "m", start, start + HOUR, cost, RECORD % rid.encode())


def _top_sum(costs: list[int], m: int) -> int:
    return sum(sorted(costs, reverse=True)[:m])


def test_a_period_pays_the_m_largest_charges(where: str) -> None:
    """Spend after each charge is the sum of the m largest charges so far; each release is charged
    by what it raises that sum by; the audit's charges add up to the spend (reconcile)."""
    costs = [0.05, 0.03, 0.08, 0.02, 0.09, 0.01, 0.07, 0.08]

    async def body() -> None:
        ledger = await _open(where, m=3)
        try:
            done: list[int] = []
            for i, cost in enumerate(costs):
                before = _top_sum(done, 3)
                res = await ledger.charge(_req(i, cost))
                done.append(cost_to_units(cost))
                assert res.outcome is Outcome.CHARGED
                assert res.cost_units == _top_sum(done, 3) - before
                status = await ledger.status("s")
                assert status.spent_units == _top_sum(done, 3)
                assert status.charged == i + 1
            (row,) = (await ledger.reconcile("s")).periods
            assert row.ok and row.stored_units == row.audited_units == _top_sum(done, 3)
            again = await ledger.charge(_req(4, 0.09))  # a known release id: its stored bytes, nothing charged
            assert again.outcome is Outcome.DUPLICATE and (await ledger.status("s")).spent_units == _top_sum(done, 3)
        finally:
            await ledger.close()

    run(body())


def test_each_topology_version_pays_its_own_m_windows(fresh_redis: Any) -> None:
    """A second topology version's pipeline counts units afresh, so its m largest charges add to the
    first's (two processes on one Redis ledger: the in-process ledger serves one topology)."""

    async def body() -> None:
        first, second = await _open(fresh_redis.url, m=2, version=1), await _open(fresh_redis.url, m=2, version=2)
        try:
            for i, cost in enumerate([0.04, 0.06, 0.05]):
                assert (await first.charge(_req(i, cost, 1))).outcome is Outcome.CHARGED
            for i, cost in enumerate([0.01, 0.02, 0.03]):
                assert (await second.charge(_req(i, cost, 2))).outcome is Outcome.CHARGED
            want = cost_to_units(0.06) + cost_to_units(0.05) + cost_to_units(0.03) + cost_to_units(0.02)
            assert (await first.status("s")).spent_units == want
        finally:
            await first.close()
            await second.close()

    run(body())


def test_a_charge_over_the_cap_is_refused_by_what_it_would_raise(where: str) -> None:
    """Overspend is judged on what the period would pay: a release that raises the m largest past
    the cap is refused (changing nothing); one priced at or under the m-th largest always fits."""

    async def body() -> None:
        ledger = await _open(where, m=2, epsilon=0.1)  # cap 0.1 ε, reserve 20 %: 0.08 outside it
        try:
            assert (await ledger.charge(_req(0, 0.039))).outcome is Outcome.CHARGED
            assert (await ledger.charge(_req(1, 0.039))).outcome is Outcome.CHARGED
            refused = await ledger.charge(_req(2, 0.05))  # raises the two largest by 0.011: past the pool
            assert refused.outcome is Outcome.REFUSED and refused.reason.startswith("pool exhausted")
            for i in range(3, 24):  # at the m-th largest: pays nothing, however many windows
                assert (await ledger.charge(_req(i, 0.039))).outcome is Outcome.CHARGED
            status = await ledger.status("s")
            assert (status.spent_units, status.refused) == (2 * cost_to_units(0.039), 1)
        finally:
            await ledger.close()

    run(body())


def test_quotes_spend_the_share_in_the_first_m_windows_then_price_at_the_mth_largest(where: str) -> None:
    """On plan the metric's period share P is priced P/m in each of its first m windows (n_eff =
    min(windows left, m − charged)), then every later window at the m-th largest, which costs 0."""

    async def body() -> None:
        ledger = await _open(where, m=4)
        try:
            cap = ledger.scope_of("m").cap_units
            pool = cap - ledger.scope_of("m").reserve_units
            costs = []
            for i in range(24):
                quote = await ledger.quote("m", P0 + i * HOUR, P0 + (i + 1) * HOUR)
                costs.append(quote.cost_units)
                res = await ledger.charge(_req(i, quote.cost)._replace(quoted_version=quote.version))
                assert res.outcome is Outcome.CHARGED
                assert quote.ratio_after == pytest.approx((await ledger.status("s")).spent_units / cap)
            assert costs[:4] == [pool // 4] * 4 and set(costs[4:]) == {pool // 4}
            assert (await ledger.status("s")).spent_units == 4 * (pool // 4)
            assert units_to_float(costs[0]) == pytest.approx(0.8 / 4)
        finally:
            await ledger.close()

    run(body())


@given(costs=st.lists(st.integers(1, 50), min_size=1, max_size=24), m=st.integers(1, 6))
@settings(max_examples=60, deadline=None)
def test_memory_spend_is_the_top_m_rule(costs: list[int], m: int) -> None:
    """Any sequence of charges (at most the 24 hourly windows of the period): the stored spend is the
    sum of the m largest (in-process)."""

    async def body() -> None:
        ledger = await _open("memory", m=m)
        try:
            for i, c in enumerate(costs):
                await ledger.charge(_req(i, c / 1000))
            assert (await ledger.status("s")).spent_units == _top_sum([cost_to_units(c / 1000) for c in costs], m)
        finally:
            await ledger.close()

    run(body())


@pytest.mark.parametrize("policy", [WarningPolicy(thin=2), WarningPolicy(stretch=2.0)], ids=["thin", "stretch"])
def test_the_warning_policy_never_acts_on_a_front_loaded_metric(where: str, policy: WarningPolicy) -> None:
    """Under m = 3 the metric spends the whole pool in its first 3 windows on plan: the scope's ratio is
    then 0.8 = warn_at, the warning state of seed 002's rule (R ≥ ρ), for the rest of the period. The
    policy does not act on the front-loading: every later window is released (never thinned) at the
    m-th largest (never stretched), pays nothing, and the spend stays at the pool."""

    async def body() -> None:
        topology = one_scope_topology(metrics=HOURLY, max_windows={"m": 3}, on_warning=policy)
        ledger = await open_ledger(where, topology, clock=ManualClock(T0))
        try:
            cfg = ledger.scope_of("m")
            pool = cfg.cap_units - cfg.reserve_units
            quotes = []
            for i in range(24):
                quote = await ledger.quote("m", P0 + i * HOUR, P0 + (i + 1) * HOUR)
                quotes.append(quote)
                res = await ledger.charge(_req(i, quote.cost)._replace(quoted_version=quote.version))
                assert res.outcome is Outcome.CHARGED, (i, res)
            status = await ledger.status("s")
            assert status.spent_units == pool and status.state is State.WARNING  # 0.8 of the cap exactly
            later = quotes[3:]
            assert all(q.state is State.WARNING for q in later[1:])
            assert not any(q.thinned or q.stretched for q in later)
            assert {q.cost_units for q in later} == {min(q.cost_units for q in quotes[:3])}
        finally:
            await ledger.close()

    run(body())
