"""`dpstream bench running-total`: the strategies' exact stds against the issue's theory (arithmetic, no timing)."""

from __future__ import annotations

import argparse
import math

import pytest

from dpstream.workers.bench import running_total as bench


def test_strategy_stds_match_theory() -> None:
    """At T = 1,440 and one ρ: (c) 3.381 within 1 %, (b) 10.49 and (a) 37.95 within 0.1 %, ratios 3.10× and 11.2×."""
    rows = bench.strategy_stds(1440, 2.0, 0.125)  # σ unit L/√(2ρ) = 4
    for name, want in bench.THEORY_PER_UNIT.items():
        got = rows[name]["max_std_per_unit"]
        assert math.isclose(got, want, rel_tol=0.01 if name == "sqrt_factorization" else 1e-3), (name, got)
        assert math.isclose(rows[name]["max_std"], 4 * got, rel_tol=1e-12)
    sqrt = rows["sqrt_factorization"]["max_std"]
    assert round(rows["binary_tree"]["max_std"] / sqrt, 2) == 3.10
    assert round(rows["independent"]["max_std"] / sqrt, 1) == 11.2
    assert rows["binary_tree"]["sensitivity"] == pytest.approx(2.0 * math.sqrt(11))
    assert rows["sqrt_factorization"]["mean_std"] < rows["binary_tree"]["mean_std"] < rows["independent"]["mean_std"]


def test_bench_prints_without_timing(capsys: pytest.CaptureFixture[str]) -> None:
    """The command prints the three strategies and OpenDP's ρ; --reps 0 skips the step timing."""
    args = argparse.Namespace(T=1440, L=1.0, rho=0.5, reps=0, json=False)
    assert bench.run(args) == 0
    out = capsys.readouterr().out
    for name in bench.THEORY_PER_UNIT:
        assert name in out
    assert "vs theory 3.381" in out
    assert "OpenDP privacy map" in out
