"""The ε-equivalent of a spend is shown at the δ the scope's cap was converted at (a zCDP scope that
selects keys converts at δ less the selection share), by `topology.accounting.epsilon_equivalent`, in
the plan, the ledger's status (which the budget gauges serve) and every release record alike."""

from __future__ import annotations

import asyncio
import json
import math

from dpstream.topology import accounting as acc
from dpstream.topology.loader import load_topology_text
from dpstream.topology.plan import build_plan
from dpstream.topology.selection import conversion_delta
from dpstream.workers.ledger import open_ledger
from dpstream.workers.ledger.testing import ManualClock
from dpstream.workers.runtime.replay import replay_lines

DAY = 86_400
T0 = 1_796_040_000 - 1_796_040_000 % DAY
YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts}
budgets:
  web: {epsilon: 1.0, delta: 1.0e-6, period: 1d, reserve: 0.0, warn_at: 1.0}
metrics:
  pages:
    source: clicks
    budget: web
    window: {tumbling: 1d}
    aggregate: count
    group_by: page
    contribution: {max_keys: 1, max_per_key: 1}
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""


def _topology():
    return load_topology_text(YAML)


def test_the_conversion_delta_of_a_selecting_zcdp_scope_is_nine_tenths_of_its_delta() -> None:
    """The premise: partition selection takes a tenth of δ, the cap is ρ* at the other 0.9 δ."""
    topo = _topology()
    budget = topo.budgets["web"]
    conv = conversion_delta(budget, list(topo.metrics.values()))
    assert conv == acc.conversion_delta(True, 1e-6, True) == 1e-6 - 1e-6 * acc.SELECTION_DELTA_SHARE
    plan = build_plan(topo).scope("web")
    assert math.isclose(acc.epsilon_equivalent(True, plan.cap, conv).epsilon, 1.0, rel_tol=1e-9)
    assert acc.epsilon_from_rho(plan.cap, 1e-6) < 0.996  # at δ the whole cap would show as ε ≈ 0.995


def test_status_and_the_release_record_show_the_cap_s_epsilon_at_the_conversion_delta() -> None:
    """A period's one release spends the whole cap ρ*: its record's cost and the ledger's status (what
    `budget status` prints and `dpstream_budget_epsilon_spent` exports) say ε = 1 at δ = 9e-07, not
    ε ≈ 0.995 at δ = 1e-06."""
    topo = _topology()

    async def body() -> tuple[list[dict], object]:
        ledger = await open_ledger("memory", topo, clock=ManualClock(T0 + DAY + 10))
        out: list[dict] = []

        async def publish(value: bytes, key: bytes) -> None:
            out.append(json.loads(value))

        lines = [json.dumps({"user_id": f"u{i}", "ts": T0 + i, "page": "home"}).encode() for i in range(50)]
        await replay_lines(topo, lines, ledger, publish, start=T0, end=T0 + DAY)
        ledger._clock = ManualClock(T0 + 10)  # the status of the period the release was charged to
        return out, await ledger.status("web")

    records, status = asyncio.run(body())
    (record,) = records
    conv = 1e-6 - 1e-6 * acc.SELECTION_DELTA_SHARE
    expected = acc.epsilon_equivalent(True, record["cost"]["rho"], conv)
    assert record["cost"]["delta"] == conv and record["cost"]["epsilon_equiv"] == expected.epsilon
    assert math.isclose(record["cost"]["epsilon_equiv"], 1.0, rel_tol=1e-6)
    assert status.delta == conv  # type: ignore[attr-defined]
    assert math.isclose(status.epsilon_equiv, 1.0, rel_tol=1e-6)  # type: ignore[attr-defined]
