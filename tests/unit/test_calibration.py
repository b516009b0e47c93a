"""Tests of topology.calibration: scales that make each noisy part cost exactly its share."""

import math

import pytest

from dpstream.topology import accounting as acc
from dpstream.topology.calibration import MEAN_SUM_SHARE, Z95, calibrate, continuous_ci_half_width
from dpstream.topology.errors import InternalError
from dpstream.topology.model import Accounting, Aggregate, Bounds, Contribution, Mechanism, Metric, Window


def _metric(aggregate=Aggregate.COUNT, mechanism=Mechanism.GAUSSIAN, **kw) -> Metric:
    return Metric("m", "s", "b", 1.0, Window(60, 60), aggregate, mechanism, **kw)


def test_gaussian_sigma_recovers_the_allowed_rho():
    """σ of a Gaussian part gives back exactly the ρ it was granted."""
    (c,) = calibrate(_metric(contribution=Contribution(max_per_key=5)), Accounting.ZCDP, 1e-4)
    assert acc.gaussian_rho(5.0, c.scale) == pytest.approx(1e-4, rel=1e-12)
    assert c.stddev == c.scale and c.epsilon is None


def test_reference_sigma_for_1440_counts_a_day():
    """ρ*/1440 for (ε=1, δ=1e-6) calibrates a sensitivity-1 count to σ ≈ 171.93 (within 0.5 %)."""
    (c,) = calibrate(_metric(), Accounting.ZCDP, acc.rho_cap(1.0, 1e-6) / 1440)
    assert c.scale == pytest.approx(171.93, rel=5e-3)


def test_laplace_in_pure_scope_has_b_sensitivity_over_epsilon():
    """Pure scope: a Laplace part granted ε gets b = Δ₁/ε (worked example: ε 0.4 → b 2.5)."""
    (c,) = calibrate(_metric(mechanism=Mechanism.LAPLACE), Accounting.PURE, 0.4)
    assert c.scale == pytest.approx(2.5) and c.epsilon == pytest.approx(0.4)
    assert c.stddev == pytest.approx(2.5 * math.sqrt(2))


def test_laplace_in_zcdp_scope_costs_epsilon_squared_over_two():
    """zCDP scope: a Laplace part granted ρ runs at ε = √(2ρ)."""
    (c,) = calibrate(_metric(mechanism=Mechanism.LAPLACE), Accounting.ZCDP, 0.02)
    assert c.epsilon == pytest.approx(0.2) and acc.pure_to_rho(acc.laplace_epsilon(1.0, c.scale)) == pytest.approx(0.02)


def test_top_k_scale_in_pure_and_zcdp_scopes():
    """Top-k over declared keys: pure ε → scale 2kΔ∞/ε; in zCDP its ρ maps back through k(2Δ∞/scale)²/8."""
    m = _metric(Aggregate.TOP_K, Mechanism.EXPONENTIAL, group_by="ref", keys=tuple("abcdefg"), k=5)
    (pure,) = calibrate(m, Accounting.PURE, 0.5)
    assert pure.scale == pytest.approx(20.0) and pure.stddev == 0.0
    (zcdp,) = calibrate(m, Accounting.ZCDP, 1e-3)
    assert acc.top_k_rho(5, 1.0, zcdp.scale) == pytest.approx(1e-3, rel=1e-12)


def test_noisy_mean_splits_cost_between_sum_and_count():
    """A mean without public n spends MEAN_SUM_SHARE on its sum and the rest on its count; total = granted."""
    m = _metric(Aggregate.MEAN, value="v", bounds=Bounds(0.0, 3600.0))
    total, count = calibrate(m, Accounting.ZCDP, 2e-4)
    assert total.cost == pytest.approx(2e-4 * MEAN_SUM_SHARE) and count.cost + total.cost == pytest.approx(2e-4)
    assert acc.gaussian_rho(1800.0, total.scale) == pytest.approx(total.cost)
    assert acc.gaussian_rho(1.0, count.scale) == pytest.approx(count.cost)


def test_ci_half_widths_of_laplace_and_gaussian():
    """95 % half-widths: Laplace b·ln 20, Gaussian 1.95996·σ; other levels via the normal quantile."""
    assert continuous_ci_half_width(Mechanism.LAPLACE, 2.0, 0.95) == pytest.approx(2.0 * math.log(20))
    assert continuous_ci_half_width(Mechanism.GAUSSIAN, 3.0, 0.95) == pytest.approx(3.0 * Z95)
    assert continuous_ci_half_width(Mechanism.GAUSSIAN, 1.0, 0.99) == pytest.approx(2.5758293, rel=1e-6)
    assert continuous_ci_half_width(Mechanism.EXPONENTIAL, 1.0, 0.95) == 0.0


def test_ci_half_width_covers_its_level():
    """P(|noise| ≤ h) equals the level for both continuous distributions."""
    h = continuous_ci_half_width(Mechanism.LAPLACE, 1.7, 0.9)
    assert 1 - math.exp(-h / 1.7) == pytest.approx(0.9)
    h = continuous_ci_half_width(Mechanism.GAUSSIAN, 1.7, 0.9)
    assert math.erf(h / (1.7 * math.sqrt(2))) == pytest.approx(0.9)


def test_gaussian_in_pure_scope_and_zero_cost_are_bugs():
    """Gaussian noise in a pure scope, or a non-positive grant, is an internal error."""
    with pytest.raises(InternalError):
        calibrate(_metric(), Accounting.PURE, 0.1)
    with pytest.raises(InternalError):
        calibrate(_metric(), Accounting.ZCDP, 0.0)


def test_top_k_over_data_keys_splits_cost_between_selection_and_ranking():
    """Top-k over data-derived keys: a thresholded count ('selection') and the top-k ('value') share the cost."""
    m = _metric(Aggregate.TOP_K, Mechanism.EXPONENTIAL, group_by="ref", k=5, contribution=Contribution(2, 1))
    selection, top = calibrate(m, Accounting.PURE, 0.5)
    assert (selection.component, selection.mechanism, top.component) == ("selection", Mechanism.LAPLACE, "value")
    assert selection.cost + top.cost == pytest.approx(0.5)
    assert selection.scale == pytest.approx(2.0 / selection.cost)  # Δ₁ = max_keys × max_per_key = 2
    assert top.scale == pytest.approx(2 * 5 / top.cost)
    z_selection, z_top = calibrate(m, Accounting.ZCDP, 1e-3)
    assert z_selection.mechanism is Mechanism.GAUSSIAN
    assert acc.gaussian_rho(math.sqrt(2), z_selection.scale) + acc.top_k_rho(5, 1.0, z_top.scale) == pytest.approx(1e-3)


def test_normal_quantile_is_the_smallest_float_covering_p() -> None:
    """One quantile for calibration and the discrete CI: Φ(z) ≥ p at z and < p one float below,
    and it agrees with the stdlib's inverse CDF (rounded up, so a CI covers at least its level)."""
    import math
    from statistics import NormalDist

    from dpstream.topology.calibration import normal_quantile

    phi = NormalDist().cdf
    for p in (0.5, 0.8, 0.9, 0.95, 0.975, 0.99, 0.999, 1 - 1e-9):
        z = normal_quantile(p)
        assert 0.5 * math.erfc(-z / math.sqrt(2.0)) >= p
        below = math.nextafter(z, -math.inf)
        assert 0.5 * math.erfc(-below / math.sqrt(2.0)) < p
        assert abs(z - NormalDist().inv_cdf(p)) < 1e-8  # near p = 1, Φ itself is resolved to ~1e-16
        assert phi(z) >= p - 1e-15
