"""Tests of topology.accounting: costs equal OpenDP's privacy maps, and the CKS20 cap and conversion."""

import math

import opendp.prelude as dp
import pytest

from dpstream.topology import accounting as acc

dp.enable_features("contrib")

_INT = dp.atom_domain(T=int)
_INT_VEC = dp.vector_domain(dp.atom_domain(T=int))


def test_reference_cap_for_epsilon_one_delta_1e6():
    """ρ* for (ε = 1, δ = 1e-6) is 0.024356 (DESIGN §1's reference scope)."""
    assert acc.rho_cap(1.0, 1e-6) == pytest.approx(0.0243560, abs=5e-7)


@pytest.mark.parametrize("epsilon,delta", [(0.1, 1e-6), (1.0, 1e-6), (1.0, 1e-9), (2.0, 1e-5), (10.0, 1e-8)])
def test_cap_is_the_largest_rho_that_fits(epsilon, delta):
    """ε(ρ*) equals the scope ε, and any larger ρ overshoots it: ρ* is tight."""
    cap = acc.rho_cap(epsilon, delta)
    assert acc.epsilon_from_rho(cap, delta) <= epsilon
    assert acc.epsilon_from_rho(cap, delta) == pytest.approx(epsilon, rel=1e-9)
    assert acc.epsilon_from_rho(cap * (1 + 1e-6), delta) > epsilon


@pytest.mark.parametrize("rho", [1e-14, 1e-10, 1e-7, 1e-5, 1e-3, 0.0243, 0.1, 1.0, 5.0, 100.0])
@pytest.mark.parametrize("delta", [1e-12, 1e-6, 1e-3])
def test_epsilon_from_rho_matches_opendp_zcdp_to_approxdp(rho, delta):
    """The CKS20 conversion equals OpenDP's make_zCDP_to_approxDP on a Gaussian of that ρ."""
    sigma = 1.0 / math.sqrt(2.0 * rho)
    gaussian = dp.m.make_gaussian(dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=sigma)
    expected = dp.c.make_zCDP_to_approxDP(gaussian).map(1.0).epsilon(delta)
    assert acc.epsilon_from_rho(rho, delta) == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert acc.epsilon_from_rho(rho, delta) >= expected * (1 - 1e-9)


def test_epsilon_from_rho_is_monotone_in_rho_and_delta():
    """More ρ never buys a smaller ε (strictly, while ε > 0); a larger δ never costs a larger ε."""
    rhos = [10.0**k for k in range(-8, 2)]
    for delta in (1e-12, 1e-9, 1e-6):
        eps = [acc.epsilon_from_rho(r, delta) for r in rhos]
        assert eps == sorted(eps) and len(set(eps)) == len(eps)
    for rho in rhos:
        eps = [acc.epsilon_from_rho(rho, d) for d in (1e-12, 1e-9, 1e-6, 1e-3)]
        assert eps == sorted(eps, reverse=True)


def test_rho_cap_is_monotone_in_epsilon_and_delta():
    """A larger ε or δ always allows a larger cap ρ*."""
    caps = [acc.rho_cap(e, 1e-6) for e in (0.01, 0.1, 0.5, 1.0, 2.0, 8.0)]
    assert caps == sorted(caps) and len(set(caps)) == len(caps)
    caps = [acc.rho_cap(1.0, d) for d in (1e-12, 1e-9, 1e-6, 1e-3)]
    assert caps == sorted(caps) and len(set(caps)) == len(caps)


def test_tiny_rho_at_large_delta_is_free():
    """A ρ so small that the Gaussian's δ at ε = 0 is already below the target gives ε = 0, as in OpenDP."""
    assert acc.epsilon_from_rho(1e-9, 1e-3) == 0.0
    assert acc.epsilon_from_rho(1e-5, 1e-3) > 0.0


def test_epsilon_from_rho_zero_and_bad_inputs():
    """ρ = 0 is free; negative ρ or δ outside (0, 1) are rejected."""
    assert acc.epsilon_from_rho(0.0, 1e-6) == 0.0
    for rho, delta in ((-1e-3, 1e-6), (0.1, 0.0), (0.1, 1.0)):
        with pytest.raises(ValueError):
            acc.epsilon_from_rho(rho, delta)
    with pytest.raises(ValueError):
        acc.rho_cap(0.0, 1e-6)


def test_epsilon_from_rho_improves_on_the_classic_bound():
    """CKS20 is never looser than the classic ρ + 2√(ρ log 1/δ) bound (it improves on it)."""
    for rho in (1e-6, 1e-3, 0.05, 1.0):
        for delta in (1e-9, 1e-6):
            assert acc.epsilon_from_rho(rho, delta) <= rho + 2 * math.sqrt(rho * math.log(1 / delta))


@pytest.mark.parametrize("sens,sigma", [(1, 171.93), (3, 2.5), (12, 40.0)])
def test_gaussian_rho_equals_opendp_map(sens, sigma):
    """Δ₂²/(2σ²) equals the privacy map of OpenDP's integer make_gaussian at d_in = Δ₂."""
    meas = dp.m.make_gaussian(_INT, dp.absolute_distance(T=int), scale=sigma)
    assert acc.gaussian_rho(sens, sigma) == pytest.approx(meas.map(sens), rel=1e-12)
    assert acc.gaussian_sigma_for_rho(sens, acc.gaussian_rho(sens, sigma)) == pytest.approx(sigma, rel=1e-12)


def test_gaussian_vector_rho_equals_opendp_map_in_l2():
    """For a vector release the L2 sensitivity enters the ρ exactly as in OpenDP's l2 map."""
    meas = dp.m.make_gaussian(_INT_VEC, dp.l2_distance(T=int), scale=7.0)
    assert acc.gaussian_rho(4, 7.0) == pytest.approx(meas.map(4), rel=1e-12)


@pytest.mark.parametrize("sens,scale", [(1, 2.5), (100, 166.0), (3, 0.75)])
def test_laplace_epsilon_equals_opendp_discrete_laplace_map(sens, scale):
    """Δ₁/b equals the privacy map of OpenDP's integer (discrete) make_laplace, and its zCDP cost is ε²/2."""
    meas = dp.m.make_laplace(_INT, dp.absolute_distance(T=int), scale=scale)
    eps = acc.laplace_epsilon(sens, scale)
    assert eps == pytest.approx(meas.map(sens), rel=1e-12)
    assert acc.laplace_scale_for_epsilon(sens, eps) == pytest.approx(scale, rel=1e-12)
    zcdp = dp.c.make_pureDP_to_zCDP(meas)
    assert acc.pure_to_rho(eps) == pytest.approx(zcdp.map(sens), rel=1e-12)
    assert acc.rho_to_pure(acc.pure_to_rho(eps)) == pytest.approx(eps, rel=1e-12)


def test_laplace_vector_epsilon_equals_opendp_map_in_l1():
    """For a vector release the L1 sensitivity enters ε as in OpenDP's l1 map."""
    meas = dp.m.make_laplace(_INT_VEC, dp.l1_distance(T=int), scale=3.0)
    assert acc.laplace_epsilon(5, 3.0) == pytest.approx(meas.map(5), rel=1e-12)


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("linf,scale", [(1, 4.0), (2, 20.0)])
def test_top_k_costs_equal_opendp_noisy_top_k_maps(k, linf, scale):
    """2kΔ∞/scale (pure) and k(2Δ∞/scale)²/8 (zCDP) equal OpenDP's make_noisy_top_k maps."""
    metric = dp.linf_distance(T=int)
    pure = dp.m.make_noisy_top_k(_INT_VEC, metric, dp.max_divergence(), k=k, scale=scale)
    zcdp = dp.m.make_noisy_top_k(_INT_VEC, metric, dp.zero_concentrated_divergence(), k=k, scale=scale)
    assert acc.top_k_epsilon(k, linf, scale) == pytest.approx(pure.map(linf), rel=1e-12)
    assert acc.top_k_rho(k, linf, scale) == pytest.approx(zcdp.map(linf), rel=1e-12)


@pytest.mark.parametrize("k", [1, 5])
def test_top_k_inverses_round_trip(k):
    """Scale from ε and ε from ρ invert the cost functions."""
    scale = acc.top_k_scale_for_epsilon(k, 1.0, 0.5)
    assert acc.top_k_epsilon(k, 1.0, scale) == pytest.approx(0.5)
    rho = acc.top_k_rho(k, 1.0, scale)
    assert acc.top_k_epsilon_for_rho(k, rho) == pytest.approx(0.5)
