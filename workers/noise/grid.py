"""Fixed-point grid for real-valued sums: integers in, integers noised, reals out.

A real sum S is published as step × (round(S / step) + integer noise), with `step` a power of
two chosen from the bounds and the noise scale, so the noise is sampled exactly on integers
(no float sampler, no float-arithmetic leak; Mironov 2012, Casacuberta et al. 2022).

Sensitivity on the grid: if one unit moves S by at most Δ, then |round(S/step) − round(S'/step)|
≤ ⌈Δ/step⌉; one extra unit absorbs a floating-point error of the incoming sum of up to half a
step (the pipeline should pass `math.fsum` of the clamped values; `encode` refuses sums so large
that half an ulp could reach step/8). So the integer sensitivity ⌈Δ/step⌉ + 1 is always ≥ the
real one, and the charge computed from it stays valid.
"""

from __future__ import annotations

__all__ = ["GRID_BITS", "FixedPointGrid", "choose_grid"]

import math
from dataclasses import dataclass
from fractions import Fraction

from dpstream.topology.errors import InternalError

GRID_BITS = 10
"""The grid step is at least 2^10 times finer than both the per-key sensitivity and the noise scale."""

_MAX_UNITS = 2**50
"""Largest |S / step| accepted: keeps half an ulp of S below step/8 and far inside i64."""


@dataclass(frozen=True)
class FixedPointGrid:
    """A power-of-two grid and the integer sensitivity of one key's sum on it."""

    step: float
    per_key_units: int
    """Integer sensitivity per key: ⌈Δ_key / step⌉ + 1 (≥ Δ_key / step)."""

    def encode(self, value: float | Fraction) -> int:
        """round(value / step), half to even, computed exactly.

        Errors never show the value: it is a true aggregate (DESIGN §1 "Trust boundary")."""
        if not isinstance(value, Fraction) and not math.isfinite(value):
            raise InternalError("non-finite true aggregate reached the fixed-point encoder")
        units = round(Fraction(value) / Fraction(self.step))
        if abs(units) > _MAX_UNITS:
            raise InternalError(
                f"a true aggregate exceeds the fixed-point grid's range (2^50 steps of {self.step}); "
                "narrow the metric's bounds"
            )
        return int(units)

    def decode(self, units: int | float) -> float:
        """Back from grid units to value units (exact: the step is a power of two)."""
        return float(units) * self.step


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
