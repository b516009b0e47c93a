"""Exact sums: clamped values are accumulated as integers on a power-of-two grid fixed by the bounds.

Each clamped value v becomes round(v · 2^E), with E chosen so that both bounds are whole grid
units. Rounding is monotone, so the rounded value stays inside [lower, upper]: the declared
sensitivity holds exactly, and an integer sum has no float drift whatever the order or the
number of additions (floats are aggregated in fixed point, so noise is drawn on integers). The release side turns
the integer back into an exact `Fraction` before the noise grid encodes it.
"""

from __future__ import annotations

__all__ = ["MIN_RESOLUTION_BITS", "value_exponent", "to_units", "from_units"]

import math
from fractions import Fraction

from dpstream.topology.model import Bounds

MIN_RESOLUTION_BITS = 24
"""The grid is at least 2^24 times finer than the bounds' range."""


def _exponent_of(x: float) -> int:
    """Smallest E ≥ 0 such that x · 2^E is an integer (x a finite float: its denominator is 2^k)."""
    return Fraction(x).denominator.bit_length() - 1


def value_exponent(bounds: Bounds) -> int:
    """E of the grid 2^-E for a metric with these bounds (both bounds land on the grid)."""
    width = float(bounds.upper) - float(bounds.lower)
    resolution = MIN_RESOLUTION_BITS - math.floor(math.log2(width))
    return max(0, resolution, _exponent_of(float(bounds.lower)), _exponent_of(float(bounds.upper)))


def to_units(value: float, exponent: int) -> int:
    """round(value · 2^E) (exact: scaling a float by a power of two loses nothing)."""
    return round(math.ldexp(value, exponent))


def from_units(units: int, exponent: int) -> Fraction:
    """The exact value of `units` grid steps."""
    return Fraction(units, 1 << exponent)
