"""The report's fairness section (workers/report/fairness.py): spend share against weight, refusals,
stretched and skipped releases."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpstream.topology.loader import load_topology
from dpstream.workers.report.collect import Charge, Event, PeriodData
from dpstream.workers.report.fairness import fairness_section, scheduled_windows

EXAMPLE = Path(__file__).resolve().parents[2] / "topology" / "examples" / "web-analytics.yaml"
START = 1_764_460_800


@pytest.mark.parametrize(
    ("metric", "horizon", "expected"),
    [
        ("page_views", START + 3600, 60),  # tumbling 1m: one per minute
        ("page_views", START + 86_400, 1440),
        ("active_users_5m", START + 3600, 60),  # hopping 5m/1m: 4 straddle in from the day before, 56 start in it
        ("basket_value", START + 299, 0),  # no 5m window has ended yet
        ("top_referrers", START + 86_400, 24),
    ],
)
def test_scheduled_windows(metric: str, horizon: int, expected: int) -> None:
    """Windows that touch the period and end by the horizon, straddling ones included."""
    topo = load_topology(EXAMPLE)
    assert scheduled_windows(topo.metrics[metric], START, horizon) == expected


def _data(charges: list[Charge], events: list[Event]) -> PeriodData:
    topo = load_topology(EXAMPLE)
    return PeriodData(
        scope="web-daily",
        period_id="2025-11-30",
        period_start=START,
        period_s=86_400,
        accounting="zcdp",
        epsilon=1.0,
        delta=1e-6,
        cap_units=1000,
        reserve_units=200,
        warn_units=800,
        spent_units=sum(c.cost_units for c in charges),
        delta_spent_units=0,
        topology=topo,
        charges=charges,
        events=events,
    )


def _charge(metric: str, minute: int, units: int, after: int) -> Charge:
    window = {"start_epoch": START + 60 * minute, "end_epoch": START + 60 * (minute + 1)}
    return Charge(f"r{metric}{minute}", metric, 0, units, 0, after, {"window": window})


def test_shares_refusals_stretched_and_skipped() -> None:
    """Spend shares sum to 1; a charge made at or above warn_at counts as stretched (stretch policy); a
    refusal is counted by its reason's head; a scheduled window with no ledger record is skipped."""
    charges = [
        _charge("page_views", 0, 500, 500),
        _charge("page_views", 1, 100, 900),
        _charge("basket_value", 4, 100, 1000),
    ]
    refusal = Event("refusal", 0, "page_views", "budget exhausted: cost 100 exceeds", "open", 1000)
    rows = {r["metric"]: r for r in fairness_section(_data(charges, [refusal]))}
    assert sum(r["spend_share"] for r in rows.values()) == pytest.approx(1.0)
    pv = rows["page_views"]
    assert (pv["charged"], pv["stretched"], pv["refused"], pv["refused_reasons"]) == (2, 1, 1, {"budget exhausted": 1})
    assert pv["scheduled_by_horizon"] == 5 and pv["skipped"] == 2  # minutes 0-4 by the horizon (minute 4's end)
    assert rows["basket_value"]["skipped"] == 0 and rows["basket_value"]["spend_share"] == pytest.approx(100 / 700)
