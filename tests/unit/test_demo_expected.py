"""The demo's prediction of a release's noise at a point of its period follows the ledger's adaptive rule."""

from __future__ import annotations

import pytest

from dpstream.topology.calibration import Z95
from dpstream.topology.loader import load_topology
from dpstream.topology.plan import build_plan
from dpstream.topology.running_total import total_stddev
from dpstream.workers.demo.expected import expect
from dpstream.workers.demo.run import demo_topology_path
from dpstream.workers.demo.sizing import Typical

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
    """Starting 40 minutes into the hour with nothing spent: the uncapped metrics (weight 10 of 14) have a
    third of their windows left, `visitors` (weight 1, max_windows 36) all 36 windows it pays for and the
    running total `basket_so_far` (weight 3) its one lump, so the whole pool meets 10/3 + 1 + 3 of the 14
    weights' windows: each release (and the lump) gets 14 / (10/3 + 4) = 21/11 its planned cost (3x without
    the capped metrics)."""
    topology, plan = demo
    assert sum(m.weight for m in topology.metrics.values()) == 14
    for metric in topology.metrics.values():
        e = expect(topology, plan, metric, None, HOUR + 2400, 0.0)
        assert e.ratio == pytest.approx(21 / 11, rel=1e-9), metric.name
        assert "100 % of this period's pool is left for the last 33 %" in e.reason()


def test_spend_on_plan_keeps_the_plan_and_warning_stretches(demo) -> None:  # noqa: ANN001
    """Half the uncapped metrics' part of the pool spent at half time, and none of the capped visitors' or the
    running total's lump (as `expect` assumes: it predicts at a schedule or period start, before a capped
    metric paid a window), predicts the plan; in warning the cost falls by stretch²."""
    topology, plan = demo
    on_plan = plan.scope("demo-hourly").pool * 10 / 28  # weight 10 of 14, half its windows
    for name in ("page_views", "basket_so_far"):
        metric = topology.metrics[name]
        assert expect(topology, plan, metric, None, HOUR + 1800, on_plan).ratio == pytest.approx(1.0, rel=1e-9)
    metric = topology.metrics["page_views"]
    warned = expect(topology, plan, metric, None, HOUR + 1800, on_plan, warning=True)
    assert warned.ratio == pytest.approx(1 / 1.5**2, rel=1e-9) and "on_warning" in warned.reason()


def test_a_running_total_is_predicted_per_period_with_the_ci_of_its_steps(demo) -> None:  # noqa: ANN001
    """`basket_so_far` is priced as one lump and calibrated per period (`calibrate` refuses it): from the hour's
    start its prediction is the plan's, at its last step (360); from 40 minutes in it has 120 steps left, its
    lump is 21/11 the plan's, so σ is √(11/21) of the plan's and its CIs are 1.96·σ·‖c_<t‖₂ at step 1 and 120."""
    topology, plan = demo
    metric, mp = topology.metrics["basket_so_far"], plan.metric("basket_so_far")
    typical = Typical(1e6 * 360, steps=360, per_step=1e6)
    e = expect(topology, plan, metric, typical, HOUR, 0.0)
    sigma = mp.components[0].scale
    assert e.steps == 360 and e.expected_ci == pytest.approx(e.planned_ci, rel=1e-9)
    assert e.planned_ci == pytest.approx(Z95 * (mp.running_total_max_stddev or 0), rel=1e-9)
    assert e.first_step_ci == pytest.approx(Z95 * sigma, rel=1e-9)
    late = expect(topology, plan, metric, typical, HOUR + 2400, 0.0)
    late_sigma = sigma * (11 / 21) ** 0.5
    assert late.steps == 120 and late.ratio == pytest.approx(21 / 11, rel=1e-9)
    assert late.first_step_ci == pytest.approx(Z95 * late_sigma, rel=1e-6)
    assert late.expected_ci == pytest.approx(Z95 * total_stddev(120, late_sigma), rel=1e-6)
