"""The error statement of a released quantile holds at its stated level (one-sided binomial test).

Statement (`calibration.quantile_rank_error`): with probability ≥ 95 % the released candidate's rank
error |(1 − α)·#(x < c) − α·#(x > c)| is at most r above the smallest of the grid, r = scale·ln((m − 1)/0.05).
Published noise is a CSPRNG and cannot be seeded, so no retries: each case runs N independent
releases of the production mechanism and fails only if fewer than K of them cover, where K is set
by the exact binomial tail so that a mechanism whose coverage is exactly 95 % fails any of the
cases with probability < 1e-6 (union bound over every (case, level) test of this file). The
synthetic data sets use a seeded RNG (they are the input, not the noise).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
from scipy.stats import binom

from dpstream.topology.calibration import QUANTILE_LEVEL, quantile_rank_error
from dpstream.topology.model import Accounting, Aggregate, Bounds, Contribution, Mechanism, Metric, Window
from dpstream.workers.noise import build_release_mechanism
from dpstream.workers.noise.quantiles import QuantileRelease, rank_distance, scores, value_vector
from dpstream.workers.pipeline.quantile_cells import cell_count, cell_index

LEVELS = (0.5, 0.9, 0.99)
GRID = tuple(float(c) for c in range(0, 101, 2))  # bins: 50 over [0, 100]
N_VALUES = 2_000
TRIALS = 1_000
COSTS = {Accounting.ZCDP: 0.005, Accounting.PURE: 0.3}
"""Scales near 15 ranks (r ≈ 100 of 2,000 values): the noise matters, the statement is not trivial."""
DATASETS = ("uniform", "exponential", "ties_on_candidates", "two_modes_with_a_gap")
TESTS = len(COSTS) * len(DATASETS) * len(LEVELS)
FALSE_FAILURE = 1e-6


def _k_min(trials: int, level: float, tests: int, false_failure: float) -> int:
    """Smallest K with P(Bin(trials, level) < K) ≤ false_failure / tests: at exactly the stated
    coverage, the assertion 'covered ≥ K' fails in any of `tests` with probability < false_failure."""
    k = int(trials * level)
    while k > 0 and binom.cdf(k - 1, trials, level) > false_failure / tests:
        k -= 1
    return k


K_MIN = _k_min(TRIALS, QUANTILE_LEVEL, TESTS, FALSE_FAILURE)


def _metric() -> Metric:
    return Metric(
        name="q",
        source="s",
        budget="b",
        weight=1.0,
        window=Window(60, 60),
        aggregate=Aggregate.QUANTILE,
        mechanism=Mechanism.EXPONENTIAL,
        contribution=Contribution(1, 1),
        value="v",
        bounds=Bounds(0.0, 100.0),
        quantiles=LEVELS,
        candidates=GRID,
    )


@cache
def _cells(dataset: str) -> tuple[int, ...]:
    rng = np.random.default_rng(sorted(DATASETS).index(dataset) + 11)
    if dataset == "uniform":
        values = rng.uniform(0, 100, N_VALUES)
    elif dataset == "exponential":
        values = np.minimum(rng.exponential(12.0, N_VALUES), 100.0)
    elif dataset == "ties_on_candidates":
        values = rng.choice(np.array(GRID[::5]), N_VALUES)
    else:
        values = np.concatenate([rng.uniform(10.5, 11.5, N_VALUES // 2), rng.uniform(80.5, 81.5, N_VALUES // 2)])
    cells = [0] * cell_count(GRID)
    for v in values:
        cells[cell_index(GRID, float(v))] += 1
    return tuple(cells)


@cache
def _coverage(accounting: Accounting, dataset: str) -> tuple[list[int], float]:
    """Covered releases per level over TRIALS, and r (one scale for every level)."""
    mech = build_release_mechanism(_metric(), accounting, COSTS[accounting])
    assert isinstance(mech, QuantileRelease)
    cells = _cells(dataset)
    r = quantile_rank_error(mech.levels[0].scale, len(GRID))
    best = [min(scores(a, GRID, cells)) for a in LEVELS]
    table = [dict(zip(GRID, scores(a, GRID, cells), strict=True)) for a in LEVELS]
    covered = [0] * len(LEVELS)
    values = value_vector(GRID, cells)
    for _ in range(TRIALS):
        for i, q in enumerate(mech.levels):  # each level's own draw (the release sorts them afterwards)
            chosen = q.select(values)
            covered[i] += table[i][chosen] <= best[i] + r
            assert rank_distance(LEVELS[i], GRID, cells, chosen) <= table[i][chosen] + 1e-9
    return covered, r


def test_the_threshold_is_what_the_binomial_tail_says() -> None:
    assert binom.cdf(K_MIN - 1, TRIALS, QUANTILE_LEVEL) <= FALSE_FAILURE / TESTS
    assert binom.cdf(K_MIN, TRIALS, QUANTILE_LEVEL) > FALSE_FAILURE / TESTS
    assert 0.9 * TRIALS < K_MIN < QUANTILE_LEVEL * TRIALS


@pytest.mark.parametrize("dataset", DATASETS)
@pytest.mark.parametrize("accounting", list(COSTS), ids=[a.value for a in COSTS])
def test_the_rank_error_statement_covers_at_its_stated_level(accounting: Accounting, dataset: str) -> None:
    covered, r = _coverage(accounting, dataset)
    assert 0 < r < N_VALUES / 5, r  # a statement worth reading: not vacuous for 2,000 values
    for alpha, hits in zip(LEVELS, covered, strict=True):
        assert hits >= K_MIN, f"α={alpha}: {hits}/{TRIALS} covered (need ≥ {K_MIN}), r={r:.1f}"


def test_the_statement_is_not_vacuous_the_noise_does_move_the_candidate() -> None:
    """At this scale the released p50 of uniform data is not always the best candidate."""
    mech = build_release_mechanism(_metric(), Accounting.ZCDP, COSTS[Accounting.ZCDP])
    assert isinstance(mech, QuantileRelease)
    values = value_vector(GRID, _cells("uniform"))
    picks = {mech.levels[0].select(values) for _ in range(200)}
    assert len(picks) > 1 and math.isfinite(min(picks))
