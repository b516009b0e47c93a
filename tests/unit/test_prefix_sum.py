"""The square-root factorization of the prefix sums and the running-total mechanism built on it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpstream.topology.errors import InternalError
from dpstream.workers.noise import prefix_sum as ps


def test_coefficients_match_binomials() -> None:
    """c_k from the recurrence equals binom(2k, k)/4^k computed exactly, to 1 ulp-scale, for k < 200."""
    c = ps.coefficients(200)
    exact = [math.comb(2 * k, k) / 4**k for k in range(200)]
    assert np.allclose(c, exact, rtol=1e-13, atol=0.0)
    assert c[:4].tolist() == [1.0, 0.5, 0.375, 0.3125]


@pytest.mark.parametrize("T", [1, 2, 64, 1440])
def test_c_squared_is_prefix_sum(T: int) -> None:
    """C·C is the lower-triangular all-ones matrix to 1e-12 for T up to 1,440; C⁻¹ inverts C."""
    C = ps.toeplitz(ps.coefficients(T))
    assert np.max(np.abs(C @ C - np.tril(np.ones((T, T))))) < 1e-12
    assert np.max(np.abs(ps.toeplitz(ps.inverse_coefficients(T)) @ C - np.eye(T))) < 1e-12


def test_variance_is_row_norm() -> None:
    """variance(t, σ) is σ² times the squared row t of C, and its sum at T = 1,440 is 3.381."""
    T, sigma = 100, 2.5
    C = ps.toeplitz(ps.coefficients(T))
    for t in (1, 2, 50, 100):
        assert math.isclose(ps.variance(t, sigma), sigma**2 * float(C[t - 1] @ C[t - 1]), rel_tol=1e-12)
    assert math.isclose(ps.variance(1440, 1.0), 3.3811, rel_tol=1e-4)
    assert math.isclose(ps.ci_half_width(1, 2.0), ps.Z95 * 2.0)


def test_sensitivity_is_max_column_norm() -> None:
    """L·‖c‖₂ is the largest ‖C u‖₂ over the L1 ball of radius L: column 0 (every column's norm checked)."""
    T, L = 200, 3.0
    C = ps.toeplitz(ps.coefficients(T))
    cols = np.linalg.norm(C, axis=0)
    assert int(np.argmax(cols)) == 0
    assert math.isclose(L * float(cols.max()), ps.period_measurement(T, L, 1.0).d_in, rel_tol=1e-12)


@pytest.mark.parametrize(("T", "L", "sigma"), [(64, 1.0, 1.0), (1440, 10.0, 37.5), (86_400, 1.0, 3.0)])
def test_period_rho_from_opendp(T: int, L: float, sigma: float) -> None:
    """OpenDP's map at d_in = L‖c‖₂ equals (L‖c‖₂)²/(2σ²) to 1e-15 and is not below it (rounding only inflates)."""
    p = ps.period_measurement(T, L, sigma)
    assert p.rho >= p.rho_closed_form
    assert math.isclose(p.rho, p.rho_closed_form, rel_tol=1e-15)
    assert ps.period_rho(T, L, sigma) == p.rho


def test_sigma_for_rho_stays_within() -> None:
    """The calibrated σ maps the period to at most ρ, and one ulp less would not."""
    s = ps.sigma_for_rho(1440, 2.0, 0.25)
    assert ps.period_rho(1440, 2.0, s) <= 0.25
    assert math.isclose(ps.period_rho(1440, 2.0, s), 0.25, rel_tol=1e-14)


def test_step_publishes_c_times_y() -> None:
    """Each step publishes (C y)_t, and y − C x is the noise: published − prefix = C(y − C x)."""
    T = 32
    rt = ps.RunningState(T)
    x = np.arange(T, dtype=float) % 5
    pub = np.array([rt.step(np.array([v]), 4.0)[0] for v in x])
    C = ps.toeplitz(ps.coefficients(T))
    ys = rt.ys[0]
    assert np.allclose(pub, C @ ys, rtol=1e-12, atol=1e-9)
    z = ys - C @ x
    assert np.allclose(pub - np.cumsum(x), C @ z, atol=1e-9)
    assert np.all(z != 0.0)  # noise was drawn at every step
    assert np.array_equal(rt.xs[0], x)


def test_restore_recomputes_identical_totals() -> None:
    """A restart from stored x's and y's republishes bit-identical totals and continues the period."""
    T = 50
    first = ps.RunningState(T)
    pub = [first.step(np.array([float(i % 3)]), 2.0)[0] for i in range(20)]
    again = ps.RunningState(T).restore(first.xs[:, :20].copy(), first.ys[:, :20].copy())
    assert np.allclose(again.published()[0], pub, rtol=1e-12, atol=1e-9)
    assert again.published().tolist() == first.published().tolist()
    assert again.steps == 20
    nxt = again.step(np.ones(1), 2.0)
    assert again.published()[:, :20].tolist() == first.published().tolist()
    assert np.allclose(again.published()[:, -1], nxt, rtol=1e-12, atol=1e-9)


def test_refusals() -> None:
    """Past the period, non-finite input, bad σ / L and mismatched restores are refused."""
    rt = ps.RunningState(1)
    rt.step(np.ones(1), 1.0)
    with pytest.raises(InternalError):
        rt.step(np.ones(1), 1.0)
    with pytest.raises(InternalError):
        ps.RunningState(3).step(np.array([math.nan]), 1.0)
    with pytest.raises(InternalError):
        ps.RunningState(3).step(np.ones(1), 0.0)
    with pytest.raises(InternalError):
        ps.RunningState(3, keys=2).step(np.ones(1), 1.0)
    with pytest.raises(InternalError):
        ps.period_measurement(3, 0.0, 1.0)
    with pytest.raises(InternalError):
        ps.RunningState(3).restore(np.ones((1, 2)), np.ones((1, 3)))
    with pytest.raises(InternalError):
        ps.coefficients(0)


def test_step_norms_are_the_coefficient_norms_of_every_prefix():
    """`step_norms(T)[t-1]` is `coefficient_norm(t)` (what a step's std is over σ), at every t of a day
    of minutes and at sampled t of a day of seconds, to the last ulp or one."""
    from dpstream.topology.running_total import coefficient_norm, step_norms

    norms = step_norms(1440)
    assert all(math.isclose(norms[t - 1], coefficient_norm(t), rel_tol=2e-16) for t in range(1, 1441))
    long = step_norms(86_400)
    for t in (1, 7, 999, 43_210, 86_400):
        assert math.isclose(long[t - 1], coefficient_norm(t), rel_tol=2e-16)
