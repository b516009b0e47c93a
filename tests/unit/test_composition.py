"""Several budget scopes over one privacy unit: `validate` warns and `plan` shows what they promise
together per unit and UTC day (caps in ρ, pure ε as ε²/2, ρ summed across period lengths, converted at
the smallest zCDP conversion δ, plus every scope's selection δ)."""

from __future__ import annotations

import json
import math

import pytest

from dpstream.topology import accounting as acc
from dpstream.topology.composition import periods_per_day, unit_guarantees
from dpstream.topology.loader import load_topology_text
from dpstream.workers.cli import main

TWO_SCOPES = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts}
  orders: {topic: t.orders, privacy_unit: user_id, timestamp: ts}
budgets:
  daily: {epsilon: 1.0, delta: 1.0e-6, period: 1d}
  hourly: {epsilon: 0.1, period: 1h, accounting: pure}
metrics:
  views: {source: clicks, budget: daily, window: {tumbling: 1h}, aggregate: count, mechanism: gaussian}
  buys: {source: orders, budget: hourly, window: {tumbling: 1h}, aggregate: count, mechanism: laplace}
sinks: {releases: r, dead_letter: d}
"""


def _expected_two_scopes() -> tuple[float, float, float]:
    """(ρ per day, ε, δ) of TWO_SCOPES by hand: ρ*(1, 1e-6) + 24 × 0.1²/2, at δ = 1e-6."""
    rho = acc.rho_cap(1.0, 1e-6) + 24 * 0.1**2 / 2
    return rho, acc.epsilon_from_rho(rho, 1e-6), 1e-6


def test_two_scopes_over_one_unit_add_up_per_day() -> None:
    """Pure ε counts as ε²/2, the hourly scope 24 times a day, converted at the zCDP scope's δ."""
    (unit,) = unit_guarantees(load_topology_text(TWO_SCOPES))
    rho, eps, delta = _expected_two_scopes()
    assert unit.composes and unit.privacy_unit == "user_id" and unit.sources == ("clicks", "orders")
    assert unit.rho_per_day is not None and math.isclose(unit.rho_per_day, rho, rel_tol=1e-12)
    assert math.isclose(unit.epsilon, eps, rel_tol=1e-9) and unit.delta == delta
    assert unit.epsilon > 2.5  # each scope alone promises ε = 1 (daily) or 0.1 per hour


def test_validate_warns_with_the_combined_figures(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """`dpstream validate` exits 0 and names the unit, both budgets, the sources and the combined
    (ε, δ) per UTC day; `--json` carries the same warning."""
    path = tmp_path / "t.yaml"
    path.write_text(TWO_SCOPES)
    _, eps, _ = _expected_two_scopes()
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if "privacy unit" in ln]
    assert "privacy unit 'user_id': budgets 'daily' (1d), 'hourly' (1h) over source(s) 'clicks', 'orders'" in line
    assert f"(ε = {eps:.4g}, δ = 1e-06)-DP per user_id per UTC day" in line
    assert main(["validate", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert any("compose for one person" in w["message"] for w in doc["warnings"])


def test_plan_shows_the_combined_guarantee_in_text_and_json(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """`dpstream plan` prints the unit's combined line with a warning; `--json` lists it under privacy_units."""
    path = tmp_path / "t.yaml"
    path.write_text(TWO_SCOPES)
    rho, eps, _ = _expected_two_scopes()
    assert main(["plan", str(path)]) == 0
    text = capsys.readouterr().out
    assert (
        f"privacy unit user_id: budgets daily, hourly compose for one person (sources clicks, orders): ρ = {rho:.4g}"
        in text
    )
    assert "WARNING: no budget counts the others' spend" in text
    assert main(["plan", str(path), "--json"]) == 0
    (unit,) = json.loads(capsys.readouterr().out)["privacy_units"]
    assert unit["composes"] is True and unit["scopes"] == ["daily", "hourly"]
    assert math.isclose(unit["epsilon_per_day"], eps, rel_tol=1e-9)


def test_the_conversion_is_at_the_smallest_delta_and_selection_delta_adds() -> None:
    """Two zCDP scopes (δ 1e-6 with a selecting metric, δ 1e-8): ρ converts at 1e-8, and the day's δ adds
    the first scope's selection δ (a tenth of 1e-6)."""
    yaml = (
        TWO_SCOPES.replace(
            "hourly: {epsilon: 0.1, period: 1h, accounting: pure}", "hourly: {epsilon: 0.5, delta: 1.0e-8, period: 1d}"
        )
        .replace(
            "views: {source: clicks, budget: daily, window: {tumbling: 1h}, aggregate: count, mechanism: gaussian}",
            "views: {source: clicks, budget: daily, window: {tumbling: 1h}, aggregate: count, group_by: page, "
            "contribution: {max_keys: 1}, mechanism: gaussian}",
        )
        .replace("mechanism: laplace", "mechanism: gaussian")
    )
    (unit,) = unit_guarantees(load_topology_text(yaml))
    rho = acc.rho_cap(1.0, 0.9e-6) + acc.rho_cap(0.5, 1e-8)
    assert unit.rho_per_day is not None and math.isclose(unit.rho_per_day, rho, rel_tol=1e-9)
    assert math.isclose(unit.epsilon, acc.epsilon_from_rho(rho, 1e-8), rel_tol=1e-9)
    assert math.isclose(unit.delta, 1e-8 + 1e-7, rel_tol=1e-9)


def test_one_scope_composes_nothing_and_warns_nothing(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both sources charged to one budget: one cap covers them, so no warning and `composes` is false."""
    yaml = (
        TWO_SCOPES.replace("budget: hourly", "budget: daily")
        .replace("  hourly: {epsilon: 0.1, period: 1h, accounting: pure}\n", "")
        .replace("mechanism: laplace", "mechanism: gaussian")
    )
    (unit,) = unit_guarantees(load_topology_text(yaml))
    assert not unit.composes
    path = tmp_path / "t.yaml"
    path.write_text(yaml)
    assert main(["validate", str(path)]) == 0
    assert "privacy unit" not in capsys.readouterr().out


def test_pure_scopes_compose_by_summing_epsilon_and_event_level_sources_are_left_out() -> None:
    """Two pure scopes: Σ ε per day (0.1 × 24 + 1), δ 0; an event-level source is no person's unit."""
    yaml = TWO_SCOPES.replace(
        "daily: {epsilon: 1.0, delta: 1.0e-6, period: 1d}", "daily: {epsilon: 1.0, period: 1d, accounting: pure}"
    ).replace("mechanism: gaussian", "mechanism: laplace")
    (unit,) = unit_guarantees(load_topology_text(yaml))
    assert unit.rho_per_day is None and math.isclose(unit.epsilon, 3.4) and unit.delta == 0.0
    event = yaml.replace(
        "orders: {topic: t.orders, privacy_unit: user_id", "orders: {topic: t.orders, privacy_unit: event"
    )
    (only,) = unit_guarantees(load_topology_text(event))
    assert only.sources == ("clicks",) and not only.composes


def test_periods_per_day() -> None:
    """A UTC day touches 24 hourly periods, one daily or weekly period, and up to 6 five-hour ones."""
    assert [periods_per_day(p) for p in (3600, 86_400, 7 * 86_400, 5 * 3600, 36 * 3600)] == [24, 1, 1, 6, 2]
