"""The demo's screen: release rows show the record's noisy values and CI beside the labelled demo-only truth."""

from __future__ import annotations

from dpstream.workers.demo.expected import Expectation, explain_release
from dpstream.workers.demo.feed import TRUTH_LABEL, ReleaseTally, format_budget, format_release, header_lines

_WINDOW = {"start_epoch": 1_796_083_200, "end_epoch": 1_796_083_210}


def test_grouped_row_shows_noisy_values_their_ci_and_the_truth_below() -> None:
    """A grouped release is two rows: noisy values with the record's ± on the first, the truth under them."""
    record = {
        "metric": "page_views",
        "window": _WINDOW,
        "budget": {"ratio_after": 0.0025},
        "values": {"home": 3702.0, "cart": -5.0},
        "ci": {"half_width": 243.0, "level": 0.95},
    }
    first, second = format_release(record, {"home": 3690.0, "cart": 12.0})
    assert first.startswith("page_views") and "00:00:00–00:00:10" in first and "0.25 %" in first
    assert "±243" in first and "home 3,702" in first and "cart -5" in first
    assert second.lstrip().startswith("truth") and "home 3,690" in second and "cart 12" in second
    assert first.index("home 3,702") == second.index("home 3,690")  # aligned under each other


def test_ungrouped_row_and_mean_units_and_missing_truth() -> None:
    """One row for an ungrouped metric; a mean gets seconds and one decimal below ±10; no truth shows '–'."""
    mean = {
        "metric": "session_seconds",
        "aggregate": "mean",
        "window": _WINDOW,
        "budget": {"ratio_after": 0.01},
        "values": {"": 1003.27},
        "ci": {"half_width": {"": 8.4}, "approximate": True},
    }
    (row,) = format_release(mean, {"": 997.91})
    assert "1,003.3 ±8.4 s" in row and "truth 997.9 s" in row
    count = {"metric": "active_users", "window": _WINDOW, "values": {"": 29_709.0}, "ci": {"half_width": 238.0}}
    (row,) = format_release(count, None)
    assert "29,709 ±238" in row and "truth –" in row


def test_charge_markers_print_nothing_and_the_header_labels_the_truth() -> None:
    """Charge-only markers are not releases; the header says the truth is shown only in the demo."""
    assert format_release({"charge_only": True, "release_id": "x@p"}) == []
    assert any(TRUTH_LABEL in line for line in header_lines())
    assert TRUTH_LABEL == "(truth shown only in the demo)"


def test_tally_counts_coverage_and_relative_ci() -> None:
    """The tally counts releases per metric and how many truths fall inside their CI."""
    tally = ReleaseTally()
    tally.add({"metric": "m", "values": {"a": 100.0, "b": 50.0}, "ci": {"half_width": 10.0}}, {"a": 95.0, "b": 70.0})
    tally.add({"metric": "m", "values": {"a": 1.0}, "ci": {"half_width": 1.0}}, None)
    assert tally.total == 2 and tally.per_metric == {"m": 2}
    assert (tally.covered, tally.compared) == (1, 2)
    assert tally.relative_ci["m"] == [10.0 / 95.0, 10.0 / 70.0]


def test_budget_line_from_the_status_json() -> None:
    """The budget line carries state, ratio, spend in the scope's currency, ε and the release counts."""
    status = {
        "scope": "demo-hourly",
        "accounting": "zcdp",
        "state": "normal",
        "ratio": 0.0123,
        "spent": 0.00108,
        "cap": 0.0882,
        "epsilon_equiv": 0.21,
        "releases": {"charged": 24, "refused": 0},
        "period": {"id": "2026-11-30T21:00Z", "seconds_left": 2450},
    }
    line = format_budget(status)
    assert "demo-hourly" in line and "1.23 %" in line and "ρ 0.00108 of 0.0882" in line
    assert "charged 24, refused 0" in line and "40 min 50 s left" in line


def _expected(cost: float) -> Expectation:
    return Expectation(
        "m",
        "p",
        planned_cost=1.0,
        expected_cost=cost,
        planned_ci=None,
        expected_ci=None,
        stretched=False,
        stretch=1.5,
        period_left=0.5,
        pool_left=1.0,
    )


def test_a_release_priced_as_predicted_needs_no_note_and_others_say_why() -> None:
    """No note within 2 % of the predicted grant; a grant cut by stretch² is named as on_warning's stretch."""
    assert explain_release(2.0 * 1.01, _expected(2.0)) == ""
    assert "on_warning" in explain_release(2.0 / 1.5**2, _expected(2.0))
    assert "σ ×0.71" in explain_release(4.0, _expected(2.0))
    assert explain_release(1.0, None) == ""


def test_expectation_reason_names_the_adaptive_re_division() -> None:
    """A grant of twice the plan with the pool untouched and half the period left is explained as such."""
    e = _expected(2.0)
    assert e.ratio == 2.0
    assert "100 % of this period's pool is left for the last 50 %" in e.reason()
    assert _expected(1.0).reason() == ""


def test_running_total_row_shows_the_total_so_far_and_its_step() -> None:
    """A running total's step is one row like any ungrouped metric (noisy total ± CI, truth so far), with
    the step and the time its total counts from."""
    record = {
        "metric": "basket_so_far",
        "window": {"start_epoch": 1_796_083_220, "end_epoch": 1_796_083_230},
        "budget": {"ratio_after": 0.2},
        "values": {"": 3_201_554.2},
        "ci": {"half_width": 455_887.1, "level": 0.95},
        "running_total": {"step": 3, "steps": 360, "first_start": 1_796_083_200},
    }
    (row,) = format_release(record, {"": 3_162_001.5})
    assert "3,201,554 ±455,887   truth 3,162,002" in row
    assert row.endswith("total since 00:00:00, step 3/360")
