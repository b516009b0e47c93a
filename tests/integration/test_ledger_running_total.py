"""A running total's lump in the ledger, on both backends: the period's whole charge is taken with its
first step (the top-m rule with m = 1), the later steps cost nothing, a refused first step refuses
every later step of the period, and each step's curator-side state is stored with its charge."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from dpstream.topology.model import Accounting
from dpstream.topology.periods import period_id
from dpstream.workers.ledger import Ledger, Outcome, ReleaseRequest, open_ledger
from dpstream.workers.ledger.testing import ManualClock, one_scope_topology
from dpstream.workers.ledger.units import cost_to_units

DAY, HOUR = 86_400, 3_600
T0 = 1_796_000_000
P0 = (T0 // DAY) * DAY
RECORD = b'{"release_id":"%s","budget":{"scope":"s","ratio_after":null}}'
METRICS = (("total", 1.0, HOUR, HOUR, False), ("plain", 1.0, HOUR, HOUR, False))


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


@pytest.fixture(params=["memory", "redis"])
def where(request: pytest.FixtureRequest) -> str:
    """'memory' or the fresh session Redis."""
    if request.param == "memory":
        return "memory"
    return request.getfixturevalue("fresh_redis").url


async def _open(where: str, epsilon: float = 1.0) -> Ledger:
    topology = one_scope_topology(
        epsilon=epsilon,
        delta=1e-6,
        accounting=Accounting.ZCDP,
        metrics=METRICS,
        running_totals={"total": 10},
    )
    return await open_ledger(where, topology, clock=ManualClock(T0))


def _req(i: int, cost: float, *, first: bool, state: bytes = b"", metric: str = "total") -> ReleaseRequest:
    rid = f"{metric}-w{i}"
    start = P0 + i * HOUR
    return ReleaseRequest(
        rid,
        "s",
        period_id(DAY, P0),
        metric,
        start,
        start + HOUR,
        cost,
        RECORD % rid.encode(),
        needs_lump=not first,
        running_state=state,
    )


def test_the_lump_is_charged_once_with_the_first_step(where: str) -> None:
    """The first step pays the whole lump, every later step at the same cost pays nothing, the scope's
    spend is the lump, and each step's state is read back by window start."""

    async def body() -> None:
        ledger = await _open(where)
        try:
            lump = (await ledger.quote("total", P0, P0 + HOUR)).cost
            assert lump > 0
            first = await ledger.charge(_req(0, lump, first=True, state=b"s0"))
            assert first.outcome is Outcome.CHARGED and first.cost_units == cost_to_units(lump)
            for i in range(1, 5):
                later = await ledger.charge(_req(i, lump, first=False, state=b"s%d" % i))
                assert later.outcome is Outcome.CHARGED and later.cost_units == 0
            status = await ledger.status("s")
            assert status.spent_units == cost_to_units(lump)
            steps = await ledger.running_steps("s", "total", period_id(DAY, P0))
            assert steps == {P0 + i * HOUR: b"s%d" % i for i in range(5)}
            again = await ledger.charge(_req(2, lump, first=False, state=b"other"))  # known id: nothing changes
            assert again.outcome is Outcome.DUPLICATE
            assert (await ledger.running_steps("s", "total", period_id(DAY, P0)))[P0 + 2 * HOUR] == b"s2"
        finally:
            await ledger.close()

    run(body())


def test_a_refused_first_step_refuses_the_later_steps(where: str) -> None:
    """With the pool too small for the lump, the first step is refused, and so is every later step of
    the period, even one that would fit at a smaller cost: no lump, no running total this period."""

    async def body() -> None:
        ledger = await _open(where)
        try:
            lump = (await ledger.quote("total", P0, P0 + HOUR)).cost
            refused = await ledger.charge(_req(0, lump * 2.2, first=True))  # over the pool, under the cap
            assert refused.outcome is Outcome.REFUSED
            for i in range(1, 4):
                later = await ledger.charge(_req(i, lump, first=False, state=b"x"))
                assert later.outcome is Outcome.REFUSED
                assert "running total" in later.reason
            assert (await ledger.status("s")).spent_units == 0
            assert await ledger.running_steps("s", "total", period_id(DAY, P0)) == {}
            plain = await ledger.charge(_req(1, lump / 10, first=True, metric="plain"))  # other metrics go on
            assert plain.outcome is Outcome.CHARGED
        finally:
            await ledger.close()

    run(body())
