"""The budget gauges count a charge only once its release's public time P(w) has passed."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from dpstream.topology.loader import load_topology_text
from dpstream.workers.ledger import open_ledger
from dpstream.workers.ledger.testing import ManualClock
from dpstream.workers.release import Releaser
from dpstream.workers.telemetry.budget import BudgetCollector, BudgetReader, LedgerSource

_YAML = """
version: 1
publish_delay: 30s
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts, allowed_lateness: 5s}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, period: 1d, warn_at: 0.02}
metrics:
  views:
    source: s
    budget: b
    window: {tumbling: 1h}
    aggregate: count
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""

_T0 = 1_796_000_400 - 1_796_000_400 % 86_400  # a day boundary
_END = _T0 + 3600
_P = _END + 5 + 30  # P(w) of the window [T0, T0 + 1h)


def test_a_charge_shows_in_the_budget_gauges_only_from_its_public_time():
    """Charged at C(w) + 1 s: spent, ratio, ε, state and spent_total stay at 0 / normal until P(w);
    from P(w) on they show the charge (the ledger itself counts it at once)."""
    topo = load_topology_text(_YAML)
    clock = ManualClock(_END + 5 + 1)

    async def go() -> list[dict[tuple[str, str], float]]:
        ledger = await open_ledger("memory", topo, clock=clock)
        ledger.use_schedule_start(_T0)

        async def publish(value: bytes, key: bytes) -> None:
            return None

        await Releaser(topo, ledger).release("views", (_T0, _END), {"": 4}, publish)
        collector = BudgetCollector(LedgerSource("memory", shared=lambda: ledger), BudgetReader(topo, clock=clock))
        registry = CollectorRegistry()
        registry.register(collector)
        seen = []
        for at in (_END + 5 + 1, _P - 1, _P, _P + 600):
            clock.now = at
            assert await collector.refresh()
            seen.append(
                {
                    (name, state): registry.get_sample_value(name, {"scope": "b", **labels}) or 0.0
                    for name, labels, state in (
                        ("dpstream_budget_spent", {"currency": "rho"}, ""),
                        ("dpstream_budget_spent_ratio", {}, ""),
                        ("dpstream_budget_epsilon_spent", {}, ""),
                        ("dpstream_budget_spent_total", {"currency": "rho"}, ""),
                        ("dpstream_budget_state", {"state": "warning"}, "warning"),
                    )
                }
            )
        status = await ledger.status("b")
        return seen + [{("ledger", ""): status.spent}]

    before_c1, before_p, at_p, later, ledger = asyncio.run(go())
    charged = ledger[("ledger", "")]
    assert charged > 0
    assert set(before_c1.values()) == {0.0} and set(before_p.values()) == {0.0}
    assert at_p == later
    assert at_p[("dpstream_budget_spent", "")] == charged
    assert at_p[("dpstream_budget_spent_total", "")] == charged
    assert at_p[("dpstream_budget_spent_ratio", "")] > 0.02 and at_p[("dpstream_budget_epsilon_spent", "")] > 0
    assert at_p[("dpstream_budget_state", "warning")] == 1.0
