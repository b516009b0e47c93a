"""A running total's privacy arithmetic: the square-root factorization of the prefix-sum matrix.

The prefix-sum matrix A (T×T lower-triangular ones) is A = C·C with C lower-triangular Toeplitz,
c_k = binom(2k, k)/4^k (Fichtenberger, Henzinger, Upadhyay 2023; also the Toeplitz max-error
optimum, Dvijotham et al. 2024). A unit moves a period's increments by at most L in L1 norm
(`contribution.max_per_period`, across steps and keys), so it moves C x by at most L·‖c‖₂ in L2 (the
largest column of C is its first, and an L1 ball's worst case is a vertex): the whole period is one
Gaussian mechanism at that sensitivity, charged once. The released total at step t (1-based) has
noise variance σ² Σ_{k<t} c_k². Pure arithmetic: the sampler lives in `workers.noise.prefix_sum`.
"""

from __future__ import annotations

__all__ = [
    "coefficients",
    "coefficient_norm",
    "period_sensitivity",
    "step_norms",
    "steps_per_period",
    "total_stddev",
]

import math
from functools import lru_cache

from dpstream.topology.errors import InternalError
from dpstream.topology.model import Metric


@lru_cache(maxsize=16)
def coefficients(T: int) -> tuple[float, ...]:
    """c_0..c_{T-1}, c_k = binom(2k, k)/4^k, by the stable recurrence c_k = c_{k-1}·(2k-1)/(2k)."""
    if T < 1:
        raise InternalError(f"a running-total period needs T >= 1 steps, got {T}")
    c = [1.0] * T
    for k in range(1, T):
        c[k] = c[k - 1] * (2 * k - 1) / (2 * k)
    return tuple(c)


def coefficient_norm(T: int) -> float:
    """‖c‖₂ over the T coefficients: the largest column norm of C (its first column)."""
    return math.sqrt(math.fsum(v * v for v in coefficients(T)))


def step_norms(T: int) -> tuple[float, ...]:
    """‖c_<t‖₂ for every step t = 1..T at once (a step's noise std over σ), cached per T: each is
    `coefficient_norm(t)`, without the O(t) sum per step."""
    return _step_norms(T)


@lru_cache(maxsize=16)
def _step_norms(T: int) -> tuple[float, ...]:
    out, total, comp = [], 0.0, 0.0
    for v in coefficients(T):  # Neumaier-compensated running sum of c_k²: within an ulp of fsum
        sq = v * v
        t = total + sq
        comp += (total - t) + sq if abs(total) >= sq else (sq - t) + total
        total = t
        out.append(math.sqrt(total + comp))
    return tuple(out)


def total_stddev(t: int, sigma: float) -> float:
    """Exact standard deviation of the noise of the total released at step t (1-based): σ·√Σ_{k<t} c_k²."""
    if t < 1:
        raise InternalError(f"steps are numbered from 1, got {t}")
    return sigma * coefficient_norm(t)


def steps_per_period(metric: Metric, period_s: int) -> int:
    """T: the running total's steps in one budget period (its tumbling windows per period)."""
    return metric.window.releases_per_period(period_s)


def period_sensitivity(metric: Metric, period_s: int) -> float:
    """L2 distance one unit moves the period's vector C x by: L·‖c‖₂ (L = `contribution.max_per_period`)."""
    bound = metric.contribution.max_per_period
    if bound is None:
        raise InternalError(f"metric {metric.name!r}: a running total without max_per_period passed validation")
    return float(bound) * coefficient_norm(steps_per_period(metric, period_s))
