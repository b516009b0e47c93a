"""OpenDP measurements dpstream samples from, each checked against the cost it is charged.

Only OpenDP's vetted samplers are used: discrete Laplace / discrete Gaussian on i64 vectors,
noisy top-k, and Laplace / Gaussian thresholding for partition selection. Every constructor
here calls the measurement's privacy map at the declared sensitivity and refuses (InternalError)
unless it equals the cost `topology.accounting` charges, to 1e-9 relative, and is not above it:
the scale is nudged up by a few ulps where OpenDP's conservatively rounded map would otherwise
exceed the charge by one.

Speed: a measurement is built and its map checked once per (mechanism, accounting, cost,
sensitivity) (`integer_noise` is memoised; the OpenDP object once per (mechanism, scale)), and
integer noise is drawn ahead in batches (`NoisePool`): OpenDP's Python wrapper costs ~150 µs
per call whatever the length, its sampler ~15 µs per discrete Gaussian sample, so one call for
hundreds of samples, each handed out once, makes a one-key release cost the sample, not the call.
The pooled value x + z (z from the same measurement on 0, saturated to i64 as OpenDP's integer
noise does) has exactly the distribution of the measurement on x.
"""

from __future__ import annotations

__all__ = [
    "COST_RTOL",
    "IntegerNoise",
    "NoisePool",
    "TopK",
    "Threshold",
    "integer_noise",
    "top_k",
    "threshold",
]

import math
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import opendp.prelude as dp

from dpstream.topology import accounting as acc
from dpstream.topology.errors import InternalError
from dpstream.topology.model import Accounting, Mechanism
from dpstream.workers.noise import discrete

COST_RTOL = 1e-9
"""Relative tolerance between OpenDP's privacy map and the charged cost."""

dp.enable_features("contrib")  # the noise measurements below are all in OpenDP's contrib set

_INT = "i64"


_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1

_POOL_MAX_SCALE = 2.0**40
"""Above this scale noise is not pooled: a pooled sample must never reach i64 saturation itself
(P(|z| ≥ 2⁶³) < e^(-2²³) at this scale), or x + z would not be OpenDP's saturate(x + z)."""

_POOL_BATCH_MAX = 512
"""Most samples one refill draws beyond what the release needs (bounds memory and waste)."""

_NUDGE_STEPS = 64
"""Most ulps a scale is moved up to bring OpenDP's rounded-up map within the charge."""


def check_cost(what: str, mapped: float, cost: float) -> None:
    """Refuse a measurement whose OpenDP privacy map differs from the charged cost."""
    if not math.isclose(mapped, cost, rel_tol=COST_RTOL, abs_tol=0.0):
        raise InternalError(f"{what}: OpenDP privacy map gives {mapped!r} but the plan charges {cost!r}")


def check_within_charge(what: str, mapped: float, cost: float) -> None:
    """Refuse a measurement whose OpenDP privacy map is not within the charge: equal to it to
    `COST_RTOL` (the plan's calibration) and not above it (it never costs more than is charged)."""
    check_cost(what, mapped, cost)
    if not mapped <= cost:
        raise InternalError(f"{what}: OpenDP privacy map gives {mapped!r}, above the {cost!r} charged")


def _scale_within(mapped_at: Callable[[float], float], scale: float, cost: float) -> float:
    """`scale`, or the next few floats above it, the first whose mapped cost is at most `cost`
    (OpenDP rounds maps up, so the exact calibration can land an ulp above the charge)."""
    for _ in range(_NUDGE_STEPS):
        if mapped_at(scale) <= cost:
            return scale
        scale = math.nextafter(scale, math.inf)
    return scale  # the caller's check refuses it


class NoisePool:
    """Integer noise of one OpenDP measurement, drawn ahead in batches and handed out once each.

    `take(n)` returns n fresh samples of the measurement applied to zeros; no sample is ever
    returned twice, not even by two processes: a forked child drops what its parent had drawn
    ahead (`os.register_at_fork`). A refill draws what is missing plus as many again as were drawn before (up to
    `_POOL_BATCH_MAX` extra), so a measurement used once draws exactly what it needs and a steady
    stream of releases makes one OpenDP call per few hundred samples. Thread-safe. The samples
    held are secret like any true aggregate (curator-side process memory).
    """

    def __init__(self, meas: Any) -> None:
        self._meas = meas
        self._lock = threading.Lock()
        self._buf: list[int] = []
        self._pos = 0
        self._drawn = 0
        _POOLS.add(self)

    def _forget_after_fork(self) -> None:
        """In a forked child: drop the samples drawn ahead (the parent may hand them out too)."""
        self._lock = threading.Lock()  # another thread may have held it at the fork
        self._buf, self._pos = [], 0

    def take(self, n: int) -> list[int]:
        """n noise samples, each used for nothing else."""
        with self._lock:
            pos = self._pos
            if n == 1 and pos < len(self._buf):  # the one-key release: one sample off the buffer
                self._pos = pos + 1
                return [self._buf[pos]]
            have = len(self._buf) - self._pos
            if have < n:
                extra = min(_POOL_BATCH_MAX, self._drawn)
                want = n - have + extra
                # an int64 array skips OpenDP's per-element type check of a list (~2 µs each)
                fresh = list(self._meas(np.zeros(want, dtype=np.int64) if want >= 64 else [0] * want))
                self._drawn += len(fresh)
                self._buf = self._buf[self._pos :] + fresh
                self._pos = 0
            out = self._buf[self._pos : self._pos + n]
            self._pos += n
            return out

    @property
    def available(self) -> int:
        """Samples drawn and not yet handed out."""
        return len(self._buf) - self._pos


_POOLS: weakref.WeakSet[NoisePool] = weakref.WeakSet()
"""Every live pool, so that a forked child drops what they drew ahead before it runs anything."""


def _drop_drawn_ahead() -> None:
    for pool in list(_POOLS):
        pool._forget_after_fork()  # noqa: SLF001 - the module's own fork hook


os.register_at_fork(after_in_child=_drop_drawn_ahead)


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
    pool: NoisePool | None = field(default=None, repr=False, compare=False)
    """Noise drawn ahead from `meas` (None: every draw is one call of `meas` on the values)."""

    def draw(self, values: Sequence[int]) -> list[int]:
        """Add independent noise to each coordinate: OpenDP's integer noise, saturated to i64."""
        if self.pool is None or not values:
            return list(self.meas(list(values)))
        if len(values) == 1:  # the one-key release
            (v,) = values
            if type(v) is not int:
                raise InternalError("integer noise input is not a list of integers")
            if not _I64_MIN <= v <= _I64_MAX:
                raise InternalError("integer noise input outside i64")
            (z,) = self.pool.take(1)
            return [min(max(v + z, _I64_MIN), _I64_MAX)]
        if not all(type(v) is int for v in values):
            raise InternalError("integer noise input is not a list of integers")
        if min(values) < _I64_MIN or max(values) > _I64_MAX:
            raise InternalError("integer noise input outside i64")
        noise = self.pool.take(len(values))
        return [min(max(v + z, _I64_MIN), _I64_MAX) for v, z in zip(values, noise, strict=True)]


@lru_cache(maxsize=256)
def _measurement(mechanism: Mechanism, scale: float) -> tuple[Any, NoisePool | None]:
    """OpenDP's integer noise on i64 vectors at `scale`, and its pool: built once per scale."""
    domain = dp.vector_domain(dp.atom_domain(T=_INT))
    if mechanism is Mechanism.GAUSSIAN:
        meas = dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=scale)
    else:
        meas = dp.m.make_laplace(domain, dp.l1_distance(T=_INT), scale=scale)
    return meas, (NoisePool(meas) if scale <= _POOL_MAX_SCALE else None)


def integer_noise(mechanism: Mechanism, accounting: Accounting, cost: float, l1: float, l2: float) -> IntegerNoise:
    """A vector measurement costing `cost` at L1 sensitivity `l1` / L2 sensitivity `l2`: its
    OpenDP map equals `cost` (to `COST_RTOL`) and is not above it. Memoised per argument set.
    `l1` is an L1 distance between integer vectors: a whole number (refused otherwise)."""
    if cost <= 0:
        raise InternalError(f"noise built with non-positive cost {cost}")
    if not float(l1).is_integer() or l1 < 1:
        raise InternalError(f"integer noise needs a whole L1 sensitivity >= 1, got {l1!r}")
    if mechanism is Mechanism.GAUSSIAN and accounting is not Accounting.ZCDP:
        raise InternalError("Gaussian noise in a pure-ε scope passed validation")
    if mechanism not in (Mechanism.GAUSSIAN, Mechanism.LAPLACE):
        raise InternalError(f"no integer noise for mechanism {mechanism!r}")
    return _integer_noise(mechanism, accounting, float(cost), int(l1), float(l2))


@lru_cache(maxsize=1024)
def _integer_noise(mechanism: Mechanism, accounting: Accounting, cost: float, l1: int, l2: float) -> IntegerNoise:
    if mechanism is Mechanism.GAUSSIAN:

        def gauss_map(s: float) -> float:
            return _measurement(mechanism, s)[0].map(l2)

        scale = _scale_within(gauss_map, acc.gaussian_sigma_for_rho(l2, cost), cost)
        meas, pool = _measurement(mechanism, scale)
        check_within_charge("discrete Gaussian", meas.map(l2), cost)
        return IntegerNoise(
            mechanism,
            scale,
            l2,
            cost,
            discrete.gaussian_stddev(scale),
            discrete.gaussian_ci_half_width(scale),
            meas,
            pool,
        )
    eps = cost if accounting is Accounting.PURE else acc.rho_to_pure(cost)

    def lap_map(s: float) -> float:
        return _charged(accounting, _measurement(mechanism, s)[0].map(l1))

    scale = _scale_within(lap_map, acc.laplace_scale_for_epsilon(l1, eps), cost)
    meas, pool = _measurement(mechanism, scale)
    check_within_charge("discrete Laplace", _charged(accounting, meas.map(l1)), cost)
    return IntegerNoise(
        mechanism,
        scale,
        float(l1),
        cost,
        discrete.laplace_stddev(scale),
        discrete.laplace_ci_half_width(scale),
        meas,
        pool,
    )


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

    def build(s: float) -> Any:
        return dp.m.make_noisy_top_k(domain, dp.linf_distance(T=_INT), measure, k=k, scale=s)

    scale = _scale_within(lambda s: build(s).map(int(linf)), scale, cost)
    meas = build(scale)
    check_within_charge(name, meas.map(int(linf)), cost)
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

        def convert(c: float) -> float:
            return c

    else:
        metric = dp.l01inf_distance(dp.absolute_distance(T=float))
        d_in = (max_keys, noise.d_in, float(linf))
        make, name = dp.m.make_laplace_threshold, "laplace_threshold"

        def convert(c: float) -> float:
            return _charged(accounting, c)

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
    check_within_charge(name, convert(mapped_cost), noise.cost)
    if mapped_delta > delta:
        raise InternalError(f"{name}: δ {mapped_delta} exceeds the granted {delta}")
    return Threshold(noise, hi, mapped_delta, name, meas)
