"""The demo's prediction of a release's noise at a point of its period follows the ledger's adaptive rule."""

from __future__ import annotations

import pytest

from dpstream.topology.loader import load_topology
from dpstream.topology.plan import build_plan
from dpstream.workers.demo.expected import expect
from dpstream.workers.demo.run import demo_topology_path

_ENV = {"DPSTREAM_KAFKA": "127.0.0.1:9092", "DPSTREAM_REDIS": "redis://127.0.0.1:6379/0"}
HOUR = 1_796_083_200  # 2026-12-01T00:00:00Z, a whole hour


@pytest.fixture(scope="module")
def demo():  # noqa: ANN201
    """demo.yaml and its plan."""
    topology = load_topology(demo_topology_path(), env=_ENV)
    return topology, build_plan(topology)


def test_at_the_period_start_the_prediction_is_the_plan(demo) -> None:  # noqa: ANN001
    """From the first second of a fresh period, every metric is predicted at its planned cost."""
    topology, plan = demo
    for metric in topology.metrics.values():
        e = expect(topology, plan, metric, None, HOUR, 0.0)
        assert e.ratio == pytest.approx(1.0, rel=1e-9) and e.reason() == ""


def test_an_untouched_pool_two_thirds_in_is_spent_faster(demo) -> None:  # noqa: ANN001
    """Starting 40 minutes into the hour with nothing spent: the uncapped metrics (weight 10 of 11) have a
    third of their windows left, `visitors` (weight 1, max_windows 36) all 36 windows it pays for, so
    the whole pool meets 10/3 + 1 of the 11 weights' windows: each release gets 11 / (10/3 + 1) = 33/13
    its planned cost (3x without the capped metric)."""
    topology, plan = demo
    assert sum(m.weight for m in topology.metrics.values()) == 11
    for metric in topology.metrics.values():
        e = expect(topology, plan, metric, None, HOUR + 2400, 0.0)
        assert e.ratio == pytest.approx(33 / 13, rel=1e-9), metric.name
        assert "100 % of this period's pool is left for the last 33 %" in e.reason()


def test_spend_on_plan_keeps_the_plan_and_warning_stretches(demo) -> None:  # noqa: ANN001
    """Half the uncapped metrics' part of the pool spent at half time, and none of the capped visitors' (as
    `expect` assumes: it predicts at a schedule or period start, before a capped metric paid a window),
    predicts the plan; in warning the cost falls by stretch²."""
    topology, plan = demo
    on_plan = plan.scope("demo-hourly").pool * 10 / 22  # weight 10 of 11, half its windows
    metric = topology.metrics["page_views"]
    assert expect(topology, plan, metric, None, HOUR + 1800, on_plan).ratio == pytest.approx(1.0, rel=1e-9)
    warned = expect(topology, plan, metric, None, HOUR + 1800, on_plan, warning=True)
    assert warned.ratio == pytest.approx(1 / 1.5**2, rel=1e-9) and "on_warning" in warned.reason()
