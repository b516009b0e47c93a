"""Shared draws for the calibration and coverage tests: production mechanisms at three scales each.

One OpenDP vector call per case (n independent releases of one key); cached so calibration and
coverage reuse the same samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from dpstream.topology.model import Accounting, Aggregate, Bounds, Contribution, Mechanism, Metric, Window
from dpstream.workers.noise import build_release_mechanism
from dpstream.workers.noise.mechanisms import ReleaseMechanism

Z = 5.0
"""Two-sided z of every assertion: P(|N(0,1)| > 5) = 5.7e-7 < 1e-6."""

SIGMA_RTOL = 0.02
MIN_DRAWS = 100_000

_W = Window(60, 60)


@dataclass(frozen=True)
class Case:
    """One mechanism at one scale; `unit` is the grid step (1 for counts)."""

    name: str
    metric: Metric
    accounting: Accounting
    cost: float
    true_value: float

    @property
    def mech(self) -> ReleaseMechanism:
        return build_release_mechanism(self.metric, self.accounting, self.cost)


def _m(aggregate: Aggregate, mechanism: Mechanism, **kw: Any) -> Metric:
    return Metric(
        name="cal", source="s", budget="b", weight=1.0, window=_W, aggregate=aggregate, mechanism=mechanism, **kw
    )


def _cases() -> list[Case]:
    out = []
    count_g = _m(Aggregate.COUNT, Mechanism.GAUSSIAN)
    count_l = _m(Aggregate.COUNT, Mechanism.LAPLACE)
    sum_g = _m(Aggregate.SUM, Mechanism.GAUSSIAN, value="v", bounds=Bounds(0.0, 200.0), contribution=Contribution(1, 2))
    sum_l = _m(Aggregate.SUM, Mechanism.LAPLACE, value="v", bounds=Bounds(-5.0, 10.0))
    for sigma in (2.0, 40.0, 3000.0):  # ρ = Δ²/(2σ²), Δ = 1
        out.append(Case(f"count/gaussian sigma={sigma:g}", count_g, Accounting.ZCDP, 1 / (2 * sigma**2), 1000))
    for b in (2.0, 40.0, 3000.0):  # ε = Δ/b
        out.append(Case(f"count/laplace b={b:g}", count_l, Accounting.PURE, 1 / b, 1000))
    for sigma in (5.0, 400.0, 50_000.0):  # Δ = 400
        out.append(
            Case(f"sum/fixed-point gaussian sigma~{sigma:g}", sum_g, Accounting.ZCDP, 400**2 / (2 * sigma**2), 12345.5)
        )
    for b in (1.0, 25.0, 2_000.0):  # Δ = 10
        out.append(Case(f"sum/fixed-point laplace b~{b:g}", sum_l, Accounting.PURE, 10 / b, -42.25))
    return out


CASES = _cases()


def kurtosis(case: Case) -> float:
    """Exact kurtosis of the integer noise (pmf sums on the grid; continuous limit for wide ones)."""
    rec = case.mech.release({"": case.true_value})
    step = rec.noise.get("grid_step", 1.0)
    scale = rec.noise["scale"] / step
    gaussian = case.metric.mechanism is Mechanism.GAUSSIAN
    if scale > 2000:
        return 3.0 if gaussian else 6.0
    top = int(60 * scale) + 60
    x = np.arange(-top, top + 1, dtype=float)
    w = np.exp(-(x * x) / (2 * scale * scale)) if gaussian else np.exp(-np.abs(x) / scale)
    p = w / w.sum()
    m2 = float(np.dot(x**2, p))
    return float(np.dot(x**4, p)) / m2**2


def draws_needed(case: Case) -> int:
    """Draws so that a 2 % error in σ is ≥ Z standard errors: SE(s)/σ ≈ √(κ−1)/(2√n) (delta method)."""
    return max(MIN_DRAWS, math.ceil((Z * math.sqrt(kurtosis(case) - 1.0) / (2 * SIGMA_RTOL)) ** 2))


@cache
def noise(case_index: int) -> np.ndarray:
    """Noise of n independent releases of case `case_index` (release − true value)."""
    case = CASES[case_index]
    n = draws_needed(case)
    return np.asarray(case.mech.noise_batch(case.true_value, n), dtype=float) - case.true_value
