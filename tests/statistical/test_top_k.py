"""Noisy top-k picks ordered pairs with exactly the probabilities its mechanism predicts (χ² test).

zCDP scopes use OpenDP's Gumbel top-k, i.e. the exponential mechanism peeled k times:
P(i, then j) = softmax_i(q/s) · softmax_j over the rest. Pure scopes use permute-and-flip
(McKenna & Sheldon 2020), peeled: candidates in random order, each accepted with probability
exp((q_r − q*)/s); its exact law is enumerated over permutations. Threshold p < 1e-7.
"""

from __future__ import annotations

import itertools
import math

import pytest

from dpstream.topology.model import Accounting, Aggregate, Mechanism, Metric, Window
from dpstream.workers.audit.stats import chi2_sf
from dpstream.workers.noise import build_release_mechanism

KEYS = ("a", "b", "c", "d", "e")
SCORES = {"a": 6, "b": 5, "c": 3, "d": 3, "e": 0}
SCALE = 2.0  # ε = 2kΔ∞/s = 2 for k = 2, Δ∞ = 1
TRIALS = 20_000
P_MIN = 1e-7


def _gumbel(pool: list[str]) -> dict[str, float]:
    w = {k: math.exp(SCORES[k] / SCALE) for k in pool}
    total = sum(w.values())
    return {k: v / total for k, v in w.items()}


def _permute_and_flip(pool: list[str]) -> dict[str, float]:
    best = max(SCORES[k] for k in pool)
    accept = {k: math.exp((SCORES[k] - best) / SCALE) for k in pool}
    probs = dict.fromkeys(pool, 0.0)
    orders = list(itertools.permutations(pool))
    for order in orders:
        reach = 1.0
        for k in order:
            probs[k] += reach * accept[k] / len(orders)
            reach *= 1.0 - accept[k]
    return probs


def _pairs(first_law) -> dict[tuple[str, str], float]:
    out = {}
    for i, pi in first_law(list(KEYS)).items():
        for j, pj in first_law([k for k in KEYS if k != i]).items():
            out[(i, j)] = pi * pj
    return out


@pytest.mark.parametrize(
    "accounting,law",
    [(Accounting.ZCDP, _gumbel), (Accounting.PURE, _permute_and_flip)],
    ids=["gumbel", "permute-and-flip"],
)
def test_top_2_frequencies_match_mechanism(accounting: Accounting, law) -> None:
    """Observed ordered top-2 pairs fit the mechanism's exact law (χ², bins with expected < 5 merged)."""
    metric = Metric(
        name="top",
        source="s",
        budget="b",
        weight=1.0,
        window=Window(60, 60),
        aggregate=Aggregate.TOP_K,
        mechanism=Mechanism.EXPONENTIAL,
        k=2,
        group_by="r",
        keys=KEYS,
    )
    eps = 2.0 * 2 / SCALE
    cost = eps if accounting is Accounting.PURE else eps**2 / (8 * 2)
    mech = build_release_mechanism(metric, accounting, cost)
    assert mech.release(SCORES).noise["scale"] == pytest.approx(SCALE, rel=1e-12)
    expected = _pairs(law)
    assert sum(expected.values()) == pytest.approx(1.0, abs=1e-12)
    observed = dict.fromkeys(expected, 0)
    for _ in range(TRIALS):
        observed[mech.release(SCORES).keys] += 1
    big = [p for p in expected if expected[p] * TRIALS >= 5]
    small = [p for p in expected if p not in big]
    cells = [(observed[p], expected[p] * TRIALS) for p in big]
    if small:
        cells.append((sum(observed[p] for p in small), sum(expected[p] for p in small) * TRIALS))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    assert chi2_sf(stat, len(cells) - 1) > P_MIN


def test_laws_differ() -> None:
    """The two laws are distinguishable at this trial count (the test has power to tell them apart)."""
    g, p = _pairs(_gumbel), _pairs(_permute_and_flip)
    stat = sum((p[k] - g[k]) ** 2 / g[k] for k in g) * TRIALS
    assert chi2_sf(stat, len(g) - 1) < P_MIN
