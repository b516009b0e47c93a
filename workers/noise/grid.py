"""Fixed-point grid for real-valued sums: integers in, integers noised, reals out.

A real sum S is published as step × (round(S / step) + integer noise), with `step` a power of
two chosen from the bounds and the noise scale, so the noise is sampled exactly on integers
(no float sampler, no float-arithmetic leak; Mironov 2012, Casacuberta et al. 2022).

Sensitivity on the grid: if one unit moves S by at most Δ, then |round(S/step) − round(S'/step)|
≤ ⌈Δ/step⌉; one extra unit absorbs a floating-point error of up to half a step in an incoming
float (the pipeline passes exact `Fraction`s). So the integer sensitivity ⌈Δ/step⌉ + 1 is always
≥ the real one, and the charge computed from it stays valid.

Range: the grid holds |S / step| ≤ MAX_UNITS = 2^60. The step is at least min(Δ, scale) · 2^-11,
so that is 2^49 · min(Δ, scale): with any budget a ledger accepts (ε ≤ 9,000, so scale ≥ Δ/2^14),
over 2^35 units each adding their whole Δ to one key of one window, far past any real stream. A
true value beyond the range anyway is clamped to it before noise, never refused: a window is not
failed (parked, unpublished) on its data. Clamping is 1-Lipschitz, so neighbours stay within the
integer sensitivity; that it happened is an un-noised fact about the data, counted curator-side
by the caller (`at_range_end`), never in a record.
"""

from __future__ import annotations

__all__ = ["GRID_BITS", "MAX_UNITS", "FixedPointGrid", "at_range_end", "choose_grid"]

import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from dpstream.topology.errors import InternalError

GRID_BITS = 10
"""The grid step is at least 2^10 times finer than both the per-key sensitivity and the noise scale."""

MAX_UNITS = 2**60
"""Largest |S / step| released: beyond it a true value is clamped to ±MAX_UNITS steps. Far inside
i64 (2^63), so a pooled noise sample (scale ≤ 2^40) added to it never saturates."""


@dataclass(frozen=True)
class FixedPointGrid:
    """A power-of-two grid and the integer sensitivity of one key's sum on it."""

    step: float
    per_key_units: int
    """Integer sensitivity per key: ⌈Δ_key / step⌉ + 1 (≥ Δ_key / step)."""

    def encode(self, value: float | Fraction) -> int:
        """round(value / step), half to even, computed exactly, clamped to ±MAX_UNITS.

        Clamping is 1-Lipschitz (|clamp(a) − clamp(b)| ≤ |a − b|), so two neighbours' values stay
        at most `per_key_units` apart; `at_range_end` counts the clamped ones for the caller. A
        non-finite float is a bug upstream (sums are exact). Errors never show the value: it is a
        true aggregate, curator-side only."""
        if not isinstance(value, Fraction) and not math.isfinite(value):
            raise InternalError("non-finite true aggregate reached the fixed-point encoder")
        units = round(Fraction(value) / Fraction(self.step))
        return int(min(max(units, -MAX_UNITS), MAX_UNITS))

    def decode(self, units: int | float) -> float:
        """Back from grid units to value units (exact: the step is a power of two)."""
        return float(units) * self.step


def at_range_end(units: Iterable[int]) -> int:
    """How many encoded true values sit at the range's end ±MAX_UNITS: clamped there (or exactly
    on it, which only a stream of some 2^35 whole contributions could reach)."""
    return sum(1 for u in units if u == MAX_UNITS or u == -MAX_UNITS)


def choose_grid(per_key_sensitivity: float, noise_scale: float) -> FixedPointGrid:
    """The grid for a sum whose one-key sensitivity and (real) noise scale are given."""
    if per_key_sensitivity <= 0 or noise_scale <= 0:
        raise InternalError(
            f"fixed-point grid needs positive sensitivity and scale, got {per_key_sensitivity}, {noise_scale}"
        )
    exponent = math.floor(math.log2(min(per_key_sensitivity, noise_scale))) - GRID_BITS
    step = math.ldexp(1.0, exponent)
    units = math.ceil(Fraction(per_key_sensitivity) / Fraction(step)) + 1
    return FixedPointGrid(step=step, per_key_units=int(units))
