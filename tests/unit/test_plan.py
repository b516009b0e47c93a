"""Tests of topology.plan: the reference plans, the pool identity, the 30-day guarantee and the JSON shape."""

import json
import math
from pathlib import Path

import pytest

from dpstream.topology import accounting as acc
from dpstream.topology.loader import load_topology
from dpstream.topology.model import (
    Accounting,
    Aggregate,
    Budget,
    Contribution,
    Mechanism,
    Metric,
    Sinks,
    Source,
    Topology,
    Window,
)
from dpstream.topology.plan import PLAN_JSON_VERSION, build_plan, plan_to_json

EXAMPLES = Path(__file__).resolve().parents[2] / "topology" / "examples"
DAY = 86_400


def _topology(budget: Budget, *metrics: Metric, unit: str = "user_id") -> Topology:
    return Topology(
        version=1,
        sources={"s": Source("s", "t", unit)},
        budgets={budget.name: budget},
        metrics={m.name: m for m in metrics},
        sinks=Sinks("out", "dlq"),
    )


def _count(name="c", window=Window(60, 60), weight=1.0, **kw) -> Metric:
    return Metric(name, "s", "b", weight, window, Aggregate.COUNT, kw.pop("mechanism", Mechanism.GAUSSIAN), **kw)


def _reference_scope() -> Topology:
    return _topology(Budget("b", 1.0, 1e-6, Accounting.ZCDP, DAY, reserve=0.0), _count())


def test_reference_scope_cap_and_sigma():
    """(ε=1, δ=1e-6, reserve 0), one sensitivity-1 count 1,440×/day: ρ* ≈ 0.024356, σ within 0.5 % of 171.93."""
    scope = build_plan(_reference_scope()).scope("b")
    assert scope.cap == pytest.approx(0.024356, abs=5e-7)
    (metric,) = scope.metrics
    assert metric.releases_per_period == 1440
    assert metric.components[0].stddev == pytest.approx(171.93, rel=5e-3)
    assert scope.planned_epsilon == pytest.approx(1.0, rel=1e-9)


def test_planned_total_equals_pool_for_mixed_scope():
    """Σ releases × per-release cost equals cap × (1 − reserve), whatever the windows and weights."""
    budget = Budget("b", 2.0, 1e-7, Accounting.ZCDP, DAY, reserve=0.3)
    topology = _topology(
        budget,
        _count("a", Window(60, 60), 2.0),
        _count("h", Window(600, 120), 1.0),
        _count("l", Window(3600, 3600), 0.5, mechanism=Mechanism.LAPLACE),
    )
    scope = build_plan(topology).scope("b")
    assert scope.pool == pytest.approx(acc.rho_cap(2.0, 1e-7) * 0.7)
    assert scope.planned_total == pytest.approx(scope.pool, rel=1e-12)
    assert scope.releases_per_period == 1440 + 720 + 24
    assert sum(m.weight_share for m in scope.metrics) == pytest.approx(1.0)


def test_hopping_metric_shows_overlap_and_straddling_windows():
    """A 10m-every-2m window: 720 releases a day, overlap 5, 4 windows straddle each midnight."""
    budget = Budget("b", 1.0, 1e-6, Accounting.ZCDP, DAY)
    metric = build_plan(_topology(budget, _count("h", Window(600, 120)))).metric("h")
    assert (metric.releases_per_period, metric.overlap, metric.straddling_windows) == (720, 5, 4)


def test_planned_from_the_deployment_start_spreads_the_pool_over_the_windows_from_s():
    """A whole period is the static plan; from S = 06:30 the windows starting at or after S share the whole
    pool in proportion to w/N (the daily window started before S: none); no window from S: nothing planned."""
    budget = Budget("b", 1.0, 1e-6, Accounting.ZCDP, DAY, reserve=0.2)
    hourly = _count("h", Window(3600, 3600), weight=1.0)
    daily = _count("d", Window(DAY, DAY), weight=3.0)
    scope = build_plan(_topology(budget, hourly, daily)).scope("b")
    whole = scope.planned_from(0, DAY)
    assert whole == {m.name: (m.releases_per_period, m.per_release_cost) for m in scope.metrics}
    assert scope.planned_from(0, DAY, 0) == whole
    first = scope.planned_from(0, DAY, 6 * 3600 + 1800)
    assert first["h"][0] == 17 and first["d"][0] == 0
    assert math.isclose(first["h"][1], scope.pool / 17, rel_tol=1e-15)
    assert math.isclose(math.fsum(n * c for n, c in first.values()), scope.pool, rel_tol=1e-15)
    late = scope.planned_from(0, DAY, DAY - 60)
    assert {n for n, _ in late.values()} == {0}


def test_per_release_epsilon_is_cks_of_rho_in_zcdp_and_epsilon_in_pure():
    """ε-equivalent: CKS20(ρ, δ) in a zCDP scope, the cost itself in a pure one."""
    zscope = build_plan(_reference_scope()).scope("b")
    m = zscope.metrics[0]
    assert m.per_release_epsilon == pytest.approx(acc.epsilon_from_rho(m.per_release_cost, 1e-6))
    pure = _topology(
        Budget("b", 1.0, 0.0, Accounting.PURE, DAY, reserve=0.0),
        _count(window=Window(3600, 3600), mechanism=Mechanism.LAPLACE),
    )
    pm = build_plan(pure).metric("c")
    assert pm.per_release_epsilon == pm.per_release_cost == pytest.approx(1 / 24)


def test_thirty_day_guarantee_of_daily_and_hourly_periods():
    """Daily periods compose 30 times (ρ adds, converted once at δ); hourly 720 times; pure ε adds."""
    scope = build_plan(_reference_scope()).scope("b")
    h = scope.horizon
    assert h.periods == 30 and h.rho == pytest.approx(30 * scope.pool)
    assert h.epsilon == pytest.approx(acc.epsilon_from_rho(30 * scope.cap, 1e-6)) and h.delta == 1e-6
    assert h.naive_epsilon == pytest.approx(30.0) and h.naive_delta == pytest.approx(3e-5)
    assert h.epsilon < h.naive_epsilon  # zCDP composition beats 30·ε
    hourly = build_plan(_topology(Budget("b", 1.0, 1e-6, Accounting.ZCDP, 3600, reserve=0.2), _count())).scope("b")
    assert hourly.horizon.periods == 720
    assert hourly.horizon.epsilon_if_reserve_spent == pytest.approx(acc.epsilon_from_rho(720 * hourly.cap, 1e-6))
    pure = build_plan(
        _topology(Budget("b", 0.5, 0.0, Accounting.PURE, DAY, reserve=0.2), _count(mechanism=Mechanism.LAPLACE))
    ).scope("b")
    assert pure.horizon.epsilon == pytest.approx(30 * 0.4) and pure.horizon.naive_epsilon == pytest.approx(15.0)
    assert pure.horizon.rho is None and pure.horizon.delta == 0.0


def test_expected_error_and_ci_per_mechanism():
    """E|noise| is b for Laplace and σ√(2/π) for Gaussian; top-k has no numeric error."""
    budget = Budget("b", 1.0, 1e-6, Accounting.ZCDP, DAY)
    topology = _topology(
        budget,
        _count("g"),
        _count("l", mechanism=Mechanism.LAPLACE),
        Metric("t", "s", "b", 1.0, Window(3600, 3600), Aggregate.TOP_K, Mechanism.EXPONENTIAL, group_by="ref", k=3),
    )
    plan = build_plan(topology)
    (g,), (lap,), (selection, top) = (plan.metric(n).components for n in "glt")
    assert selection.mechanism is Mechanism.GAUSSIAN and selection.stddev == selection.scale
    assert g.expected_abs_error == pytest.approx(g.scale * math.sqrt(2 / math.pi))
    assert g.ci95_half_width == pytest.approx(1.959964 * g.scale, rel=1e-6)
    assert lap.expected_abs_error == lap.scale and lap.stddev == pytest.approx(math.sqrt(2) * lap.scale)
    assert top.stddev is None and top.expected_abs_error is None and top.ci95_half_width is None
    assert plan.metric("t").partition_selection and plan.metric("t").keys == "data"


def test_event_level_unit_is_labelled():
    """privacy_unit 'event' marks the metric and its scope as event-level (weaker)."""
    plan = build_plan(_topology(Budget("b", 1.0, 1e-6, Accounting.ZCDP, DAY), _count(), unit="event"))
    assert plan.metric("c").event_level and plan.scope("b").event_level
    assert not build_plan(_reference_scope()).scope("b").event_level


def test_declared_keys_need_no_partition_selection():
    """Grouped counts over declared keys are public; over data keys they need partition selection."""
    budget = Budget("b", 1.0, 1e-6, Accounting.ZCDP, DAY)
    plan = build_plan(
        _topology(budget, _count("pub", group_by="page", keys=("a", "b")), _count("dat", group_by="page"))
    )
    assert (plan.metric("pub").keys, plan.metric("pub").partition_selection) == ("declared", False)
    assert (plan.metric("dat").keys, plan.metric("dat").partition_selection) == ("data", True)


def test_scope_without_metrics_plans_nothing():
    """A budget no metric draws on has a pool but plans no spend, and its 30-day guarantee spends nothing."""
    scope = build_plan(_topology(Budget("b", 1.0, 1e-6, Accounting.ZCDP, DAY))).scope("b")
    assert scope.releases_per_period == 0 and scope.planned_total == 0.0 and scope.planned_epsilon == 0.0
    assert scope.pool > 0 and scope.horizon.rho == 0.0 and scope.horizon.epsilon == 0.0


# ---- reference topologies (through the loader) ----------------------------------------------------


def test_seed_example_reproduces_seed_000():
    """seed-example.yaml: ε 0.4/0.6/0.5/0.5, Laplace b 2.5 / 166.67 / 0.02, top-5 at ε 0.5."""
    plan = build_plan(load_topology(EXAMPLES / "seed-example.yaml"))
    scope = plan.scope("risk-features")
    assert [m.per_release_cost for m in scope.metrics] == pytest.approx([0.4, 0.6, 0.5, 0.5])
    assert [m.components[0].scale for m in scope.metrics[:3]] == pytest.approx([2.5, 166.6667, 0.02], rel=1e-5)
    top = plan.metric("q4_top5")
    assert (top.mechanism, top.k, top.per_release_epsilon) == (Mechanism.EXPONENTIAL, 5, pytest.approx(0.5))
    assert sum(c.epsilon for c in top.components) == pytest.approx(0.5)  # selection + ranking of data-derived keys
    assert scope.planned_total == pytest.approx(2.0)


def test_seed_adaptive_reproduces_seed_002():
    """seed-adaptive.yaml: reserve 0.4 of ε 2, ε 0.64/0.48/0.32/0.16, b 1.5625/2.0833/3.125/6.25."""
    scope = build_plan(load_topology(EXAMPLES / "seed-adaptive.yaml")).scope("columns")
    assert scope.reserve == pytest.approx(0.4) and scope.pool == pytest.approx(1.6)
    assert [m.per_release_cost for m in scope.metrics] == pytest.approx([0.64, 0.48, 0.32, 0.16])
    assert [m.components[0].scale for m in scope.metrics] == pytest.approx([1.5625, 2.08333, 3.125, 6.25], rel=1e-5)


def test_web_analytics_releases_and_pool():
    """web-analytics.yaml: 1440+1440+288+96+24 releases a day and planned ρ = 0.8·ρ*.

    Its top_referrers selects data-derived keys, so a tenth of δ is set aside for partition
    selection and ρ* is the CKS20 cap of (ε = 1, δ = 0.9e-6).
    """
    scope = build_plan(load_topology(EXAMPLES / "web-analytics.yaml")).scope("web-daily")
    assert [m.releases_per_period for m in scope.metrics] == [1440, 1440, 288, 96, 24]
    assert scope.planned_total == pytest.approx(0.8 * acc.rho_cap(1.0, 0.9e-6), rel=1e-12)
    assert scope.selection_delta == pytest.approx(1e-7) and scope.conversion_delta == pytest.approx(0.9e-6)
    active = scope.metrics[1]
    assert active.overlap == 5 and active.window_kind.value == "hopping"


def test_plan_json_shape_is_stable_and_serialisable():
    """plan_to_json has exactly the documented keys at every level and survives json.dumps."""
    doc = plan_to_json(build_plan(load_topology(EXAMPLES / "web-analytics.yaml")))
    json.loads(json.dumps(doc))
    assert doc["plan_version"] == PLAN_JSON_VERSION
    assert set(doc) == {"plan_version", "topology", "topology_version", "publish_delay_s", "scopes", "privacy_units"}
    (unit,) = doc["privacy_units"]
    assert set(unit) == {
        "privacy_unit",
        "sources",
        "scopes",
        "composes",
        "rho_per_day",
        "epsilon_per_day",
        "delta_per_day",
    }
    (scope,) = doc["scopes"]
    assert set(scope) == {
        "name",
        "accounting",
        "currency",
        "epsilon",
        "delta",
        "period",
        "period_s",
        "cap",
        "selection_delta",
        "conversion_delta",
        "reserve_fraction",
        "reserve",
        "pool",
        "warn_at",
        "on_warning",
        "releases_per_period",
        "planned_total",
        "planned_epsilon",
        "event_level",
        "horizon",
        "metrics",
    }
    assert set(scope["horizon"]) == {
        "days",
        "periods",
        "rho",
        "epsilon",
        "delta",
        "epsilon_if_reserve_spent",
        "naive_epsilon",
        "naive_delta",
    }
    assert (scope["currency"], scope["period"], scope["horizon"]["periods"]) == ("rho", "1d", 30)
    metric = scope["metrics"][0]
    assert set(metric) == {
        "name",
        "aggregate",
        "mechanism",
        "privacy_unit",
        "event_level",
        "create_time_arrival",
        "window",
        "straddling_windows",
        "weight",
        "weight_share",
        "releases_per_period",
        "max_windows",
        "charged_per_period",
        "per_release_cost",
        "per_release_epsilon",
        "per_period_cost",
        "may_use_reserve",
        "group_by",
        "keys",
        "declared_keys",
        "partition_selection",
        "selection_delta",
        "k",
        "components",
    }
    assert set(metric["window"]) == {"kind", "size_s", "every_s", "overlap"}
    assert set(metric["components"][0]) == {
        "component",
        "mechanism",
        "sensitivity",
        "cost",
        "epsilon",
        "scale",
        "stddev",
        "ci95_half_width",
        "expected_abs_error",
    }
    assert metric["declared_keys"] == ["home", "search", "product", "cart", "checkout"]
    assert sum(m["per_period_cost"] for m in scope["metrics"]) == pytest.approx(scope["pool"])


def test_max_windows_shrinks_sigma_by_the_square_root_of_windows_over_cap():
    """1,440 one-minute windows a day, max_windows 60: each release costs 24× more ρ, so σ is √24 ≈ 4.9× smaller,
    shown beside the uncapped σ; the unit's worst case (60 charged windows) still spends the pool."""
    budget = Budget("b", 1.0, 1e-6, Accounting.ZCDP, DAY, reserve=0.0)
    capped = _count(contribution=Contribution(max_windows=60))
    scope = build_plan(_topology(budget, capped)).scope("b")
    (metric,) = scope.metrics
    assert (metric.releases_per_period, metric.max_windows, metric.charged) == (1440, 60, 60)
    assert metric.uncapped_per_release_cost is not None and metric.uncapped_components is not None
    assert metric.per_release_cost == pytest.approx(24 * metric.uncapped_per_release_cost, rel=1e-12)
    sigma, uncapped_sigma = metric.components[0].stddev, metric.uncapped_components[0].stddev
    assert sigma is not None and uncapped_sigma is not None
    assert uncapped_sigma / sigma == pytest.approx(math.sqrt(24), rel=1e-9)
    assert round(uncapped_sigma / sigma, 1) == 4.9
    # the uncapped σ is the plain plan's, and the pool is what one unit can cost at most
    plain = build_plan(_reference_scope()).scope("b").metrics[0]
    assert uncapped_sigma == pytest.approx(plain.components[0].stddev, rel=1e-12)
    assert scope.planned_total == pytest.approx(scope.pool, rel=1e-12)
    doc = plan_to_json(build_plan(_topology(budget, capped)))["scopes"][0]["metrics"][0]
    assert (doc["max_windows"], doc["charged_per_period"]) == (60, 60)
    assert doc["uncapped"]["components"][0]["stddev"] == pytest.approx(uncapped_sigma)


def test_max_windows_in_a_mixed_scope_prices_by_the_one_rule():
    """A capped metric beside an uncapped one: each gets its weight share of the pool over its charged windows."""
    budget = Budget("b", 1.0, 1e-6, Accounting.ZCDP, DAY, reserve=0.2)
    topology = _topology(budget, _count("a", contribution=Contribution(max_windows=10)), _count("b", weight=3.0))
    scope = build_plan(topology).scope("b")
    a, b = scope.metrics
    assert a.per_release_cost == pytest.approx(scope.pool * 0.25 / 10, rel=1e-12)
    assert b.per_release_cost == pytest.approx(scope.pool * 0.75 / 1440, rel=1e-12)
    assert b.uncapped_components is None and b.max_windows is None
    assert scope.planned_total == pytest.approx(scope.pool, rel=1e-12)
    # from a start S in the period: the windows from S, at most the cap, share the pool by the same rule
    first = scope.planned_from(0, DAY, DAY - 600)
    assert first["a"][0] == 10 and first["b"][0] == 10
    assert first["a"][1] == pytest.approx(scope.pool * 0.25 / 10 * (0.25 + 0.75) / (0.25 + 0.75 * 10 / 1440))


def test_rendered_plan_shows_sigma_with_and_without_the_cap_side_by_side():
    """The text plan gains a 'σ no cap' column beside σ (only when a metric of the scope has max_windows)."""
    from dpstream.topology.plan_render import render_plan

    budget = Budget("b", 1.0, 1e-6, Accounting.ZCDP, DAY, reserve=0.0)
    text = render_plan(build_plan(_topology(budget, _count(contribution=Contribution(max_windows=60)))))
    header = next(line for line in text.splitlines() if line.strip().startswith("metric"))
    row = next(line for line in text.splitlines() if line.strip().startswith("c "))
    assert " σ  σ no cap " in header
    assert "1440 (cap 60)" in row and "35.1" in row and "171.9" in row  # σ ≈ 171.93/√24 beside 171.93
    assert "σ no cap" not in render_plan(build_plan(_reference_scope()))
