"""DP quantiles: OpenDP's private quantile (quantile score + noisy max) over a public candidate grid.

The pipeline keeps, per window, how many bounded values fall in each cell of the grid
c_0 < … < c_{m-1}: below c_0, at c_0, strictly between c_0 and c_1, at c_1, …, above c_{m-1}
(2m + 1 counts, fixed memory). OpenDP's score of a candidate, |(1 − α)·#(x < c) − α·#(x > c)|,
depends only on those counts, so the release rebuilds a value vector with exactly the same scores
(each count at a point of its cell) and feeds it to `make_private_quantile` on a symmetric-distance
input of unknown size at d_in = max_keys · max_per_key. Every level is built at the one scale
`topology.calibration` sets, and its privacy map at d_in is checked against that level's charge;
the release's cost is their sum, charged once.

The record carries, per level, the released candidate ('p50', ...) and an error statement that does
not depend on the data: with probability ≥ 95 % the candidate's rank error — OpenDP's score
|(1 − α)·#(x < c) − α·#(x > c)|, which is |#(x < c) − α·n| when no value equals c — is at most
`rank_error` above the smallest of the grid's candidates. The levels' values are then sorted
(free post-processing, flagged `sorted`).
"""

from __future__ import annotations

__all__ = [
    "STATEMENT",
    "PrivateQuantile",
    "QuantileRelease",
    "cell_count",
    "cell_index",
    "mechanism_name",
    "private_quantile",
    "rank_distance",
    "scores",
    "value_vector",
]

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import opendp.prelude as dp

from dpstream.topology.calibration import QUANTILE_LEVEL, calibrate, quantile_rank_error
from dpstream.topology.errors import InternalError
from dpstream.topology.model import Accounting, Metric
from dpstream.topology.sensitivity import quantile_d_in
from dpstream.workers.noise.measurements import _scale_within, check_within_charge
from dpstream.workers.noise.mechanisms import ReleaseMechanism
from dpstream.workers.noise.release import FrozenFields, NoisyRelease, apply_postprocess
from dpstream.workers.pipeline.quantile_cells import cell_count, cell_index, quantile_scores
from dpstream.workers.release.event import Noise, NoiseEvent, PrivacyEvent

STATEMENT = (
    "with probability >= {level} the released candidate c's rank error |(1-alpha)*#(x < c) - alpha*#(x > c)| "
    "(with no value at c: |#(x < c) - alpha*n|, its distance in ranks from the alpha-quantile) is at most "
    "rank_error above the smallest rank error of any candidate of the public grid"
)
"""The error statement every quantile record carries beside its per-level `rank_error`."""


def _representatives(candidates: Sequence[float]) -> np.ndarray:
    """A point of each cell: the candidate itself, the midpoint between neighbours, and one unit
    beyond the ends (any point of a cell has the same comparisons with every candidate)."""
    points = [candidates[0] - 1.0]
    for i, c in enumerate(candidates):
        points.append(c)
        nxt = candidates[i + 1] if i + 1 < len(candidates) else c + 2.0
        mid = c + (nxt - c) / 2.0
        if not c < mid < nxt:
            raise InternalError(f"quantile candidates {c!r} and {nxt!r} have no float between them")
        points.append(mid)
    points[-1] = candidates[-1] + 1.0
    return np.asarray(points, dtype=np.float64)


def value_vector(candidates: Sequence[float], cells: Sequence[int]) -> np.ndarray:
    """Values with the counts of `cells`, one per counted value at its cell's point: OpenDP scores
    every candidate on them exactly as on the bounded values themselves."""
    if len(cells) != cell_count(candidates) or min(cells, default=0) < 0:
        raise InternalError(f"quantile cells of length {len(cells)} for {len(candidates)} candidates")
    return np.repeat(_representatives(candidates), np.asarray(cells, dtype=np.int64))


@dataclass(frozen=True)
class PrivateQuantile:
    """OpenDP's private quantile at one level α, scale and d_in; its map is the level's charge."""

    alpha: float
    scale: float
    d_in: int
    cost: float
    meas: Any

    def select(self, values: np.ndarray) -> float:
        """The released candidate for these values (one noisy-max draw)."""
        return float(self.meas(values))


def _output_measure(accounting: Accounting) -> Any:
    return dp.max_divergence() if accounting is Accounting.PURE else dp.zero_concentrated_divergence()


def mechanism_name(accounting: Accounting) -> str:
    """The record's `mechanism`: OpenDP's noisy max is Gumbel in zCDP, permute-and-flip in pure ε."""
    return "private_quantile_" + ("permute_and_flip" if accounting is Accounting.PURE else "gumbel")


@lru_cache(maxsize=256)
def private_quantile(
    accounting: Accounting, alpha: float, candidates: tuple[float, ...], d_in: int, cost: float, scale: float
) -> PrivateQuantile:
    """The level-α measurement at `scale` (nudged up a few ulps if OpenDP's rounded-up map exceeds
    `cost`), refused unless its privacy map at `d_in` equals `cost` and is not above it."""
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False))  # no size: never a known-size domain
    measure = _output_measure(accounting)

    def build(s: float) -> Any:
        return dp.m.make_private_quantile(
            domain, dp.symmetric_distance(), measure, candidates=list(candidates), alpha=alpha, scale=s
        )

    scale = _scale_within(lambda s: build(s).map(d_in), scale, cost)
    meas = build(scale)
    check_within_charge(f"{mechanism_name(accounting)} α={alpha}", meas.map(d_in), cost)
    return PrivateQuantile(alpha, scale, d_in, cost, meas)


class QuantileRelease(ReleaseMechanism):
    """One quantile metric's release at one cost: every level by OpenDP's private quantile
    (nothing is clamped here: values were clamped to the bounds at ingest)."""

    def __init__(self, metric: Metric, accounting: Accounting, cost: float, delta: float) -> None:
        if metric.candidates is None or metric.quantiles is None:
            raise InternalError(f"metric {metric.name!r}: a quantile without levels or grid passed validation")
        self.metric, self.cost, self.delta = metric, cost, delta
        self._candidates = metric.candidates
        d_in = quantile_d_in(metric)
        parts = calibrate(metric, accounting, cost)
        self.levels = tuple(
            private_quantile(accounting, alpha, metric.candidates, d_in, part.cost, part.scale)
            for alpha, part in zip(metric.quantiles, parts, strict=True)
        )
        self._labels = metric.quantile_labels
        self._name = mechanism_name(accounting)
        m = len(metric.candidates)
        scale = max(q.scale for q in self.levels)
        self.rank_errors = {
            label: quantile_rank_error(q.scale, m) for label, q in zip(self._labels, self.levels, strict=True)
        }
        self._noise = FrozenFields(scale=scale, stddev=None, candidates=m)
        self._ci = FrozenFields(
            level=QUANTILE_LEVEL,
            rank_error=FrozenFields(self.rank_errors),
            statement=STATEMENT.format(level=QUANTILE_LEVEL),
        )
        self._flags = FrozenFields(apply_postprocess({}, metric.postprocess)[1], sorted=True)
        self.event = PrivacyEvent(
            accounting,
            cost,
            tuple(NoiseEvent(Noise.QUANTILE, q.scale, float(q.d_in), q.cost, alpha=q.alpha) for q in self.levels),
            max_windows=metric.contribution.max_windows,
        )

    def release(self, true_values: Mapping[str, Any]) -> NoisyRelease:
        """The released candidate per level, sorted across levels (flagged post-processing)."""
        cells = true_values.get("", (0,) * cell_count(self._candidates))
        _check_cells(cells)
        values = value_vector(self._candidates, cells)
        chosen = sorted(q.select(values) for q in self.levels)
        raw = dict(zip(self._labels, chosen, strict=True))
        out, _ = apply_postprocess(raw, self.metric.postprocess)
        return NoisyRelease(
            values=out,
            mechanism=self._name,
            noise=self._noise,
            ci=self._ci,
            cost=self.cost,
            postprocess=self._flags,
            partition_selection=None,
            event=self.event,
        )

    def noise_batch(self, true_value: Any, n: int) -> list[float]:
        """n independent releases of the first level for these cells, before post-processing (tests, audit)."""
        values = value_vector(self._candidates, true_value)
        return [self.levels[0].select(values) for _ in range(n)]


def _check_cells(cells: Sequence[int]) -> None:
    if not all(type(c) is int for c in cells):
        raise InternalError("quantile cells are not integer counts")


def scores(alpha: float, candidates: Sequence[float], cells: Sequence[int]) -> list[float]:
    """The (unscaled) score |(1 − α)·#(x < c) − α·#(x > c)| of each candidate, from the cells
    (for tests and the coverage check; the release uses OpenDP's own scoring)."""
    _check_cells(cells)
    return quantile_scores(alpha, candidates, cells)


def rank_distance(alpha: float, candidates: Sequence[float], cells: Sequence[int], chosen: float) -> float:
    """Distance from α·n to the rank range [#values < c, #values ≤ c] of candidate `chosen` (at most
    its rank error, the score: so the statement bounds this distance too)."""
    at = cell_index(candidates, chosen)
    n = sum(cells)
    lt = sum(cells[:at])
    le = lt + cells[at]
    target = alpha * n
    return max(0.0, lt - target, target - le)
