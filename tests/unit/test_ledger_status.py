"""`budget status --json` shows the period's selection δ: spent and cap, as floats."""

from __future__ import annotations

import asyncio

import pytest

from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import load_topology_text
from dpstream.topology.periods import period_id
from dpstream.workers.ledger import Outcome, ReleaseRequest, open_ledger
from dpstream.workers.ledger.reporting import status_json
from dpstream.workers.ledger.testing import ManualClock

_YAML = """
version: 1
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
metrics:
  pages:
    source: s
    budget: b
    weight: 1
    window: {tumbling: 1h}
    aggregate: count
    group_by: page
    contribution: {max_keys: 1, max_per_key: 1}
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""
DAY = 86_400
P0 = (1_796_000_000 // DAY) * DAY


def test_status_json_reports_selection_delta_spent_and_cap() -> None:
    """One release with selection δ 2e-9: delta_spent ≈ 2e-9 of delta_cap ≈ 1e-7 (a tenth of the scope's δ)."""

    async def body() -> dict:
        ledger = await open_ledger("memory", load_topology_text(_YAML), clock=ManualClock(P0 + 7200))
        r = await ledger.charge(
            ReleaseRequest("a", "b", period_id(DAY, P0), "pages", P0, P0 + 3600, 1e-4, b"{}", delta=2e-9)
        )
        assert r.outcome is Outcome.CHARGED
        return status_json(await ledger.status("b"))

    out = asyncio.run(body())
    assert abs(out["delta_spent"] - 2e-9) <= 2e-18 and abs(out["delta_cap"] - 1e-7) <= 2e-18  # to a unit or two
    assert isinstance(out["delta_spent"], float) and isinstance(out["delta_cap"], float)


def test_pool_left_and_reserve_left_add_up_to_what_the_cap_has_left_after_grants() -> None:
    """Two operator grants and a release: pool left + reserve left = cap − spent, and the reserve left
    is the reserve less the grants (a grant moves reserve into the pool, it is not counted twice)."""
    yaml = _YAML.replace("period: 1d}", "period: 1d, reserve: 0.2}")

    async def body() -> list:
        ledger = await open_ledger("memory", load_topology_text(yaml), clock=ManualClock(P0 + 7200))
        seen = [await ledger.status("b")]
        await ledger.grant_reserve("b", 0.001, "incident 1", "ops")
        seen.append(await ledger.status("b"))
        r = await ledger.charge(ReleaseRequest("a", "b", period_id(DAY, P0), "pages", P0, P0 + 3600, 1e-4, b"{}"))
        assert r.outcome is Outcome.CHARGED
        await ledger.grant_reserve("b", 0.002, "incident 2", "ops")
        seen.append(await ledger.status("b"))
        with pytest.raises(ConfigError, match="left to grant"):  # a few units more than status says is left
            await ledger.grant_reserve("b", seen[-1].reserve_left + 5e-12, "too much", "ops")
        await ledger.grant_reserve("b", seen[-1].reserve_left, "the rest", "ops")  # exactly what is left
        seen.append(await ledger.status("b"))
        return seen

    before, granted, both, rest = asyncio.run(body())
    assert rest.reserve_left <= 1e-12 and abs(rest.pool_left - (rest.cap - rest.spent)) <= 2e-12
    reserve = before.reserve_left
    assert abs(before.pool_left + before.reserve_left - before.cap) <= 2e-12 and reserve > 0.003
    for status, grants in ((granted, 0.001), (both, 0.003)):
        assert abs(status.pool_left + status.reserve_left - (status.cap - status.spent)) <= 2e-12, status
        assert abs(status.reserve_left - (reserve - grants)) <= 2e-12, status
