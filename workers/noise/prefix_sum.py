"""Running totals with correlated noise: the square-root factorization of the prefix-sum matrix.

The prefix-sum matrix A (lower-triangular ones, T×T) is A = C·C with C lower-triangular Toeplitz,
c_k = binom(2k, k) / 4^k (Fichtenberger, Henzinger, Upadhyay 2023; also the Toeplitz max-error
optimum, Dvijotham et al. 2024). Over one period of T steps the private input is the per-step
increments x (one key); step t draws y_t = OpenDP's float Gaussian applied to (C x)_t and publishes
(C y)_t = prefix(t) + (C z)_t. The noise is applied by OpenDP to the data-side value (never noise
drawn on zeros added to an exact prefix), so OpenDP's float-rounding bound is inside its privacy map.

Charge: the period is ONE Gaussian mechanism on the T-vector C x (`period_measurement`): a unit that
moves the increments by at most L in L1 norm moves C x by at most L·max column norm = L·‖c‖₂ in L2
norm (column 0 is the longest). The per-step draws are that measurement's coordinates: the same
OpenDP float Gaussian (same scale, same grid 2^K_GRID), which rounds and samples each coordinate
independently, so T one-coordinate calls have exactly the distribution of one call on the T-vector.
Increments chosen adaptively (after earlier totals were published) cost the same: for a
lower-triangular C the streaming Gaussian matrix mechanism is as private as the one-shot one
(Denisov, McMahan, Rush, Smith, Thakurta 2022, adaptive streaming).

Caveat (not certified by any privacy map): (C x)_t is computed in float64; its rounding error
(relative ~1e-16 of Σ c_k |x_{t-k}|) sits on the data side outside OpenDP's map.

Cost (direct convolution): two dot products of length t per step (C x and C y) plus one OpenDP call
(~120-250 µs, the wrapper). The state is x and y, 16 bytes per step per key.
"""

from __future__ import annotations

__all__ = [
    "K_GRID",
    "Z95",
    "PeriodMeasurement",
    "RunningState",
    "ci_half_width",
    "coefficient_norm",
    "coefficients",
    "draw",
    "inverse_coefficients",
    "mapped_rho",
    "period_measurement",
    "period_rho",
    "sigma_for_rho",
    "toeplitz",
    "variance",
]

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import opendp.prelude as dp

from dpstream.topology import running_total
from dpstream.topology.errors import InternalError

dp.enable_features("contrib")  # OpenDP's float Gaussian is in its contrib set

K_GRID = -60
"""OpenDP noise granularity 2^k of every draw: the inflation of d_in it costs, 2^-60·√T, is below
one ulp of the map at T ≤ 10⁶, and sampling is ~5× faster than OpenDP's default k = -1074."""

Z95 = 1.959963984540054
"""Two-sided 95 % quantile of N(0, 1): the CI half-width is Z95 standard deviations."""


def coefficients(T: int) -> np.ndarray:
    """c_0..c_{T-1} as an array (the one rule: `topology.running_total.coefficients`)."""
    return np.array(running_total.coefficients(T))


def inverse_coefficients(T: int) -> np.ndarray:
    """d_0..d_{T-1}, the Toeplitz coefficients of C⁻¹ ((1-x)^(1/2)): d_k = d_{k-1}·(2k-3)/(2k)."""
    d = np.empty(T)
    d[0] = 1.0
    for k in range(1, T):
        d[k] = d[k - 1] * (2 * k - 3) / (2 * k)
    return d


def toeplitz(c: np.ndarray) -> np.ndarray:
    """The lower-triangular Toeplitz matrix with first column c (for tests and the bench)."""
    T = len(c)
    i, j = np.indices((T, T))
    return np.where(i >= j, c[np.clip(i - j, 0, T - 1)], 0.0)


def coefficient_norm(T: int) -> float:
    """‖c‖₂ over the T coefficients (`topology.running_total.coefficient_norm`)."""
    return running_total.coefficient_norm(T)


def variance(t: int, sigma: float) -> float:
    """Exact variance of the noise of the released total at step t (1-based): σ² Σ_{k<t} c_k²."""
    if t < 1:
        raise InternalError(f"steps are numbered from 1, got {t}")
    return sigma**2 * math.fsum(v * v for v in running_total.coefficients(t))


def ci_half_width(t: int, sigma: float) -> float:
    """Half-width of the 95 % CI of the released total at step t (1-based): Z95·√variance."""
    return Z95 * math.sqrt(variance(t, sigma))


@lru_cache(maxsize=64)
def _gaussian(size: int, sigma: float) -> Any:
    """OpenDP's float Gaussian on a float vector of `size` at scale σ, grid 2^K_GRID."""
    if not (sigma > 0 and math.isfinite(sigma)):
        raise InternalError(f"running-total noise needs a finite σ > 0, got {sigma!r}")
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size)
    return dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=sigma, k=K_GRID)


def mapped_rho(size: int, sigma: float, d_in: float) -> float:
    """ρ of OpenDP's float Gaussian on a `size`-vector at σ, at L2 distance d_in (a record's event)."""
    return float(_gaussian(size, float(sigma)).map(float(d_in)))


def draw(values: np.ndarray, sigma: float) -> np.ndarray:
    """OpenDP's float Gaussian at σ applied to each coordinate of `values` (the data-side (C x)_t)."""
    arr = np.ascontiguousarray(values, dtype=np.float64)
    if arr.ndim != 1 or not np.all(np.isfinite(arr)):
        raise InternalError("running-total noise input is not a finite float vector")
    return np.asarray(_gaussian(len(arr), float(sigma))(arr), dtype=np.float64)


@dataclass(frozen=True)
class PeriodMeasurement:
    """The period's charge: OpenDP's Gaussian on the T-vector C x at d_in = L·‖c‖₂."""

    T: int
    L: float
    sigma: float
    d_in: float
    rho: float
    """ρ from OpenDP's privacy map at d_in (zCDP)."""
    rho_closed_form: float
    """(L‖c‖₂)²/(2σ²): what the map gives without rounding."""
    meas: Any = field(repr=False, compare=False)


def period_measurement(T: int, L: float, sigma: float, keys: int = 1) -> PeriodMeasurement:
    """The one Gaussian mechanism a period of T steps over `keys` keys is charged as (on the T·keys
    vector: a unit's L bound holds across keys, so d_in is L·‖c‖₂ whatever their number), with its mapped ρ."""
    if not (L > 0 and math.isfinite(L)):
        raise InternalError(f"running-total bound L must be finite and > 0, got {L!r}")
    d_in = float(L) * coefficient_norm(T)
    meas = _gaussian(T * keys, float(sigma))
    return PeriodMeasurement(T, float(L), float(sigma), d_in, float(meas.map(d_in)), d_in**2 / (2 * sigma**2), meas)


def period_rho(T: int, L: float, sigma: float, keys: int = 1) -> float:
    """ρ (zCDP) of the whole period from OpenDP's privacy map."""
    return period_measurement(T, L, sigma, keys).rho


_NUDGE_STEPS = 64
"""Most ulps σ is moved up to bring OpenDP's rounded-up map within ρ."""


def sigma_for_rho(T: int, L: float, rho: float, keys: int = 1) -> float:
    """The smallest float σ at or above L‖c‖₂/√(2ρ) (within a few ulps) whose mapped period ρ is ≤ `rho`."""
    if not (rho > 0 and math.isfinite(rho)):
        raise InternalError(f"running-total ρ must be finite and > 0, got {rho!r}")
    sigma = float(L) * coefficient_norm(T) / math.sqrt(2 * rho)
    for _ in range(_NUDGE_STEPS):
        if period_rho(T, L, sigma, keys) <= rho:
            return sigma
        sigma = math.nextafter(sigma, math.inf)
    raise InternalError(f"no σ near {sigma!r} maps the period within ρ = {rho!r}")


def _dot(c: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Σ_j c_j · rows[k, j] for each key k, by einsum's own loop, not BLAS: OpenBLAS threads a long dot
    product, and on a busy 2-core host its threads wait on each other (86,400 terms, 2 keys, measured
    under load: 8 ms a dot threaded, 0.08 ms here; a (steps × keys) layout summed over axis 0: 2.2 ms)."""
    return np.einsum("j,kj->k", c, rows)


class RunningState:
    """One period's running total over `keys` keys: the increments x and noisy values y of its steps so
    far (steps × keys arrays), and the one rule of a step (`next`). Curator-side: (C x)_t needs every past
    increment. The y's determine every published total (C y); never keep z = y − C x alone (z and a
    release give the true prefix). Key-major arrays (keys × T: each key's steps contiguous), 16 bytes
    per key and step; a step is two dots of length t per key and one OpenDP call (`dpstream bench
    running-total`)."""

    __slots__ = ("T", "keys", "xs", "ys", "steps", "_c_rev", "_norms")

    def __init__(self, T: int, keys: int = 1) -> None:
        self.T, self.keys = T, keys
        self.xs = np.zeros((keys, T))
        self.ys = np.zeros((keys, T))
        self.steps = 0
        """Steps held, from the period's first (a step never stored holds zeros)."""
        self._c_rev = coefficients(T)[::-1].copy()  # c_{T-1} .. c_0: step t convolves with its last t + 1
        self._norms = running_total.step_norms(T)

    def next(self, x_t: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
        """(y_t, (C y)_t) of the step after those held, from its increments x_t (one per key): y_t is
        OpenDP's float Gaussian at σ on the data-side (C x)_t. Nothing is kept (`append` does, once
        the step's y is stored)."""
        t = self.steps
        if t >= self.T:
            raise InternalError(f"running total stepped past its period of {self.T} steps")
        x_t = np.asarray(x_t, dtype=np.float64)
        if x_t.shape != (self.keys,) or not np.all(np.isfinite(x_t)):
            raise InternalError("a running-total increment is not one finite value per key")
        past = self._c_rev[self.T - 1 - t : -1]  # c_t .. c_1 (c_0 = 1)
        cx = _dot(past, self.xs[:, :t]) + x_t if t else x_t
        y_t = draw(cx, sigma)
        return y_t, (_dot(past, self.ys[:, :t]) + y_t if t else y_t)

    def append(self, x_t: np.ndarray, y_t: np.ndarray) -> None:
        """Keep the next step's x and y."""
        self.xs[:, self.steps], self.ys[:, self.steps] = x_t, y_t
        self.steps += 1

    def step(self, x_t: np.ndarray, sigma: float) -> np.ndarray:
        """`next` and `append` at once (a process that keeps its own y's): the published totals."""
        y_t, total = self.next(x_t, sigma)
        self.append(np.asarray(x_t, dtype=np.float64), y_t)
        return total

    def stddev(self, step: int, sigma: float) -> float:
        """The std of the total released at `step` (1-based): σ·‖c_<step‖₂."""
        return sigma * self._norms[step - 1]

    def published(self) -> np.ndarray:
        """Every total published so far (keys × steps), recomputed from the y's: (C y)_t for each t."""
        C = toeplitz(coefficients(self.steps)) if self.steps else np.zeros((0, 0))
        return self.ys[:, : self.steps] @ C.T

    def restore(self, xs: np.ndarray, ys: np.ndarray) -> RunningState:
        """Continue a period from stored x's and y's (keys × steps): the next step draws afresh."""
        xs, ys = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
        if xs.shape != ys.shape or xs.ndim != 2 or xs.shape[0] != self.keys or xs.shape[1] > self.T:
            raise InternalError("running-total restore needs equal keys × steps x's and y's within the period")
        n = xs.shape[1]
        self.xs[:] = 0.0
        self.ys[:] = 0.0
        self.xs[:, :n], self.ys[:, :n] = xs, ys
        self.steps = n
        return self
