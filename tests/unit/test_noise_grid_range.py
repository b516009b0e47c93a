"""The fixed-point grid's range: sized from the bounds and the scale so no real stream reaches it,
and a true value past it anyway is clamped before noise (and counted curator-side), never refused."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dpstream.topology.model import Accounting, Aggregate, Bounds, Contribution, Mechanism, Metric, Window
from dpstream.workers.noise import build_release_mechanism
from dpstream.workers.noise.grid import MAX_UNITS, choose_grid


def _metric(**kw: Any) -> Metric:
    base: dict[str, Any] = dict(
        name="spend",
        source="s",
        budget="b",
        weight=1.0,
        window=Window(60, 60),
        aggregate=Aggregate.SUM,
        mechanism=Mechanism.GAUSSIAN,
        value="eur",
        bounds=Bounds(0.0, 200.0),
        contribution=Contribution(1, 2),
    )
    base.update(kw)
    return Metric(**base)


@given(st.floats(1e-6, 1e9), st.floats(0.0, 14.0))
def test_the_grid_holds_2_to_the_35_whole_contributions_at_any_accepted_budget(per_key: float, log_ratio: float):
    """With a noise scale at least Δ/2^14 (a ledger caps ε below 9,008, so every accepted budget),
    the grid's range holds 2^35 units each adding its whole per-key Δ to one key."""
    grid = choose_grid(per_key, per_key * 2.0**-log_ratio)
    assert MAX_UNITS * grid.step >= 2**35 * per_key
    assert MAX_UNITS < 2**63 - 2**45  # a true value plus pooled noise (scale ≤ 2^40) stays inside i64


@given(st.integers(-(2**70), 2**70), st.integers(0, 10))
def test_clamping_keeps_neighbours_within_the_integer_sensitivity(units: int, moved: int):
    """Two sums one unit apart (|S − S′| ≤ Δ) encode at most per_key_units apart, past the range too."""
    grid = choose_grid(400.0, 30.0)
    s = Fraction(units) * Fraction(grid.step)
    s2 = s + Fraction(moved, 10) * 400
    a, b = grid.encode(s), grid.encode(s2)
    assert -MAX_UNITS <= a <= b <= MAX_UNITS
    assert b - a <= grid.per_key_units


def test_a_sum_past_the_range_is_released_clamped_and_counted_off_the_record():
    """A true sum beyond the grid's range is released (not an InternalError that parks the window):
    noised as the clamped value, counted on the mechanism, and the record's fields are the same
    ones, with the same noise metadata, as a release of an ordinary value."""
    mech = build_release_mechanism(_metric(), Accounting.ZCDP, 0.5)
    grid_step = mech.release({"": Fraction(10)}).to_record_fields()["noise"]["grid_step"]
    before = mech.clamped
    huge = Fraction(MAX_UNITS) * Fraction(grid_step) * 3
    ordinary = mech.release({"": Fraction(1234)}).to_record_fields()
    assert mech.clamped == before
    clamped = mech.release({"": huge}).to_record_fields()
    assert mech.clamped == before + 1
    assert abs(clamped["values"][""] - MAX_UNITS * grid_step) < 1e6 * grid_step  # the range's end, plus noise
    for name in set(ordinary) | set(clamped):
        if name != "values":
            assert json.dumps(ordinary[name], sort_keys=True) == json.dumps(clamped[name], sort_keys=True), name


def test_a_noisy_ratio_mean_past_the_range_is_released_and_counted():
    """A mean without a public denominator whose centred sum is past the range is released and counted."""
    mech = build_release_mechanism(
        _metric(name="avg", aggregate=Aggregate.MEAN, contribution=Contribution(1, 1)), Accounting.ZCDP, 0.5
    )
    before = mech.clamped
    huge = Fraction(2**80)
    out = mech.release({"": (huge, 5)})
    assert mech.clamped == before + 1
    assert 0.0 <= out.values[""] <= 200.0  # the mean is clamped to the bounds as ever
