"""Exact spread of OpenDP's integer noise: standard deviation and 95 % interval half-width.

The published σ and CI describe the distribution actually sampled, not a continuous
approximation: discrete Laplace (P(x) ∝ e^{-|x|/t}) in closed form; discrete Gaussian
(P(x) ∝ e^{-x²/2σ²}) by summing its pmf. Results are in integer (grid) units.
"""

from __future__ import annotations

__all__ = [
    "LEVEL",
    "laplace_stddev",
    "laplace_ci_half_width",
    "laplace_coverage",
    "gaussian_stddev",
    "gaussian_ci_half_width",
    "gaussian_coverage",
]

import math
from functools import lru_cache

import numpy as np

from dpstream.topology.calibration import normal_quantile

LEVEL = 0.95
"""Confidence level of every published interval."""

_EXACT_SIGMA_MAX = 8192.0
"""Up to this σ the discrete Gaussian pmf is summed term by term; above, the sums are
Poisson/Euler–Maclaurin exact to far below 1e-9 relative (corrections ~e^{-2π²σ²}, 1/(24σ²))."""


def laplace_stddev(scale: float) -> float:
    """σ of the discrete Laplace with scale t: √(2q)/(1−q), q = e^{−1/t}."""
    q = math.exp(-1.0 / scale)
    return math.sqrt(2.0 * q) / -math.expm1(-1.0 / scale)


def laplace_coverage(scale: float, h: int) -> float:
    """P(|X| ≤ h) for the discrete Laplace: 1 − 2q^{h+1}/(1+q)."""
    q = math.exp(-1.0 / scale)
    return 1.0 - 2.0 * math.exp(-(h + 1) / scale) / (1.0 + q)


def laplace_ci_half_width(scale: float, level: float = LEVEL) -> int:
    """Smallest integer h with P(|X| ≤ h) ≥ level for the discrete Laplace."""
    q = math.exp(-1.0 / scale)
    guess = max(0, math.ceil(scale * math.log(2.0 / ((1.0 - level) * (1.0 + q)))) - 1)
    return _settle(lambda h: laplace_coverage(scale, h), guess, level)


def _settle(coverage, guess: int, level: float) -> int:
    """Move an approximate h to the exact smallest integer whose coverage reaches `level`."""
    h = guess
    while h > 0 and coverage(h - 1) >= level:
        h -= 1
    while coverage(h) < level:
        h += 1
    return h


@lru_cache(maxsize=512)
def _gaussian_pmf(sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """Support 0..L and the pmf of |X| for the discrete Gaussian, L = 40σ + 40 (tail < 1e-300)."""
    top = int(math.ceil(40.0 * sigma)) + 40
    x = np.arange(0, top + 1, dtype=np.float64)
    w = np.exp(-(x * x) / (2.0 * sigma * sigma))
    w[1:] *= 2.0  # ±x
    return x, w / w.sum()


def gaussian_stddev(sigma: float) -> float:
    """σ of the discrete Gaussian with parameter σ (equal to σ to double precision once σ ≳ 2)."""
    if sigma > _EXACT_SIGMA_MAX:
        return sigma
    x, p = _gaussian_pmf(sigma)
    return float(math.sqrt(float(np.dot(x * x, p))))


def gaussian_coverage(sigma: float, h: int) -> float:
    """P(|X| ≤ h) for the discrete Gaussian."""
    if sigma > _EXACT_SIGMA_MAX:
        # Σ_{x>h} pmf = ∫_{h+½}^∞ normal density (midpoint rule; error ~ 1/(24σ²) relative)
        return 1.0 - math.erfc((h + 0.5) / (sigma * math.sqrt(2.0)))
    _, p = _gaussian_pmf(sigma)
    return float(np.sum(p[: h + 1]))


def gaussian_ci_half_width(sigma: float, level: float = LEVEL) -> int:
    """Smallest integer h with P(|X| ≤ h) ≥ level for the discrete Gaussian."""
    if sigma > _EXACT_SIGMA_MAX:
        guess = max(0, math.ceil(normal_quantile((1.0 + level) / 2.0) * sigma - 0.5))
        return _settle(lambda h: gaussian_coverage(sigma, h), guess, level)
    _, p = _gaussian_pmf(sigma)
    cdf = np.cumsum(p)
    return int(np.searchsorted(cdf, level, side="left"))
