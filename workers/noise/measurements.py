"""OpenDP measurements dpstream samples from, each checked against the cost it is charged.

Only OpenDP's vetted samplers are used: discrete Laplace / discrete Gaussian on i64 vectors,
noisy top-k, and Laplace / Gaussian thresholding for partition selection. Every constructor
here calls the measurement's privacy map at the declared sensitivity and refuses (InternalError)
unless it equals the cost `topology.accounting` charges, to 1e-9 relative.
"""

from __future__ import annotations

__all__ = [
    "COST_RTOL",
    "IntegerNoise",
    "TopK",
    "Threshold",
    "integer_noise",
    "top_k",
    "threshold",
]

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import opendp.prelude as dp

from dpstream.topology import accounting as acc
from dpstream.topology.errors import InternalError
from dpstream.topology.model import Accounting, Mechanism
from dpstream.workers.noise import discrete

COST_RTOL = 1e-9
"""Relative tolerance between OpenDP's privacy map and the charged cost."""

dp.enable_features("contrib")  # the noise measurements below are all in OpenDP's contrib set

_INT = "i64"


def check_cost(what: str, mapped: float, cost: float) -> None:
    """Refuse a measurement whose OpenDP privacy map differs from the charged cost."""
    if not math.isclose(mapped, cost, rel_tol=COST_RTOL, abs_tol=0.0):
        raise InternalError(f"{what}: OpenDP privacy map gives {mapped!r} but the plan charges {cost!r}")


def _charged(accounting: Accounting, pure_epsilon: float) -> float:
    """What a pure ε-DP measurement costs in a scope's currency (OpenDP's pureDP→zCDP: ε²/2)."""
    return pure_epsilon if accounting is Accounting.PURE else acc.pure_to_rho(pure_epsilon)


@dataclass(frozen=True)
class IntegerNoise:
    """Discrete Laplace or Gaussian on an integer vector; scale, σ and CI in integer units."""

    mechanism: Mechanism
    scale: float
    d_in: float
    cost: float
    stddev: float
    ci_half_width: int
    meas: Any

    def draw(self, values: Sequence[int]) -> list[int]:
        """Add independent noise to each coordinate (one OpenDP call)."""
        return list(self.meas(list(values)))


def integer_noise(mechanism: Mechanism, accounting: Accounting, cost: float, l1: int, l2: float) -> IntegerNoise:
    """A vector measurement costing exactly `cost` at L1 sensitivity `l1` / L2 sensitivity `l2`."""
    if cost <= 0:
        raise InternalError(f"noise built with non-positive cost {cost}")
    domain = dp.vector_domain(dp.atom_domain(T=_INT))
    if mechanism is Mechanism.GAUSSIAN:
        if accounting is not Accounting.ZCDP:
            raise InternalError("Gaussian noise in a pure-ε scope passed validation")
        scale = acc.gaussian_sigma_for_rho(l2, cost)
        meas = dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=scale)
        check_cost("discrete Gaussian", meas.map(float(l2)), cost)
        return IntegerNoise(mechanism, scale, float(l2), cost, discrete.gaussian_stddev(scale),
                            discrete.gaussian_ci_half_width(scale), meas)
    if mechanism is Mechanism.LAPLACE:
        eps = cost if accounting is Accounting.PURE else acc.rho_to_pure(cost)
        scale = acc.laplace_scale_for_epsilon(l1, eps)
        meas = dp.m.make_laplace(domain, dp.l1_distance(T=_INT), scale=scale)
        check_cost("discrete Laplace", _charged(accounting, meas.map(int(l1))), cost)
        return IntegerNoise(mechanism, scale, float(l1), cost, discrete.laplace_stddev(scale),
                            discrete.laplace_ci_half_width(scale), meas)
    raise InternalError(f"no integer noise for mechanism {mechanism!r}")


@dataclass(frozen=True)
class TopK:
    """OpenDP noisy top-k: Gumbel (exponential mechanism) in zCDP, permute-and-flip in pure ε."""

    k: int
    scale: float
    cost: float
    name: str
    meas: Any

    def select(self, scores: Sequence[int]) -> list[int]:
        """Indices of the selected candidates, best first."""
        return list(self.meas(list(scores)))


def top_k(accounting: Accounting, cost: float, k: int, linf: int) -> TopK:
    """Noisy top-k costing exactly `cost` at score sensitivity Δ∞ = `linf`."""
    if accounting is Accounting.ZCDP:
        scale = acc.top_k_scale_for_epsilon(k, linf, acc.top_k_epsilon_for_rho(k, cost))
        measure, name = dp.zero_concentrated_divergence(), "noisy_top_k_gumbel"
    else:
        scale = acc.top_k_scale_for_epsilon(k, linf, cost)
        measure, name = dp.max_divergence(), "noisy_top_k_permute_and_flip"
    domain = dp.vector_domain(dp.atom_domain(T=_INT))
    meas = dp.m.make_noisy_top_k(domain, dp.linf_distance(T=_INT), measure, k=k, scale=scale)
    check_cost(name, meas.map(int(linf)), cost)
    return TopK(k, scale, cost, name, meas)


@dataclass(frozen=True)
class Threshold:
    """Partition selection: noisy values of the keys whose noisy value reaches `threshold`."""

    noise: IntegerNoise
    threshold: int
    delta: float
    """δ of OpenDP's privacy map at the declared sensitivity (≤ the δ granted)."""
    name: str
    meas: Any

    def draw(self, values: Mapping[str, int]) -> dict[str, int]:
        """Noisy values of the surviving keys (the key set itself is the private selection)."""
        return dict(self.meas(dict(values)))


def threshold(noise: IntegerNoise, accounting: Accounting, max_keys: int, linf: int, delta: float) -> Threshold:
    """Laplace / Gaussian thresholding with `noise`'s scale and the smallest threshold whose δ ≤ `delta`."""
    if not 0 < delta < 1:
        raise InternalError(f"partition selection needs 0 < δ < 1, got {delta}")
    domain = dp.map_domain(dp.atom_domain(T=str), dp.atom_domain(T=_INT))
    if noise.mechanism is Mechanism.GAUSSIAN:
        metric = dp.l02inf_distance(dp.absolute_distance(T=float))
        d_in = (max_keys, noise.d_in, float(linf))
        make, name = dp.m.make_gaussian_threshold, "gaussian_threshold"
        convert = lambda c: c  # noqa: E731
    else:
        metric = dp.l01inf_distance(dp.absolute_distance(T=float))
        d_in = (max_keys, noise.d_in, float(linf))
        make, name = dp.m.make_laplace_threshold, "laplace_threshold"
        convert = lambda c: _charged(accounting, c)  # noqa: E731

    def build(t: int) -> Any:
        return make(domain, metric, scale=noise.scale, threshold=t)

    def delta_at(t: int) -> float:
        return build(t).map(d_in)[1]

    lo, hi = int(linf), int(linf) + max(1, int(math.ceil(noise.scale)))
    while delta_at(hi) > delta:
        lo, hi = hi, hi + 2 * (hi - lo)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if delta_at(mid) <= delta:
            hi = mid
        else:
            lo = mid
    meas = build(hi)
    mapped_cost, mapped_delta = meas.map(d_in)
    check_cost(name, convert(mapped_cost), noise.cost)
    if mapped_delta > delta:
        raise InternalError(f"{name}: δ {mapped_delta} exceeds the granted {delta}")
    return Threshold(noise, hi, mapped_delta, name, meas)
