"""Empirical privacy audit: a black-box lower bound on ε for each mechanism, at its worst case.

Method (Jagielski, Ullman & Oprea 2020, "Auditing differentially private machine learning";
Ding et al. 2018 and Google's DP stochastic tester, differential-privacy/java/…/testing):
for a mechanism M and neighbouring inputs D, D' that differ by one privacy unit's largest
contribution the bounds allow, draw N outputs of each. Half the draws choose the most revealing
threshold event E (X ≥ t, X ≤ t or X = v, either orientation) and δ; the other half estimate
p = P[M(D) ∈ E] and p' = P[M(D') ∈ E] with exact Clopper–Pearson intervals. Any (ε, δ)-DP
mechanism has p ≤ e^ε p' + δ, so ε_lb = ln((p_lo − δ) / p'_hi) is a lower bound on the true ε
with the stated confidence. The audit fails when ε_lb exceeds the claimed ε(δ).

Claims: pure ε for Laplace / permute-and-flip; for zCDP mechanisms every δ on a grid (the
scope's δ first) with ε(δ) from the CKS20 conversion, tightened by the pure ε where there is
one (top-k); thresholding adds its own δ. The 95 % bound is reported; the pass/fail verdict
uses α = 1e-7, because a tight mechanism (Laplace tail events are exact) would push a 95 %
bound over its claim in a few percent of runs. Sampling uses the production mechanisms
(`build_release_mechanism`); the power check halves their scale and must be flagged.
"""

from __future__ import annotations

__all__ = [
    "STRICT_ALPHA",
    "DELTA_GRID",
    "Claim",
    "AuditCase",
    "AuditResult",
    "audit",
    "standard_cases",
    "broken_cases",
    "trials_to_flag",
]

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import opendp.prelude as dp

from dpstream.topology.accounting import epsilon_from_rho
from dpstream.topology.model import Accounting, Aggregate, Bounds, Contribution, Mechanism, Metric, Window
from dpstream.workers.audit.stats import clopper_pearson
from dpstream.workers.noise import measurements
from dpstream.workers.noise.mechanisms import ReleaseMechanism, build_release_mechanism

STRICT_ALPHA = 1e-7
"""Total error probability of the verdict's bound: a correct mechanism fails with probability < 1e-7."""

REPORT_ALPHA = 0.05
"""The customary 95 % Clopper–Pearson bound, reported alongside."""

DELTA_GRID = (1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.2)
"""δ values checked for zCDP claims besides the scope's δ (ρ-zCDP implies (ε(δ), δ) for all δ)."""

_SCOPE_DELTA = 1e-6
_NOT_RELEASED = -1e18
"""Output value standing for "key not released" in partition-selection audits."""


@dataclass(frozen=True)
class Claim:
    """What a mechanism promises: pure ε and/or ρ-zCDP, plus any additive δ of its own."""

    epsilon: float | None = None
    rho: float | None = None
    scope_delta: float = 0.0
    extra_delta: float = 0.0

    def deltas(self) -> tuple[float, ...]:
        """The δ values the audit checks (the scope's first)."""
        if self.rho is None and self.extra_delta == 0.0:
            return (0.0,)
        base = (self.scope_delta,) if self.scope_delta > 0 else ()
        return base + tuple(d for d in DELTA_GRID if d > self.extra_delta)

    def epsilon_at(self, delta: float) -> float:
        """The claimed ε at δ (∞ if nothing is claimed there)."""
        best = math.inf
        if self.epsilon is not None and delta >= self.extra_delta:
            best = self.epsilon
        own = delta - self.extra_delta
        if self.rho is not None and own > 0:
            best = min(best, epsilon_from_rho(self.rho, own))
        return best


@dataclass(frozen=True)
class AuditCase:
    """A mechanism under audit: its claim and samplers of M(D) and M(D') (n draws each)."""

    name: str
    claim: Claim
    sample_d: Callable[[int], Sequence[float]]
    sample_d_prime: Callable[[int], Sequence[float]]
    trial_share: float = 1.0
    """Fraction of the requested trials this case runs (release-path cases are slower per draw)."""


@dataclass(frozen=True)
class AuditResult:
    """The best event found and the ε lower bounds it gives against the claim."""

    name: str
    trials: int
    event: str
    delta: float
    claimed_epsilon: float
    epsilon_lower_95: float
    epsilon_lower_strict: float
    k0: int = 0
    """Estimate-half draws in the event on the side that should be likelier (D, or D' when reversed)."""
    k1: int = 0
    """The same on the other side."""
    draws: int = 0
    """Estimate-half draws per side (half of `trials`)."""
    trial_share: float = 1.0
    """The case's fraction of the requested trials (`AuditCase.trial_share`)."""

    @property
    def passed(self) -> bool:
        """True when the strict lower bound does not exceed the claim."""
        return self.epsilon_lower_strict <= self.claimed_epsilon

    def as_dict(self) -> dict[str, object]:
        """JSON-able view."""
        return {
            "name": self.name,
            "trials": self.trials,
            "event": self.event,
            "delta": self.delta,
            "claimed_epsilon": self.claimed_epsilon,
            "epsilon_lower_95": self.epsilon_lower_95,
            "epsilon_lower_strict": self.epsilon_lower_strict,
            "passed": self.passed,
        }


@dataclass(frozen=True)
class _Event:
    kind: str  # ">=", "<=", "=="
    value: float

    def count(self, ordered: Sequence[float]) -> int:
        if self.kind == ">=":
            return len(ordered) - bisect.bisect_left(ordered, self.value)
        if self.kind == "<=":
            return bisect.bisect_right(ordered, self.value)
        return bisect.bisect_right(ordered, self.value) - bisect.bisect_left(ordered, self.value)


def _events(pooled: Sequence[float]) -> list[_Event]:
    distinct = sorted(set(pooled))
    if len(distinct) <= 64:
        cuts = distinct
        extra = [_Event("==", v) for v in distinct]
    else:
        cuts = [distinct[round(i * (len(distinct) - 1) / 400)] for i in range(401)]
        extra = []
    return [_Event(kind, t) for t in sorted(set(cuts)) for kind in (">=", "<=")] + extra


def _epsilon_lb(k0: int, k1: int, n: int, delta: float, alpha: float) -> float:
    p0_lo, _ = clopper_pearson(k0, n, alpha)
    _, p1_hi = clopper_pearson(k1, n, alpha)
    return math.log((p0_lo - delta) / p1_hi) if p0_lo > delta else 0.0


_SELECTION_Z = 5.3
"""The selection score's z: about the strict bound's (two-sided α = 1e-7), so an event is chosen for the
bound it can be expected to reach on the other half, not for a lucky tail count."""


def _wilson(k: int, n: int, z: float) -> tuple[float, float]:
    """Wilson score interval of k/n at `z`: close to Clopper–Pearson even at a handful of counts,
    where the plain normal interval is far too narrow."""
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return centre - half, centre + half


def _approx_lb(k0: int, k1: int, n: int, delta: float) -> float:
    """Cheap selection score: the ε bound with Wilson intervals at the strict bound's z. (A normal
    interval at z = 5 picked far-tail events whose few counts looked strong on the selection half
    and were not on the other: the half-scale histogram was missed in 1 of 12 runs at 20,000 trials;
    with Wilson its margin over the claim was 1.05-1.16 nats in 12 of 12.)"""
    lo, _ = _wilson(k0, n, _SELECTION_Z)
    _, hi = _wilson(k1, n, _SELECTION_Z)
    return math.log((lo - delta) / hi) if lo > delta else -math.inf


def audit(case: AuditCase, trials: int) -> AuditResult:
    """Run `trials` draws of each side; choose the event on one half, bound ε on the other."""
    trials = max(2, int(trials * case.trial_share))
    half = trials // 2
    d = list(case.sample_d(2 * half))
    d_prime = list(case.sample_d_prime(2 * half))
    sel = (sorted(d[:half]), sorted(d_prime[:half]))
    est = (sorted(d[half:]), sorted(d_prime[half:]))
    best = None
    for event in _events(sel[0] + sel[1]):
        counts = (event.count(sel[0]), event.count(sel[1]))
        for first in (0, 1):
            k0, k1 = counts[first], counts[1 - first]
            for delta in case.claim.deltas():
                score = _approx_lb(k0, k1, half, delta) - case.claim.epsilon_at(delta)
                if best is None or score > best[0]:
                    best = (score, event, first, delta)
    assert best is not None
    _, event, first, delta = best
    k = (event.count(est[0]), event.count(est[1]))
    k0, k1 = k[first], k[1 - first]
    sides = ("D", "D'") if first == 0 else ("D'", "D")
    return AuditResult(
        name=case.name,
        trials=trials,
        event=f"X {event.kind} {event.value:g}, {sides[0]} vs {sides[1]}",
        delta=delta,
        claimed_epsilon=case.claim.epsilon_at(delta),
        epsilon_lower_95=_epsilon_lb(k0, k1, half, delta, REPORT_ALPHA),
        epsilon_lower_strict=_epsilon_lb(k0, k1, half, delta, STRICT_ALPHA),
        k0=k0,
        k1=k1,
        draws=half,
        trial_share=case.trial_share,
    )


_MAX_DRAWS = 1 << 40
"""Extrapolation stops here: an excess this small is not worth a number of trials."""


def trials_to_flag(result: AuditResult) -> int | None:
    """Requested `--trials` at which the verdict's strict bound on `result`'s event would exceed its claim,
    were the event's rates those its 95 % bounds guarantee (p at its lower, p' at its upper bound: the
    excess lb95 − claim is kept, only the sampling error shrinks); None when those rates show no excess
    over the claim (no trial count is known to flag it). Why the power check may pass at few trials: the
    strict bound (α = 1e-7) is much wider than the 95 % one at the same draws."""
    n, delta, claim = result.draws, result.delta, result.claimed_epsilon
    if n <= 0:
        return None
    p0, _ = clopper_pearson(result.k0, n, REPORT_ALPHA)
    _, p1 = clopper_pearson(result.k1, n, REPORT_ALPHA)
    if p0 <= delta or math.log((p0 - delta) / p1) <= claim:
        return None

    def flags(m: int) -> bool:
        return _epsilon_lb(math.floor(p0 * m), min(m, math.ceil(p1 * m)), m, delta, STRICT_ALPHA) > claim

    lo, hi = 1, max(2, n)
    while not flags(hi):
        lo, hi = hi, 2 * hi
        if hi > _MAX_DRAWS:
            return None
    while hi - lo > max(1, hi // 1000):  # to 0.1 %: the figure is an estimate, not a bound
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if flags(mid) else (mid, hi)
    return math.ceil(2 * hi / result.trial_share)


# ---------------------------------------------------------------- the audited mechanisms

_W = Window(60, 60)


def _metric(aggregate: Aggregate, mechanism: Mechanism, **kw: Any) -> Metric:
    return Metric(
        name=f"audit_{aggregate.value}_{mechanism.value}",
        source="audit",
        budget="audit",
        weight=1.0,
        window=_W,
        aggregate=aggregate,
        mechanism=mechanism,
        **kw,
    )


def _value_case(name: str, mech: ReleaseMechanism, claim: Claim, x: object, x_prime: object) -> AuditCase:
    """Neighbouring true values x, x' as the mechanism takes them (a number, or top-k's scores)."""
    return AuditCase(name, claim, lambda n: mech.noise_batch(x, n), lambda n: mech.noise_batch(x_prime, n))


def _histogram_case(name: str, mech: ReleaseMechanism, claim: Claim, keys: int, per_key: int) -> AuditCase:
    """A unit adds `per_key` to each of `keys` keys; the audit sees the sum of those coordinates."""

    def sampler(shift: int) -> Callable[[int], list[float]]:
        def draw(n: int) -> list[float]:
            flat = mech.noise_batch(100 + shift, keys * n)
            return [sum(flat[i * keys : (i + 1) * keys]) for i in range(n)]

        return draw

    return AuditCase(name, claim, sampler(0), sampler(per_key))


def _top_k_scores(m: int, linf: int) -> tuple[dict[str, int], dict[str, int]]:
    """Worst case under L∞: candidate 0 rises by Δ∞ while all m others fall by Δ∞."""
    keys = [f"c{i:02d}" for i in range(m + 1)]
    d = {k: (0 if i == 0 else linf) for i, k in enumerate(keys)}
    d_prime = {k: (linf if i == 0 else 0) for i, k in enumerate(keys)}
    return d, d_prime


def _selection_case(name: str, mech: ReleaseMechanism, claim: Claim, per_key: int) -> AuditCase:
    """D has one key held only by the audited unit (count = Δ∞), D' has no key at all."""

    def draw(values: dict[str, int]) -> Callable[[int], list[float]]:
        def run(n: int) -> list[float]:
            return [mech.release(values).values.get("u", _NOT_RELEASED) for _ in range(n)]

        return run

    return AuditCase(name, claim, draw({"u": per_key}), draw({}), trial_share=0.2)


def _specs() -> list[tuple[str, ReleaseMechanism, Claim, Callable[[str, ReleaseMechanism, Claim], AuditCase]]]:
    rho, eps = 0.5, 1.0
    zcdp = Claim(rho=rho, scope_delta=_SCOPE_DELTA)
    count_l = _metric(Aggregate.COUNT, Mechanism.LAPLACE, contribution=Contribution(1, 3))
    count_g = _metric(Aggregate.COUNT, Mechanism.GAUSSIAN, contribution=Contribution(1, 3))
    hist_g = _metric(
        Aggregate.COUNT,
        Mechanism.GAUSSIAN,
        contribution=Contribution(3, 2),
        group_by="page",
        keys=("a", "b", "c", "d", "e"),
    )
    sum_g = _metric(
        Aggregate.SUM, Mechanism.GAUSSIAN, contribution=Contribution(1, 2), value="v", bounds=Bounds(0.0, 200.0)
    )
    sum_l = _metric(
        Aggregate.SUM, Mechanism.LAPLACE, contribution=Contribution(1, 1), value="v", bounds=Bounds(-5.0, 10.0)
    )
    keys = tuple(f"c{i:02d}" for i in range(21))
    top_g = _metric(Aggregate.TOP_K, Mechanism.EXPONENTIAL, k=1, group_by="r", keys=keys)
    sel_g = _metric(Aggregate.COUNT, Mechanism.GAUSSIAN, contribution=Contribution(1, 3), group_by="page")
    top_eps = 2.0
    d, d_prime = _top_k_scores(20, 1)
    m_top_z = build_release_mechanism(top_g, Accounting.ZCDP, top_eps**2 / 8.0)
    m_top_p = build_release_mechanism(top_g, Accounting.PURE, top_eps)
    m_sel = build_release_mechanism(sel_g, Accounting.ZCDP, rho, delta=_SCOPE_DELTA)
    assert m_sel.partition_selection is not None  # data-derived keys: it selects partitions
    sel_claim = Claim(rho=rho, scope_delta=2 * _SCOPE_DELTA, extra_delta=m_sel.partition_selection["delta"])
    return [
        (
            "count / discrete Laplace (pure, eps=1, max_per_key=3)",
            build_release_mechanism(count_l, Accounting.PURE, eps),
            Claim(epsilon=eps),
            lambda n, m, c: _value_case(n, m, c, 50, 53),
        ),
        (
            "count / discrete Gaussian (zCDP, rho=0.5, max_per_key=3)",
            build_release_mechanism(count_g, Accounting.ZCDP, rho),
            zcdp,
            lambda n, m, c: _value_case(n, m, c, 50, 53),
        ),
        (
            "histogram / discrete Gaussian (zCDP, rho=0.5, L0=3, Linf=2)",
            build_release_mechanism(hist_g, Accounting.ZCDP, rho),
            zcdp,
            lambda n, m, c: _histogram_case(n, m, c, 3, 2),
        ),
        (
            "sum [0,200] / fixed-point Gaussian (zCDP, rho=0.5)",
            build_release_mechanism(sum_g, Accounting.ZCDP, rho),
            zcdp,
            lambda n, m, c: _value_case(n, m, c, 1000.0, 1400.0),
        ),
        (
            "sum [-5,10] / fixed-point Laplace (pure, eps=1)",
            build_release_mechanism(sum_l, Accounting.PURE, eps),
            Claim(epsilon=eps),
            lambda n, m, c: _value_case(n, m, c, -20.0, -10.0),
        ),
        (
            "top-1 of 21 / Gumbel (zCDP, rho=0.5)",
            m_top_z,
            Claim(epsilon=top_eps, rho=top_eps**2 / 8.0, scope_delta=_SCOPE_DELTA),
            lambda n, m, c: _value_case(n, m, c, d, d_prime),
        ),
        (
            "top-1 of 21 / permute-and-flip (pure, eps=2)",
            m_top_p,
            Claim(epsilon=top_eps),
            lambda n, m, c: _value_case(n, m, c, d, d_prime),
        ),
        (
            "partition selection / Gaussian threshold (zCDP, rho=0.5)",
            m_sel,
            sel_claim,
            lambda n, m, c: _selection_case(n, m, c, 3),
        ),
    ]


def standard_cases() -> list[AuditCase]:
    """The production mechanisms at their worst-case neighbouring inputs."""
    return [make(name, mech, claim) for name, mech, claim, make in _specs()]


class _Halved(ReleaseMechanism):
    """A deliberately broken copy of a mechanism: same claim, half the noise scale (power check)."""

    def __init__(self, mech: ReleaseMechanism) -> None:
        self._inner = mech
        noise = getattr(mech, "_noise", None)
        top = getattr(mech, "_top", None)
        domain = dp.vector_domain(dp.atom_domain(T="i64"))
        if top is not None:
            measure = dp.zero_concentrated_divergence() if "gumbel" in top.name else dp.max_divergence()
            self._top_meas = dp.m.make_noisy_top_k(
                domain, dp.linf_distance(T="i64"), measure, k=top.k, scale=top.scale / 2
            )
            self._keys = mech.metric.keys
        else:
            assert isinstance(noise, measurements.IntegerNoise)
            make = dp.m.make_gaussian if noise.mechanism is Mechanism.GAUSSIAN else dp.m.make_laplace
            metric = dp.l2_distance(T=float) if noise.mechanism is Mechanism.GAUSSIAN else dp.l1_distance(T="i64")
            self._meas = make(domain, metric, scale=noise.scale / 2)
            self._codec = mech._codec  # type: ignore[attr-defined]  # only _ValueRelease has _noise, and it has a codec

    def noise_batch(self, true_value: Any, n: int) -> list[float]:
        if hasattr(self, "_top_meas"):
            assert self._keys is not None  # the audited top-k declares its keys
            scores = [int(true_value.get(k, 0)) for k in self._keys]
            return [float(self._top_meas(scores)[0]) for _ in range(n)]
        units = self._meas([self._codec.encode(true_value)] * n)
        return [self._codec.decode(u) for u in units]


def broken_cases() -> list[AuditCase]:
    """The same audits on mechanisms with half their declared scale: each must be flagged."""
    out = []
    for name, mech, claim, make in _specs():
        if mech.partition_selection is not None:
            continue  # halving a threshold's scale only lowers its δ; nothing to flag
        out.append(make(f"BROKEN (half scale) {name}", _Halved(mech), claim))
    return out
