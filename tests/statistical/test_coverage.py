"""The published 95 % intervals cover the true value as often as they claim.

For discrete noise the exact coverage P(|X| ≤ h) is ≥ 95 % and can exceed it at small scales
(h is an integer); the empirical rate must match the exact one within 5 standard errors (false
failures < 1e-6), and be 95 % ± 1 % wherever the discreteness allows (exact ≤ 96 %). 10⁴ trials
would make ±1 % only a 4.6-SE bound, so these use ≥ 10⁵ trials (±1 % ≈ 14.5 SE).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpstream.topology.model import Accounting, Aggregate, Bounds, Mechanism, Metric, Window
from dpstream.workers.noise import build_release_mechanism, discrete
from tests.statistical._draws import CASES, Z, noise

IDS = [c.name for c in CASES]


def _exact_coverage(case_index: int) -> tuple[float, float]:
    case = CASES[case_index]
    rec = case.mech.release({"": case.true_value})
    step = rec.noise.get("grid_step", 1.0)
    h_units = round(rec.ci["half_width"] / step)
    scale_units = rec.noise["scale"] / step
    if case.metric.mechanism is Mechanism.GAUSSIAN:
        return discrete.gaussian_coverage(scale_units, h_units), rec.ci["half_width"]
    return discrete.laplace_coverage(scale_units, h_units), rec.ci["half_width"]


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_ci_coverage(index: int) -> None:
    """Empirical coverage of the declared half-width equals the exact coverage (≥ 95 %), 95 ± 1 % where possible."""
    exact, half = _exact_coverage(index)
    x = noise(index)
    step = CASES[index].mech.release({"": CASES[index].true_value}).noise.get("grid_step", 0.0)
    # noise is measured against the unrounded true value; compare on the grid
    offset = (CASES[index].true_value / step - round(CASES[index].true_value / step)) * step if step else 0.0
    covered = float(np.mean(np.abs(x + offset) <= half + 1e-9))
    n = len(x)
    assert exact >= 0.95
    assert abs(covered - exact) <= Z * math.sqrt(exact * (1 - exact) / n)
    if exact <= 0.96:
        assert abs(covered - 0.95) <= 0.01


def test_ratio_mean_interval_is_approximately_95() -> None:
    """The noisy-ratio mean's delta-method interval covers the true mean 95 % ± 1.5 % when n ≫ σ_count."""
    m = Metric(
        name="mean",
        source="s",
        budget="b",
        weight=1.0,
        window=Window(60, 60),
        aggregate=Aggregate.MEAN,
        mechanism=Mechanism.GAUSSIAN,
        value="v",
        bounds=Bounds(0.0, 100.0),
    )
    mech = build_release_mechanism(m, Accounting.ZCDP, 0.02)
    true_sum, count = 70.0 * 2000, 2000
    trials = 40_000
    means = np.asarray(mech.noise_batch((true_sum, count), trials))
    rec = mech.release({"": (true_sum, count)})
    half = rec.ci["half_width"][""]  # data-independent enough at this n: |Δhalf| ≪ half
    covered = float(np.mean(np.abs(means - 70.0) <= half))
    # 5 SE at 4·10⁴ trials is 0.0054; the delta-method approximation error is well below 1 %
    assert abs(covered - 0.95) <= 0.015
