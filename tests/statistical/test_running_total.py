"""Running-total noise, in process: per-step 95 % CIs cover 95 % ± 1 %, and C⁻¹ whitens the noise to i.i.d. σ².

Many simulated periods of T = 64 steps, drawn by the mechanism's own OpenDP float Gaussian
(`prefix_sum.draw`, scale σ, grid 2^K_GRID): one call per chunk of periods on the data-side values
(C x)_t, which OpenDP samples coordinate by coordinate exactly as `RunningState.step` does with its
one-coordinate call (~200 µs a call, the wrapper; ~15 µs a coordinate in a batch). The step() path
itself is checked on 1,000 periods (~130 µs a step). Every bound is an exact tail bound at a false-failure rate
below 1e-6 (union over the checks), never a retry; OpenDP cannot be seeded and is not.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest

from dpstream.workers.noise import prefix_sum as ps

pytestmark = pytest.mark.statistical

T = 64
SIGMA = 3.0
ALPHA = 1e-6
"""False-failure rate of each test, by construction."""

P = 0.95
"""Coverage of the 95 % interval of a Gaussian: exact for OpenDP's float Gaussian (grid 2^-60)."""

CHUNK = 256
"""Periods per OpenDP call."""


def _log_pmf(n: int, k: int, p: float) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p) + (n - k) * math.log1p(-p)


def _tails(n: int, lo: int, hi: int, p: float) -> tuple[float, float]:
    """P(X < lo) and P(X > hi) for X ~ Binomial(n, p), summed exactly term by term."""
    below = math.fsum(math.exp(_log_pmf(n, k, p)) for k in range(0, lo))
    above = math.fsum(math.exp(_log_pmf(n, k, p)) for k in range(hi + 1, n + 1))
    return below, above


def periods_for_coverage(steps: int, p: float = P, margin: float = 0.01, alpha: float = ALPHA) -> int:
    """Fewest periods n (to the next 500) whose acceptance region [⌈(p-margin)n⌉, ⌊(p+margin)n⌋] has
    exact binomial tail mass ≤ alpha/steps at every step (union bound over the steps)."""
    n = 1000
    while True:
        lo, hi = math.ceil((p - margin) * n), math.floor((p + margin) * n)
        if sum(_tails(n, lo, hi, p)) <= alpha / steps:
            return n
        n += 500


def _increments() -> np.ndarray:
    """Per-step increments of one period (integers as counts are; their values do not change the noise)."""
    return ((np.arange(T) * 7) % 11).astype(float)


@cache
def simulated_errors(n: int) -> np.ndarray:
    """n periods' published totals minus the true prefix sums (n × T), by the mechanism's draws."""
    C = ps.toeplitz(ps.coefficients(T))
    x = _increments()
    cx = C @ x
    out = np.empty((n, T))
    for start in range(0, n, CHUNK):
        m = min(CHUNK, n - start)
        y = ps.draw(np.tile(cx, m), SIGMA).reshape(m, T)
        out[start : start + m] = y @ C.T - np.cumsum(x)
    return out


def _chi2_dev(n: int, x: float) -> float:
    """Laurent–Massart: |χ²_n/n − 1| ≤ (2√(n x) + 2x)/n except with probability ≤ 2e^(-x)."""
    return (2 * math.sqrt(n * x) + 2 * x) / n


def test_per_step_ci_coverage() -> None:
    """At every step the 95 % CI from σ² Σ c_k² covers the true total 95 % ± 1 % (exact binomial, 1e-6)."""
    n = periods_for_coverage(T)
    lo, hi = math.ceil((P - 0.01) * n), math.floor((P + 0.01) * n)
    print(f"{n} simulated periods of T = {T}: per-step acceptance [{lo}, {hi}] covered, tails {_tails(n, lo, hi, P)}")
    err = simulated_errors(n)
    half = np.array([ps.ci_half_width(t, SIGMA) for t in range(1, T + 1)])
    covered = np.sum(np.abs(err) <= half, axis=0)
    print(f"  coverage per step: min {covered.min() / n:.4f}, max {covered.max() / n:.4f}")
    bad = {t + 1: int(k) for t, k in enumerate(covered) if not lo <= k <= hi}
    assert bad == {}, f"steps outside [{lo}, {hi}] of {n}: {bad}"


def test_whitened_noise_is_iid() -> None:
    """C⁻¹(published − prefix) has sample covariance σ²·I: every entry within its Laurent–Massart bound.

    For i.i.d. N(0, σ²) coordinates n·S_ii/σ² ~ χ²_n, and n·S_ij/σ² = (U − V)/2 with U, V independent
    χ²_n (w_i w_j = ((w_i+w_j)² − (w_i−w_j)²)/4); union over the T(T+1)/2 entries at 1e-6. The same
    bound refuses the unwhitened noise (correlation of steps 1 and 2 is 0.447).
    """
    n = periods_for_coverage(T)
    err = simulated_errors(n)
    D = ps.toeplitz(ps.inverse_coefficients(T))
    w = err @ D.T
    S = (w.T @ w) / (n * SIGMA**2)
    x = math.log((2 * T + 4 * T * (T - 1) / 2) / ALPHA)
    dev = _chi2_dev(n, x)
    print(f"{n} periods: |S − I| max {np.max(np.abs(S - np.eye(T))):.4f}, bound {dev:.4f}")
    assert np.max(np.abs(np.diag(S) - 1.0)) <= dev
    assert np.max(np.abs(S - np.diag(np.diag(S)))) <= dev
    raw = err / np.sqrt([ps.variance(t, SIGMA) for t in range(1, T + 1)])
    assert abs(float(raw[:, 0] @ raw[:, 1]) / n) > dev  # the test sees correlation when it is there


def test_step_path_noise_is_iid() -> None:
    """Through `RunningState.step`: the whitened noise of 1,000 periods has variance σ² and no lag-1 correlation."""
    periods = 1000
    x = _increments()
    D = ps.toeplitz(ps.inverse_coefficients(T))
    prefix = np.cumsum(x)
    w = np.empty((periods, T))
    for i in range(periods):
        rt = ps.RunningState(T)
        pub = np.array([rt.step(np.array([v]), SIGMA)[0] for v in x])
        w[i] = D @ (pub - prefix) / SIGMA
    n = w.size
    xb = math.log(10 / ALPHA)  # variance two-sided (2e^-x) + two lag checks as (U − V)/2 (4e^-x each)
    var = float(np.sum(w**2)) / n
    print(f"step path, {periods} periods: variance/σ² {var:.4f}, bound {_chi2_dev(n, xb):.4f}")
    assert abs(var - 1.0) <= _chi2_dev(n, xb)
    # lag-1 products share coordinates; the even pairs (w_0 w_1, w_2 w_3, …) are independent, so are the odd
    for parity in (0, 1):
        pairs = w[:, parity : T - 1 : 2] * w[:, parity + 1 : T : 2]
        lag = float(pairs.sum()) / pairs.size
        print(f"  lag-1 ({'even' if parity == 0 else 'odd'} pairs) {lag:+.4f}, bound {_chi2_dev(pairs.size, xb):.4f}")
        assert abs(lag) <= _chi2_dev(pairs.size, xb)
