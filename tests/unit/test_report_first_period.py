"""The report card of a deployment's first period, which starts at the schedule start S inside the
period: no window before S is scheduled (so none is "skipped"), a window after S that was never released
still is, and the planned figures count from S as the ledger's split and the plan gauges do."""

from __future__ import annotations

import asyncio
import math
import re
from typing import Any

import pytest

from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import Topology
from dpstream.topology.periods import period_id
from dpstream.topology.plan import build_plan
from dpstream.workers.ledger import Ledger, open_ledger
from dpstream.workers.ledger.testing import ManualClock
from dpstream.workers.report.advice import CHANGE_TOLERANCE
from dpstream.workers.report.build import build_report
from dpstream.workers.report.collect import collect_period, schedule_start_read
from dpstream.workers.runtime.replay import replay_lines
from dpstream.workers.telemetry.budget import planned_spent

HOUR = 3_600
P0 = (1_796_000_000 // HOUR) * HOUR  # an hour boundary: the period start
S = P0 + 400  # the deployment starts at :06:40, inside the period

_YAML = """
version: 1
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts, allowed_lateness: 30s}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1h, reserve: 0.2, warn_at: 0.8}
metrics:
  minute: {source: s, budget: b, weight: 1, window: {tumbling: 1m}, aggregate: count, mechanism: gaussian}
  sliding: {source: s, budget: b, weight: 2, window: {hopping: 2m, every: 1m}, aggregate: count, mechanism: gaussian}
  ten: {source: s, budget: b, weight: 3, window: {tumbling: 10m}, aggregate: count, mechanism: gaussian}
sinks: {releases: r, dead_letter: d}
"""


async def _publish(value: bytes, key: bytes) -> None:
    return None


async def _report(spans: list[tuple[int, int]], start: int = S) -> tuple[dict[str, Any], Topology]:
    """Release every window of the schedule from `start` (S) over `spans` (no events: empty windows are
    released too) through the Releaser and the in-process ledger, then build the report of the first period."""
    topo = load_topology_text(_YAML)
    ledger = await open_ledger("memory", topo, clock=ManualClock(start), schedule_start=start)
    for lo, hi in spans:
        await replay_lines(topo, [], ledger, _publish, start=lo, end=hi)
    data = await collect_period(ledger, topo, "b", period_id(HOUR, P0))
    assert data.period_start == P0 and data.schedule_start == start
    return build_report(data), topo


def _rows(rep: dict[str, Any], section: str) -> dict[str, dict[str, Any]]:
    return {r["metric"]: r for r in rep[section]}


def test_a_first_period_released_in_full_skips_nothing() -> None:
    """Every window from S released: each metric's scheduled windows (from the first grid window at or
    after S) are all charged, so 0 skipped; the windows from :00 to S are not counted as scheduled."""
    rep, topo = asyncio.run(_report([(S, P0 + HOUR + 120)]))
    fair = _rows(rep, "fairness")
    for name, m in topo.metrics.items():
        row = fair[name]
        first = math.ceil(S / m.window.every_s) * m.window.every_s
        in_period = [w for w in range(first, P0 + HOUR, m.window.every_s) if w + m.window.size_s <= P0 + HOUR]
        assert row["scheduled_by_horizon"] == len(in_period) > 0, name
        assert row["skipped"] == 0 and row["refused"] == 0, name
    assert rep["period"]["schedule_start_epoch"] == S


def test_a_window_missing_after_the_deployment_start_is_skipped() -> None:
    """Windows of [:20, :25) never released (the replay stops at :20 and resumes at :25): the tumbling
    minute metric counts exactly those five as skipped, and nothing before S."""
    rep, _ = asyncio.run(_report([(S, P0 + 1200), (P0 + 1500, P0 + HOUR)]))
    fair = _rows(rep, "fairness")
    assert fair["minute"]["skipped"] == (1500 - 1200) // 60
    assert fair["sliding"]["skipped"] >= 1  # its windows starting in [:19, :25) were not released either


def test_a_window_missing_at_the_first_period_end_is_not_hidden_by_a_straddling_charge() -> None:
    """Windows of [:29, :31) never released (the replay stops at :30 and resumes at :31) and the schedule
    then released past the period's end: the sliding window straddling out of the period is charged to it,
    but S left no window straddling in for it to stand for, so both missing sliding windows count."""
    rep, topo = asyncio.run(_report([(S, P0 + 1800), (P0 + 1860, P0 + HOUR + 120)]))
    fair = _rows(rep, "fairness")
    w = topo.metrics["sliding"].window
    missing = [s for s in range(P0, P0 + HOUR, w.every_s) if s >= S and s + w.size_s > P0 + 1800 and s < P0 + 1860]
    assert fair["minute"]["skipped"] == 1 and fair["sliding"]["skipped"] == len(missing) == 2


def test_planned_figures_count_from_the_deployment_start() -> None:
    """The utility's planned releases are the windows from S; planned releases × planned cost sum to the
    pool, as the plan gauges reach it at the period's end; the ledger's allowances match the planned cost."""
    rep, topo = asyncio.run(_report([(S, P0 + HOUR + 120)]))
    scope_plan = build_plan(topo).scopes[0]
    util = _rows(rep, "utility")
    for name, m in topo.metrics.items():
        first = math.ceil(S / m.window.every_s) * m.window.every_s
        assert util[name]["planned_releases"] == len(range(first, P0 + HOUR, m.window.every_s)), name
        realised, planned = util[name]["realised_cost_mean"], util[name]["planned_cost"]
        assert abs(realised - planned) <= 1e-3 * planned, name  # on plan: allowances floored to the unit
    total = math.fsum(u["planned_releases"] * u["planned_cost"] for u in util.values())
    gauge = planned_spent(scope_plan, P0, P0 + HOUR, P0 + 2 * HOUR, S)
    assert math.isclose(total, scope_plan.pool, rel_tol=1e-12) and math.isclose(gauge, total, rel_tol=1e-12)


def test_the_report_reads_the_deployment_start_from_the_topology_or_the_ledger() -> None:
    """S is the topology's start:, else the ledger's own (the recorded one: tests/integration/
    test_report_schedule_start.py); with neither the in-process ledger gives None."""

    async def run() -> tuple[int | None, ...]:
        topo = load_topology_text(_YAML)
        declared = load_topology_text(_YAML.replace("version: 1", "version: 1\nstart: 2026-12-01T00:00:00Z"))
        bare: Ledger = await open_ledger("memory", topo, clock=ManualClock(S))
        own: Ledger = await open_ledger("memory", topo, clock=ManualClock(S), schedule_start=S)
        return (
            await schedule_start_read(bare, topo),
            await schedule_start_read(own, topo),
            await schedule_start_read(own, declared),
        )

    none, own, declared = asyncio.run(run())
    assert none is None and own == S and declared == 1_796_083_200  # 2026-12-01T00:00:00Z


def test_first_period_advice_compares_plan_with_plan_over_the_span_from_the_deployment_start() -> None:
    """On-plan charges of a first period starting at :41:40 (every window from S released): the realised E
    equals the plan's E priced over the windows from S, as the ledger priced them (a third of the period's
    windows share the whole pool); only a whole next period is set against a whole period's plan, and the
    verdict judges the advised weights there, where they are optimal. (Over the partial span they are not:
    with the noisy magnitudes of empty windows they came out up to 1.1 % worse there in 2 of 100 runs, and
    the verdict, when taken over the span, said "worse" in 1.)"""
    late = P0 + 2_500
    rep, _ = asyncio.run(_report([(late, P0 + HOUR + 120)], start=late))
    adv = rep["advice"]
    j = adv["weighted_relative_error"]
    assert math.isclose(j["this_period"], j["this_plan"], rel_tol=2e-3)
    nxt = j["next_period"]
    assert j["predicted_change"] == nxt["advised"] / nxt["this_plan"] <= 1.0 + 1e-6  # weights rounded to 4 digits
    assert j["predicted_change_over"] == "a whole next period, advised vs current weights"
    assert j["verdict"] != "worse"
    assert adv["span"] == {"from_epoch": late, "first_period": True, "note": adv["span"]["note"]}
    for row in adv["metrics"]:
        realised, planned = row["expected_abs_error_this_period"], row["expected_abs_error_planned"]
        assert math.isclose(realised, planned, rel_tol=2e-3), row["metric"]  # allowances floored to the unit
    # set against a whole period's plan (the report's old comparison), this boosted part would look better
    # than any plan: the advice "worse" for want of the windows before S alone
    assert j["next_period"]["advised"] > 1.2 * j["this_period"]


def test_a_few_minutes_of_a_first_period_give_no_worse_advice() -> None:
    """Only minutes of charges after S (the replay stops at :15): still on plan, still no "worse" verdict.
    The advised weights are fitted to the noisy magnitudes of those minutes and rounded to 4 digits, so
    the predicted change of a whole next period can exceed 1 by a hair (up to 1.6e-5 in 300 runs): within
    `CHANGE_TOLERANCE`, which is what "no change" means."""
    rep, _ = asyncio.run(_report([(S, P0 + 900)]))
    j = rep["advice"]["weighted_relative_error"]
    assert j["predicted_change"] <= 1.0 + CHANGE_TOLERANCE and j["verdict"] != "worse"


def test_a_metric_with_no_release_yet_is_labelled_by_its_aggregate() -> None:
    """Minutes into a first period a count_units and a top_k metric of ten-minute windows have no release
    yet: the count_units one says so by its aggregate and only the top_k one gets the top-k wording, in the
    JSON (utility and advice) and on the page."""
    yaml = _YAML.replace(
        "  ten: {source: s, budget: b, weight: 3, window: {tumbling: 10m}, aggregate: count, mechanism: gaussian}",
        "  users: {source: s, budget: b, weight: 3, window: {tumbling: 10m}, aggregate: count_units,"
        " mechanism: gaussian}\n"
        "  top: {source: s, budget: b, weight: 1, window: {tumbling: 10m}, aggregate: top_k, k: 3, group_by: ref,"
        " contribution: {max_keys: 1, max_per_key: 1}, mechanism: exponential}",
    )

    async def run() -> dict[str, Any]:
        topo = load_topology_text(yaml)
        ledger = await open_ledger("memory", topo, clock=ManualClock(S), schedule_start=S)
        await replay_lines(topo, [], ledger, _publish, start=S, end=P0 + 900)
        return build_report(await collect_period(ledger, topo, "b", period_id(HOUR, P0)))

    rep = asyncio.run(run())
    util = _rows(rep, "utility")
    assert util["users"]["releases"] == util["top"]["releases"] == 0 and "fit" in util["minute"]
    assert util["users"]["note"].startswith("count_units: no release yet") and "top-k" not in util["users"]["note"]
    assert util["top"]["note"].startswith("top-k: keys")
    notes = rep["advice"]["not_advised_notes"]
    assert set(notes) == {"users", "top"} and "top-k" not in notes["users"] and "top-k" in notes["top"]
    from dpstream.workers.commands.budget_report import render_text

    text = render_text(rep).splitlines()
    users = next(line for line in text if line.strip().startswith("users "))
    assert "count_units: no release yet" in users and "top-k" not in users, users
    pytest.importorskip("matplotlib")
    from dpstream.workers.report.page import render_page

    page = render_page(rep)
    assert "count_units: no release yet" in page and page.count("top-k: keys") == 1


def _path_xs(svg: str, gid: str) -> list[float]:
    """The x coordinates of the first path drawn inside the SVG group `gid` (matplotlib writes an
    artist's gid as its group's id)."""
    group = svg[svg.index(f'<g id="{gid}">') :]
    d = re.search(r'<path d="([^"]+)"', group)
    assert d, gid
    nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", d[1])]
    return nums[0::2]


def test_the_time_axis_zooms_to_the_minutes_with_charges() -> None:
    """Eight minutes of charges in the first period (S at :06:40, the replay stops at :15): on the page the
    spend line's first and last charge lie most of the plot's width apart (not one vertical line of the
    hour), the whole period is drawn below as context, and the burn rate has a bar per few minutes."""
    pytest.importorskip("matplotlib")
    from dpstream.workers.report.page import render_page

    rep, _ = asyncio.run(_report([(S, P0 + 900)]))
    page = render_page(rep)
    spend = page[page.index("<figure data-plot='spend'>") :]
    spend = spend[: spend.index("</figure>")]
    line, area = _path_xs(spend, "spend-line"), _path_xs(spend, "spend-plot-area")
    width = max(area) - min(area)
    assert max(line) - min(line) > 0.8 * width
    assert min(area) <= min(line) and max(line) <= max(area)
    assert '<g id="period-overview">' in spend and "the whole period, 0–1 h" in spend
    assert "zoomed to" in spend and "time into the period, h:mm" in spend
    burn = page[page.index("<figure data-plot='burn_rate'>") :]
    burn = burn[: burn.index("</figure>")]
    assert '<g id="period-overview">' in burn
    assert len(re.findall(r'<g id="burn-bar-\d+">', burn)) >= 5  # minutes-wide bins, not one hour


def test_a_whole_period_of_charges_keeps_the_whole_axis() -> None:
    """Charges over the whole first period from S: no zoom (the span is most of the period), no overview bar."""
    pytest.importorskip("matplotlib")
    from dpstream.workers.report.page import render_page

    rep, _ = asyncio.run(_report([(S, P0 + HOUR + 120)]))
    page = render_page(rep)
    assert '<g id="period-overview">' not in page and "zoomed to" not in page


def test_the_report_calls_one_number_per_release_its_epsilon_equivalent() -> None:
    """The utility's planned ε-equivalent of a release is the release record's (`epsilon_equivalent` at the
    scope's conversion δ); √(2ρ), the scale of the error model E = c/m, is the noise multiplier, not an ε."""

    async def run() -> tuple[dict[str, Any], dict[str, list[float]]]:
        topo = load_topology_text(_YAML)
        ledger = await open_ledger("memory", topo, clock=ManualClock(S), schedule_start=S)
        await replay_lines(topo, [], ledger, _publish, start=S, end=P0 + 1200)
        data = await collect_period(ledger, topo, "b", period_id(HOUR, P0))
        recorded: dict[str, list[float]] = {}
        for ch in data.charges:
            assert ch.record is not None
            recorded.setdefault(ch.metric, []).append(ch.record["cost"]["epsilon_equiv"])
        return build_report(data), recorded

    rep, recorded = asyncio.run(run())
    for name, row in _rows(rep, "utility").items():
        assert math.isclose(row["planned_noise_multiplier"], math.sqrt(2.0 * row["planned_cost"]), rel_tol=1e-12)
        for eps in recorded[name]:  # on plan: the allowances are the planned cost floored to the ledger's unit
            assert math.isclose(eps, row["planned_epsilon_equivalent"], rel_tol=1e-3), name
        assert row["planned_epsilon_equivalent"] > 2 * row["planned_noise_multiplier"], name
        assert not any(key.startswith("planned_epsilon") and key != "planned_epsilon_equivalent" for key in row)
    for row in rep["advice"]["metrics"]:
        assert not [key for key in row if key.startswith("epsilon") and "equivalent" not in key]


def test_minutes_of_charges_in_a_day_long_first_period_spread_over_the_plot() -> None:
    """A day-long period whose deployment starts at 18:00 and has charged ten minutes: the first and last
    charge lie most of the spend plot's width apart, the axis in minutes, the whole day below."""
    pytest.importorskip("matplotlib")
    from dpstream.workers.report.page import render_page

    day0 = (1_796_000_000 // 86_400) * 86_400
    start = day0 + 18 * HOUR

    async def run() -> dict[str, Any]:
        topo = load_topology_text(_YAML.replace("period: 1h", "period: 1d"))
        ledger = await open_ledger("memory", topo, clock=ManualClock(start), schedule_start=start)
        await replay_lines(topo, [], ledger, _publish, start=start, end=start + 600)
        return build_report(await collect_period(ledger, topo, "b", period_id(86_400, day0)))

    rep = asyncio.run(run())
    spend = render_page(rep).split("<figure data-plot='spend'>", 1)[1].split("</figure>", 1)[0]
    line, area = _path_xs(spend, "spend-line"), _path_xs(spend, "spend-plot-area")
    assert max(line) - min(line) > 0.8 * (max(area) - min(area))
    assert "the whole period, 0–24 h" in spend and "time into the period, h:mm" in spend
    assert rep["advice"]["weighted_relative_error"]["verdict"] != "worse"
