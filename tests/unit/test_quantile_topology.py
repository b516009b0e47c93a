"""Quantile metrics in the topology: the loader's fields and messages, the pricing of each level."""

from __future__ import annotations

import math

import pytest

from dpstream.topology.calibration import calibrate, quantile_cost, quantile_rank_error, quantile_scale
from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import Accounting, Aggregate, Mechanism
from dpstream.topology.plan import build_plan, plan_to_json
from dpstream.topology.plan_render import render_plan
from dpstream.topology.validation import TopologyError

_HEAD = """\
version: 1
sources:
  s: {topic: t, privacy_unit: u}
  ev: {topic: t2, privacy_unit: event}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, period: 1h}
  pure: {epsilon: 1.0, accounting: pure, period: 1h}
sinks: {releases: r, dead_letter: d}
metrics:
  lat:
    source: s
    budget: b
    window: {tumbling: 1m}
    aggregate: quantile
    value: ms
    bounds: [0, 1000]
    mechanism: exponential
"""


def _load(extra: str):
    return load_topology_text(_HEAD + extra)


def _error(extra: str) -> str:
    with pytest.raises(TopologyError) as info:
        _load(extra)
    return str(info.value)


def test_bins_make_an_even_grid_over_the_bounds_and_levels_are_sorted() -> None:
    m = _load("    bins: 4\n    quantiles: [0.9, 0.5]\n").metrics["lat"]
    assert m.aggregate is Aggregate.QUANTILE and m.mechanism is Mechanism.EXPONENTIAL
    assert m.candidates == (0.0, 250.0, 500.0, 750.0, 1000.0)
    assert m.quantiles == (0.5, 0.9) and m.quantile_labels == ("p50", "p90")


def test_listed_candidates_are_kept() -> None:
    m = _load("    candidates: [0, 10, 100, 1000]\n    quantiles: [0.99]\n").metrics["lat"]
    assert m.candidates == (0.0, 10.0, 100.0, 1000.0) and m.quantile_labels == ("p99",)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("    bins: 10\n", "missing field 'quantiles'"),
        ("    quantiles: [0.5]\n", "missing field 'bins'; aggregate quantile needs a public candidate grid"),
        ("    bins: 10\n    candidates: [0, 1]\n    quantiles: [0.5]\n", "give either bins"),
        ("    bins: 10\n    quantiles: [0.5, 1.0]\n", "must be strictly between 0 and 1"),
        ("    bins: 10\n    quantiles: [0.5, 0.5]\n", "duplicate level"),
        ("    candidates: [0, 5, 5]\n    quantiles: [0.5]\n", "list them ascending"),
        ("    candidates: [0, 5000]\n    quantiles: [0.5]\n", "must lie inside bounds [0, 1000]"),
        ("    bins: 10\n    quantiles: [0.5]\n    group_by: page\n", "released ungrouped"),
    ],
)
def test_quantile_mistakes_name_their_line_field_and_fix(extra: str, message: str) -> None:
    text = _error(extra)
    assert message in text
    assert len(text.splitlines()) == 1 and ":" in text.split(" ")[0]


def test_a_quantile_needs_the_exponential_mechanism() -> None:
    swapped = _HEAD.replace("mechanism: exponential", "mechanism: gaussian")
    with pytest.raises(TopologyError, match="use mechanism: exponential"):
        load_topology_text(swapped + "    bins: 10\n    quantiles: [0.5]\n")
    event_level = _HEAD.replace("source: s\n", "source: ev\n") + "    bins: 10\n    quantiles: [0.5]\n"
    assert load_topology_text(event_level).metrics["lat"].source == "ev"  # event-level: each event its own unit


def test_other_aggregates_refuse_the_quantile_fields() -> None:
    text = _HEAD.replace("aggregate: quantile", "aggregate: sum").replace("exponential", "gaussian")
    with pytest.raises(TopologyError, match="only a quantile metric uses bins"):
        load_topology_text(text + "    bins: 10\n")


@pytest.mark.parametrize("accounting", list(Accounting))
def test_levels_share_one_scale_and_their_costs_add_up_to_the_release(accounting: Accounting) -> None:
    m = _load("    bins: 100\n    quantiles: [0.5, 0.9, 0.99]\n    contribution: {max_per_key: 3}\n").metrics["lat"]
    parts = calibrate(m, accounting, 0.02)
    assert [p.component for p in parts] == ["p50", "p90", "p99"]
    assert len({p.scale for p in parts}) == 1
    assert math.fsum(p.cost for p in parts) == pytest.approx(0.02, rel=1e-12)
    scale = parts[0].scale
    for p, alpha in zip(parts, m.quantiles or (), strict=True):
        eps = 2 * max(alpha, 1 - alpha) * 3 / scale
        assert p.cost == pytest.approx(eps if accounting is Accounting.PURE else eps**2 / 8, rel=1e-12)
        assert p.epsilon == pytest.approx(eps, rel=1e-12)


def test_p99_costs_3_92_times_p50_in_rho_at_one_scale() -> None:
    ratio = quantile_cost(0.99, 1, 10.0, Accounting.ZCDP) / quantile_cost(0.5, 1, 10.0, Accounting.ZCDP)
    assert ratio == pytest.approx((0.99 / 0.5) ** 2) and round(ratio, 2) == 3.92
    assert quantile_cost(0.99, 1, 10.0, Accounting.PURE) / quantile_cost(0.5, 1, 10.0, Accounting.PURE) == 1.98


def test_the_scale_spends_exactly_the_cost() -> None:
    for accounting in Accounting:
        scale = quantile_scale((0.25, 0.75), 2, accounting, 0.1)
        assert quantile_cost(0.25, 2, scale, accounting) * 2 == pytest.approx(0.1, rel=1e-12)


def test_the_rank_error_depends_on_the_scale_and_grid_size_only() -> None:
    assert quantile_rank_error(10.0, 101) == pytest.approx(10.0 * math.log(100 / 0.05))
    assert quantile_rank_error(10.0, 1) == 0.0


def test_the_plan_shows_each_level_with_its_cost_and_rank_error() -> None:
    topology = _load("    bins: 100\n    quantiles: [0.5, 0.99]\n")
    plan = build_plan(topology)
    doc = plan_to_json(plan)
    (metric,) = [m for s in doc["scopes"] for m in s["metrics"]]
    assert metric["quantiles"] == [0.5, 0.99] and metric["candidates"] == 101
    p50, p99 = metric["components"]
    assert p99["cost"] / p50["cost"] == pytest.approx(3.9204)
    assert p50["cost"] + p99["cost"] == pytest.approx(metric["per_release_cost"])
    assert p50["rank_error95"] == pytest.approx(quantile_rank_error(p50["scale"], 101))
    text = render_plan(plan)
    assert "p50 ρ" in text and "p99 ρ" in text and "rank " in text
