"""Small exact statistics without scipy: binomial tails, Clopper–Pearson bounds, χ² p-values.

Binomial tails use the regularized incomplete beta, P(X ≥ k | n, p) = I_p(k, n − k + 1),
evaluated by its continued fraction (Lentz) with `math.lgamma` prefactors; Clopper–Pearson
bounds bisect on that tail. The χ² survival function is the regularized upper gamma Q(ν/2, x/2).
"""

from __future__ import annotations

__all__ = ["betainc", "binomial_sf", "clopper_pearson", "chi2_sf"]

import math

_EPS = 1e-15
_TINY = 1e-300


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of I_x(a, b) (modified Lentz; Numerical Recipes, section 6.4)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 100_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > _TINY else _TINY
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > _TINY else _TINY
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for a, b > 0, 0 ≤ x ≤ 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def binomial_sf(k: int, n: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return betainc(k, n - k + 1, p)


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Exact two-sided (1 − alpha) interval for a binomial proportion (alpha/2 in each tail).

    Lower bound: the p with P(X ≥ k | p) = alpha/2; upper: the p with P(X ≤ k | p) = alpha/2.
    """
    if not 0 <= k <= n or n <= 0 or not 0 < alpha < 1:
        raise ValueError(f"need 0 <= k <= n, n > 0, 0 < alpha < 1; got k={k}, n={n}, alpha={alpha}")
    tail = alpha / 2.0
    lower = 0.0 if k == 0 else _bisect(lambda p: binomial_sf(k, n, p) - tail)
    upper = 1.0 if k == n else _bisect(lambda p: tail - (1.0 - binomial_sf(k + 1, n, p)))
    return lower, upper


def _bisect(f) -> float:
    """Root in (0, 1) of a function increasing in p."""
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def chi2_sf(x: float, dof: int) -> float:
    """P(χ²_dof ≥ x): the regularized upper incomplete gamma Q(dof/2, x/2)."""
    if x <= 0:
        return 1.0
    a, z = dof / 2.0, x / 2.0
    log_front = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1.0:  # series for P, then Q = 1 − P
        term = total = 1.0 / a
        ap = a
        for _ in range(100_000):
            ap += 1.0
            term *= z / ap
            total += term
            if abs(term) < abs(total) * _EPS:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    b = z + 1.0 - a  # continued fraction for Q (Lentz)
    c, d = 1.0 / _TINY, 1.0 / b
    h = d
    for i in range(1, 100_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = b + an / c
        c = c if abs(c) > _TINY else _TINY
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return math.exp(log_front) * h
