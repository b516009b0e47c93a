"""`budget status --json` shows the period's selection δ: spent and cap, as floats."""

from __future__ import annotations

import asyncio

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
        assert r.outcome is Outcome.GRANTED
        return status_json(await ledger.status("b"))

    out = asyncio.run(body())
    assert abs(out["delta_spent"] - 2e-9) <= 2e-18 and abs(out["delta_cap"] - 1e-7) <= 2e-18  # to a unit or two
    assert isinstance(out["delta_spent"], float) and isinstance(out["delta_cap"], float)
