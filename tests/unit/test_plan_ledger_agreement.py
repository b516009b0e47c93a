"""The plan, the ledger and the releaser read the same cap and the same selection δ."""

from pathlib import Path

import pytest

from dpstream.topology.loader import load_topology
from dpstream.topology.plan import build_plan
from dpstream.topology.selection import selection_delta_per_release
from dpstream.workers.ledger.config import ScopeConfig
from dpstream.workers.ledger.units import units_to_float

EXAMPLES = Path(__file__).resolve().parents[2] / "topology" / "examples"


@pytest.mark.parametrize("name", ["web-analytics.yaml", "seed-example.yaml", "seed-adaptive.yaml"])
def test_ledger_cap_equals_plan_cap(name):
    """The ledger enforces exactly the cap the plan divides (to the ledger's 1e-12 units)."""
    topology = load_topology(EXAMPLES / name)
    plan = build_plan(topology)
    for budget in topology.budgets.values():
        config = ScopeConfig.from_budget(budget, topology.metrics_of(budget.name))
        assert units_to_float(config.cap_units) == pytest.approx(plan.scope(budget.name).cap, abs=1e-12)


def test_selection_delta_of_every_release_adds_up_to_the_set_aside():
    """Per period, the selections' δ (straddling windows counted in both periods) sum to the scope's selection δ."""
    topology = load_topology(EXAMPLES / "web-analytics.yaml")
    scope = build_plan(topology).scope("web-daily")
    budget = topology.budgets["web-daily"]
    metrics = list(topology.metrics.values())
    total = 0.0
    for metric in metrics:
        per_release = selection_delta_per_release(metric, budget, metrics)
        assert per_release == pytest.approx(
            scope.metrics[[m.name for m in scope.metrics].index(metric.name)].selection_delta
        )
        total += per_release * (metric.window.releases_per_period(budget.period_s) + metric.window.overlap - 1)
    assert total == pytest.approx(scope.selection_delta) and total > 0
    assert scope.conversion_delta + scope.selection_delta == pytest.approx(budget.delta)
