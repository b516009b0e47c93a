"""The report's accounting (workers/report): the per-record cost check and the tight recomputation, on
periods replayed through the in-process ledger (no servers)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from dpstream.topology.loader import load_topology
from dpstream.topology.model import Topology
from dpstream.workers.ledger import open_ledger
from dpstream.workers.report.build import build_report
from dpstream.workers.report.collect import PeriodData, collect_period
from dpstream.workers.runtime.replay import replay_lines
from dpstream.workers.synthetic import EventGenerator, GeneratorConfig

pytest.importorskip("dp_accounting")

EXAMPLES = Path(__file__).resolve().parents[2] / "topology" / "examples"
DAY = 86_400
START = 1_764_460_800  # 2025-11-30T00:00Z: a fixed past day


def _period(name: str, hours: int, events: int) -> tuple[Topology, PeriodData]:
    """`hours` of a period of an example replayed through the in-process ledger, read back as the report does."""
    topo = load_topology(EXAMPLES / name)
    gen = EventGenerator(topo, config=GeneratorConfig(users=200, seed=3, start_ts=START + 0.5))
    lines = [e.value for e in gen.events(events, rate=events / (hours * 3600))]

    async def run() -> PeriodData:
        ledger = await open_ledger("memory", topo, clock=lambda: float(START + 60))

        async def publish(value: bytes, key: bytes) -> None:
            return None

        await replay_lines(topo, lines, ledger, publish, start=START, end=START + hours * 3600)
        try:
            return await collect_period(ledger, topo, next(iter(topo.budgets)))
        finally:
            await ledger.close()

    return topo, asyncio.run(run())


@pytest.fixture(scope="module")
def web_hour() -> tuple[Topology, PeriodData]:
    """The first hour of the web-analytics example (zCDP: Gaussians, a mean, top-k with selection)."""
    return _period("web-analytics.yaml", 1, 600)


@pytest.fixture(scope="module")
def seed_day() -> tuple[Topology, PeriodData]:
    """A day of seed 000's example (pure ε: Laplace count, sum, mean, exponential top-5)."""
    return _period("seed-example.yaml", 24, 300)


def test_every_record_maps_to_its_charge(web_hour: Any, seed_day: Any) -> None:
    """zCDP and pure periods: every record's noise scale maps (OpenDP) to exactly its charged cost."""
    for _topo, data in (web_hour, seed_day):
        rep = build_report(data)
        rc = rep["accounting"]["record_check"]
        assert rc["checked"] == len(data.charges) > 0 and rc["flagged"] == []
        assert rep["accounting"]["charged"]["reconciles"]
        for row in rep["accounting"]["charges"]:
            assert math.isclose(row["mapped_cost"], row["cost"], rel_tol=1e-6)


def _with_event_part(data: PeriodData, **changes: Any) -> tuple[PeriodData, str]:
    """`data` with its first charge's record's first event part changed; and that release's id."""
    first = data.charges[0]
    rec = dict(first.record or {})
    event = dict(rec["event"])
    event["parts"] = [dict(event["parts"][0]) | changes, *event["parts"][1:]]
    rec["event"] = event
    return dataclasses.replace(
        data, charges=[dataclasses.replace(first, record=rec), *data.charges[1:]]
    ), first.release_id


@pytest.mark.parametrize("factor", [1.001, 0.5, 2.0])
def test_a_changed_scale_is_flagged(web_hour: Any, factor: float) -> None:
    """A record whose event scale differs from what was drawn (any factor) fails the check; the others pass."""
    _topo, data = web_hour
    scale = data.charges[0].record["event"]["parts"][0]["scale"]
    tampered, rid = _with_event_part(data, scale=scale * factor)
    flagged = build_report(tampered)["accounting"]["record_check"]["flagged"]
    assert [f["release_id"] for f in flagged] == [rid]
    assert any("map to" in p for p in flagged[0]["problems"])


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_a_changed_sensitivity_with_a_matching_scale_is_flagged(web_hour: Any, factor: float) -> None:
    """Scale and d_in changed together (their map still equals the charge): the parts are not the
    metric's declared ones, so the record is flagged all the same."""
    _topo, data = web_hour
    part = data.charges[0].record["event"]["parts"][0]
    assert part["mechanism"] == "gaussian"
    tampered, rid = _with_event_part(data, scale=part["scale"] * factor, d_in=part["d_in"] * factor)
    (check,) = build_report(tampered)["accounting"]["record_check"]["flagged"]
    assert check["release_id"] == rid
    assert [p for p in check["problems"] if "not the metric's" in p] and not [
        p for p in check["problems"] if "map" in p
    ]


def test_a_record_without_its_event_is_flagged(web_hour: Any) -> None:
    """No `event` in the stored record: flagged, the others pass."""
    _topo, data = web_hour
    first = data.charges[0]
    rec = {k: v for k, v in (first.record or {}).items() if k != "event"}
    changed = dataclasses.replace(data, charges=[dataclasses.replace(first, record=rec), *data.charges[1:]])
    flagged = build_report(changed)["accounting"]["record_check"]["flagged"]
    assert [f["release_id"] for f in flagged] == [first.release_id]
    assert "privacy event" in flagged[0]["problems"][0]


def test_each_event_sums_to_its_charge(web_hour: Any, seed_day: Any) -> None:
    """Every stored record's event: its cost is the charged cost, its parts' costs add up to it, and its
    parts' OpenDP maps equal their own costs."""
    from dpstream.workers.report.accounting import checks_of

    for _topo, data in (web_hour, seed_day):
        for charge, check in zip(data.charges, checks_of(data), strict=True):
            event = charge.record["event"]
            assert math.isclose(event["cost"], charge.cost, rel_tol=1e-9)
            assert math.isclose(math.fsum(p["cost"] for p in event["parts"]), event["cost"], rel_tol=1e-12)
            for part, comp in zip(event["parts"], check.components, strict=True):
                assert math.isclose(comp.mapped_cost, part["cost"], rel_tol=1e-9)


def test_a_missing_or_foreign_record_is_flagged(web_hour: Any) -> None:
    """A charge without a stored record, or whose record names another release, is flagged."""
    _topo, data = web_hour
    a, b = data.charges[0], data.charges[1]
    changed = [dataclasses.replace(a, record=None), dataclasses.replace(b, record=a.record), *data.charges[2:]]
    flagged = build_report(dataclasses.replace(data, charges=changed))["accounting"]["record_check"]["flagged"]
    assert [f["release_id"] for f in flagged] == [a.release_id, b.release_id]


def test_tight_figures_against_dp_accounting_and_the_charge(web_hour: Any) -> None:
    """The PLD figure equals dp-accounting's PLD of the same parts built here, is below the charged ε, and
    the RDP figure is dp-accounting's RdpAccountant of the parts' zCDP/RDP (≥ the PLD)."""
    from dp_accounting import dp_event
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

    from dpstream.workers.report.accounting import checks_of

    _topo, data = web_hour
    rep = build_report(data)
    tight, charged = rep["accounting"]["tight"], rep["accounting"]["charged"]
    parts = [p for c in checks_of(data) for p in c.components]
    gauss = [p for p in parts if p.kind == "gaussian"]
    topk = [p for p in parts if p.kind == "exponential"]
    assert gauss and topk and len(gauss) + len(topk) == len(parts)
    mult = 1.0 / math.sqrt(math.fsum((p.sensitivity / p.scale) ** 2 for p in gauss))
    pld = pld_lib.from_gaussian_mechanism(mult, value_discretization_interval=1e-4)
    for p in topk:
        assert math.isclose(p.epsilon0, p.sensitivity / p.scale, rel_tol=1e-12)  # OpenDP's monotone map: Δ∞/scale
        one = pld_lib.from_privacy_parameters(common.DifferentialPrivacyParameters(p.epsilon0, 0.0), 1e-4)
        pld = pld.compose(one.self_compose(p.k))
    assert math.isclose(pld.get_epsilon_for_delta(tight["delta"]), tight["pld_epsilon"], rel_tol=1e-6)
    rdp = RdpAccountant(
        orders=[1.0 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [64, 80, 96, 128, 256, 512, 1024]
    )
    rdp.compose(dp_event.GaussianDpEvent(mult))
    for p in topk:
        rdp.compose(dp_event.ZCDpEvent(p.k * (2.0 * p.sensitivity / p.scale) ** 2 / 8.0))
    assert math.isclose(rdp.get_epsilon(tight["delta"]), tight["rdp_epsilon"], rel_tol=1e-9)
    assert tight["pld_epsilon"] < charged["epsilon"] <= tight["rdp_epsilon"] * (1 + 1e-3)
    assert rep["accounting"]["gap"]["credited"] is False


def test_pure_scope_has_no_tight_figure_and_says_why(seed_day: Any) -> None:
    """In a pure scope the charged ε is exact at δ = 0: no PLD figure, a note instead."""
    rep = build_report(seed_day[1])
    assert rep["accounting"]["tight"] is None and "δ = 0" in rep["accounting"]["tight_note"]
    assert rep["accounting"]["charged"]["epsilon"] == rep["accounting"]["charged"]["total"]


def test_page_has_four_svg_plots_and_no_external_reference(web_hour: Any) -> None:
    """The page is one file: four inline SVG plots, no script, no link."""
    pytest.importorskip("matplotlib")
    from dpstream.workers.report.page import PLOTS, render_page

    text = render_page(build_report(web_hour[1]))
    assert all(f"<figure data-plot='{p}'><svg" in text for p in PLOTS)
    assert "<script" not in text and "<link" not in text and "<img" not in text


def test_page_keeps_the_whole_period_when_every_charge_is_at_one_window_end(seed_day: Any) -> None:
    """Daily windows all released at the day's end: no span to zoom to, so the axis is the whole day."""
    pytest.importorskip("matplotlib")
    from dpstream.workers.report.page import render_page

    text = render_page(build_report(seed_day[1]))
    assert "zoomed to" not in text and '<g id="period-overview">' not in text
    assert "hours into the period (window end)" in text


def test_a_period_composes_only_the_m_costliest_records_of_a_max_windows_metric() -> None:
    """Under contribution.max_windows m the report composes each (metric, topology version)'s m
    costliest records (the ledger pays only those); other metrics' records all count; flagged ones never."""
    from dpstream.workers.report.accounting import composed_checks
    from dpstream.workers.report.collect import Charge
    from dpstream.workers.report.costcheck import RecordCheck

    def charge(rid: str, metric: str, version: str, m: int | None) -> Charge:
        record = {"topology_version": version, "event": {"max_windows": m}}
        return Charge(rid, metric, 0, 1, 0, 0, record)

    rows = [
        ("a1", "capped", "v1", 2, 0.3),
        ("a2", "capped", "v1", 2, 0.5),
        ("a3", "capped", "v1", 2, 0.1),
        ("a4", "capped", "v1", 2, 0.4),
        ("b1", "capped", "v2", 2, 0.2),
        ("c1", "plain", "v1", None, 0.1),
        ("c2", "plain", "v1", None, 0.1),
    ]
    charges = [charge(rid, metric, version, m) for rid, metric, version, m, _ in rows]
    checks = [RecordCheck(rid, metric, cost, record_cost=cost) for rid, metric, _, _, cost in rows]
    flagged = RecordCheck("a5", "capped", 0.9, record_cost=0.9, problems=["bad"])
    kept = composed_checks([*checks, flagged], [*charges, charge("a5", "capped", "v1", 2)])
    assert sorted(c.release_id for c in kept) == ["a2", "a4", "b1", "c1", "c2"]


_RUNNING = """
version: 1
sources:
  shop: {topic: shop-events, privacy_unit: user_id, timestamp: ts}
budgets:
  day: {epsilon: 2, period: 1d, accounting: zcdp, delta: 1.0e-6}
metrics:
  revenue_so_far:
    source: shop
    budget: day
    window: {tumbling: 1h}
    aggregate: sum
    value: amount
    bounds: [0, 100]
    group_by: channel
    keys: [web, app]
    release: running_total
    contribution: {max_per_key: 10, max_per_period: 500}
    mechanism: gaussian
  views:
    source: shop
    budget: day
    window: {tumbling: 1h}
    aggregate: count
    mechanism: gaussian
sinks: {releases: rel, dead_letter: dlq}
"""


def test_a_running_totals_steps_map_to_its_one_lump() -> None:
    """Six hourly steps of a running total beside a plain count: every step's record maps (OpenDP's float
    Gaussian on C x, at d_in L·‖c‖₂) to the lump, the ledger paid it once, the report composes it once,
    and the tight figures count it once (max_windows 1)."""
    from dpstream.topology.loader import load_topology_text

    topo = load_topology_text(_RUNNING)
    lines = [
        b'{"user_id": "u%d", "ts": %d, "channel": "%s", "amount": 20.0}'
        % (i % 40, START + 30 * i, b"web" if i % 3 else b"app")
        for i in range(700)
    ]

    async def run() -> PeriodData:
        ledger = await open_ledger("memory", topo, clock=lambda: float(START + 60))

        async def publish(value: bytes, key: bytes) -> None:
            return None

        await replay_lines(topo, lines, ledger, publish, start=START, end=START + 6 * 3600)
        try:
            return await collect_period(ledger, topo, "day")
        finally:
            await ledger.close()

    data = asyncio.run(run())
    rep = build_report(data)
    acc = rep["accounting"]
    assert acc["record_check"]["flagged"] == [] and acc["charged"]["reconciles"]
    steps = [c for c in data.charges if c.metric == "revenue_so_far"]
    assert len(steps) == 6 and [c.cost_units for c in steps][1:] == [0] * 5
    lump = steps[0].record["event"]["lump"]
    assert all(c.record["event"]["lump"] == lump for c in steps)
    running_rows = [r for r in acc["charges"] if r["metric"] == "revenue_so_far"]
    assert all(math.isclose(r["mapped_cost"], lump, rel_tol=1e-6) for r in running_rows)
    assert "max_windows_note" in acc["charged"]


def test_a_running_total_is_reported_without_a_fit() -> None:
    """An hour of demo.yaml (basket_so_far, a running total): the report builds and renders; the running
    total's releases are counted but not fitted to E = c/m (its later steps' charges are 0, its std grows with
    the step), and its row says so."""
    from dpstream.workers.report.page import render_page

    _topo, data = _period("demo.yaml", 1, 3000)
    report = build_report(data)
    row = next(r for r in report["utility"] if r["metric"] == "basket_so_far")
    assert row["releases"] > 1 and "fit" not in row and "running total" in row["note"]
    assert render_page(report)
