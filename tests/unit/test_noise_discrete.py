"""Exact σ and 95 % half-widths of OpenDP's discrete Laplace and discrete Gaussian."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpstream.workers.noise import discrete


def _laplace_pmf(t: float, top: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(-top, top + 1, dtype=float)
    w = np.exp(-np.abs(x) / t)
    return x, w / w.sum()


@pytest.mark.parametrize("t", [0.3, 1.0, 2.5, 17.0, 400.0])
def test_laplace_stddev_matches_pmf_sum(t: float) -> None:
    """The closed-form discrete Laplace σ equals the σ of its summed pmf."""
    x, p = _laplace_pmf(t, int(60 * t) + 60)
    assert discrete.laplace_stddev(t) == pytest.approx(math.sqrt(float(np.dot(x * x, p))), rel=1e-9)


@pytest.mark.parametrize("t", [0.3, 1.0, 2.5, 17.0, 400.0])
def test_laplace_ci_is_smallest_integer_reaching_95(t: float) -> None:
    """h covers ≥ 95 % of the discrete Laplace mass and h − 1 does not."""
    x, p = _laplace_pmf(t, int(60 * t) + 60)
    h = discrete.laplace_ci_half_width(t)
    assert float(p[np.abs(x) <= h].sum()) >= 0.95
    assert h == 0 or float(p[np.abs(x) <= h - 1].sum()) < 0.95


@pytest.mark.parametrize("sigma", [0.4, 1.0, 3.0, 50.0, 9000.0])
def test_gaussian_stddev_and_ci(sigma: float) -> None:
    """Discrete Gaussian σ and h agree with a direct pmf sum (σ → its parameter once σ ≳ 2)."""
    top = int(40 * sigma) + 40
    x = np.arange(-top, top + 1, dtype=float)
    w = np.exp(-(x * x) / (2 * sigma * sigma))
    p = w / w.sum()
    assert discrete.gaussian_stddev(sigma) == pytest.approx(math.sqrt(float(np.dot(x * x, p))), rel=1e-9)
    h = discrete.gaussian_ci_half_width(sigma)
    assert float(p[np.abs(x) <= h].sum()) >= 0.95
    assert h == 0 or float(p[np.abs(x) <= h - 1].sum()) < 0.95


def test_continuous_limit() -> None:
    """For large scales the half-widths approach the continuous ones (b·ln 20, 1.96σ)."""
    assert discrete.laplace_ci_half_width(1e4) == pytest.approx(1e4 * math.log(20), rel=1e-3)
    assert discrete.gaussian_ci_half_width(1e5) == pytest.approx(1.959964e5, rel=1e-4)
