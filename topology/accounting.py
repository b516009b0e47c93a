"""Privacy accounting arithmetic: costs of releases, the zCDP cap, conversions.

Every formula here matches the privacy map of the OpenDP measurement dpstream samples with
(checked by the mechanisms before first use, and by tests against OpenDP and dp-accounting):

- discrete Gaussian (OpenDP `make_gaussian` on integers): ρ = Δ₂² / (2σ²);
- discrete Laplace (OpenDP `make_laplace` on integers): ε = Δ₁ / b; in a zCDP scope ρ = ε²/2;
- noisy top-k (OpenDP `make_noisy_top_k`, k one-shot Gumbel selections, score sensitivity Δ∞):
  pure ε = 2kΔ∞ / scale; in a zCDP scope ρ = k·(2Δ∞/scale)²/8 = ε²/(8k);
- the cap ρ* of a zCDP scope is the largest ρ whose (ε, δ) by Canonne–Kamath–Steinke 2020
  (the conversion OpenDP's `make_zCDP_to_approxDP` uses) fits the scope's (ε, δ).

The two numerical conversions (`epsilon_from_rho`, solved by golden-section search, and
`rho_cap`, a bisection over it) are pure functions of their float arguments, memoised by exact
value: a release is priced at one of a handful of costs per period, so every release after the
first at a cost is a dictionary look-up. `fn.__wrapped__` is the uncached function.
"""

from __future__ import annotations

__all__ = [
    "SELECTION_DELTA_SHARE",
    "EpsilonEquivalent",
    "conversion_delta",
    "epsilon_equivalent",
    "epsilon_from_rho",
    "rho_cap",
    "gaussian_rho",
    "gaussian_sigma_for_rho",
    "laplace_epsilon",
    "laplace_scale_for_epsilon",
    "pure_to_rho",
    "rho_to_pure",
    "top_k_epsilon",
    "top_k_scale_for_epsilon",
    "top_k_rho",
    "top_k_epsilon_for_rho",
]

import math
from dataclasses import dataclass
from functools import lru_cache

SELECTION_DELTA_SHARE = 0.1
"""Fraction of a zCDP scope's δ set aside for partition selection (when any of its metrics selects)."""

_LOG_ALPHA_MIN_LOG = -20.0  # search log(α − 1) over [-20, 40]: exact down to ρ ≈ 1e-30
_LOG_ALPHA_MAX = 40.0


def _cks_epsilon(rho: float, delta: float, alpha: float) -> float:
    """ε at Rényi order α of a ρ-zCDP mechanism at δ (CKS20, Proposition 12)."""
    return rho * alpha + (math.log(1.0 / delta) + (alpha - 1.0) * math.log1p(-1.0 / alpha) - math.log(alpha)) / (
        alpha - 1.0
    )


@lru_cache(maxsize=4096)
def epsilon_from_rho(rho: float, delta: float) -> float:
    """Smallest ε such that ρ-zCDP implies (ε, δ)-DP, by the CKS20 conversion.

    The bound is convex in log(α − 1); golden-section search over that variable is exact to
    well below 1e-12 relative. Memoised by the exact (rho, delta) (pure; errors are not cached).
    """
    if rho < 0 or not 0 < delta < 1:
        raise ValueError(f"need rho >= 0 and 0 < delta < 1, got rho={rho}, delta={delta}")
    if rho == 0:
        return 0.0
    lo, hi = _LOG_ALPHA_MIN_LOG, _LOG_ALPHA_MAX

    def f(t: float) -> float:
        return _cks_epsilon(rho, delta, 1.0 + math.exp(t))

    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(200):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    return max(0.0, min(fc, fd))


@lru_cache(maxsize=256)
def rho_cap(epsilon: float, delta: float) -> float:
    """Largest ρ whose CKS20 (ε, δ) conversion is at most (epsilon, delta): the scope cap ρ*.

    Memoised by the exact (epsilon, delta); its 200 bisection steps use the uncached conversion
    so that a cap computation does not flush the release costs out of `epsilon_from_rho`'s cache.

    >>> round(rho_cap(1.0, 1e-6), 6)
    0.024356
    """
    if epsilon <= 0 or not 0 < delta < 1:
        raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got epsilon={epsilon}, delta={delta}")
    lo, hi = 0.0, epsilon  # ε(ρ) ≥ ρ, so ρ* < ε
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if _epsilon_from_rho_uncached(mid, delta) <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo


_epsilon_from_rho_uncached = epsilon_from_rho.__wrapped__


def conversion_delta(zcdp: bool, delta: float, selects: bool) -> float:
    """The δ at which a scope's cap was converted, and so every ε-equivalent of it: a zCDP scope's δ
    less the share set aside for partition selection when a metric of it selects; 0 in a pure scope.

    >>> conversion_delta(True, 1e-6, True) == 1e-6 - 1e-6 * SELECTION_DELTA_SHARE
    True
    """
    if not zcdp:
        return 0.0
    return delta - delta * SELECTION_DELTA_SHARE if selects else delta


@dataclass(frozen=True, slots=True)
class EpsilonEquivalent:
    """The (ε, δ) a spend amounts to: what status, records and the exported gauges show."""

    epsilon: float
    delta: float
    """The δ the ε holds at: the conversion δ (zCDP), 0 (pure)."""

    def __str__(self) -> str:
        return f"ε={self.epsilon:.4g} at δ={self.delta:g}"


def epsilon_equivalent(zcdp: bool, spend: float, conversion: float) -> EpsilonEquivalent:
    """The ε of a spend in its scope's currency at `conversion`, the δ the scope's cap was converted
    at (`conversion_delta`): ρ by the CKS20 conversion (zCDP), ε itself (pure). The one place an
    ε-equivalent is computed (plan, status, records, exported gauges), so the ε shown and the δ
    beside it are the cap's.

    >>> cap = rho_cap(1.0, conversion_delta(True, 1e-6, True))
    >>> str(epsilon_equivalent(True, cap, conversion_delta(True, 1e-6, True)))
    'ε=1 at δ=9e-07'
    """
    if not zcdp:
        return EpsilonEquivalent(spend, 0.0)
    return EpsilonEquivalent(epsilon_from_rho(spend, conversion) if spend > 0 else 0.0, conversion)


def gaussian_rho(l2_sensitivity: float, sigma: float) -> float:
    """ρ of the (discrete) Gaussian mechanism: Δ₂² / (2σ²)."""
    return l2_sensitivity**2 / (2.0 * sigma**2)


def gaussian_sigma_for_rho(l2_sensitivity: float, rho: float) -> float:
    """σ that makes the Gaussian mechanism cost exactly ρ: Δ₂ / √(2ρ)."""
    return l2_sensitivity / math.sqrt(2.0 * rho)


def laplace_epsilon(l1_sensitivity: float, scale: float) -> float:
    """ε of the (discrete) Laplace mechanism: Δ₁ / b."""
    return l1_sensitivity / scale


def laplace_scale_for_epsilon(l1_sensitivity: float, epsilon: float) -> float:
    """Laplace scale b that costs exactly ε: Δ₁ / ε."""
    return l1_sensitivity / epsilon


def pure_to_rho(epsilon: float) -> float:
    """ρ of a pure ε-DP release (ε-DP implies ε²/2-zCDP)."""
    return epsilon**2 / 2.0


def rho_to_pure(rho: float) -> float:
    """The pure ε whose zCDP cost is ρ: √(2ρ)."""
    return math.sqrt(2.0 * rho)


def top_k_epsilon(k: int, linf_sensitivity: float, scale: float) -> float:
    """Pure ε of OpenDP's noisy top-k (k Gumbel selections): 2kΔ∞ / scale."""
    return 2.0 * k * linf_sensitivity / scale


def top_k_scale_for_epsilon(k: int, linf_sensitivity: float, epsilon: float) -> float:
    """Noise scale of noisy top-k that costs exactly pure ε."""
    return 2.0 * k * linf_sensitivity / epsilon


def top_k_rho(k: int, linf_sensitivity: float, scale: float) -> float:
    """ρ of noisy top-k: k selections, each (2Δ∞/scale)-bounded-range, i.e. ε_each²/8 each."""
    return k * (2.0 * linf_sensitivity / scale) ** 2 / 8.0


def top_k_epsilon_for_rho(k: int, rho: float) -> float:
    """The total pure ε (2kΔ∞/scale) of a top-k whose zCDP cost is ρ: √(8kρ)."""
    return math.sqrt(8.0 * k * rho)
