"""The demo's topology: its plan buys 95 % CIs within 10 % of what its own synthetic feed typically shows, its
windows close inside a short demo, and each run gets fresh topics and a public start without changing the plan."""

from __future__ import annotations

import re

import pytest

from dpstream.topology.dumper import dump_topology
from dpstream.topology.loader import load_topology, load_topology_text
from dpstream.topology.plan import build_plan
from dpstream.workers.demo.run import demo_topology_path, for_run, schedule_start
from dpstream.workers.demo.sizing import DemoPopulation, first_useful_step, planned_ci, relative_ci, typical_values

_ENV = {"DPSTREAM_KAFKA": "127.0.0.1:9092", "DPSTREAM_REDIS": "redis://127.0.0.1:6379/0"}


@pytest.fixture(scope="module")
def demo():  # noqa: ANN201
    """demo.yaml, its plan, and the typical true values of the demo's default population (simulated once)."""
    topology = load_topology(demo_topology_path(), env=_ENV)
    return topology, build_plan(topology), typical_values(topology, DemoPopulation())


def test_every_metric_ci_is_within_ten_percent_of_its_typical_value(demo) -> None:  # noqa: ANN001
    """Planned 95 % CI half-width ≤ 10 % of the metric's typical true value per window (smallest key of a
    grouped metric), the typical values coming from the generator's own population and rate."""
    topology, plan, typical = demo
    assert set(typical) == set(topology.metrics)
    for name, metric in topology.metrics.items():
        ci = planned_ci(metric, plan.metric(name), typical[name])
        assert ci is not None and typical[name].value > 0, name
        assert ci <= 0.10 * typical[name].value, f"{name}: CI ±{ci:,.1f} vs typical {typical[name].value:,.1f}"


def test_typical_values_follow_the_population(demo) -> None:  # noqa: ANN001
    """Half the rate gives about half the counts per window: the figures are derived, not written down."""
    topology, _plan, typical = demo
    half = typical_values(topology, DemoPopulation(rate=1000.0), seconds=20)
    for name in ("page_views", "basket_value"):
        assert 0.4 < half[name].value / typical[name].value < 0.6, name


def test_the_header_comment_states_the_plan_and_typical_values(demo) -> None:  # noqa: ANN001
    """demo.yaml's table of σ, CI and typical values matches `dpstream plan` and the simulated feed."""
    topology, plan, typical = demo
    text = demo_topology_path().read_text(encoding="utf-8")

    def figures(cell: str) -> list[float]:
        return [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*\.?\d*", cell)]

    rows = {}
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.lstrip("#").strip())
        if len(cells) == 7 and cells[0] in topology.metrics:
            rows[cells[0]] = cells
    assert set(rows) == set(topology.metrics)
    for name, (_, _window, rho, sigma, ci_text, typical_text, _rel) in rows.items():
        mp = plan.metric(name)
        assert float(rho) == pytest.approx(mp.per_release_cost, rel=5e-3), name
        # a quantile's parts share one scale (in ranks) and have no σ: its cell states that scale once; a running
        # total's states each step's σ and the std of its last step's total
        spread = [c.stddev for c in mp.components] if mp.quantiles is None else sorted({c.scale for c in mp.components})
        if mp.running_total_steps is not None:
            spread = [mp.components[0].scale, mp.running_total_max_stddev]
        assert figures(sigma) == pytest.approx(spread, rel=1e-3), name
        ci = planned_ci(topology.metrics[name], mp, typical[name])
        assert figures(ci_text)[0] == pytest.approx(ci, rel=1e-2), name
        assert figures(typical_text)[0] == pytest.approx(typical[name].value, rel=0.03), name


def test_the_running_total_prose_states_its_ci_by_step(demo) -> None:  # noqa: ANN001
    """basket_so_far's paragraph: its lump, its CI at step 1, from the first step within 10 % (5) and at the
    last (360), each the plan's 1.96·σ·‖c_<t‖₂ against the typical total t × the typical 10 s sum."""
    topology, plan, typical = demo
    metric, mp, t = topology.metrics["basket_so_far"], plan.metric("basket_so_far"), typical["basket_so_far"]
    assert metric.running_total and mp.running_total_steps == t.steps == 360
    assert first_useful_step(metric, mp, t) == 5
    text = " ".join(line.lstrip("#").strip() for line in demo_topology_path().read_text(encoding="utf-8").splitlines())
    paragraph = text[text.index("basket_so_far (`release: running_total`)") :]
    assert f"ρ {mp.per_release_cost:.3g}" in paragraph
    for step in (1, 360):
        ci = planned_ci(metric, mp, t, step)
        assert ci is not None and f"±{ci:,.0f} at step {step}" in paragraph, step
    rel1 = relative_ci(metric, mp, t, 1)
    assert rel1 is not None and f"at step 1 ({100 * rel1:.0f} %)" in paragraph
    assert "≤ 10 % from step 5" in paragraph
    assert f"max_per_period: {metric.contribution.max_per_period}" in paragraph


def test_windows_close_within_a_short_demo() -> None:
    """Every window closes at most 22 s after the schedule starts (a 40 s demo shows every metric)."""
    topology = load_topology(demo_topology_path(), env=_ENV)
    for metric in topology.metrics.values():
        lateness = topology.sources[metric.source].allowed_lateness_s
        assert metric.window.size_s + lateness <= 22, metric.name


def test_a_run_gets_fresh_topics_and_a_public_start_and_the_same_plan() -> None:
    """for_run suffixes every topic and sets start:, the file the worker reads round-trips, and every release
    is priced as the shipped file prices it; two runs share no topic."""
    shipped = load_topology(demo_topology_path(), env=_ENV)
    one = load_topology_text(dump_topology(for_run(shipped, "demo1", 1_796_083_200)), env=_ENV)
    two = for_run(shipped, "demo2", 1_796_083_210)
    assert one.schedule_start == 1_796_083_200

    def topics(t):  # noqa: ANN001, ANN202
        return {s.topic for s in t.sources.values()} | {t.sinks.releases, t.sinks.dead_letter, t.sinks.partials_topic}

    assert not topics(one) & topics(two) and not topics(one) & topics(shipped)
    plan, run_plan = build_plan(shipped), build_plan(one)
    for name in shipped.metrics:
        assert run_plan.metric(name).per_release_cost == plan.metric(name).per_release_cost


def test_schedule_start_is_on_every_window_grid_and_after_now() -> None:
    """The run's start S lies after now + margin, on a boundary of every metric's grid."""
    topology = load_topology(demo_topology_path(), env=_ENV)
    for now in (1_796_083_200.0, 1_796_083_203.5, 1_796_083_209.2):
        start = schedule_start(now, topology)
        assert now + 1 <= start < now + 1 + 10
        assert all(start % m.window.every_s == 0 for m in topology.metrics.values())
