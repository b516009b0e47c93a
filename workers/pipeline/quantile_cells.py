"""The cells of a quantile metric's public candidate grid c_0 < … < c_{m-1}, as the pipeline counts them.

2m + 1 cells: below c_0 (0), at c_i (2i + 1), strictly between c_{i-1} and c_i (2i), above
c_{m-1} (2m). OpenDP's quantile score of each candidate compares values with it (< and >) only,
so the counts per cell are all a release needs (fixed memory, deterministic, mergeable by adding).
"""

from __future__ import annotations

__all__ = ["cell_count", "cell_index", "quantile_scores"]

from bisect import bisect_left
from collections.abc import Sequence


def cell_count(candidates: Sequence[float]) -> int:
    """2m + 1: below c_0, at each candidate, between neighbours, above c_{m-1}."""
    return 2 * len(candidates) + 1


def cell_index(candidates: Sequence[float], value: float) -> int:
    """The cell of `value`: 2i + 1 when it equals c_i, 2i when it lies strictly between c_{i-1} and
    c_i (0 below c_0, 2m above c_{m-1})."""
    i = bisect_left(candidates, value)
    if i < len(candidates) and candidates[i] == value:
        return 2 * i + 1
    return 2 * i


def quantile_scores(alpha: float, candidates: Sequence[float], cells: Sequence[int]) -> list[float]:
    """The rank error |(1 − α)·#(x < c) − α·#(x > c)| of each candidate (OpenDP's quantile score,
    unscaled) from the cell counts: for the demo's truth and the tests; releases use OpenDP's own."""
    n = sum(cells)
    out: list[float] = []
    below = 0
    for i in range(len(candidates)):
        below += cells[2 * i]
        above = n - below - cells[2 * i + 1]
        out.append(abs((1.0 - alpha) * below - alpha * above))
        below += cells[2 * i + 1]
    return out
