"""The fixed-point grid: power-of-two steps and an integer sensitivity that never undercounts."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpstream.topology.errors import InternalError
from dpstream.workers.noise.grid import GRID_BITS, MAX_UNITS, choose_grid


@given(st.floats(1e-3, 1e6), st.floats(1e-3, 1e7))
def test_step_is_fine_power_of_two(per_key: float, scale: float) -> None:
    """The step is a power of two at least 2^GRID_BITS below both the sensitivity and the scale."""
    grid = choose_grid(per_key, scale)
    mantissa, _ = math.frexp(grid.step)
    assert mantissa == 0.5
    assert grid.step * 2**GRID_BITS <= min(per_key, scale)
    assert grid.per_key_units * grid.step >= per_key


@given(st.floats(1.0, 1000.0), st.floats(-1e6, 1e6), st.floats(0.0, 1.0))
def test_rounding_never_exceeds_integer_sensitivity(per_key: float, total: float, frac: float) -> None:
    """Neighbouring sums (|S − S'| ≤ Δ) land at most `per_key_units` apart on the grid."""
    grid = choose_grid(per_key, 10.0)
    other = total + frac * per_key
    assert abs(grid.encode(other) - grid.encode(total)) <= grid.per_key_units


def test_encode_is_exact_round_half_even() -> None:
    """Encoding divides exactly and rounds half to even; decode is exact."""
    grid = choose_grid(200.0, 100.0)
    assert grid.encode(grid.step * 2.5) == 2
    assert grid.encode(Fraction(7, 2) * Fraction(grid.step)) == 4
    assert grid.decode(3) == 3 * grid.step


def test_encode_refuses_non_finite_and_clamps_huge() -> None:
    """NaN is a bug upstream, not a releasable value; a sum beyond the grid's range is clamped to
    it (never refused: a window is not failed on its data), see test_noise_grid_range.py."""
    grid = choose_grid(1.0, 1.0)
    with pytest.raises(InternalError, match="non-finite"):
        grid.encode(float("nan"))
    assert grid.encode(1.2345e300) == MAX_UNITS and grid.encode(-1.2345e300) == -MAX_UNITS
