"""Clopper–Pearson bounds and χ² p-values without scipy, checked against scipy."""

from __future__ import annotations

import pytest

from dpstream.workers.audit.stats import betainc, chi2_sf, clopper_pearson

scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize("k,n", [(0, 10), (1, 1), (3, 100_000), (347, 50_000), (5_000, 10_000), (9_999, 10_000)])
@pytest.mark.parametrize("alpha", [0.05, 1e-7])
def test_clopper_pearson_matches_beta_quantiles(k: int, n: int, alpha: float) -> None:
    """Bounds equal the Beta quantiles that define the exact interval."""
    lo, hi = clopper_pearson(k, n, alpha)
    ref_lo = 0.0 if k == 0 else scipy_stats.beta.ppf(alpha / 2, k, n - k + 1)
    ref_hi = 1.0 if k == n else scipy_stats.beta.ppf(1 - alpha / 2, k + 1, n - k)
    assert lo == pytest.approx(ref_lo, rel=1e-8, abs=1e-15)
    assert hi == pytest.approx(ref_hi, rel=1e-8, abs=1e-15)


@pytest.mark.parametrize("x,dof", [(0.1, 1), (3.0, 5), (50.0, 19), (200.0, 150), (1e3, 30)])
def test_chi2_sf_matches_scipy(x: float, dof: int) -> None:
    """The χ² survival function matches scipy's to 1e-9 relative."""
    assert chi2_sf(x, dof) == pytest.approx(scipy_stats.chi2.sf(x, dof), rel=1e-9, abs=1e-300)


def test_betainc_symmetry() -> None:
    """I_x(a, b) = 1 − I_{1−x}(b, a)."""
    assert betainc(2.5, 3.5, 0.3) == pytest.approx(1 - betainc(3.5, 2.5, 0.7), rel=1e-12)


def test_clopper_pearson_rejects_bad_input() -> None:
    """k outside [0, n] is a caller bug."""
    with pytest.raises(ValueError):
        clopper_pearson(5, 4, 0.05)
