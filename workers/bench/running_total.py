"""`dpstream bench running-total`: exact error of three running-total strategies at one ρ, and step cost.

Strategies for the T prefix sums of one period, each a factorization A = B·S (noise on S x at the
scale that makes its L2 sensitivity L·max column norm of S cost ρ, published B(S x + z)):
(a) independent per-step noise summed (S = I, B = A), (b) the binary tree (S = the complete dyadic
blocks of ⌊log₂T⌋ + 1 levels, B = each prefix's dyadic decomposition), (c) dpstream's square-root
factorization (S = B = C). Stds are exact (σ·row norms of B), not sampled. Step cost is timed on
`RunningState.next` + `append`, the releaser's step (two numpy dots over the stored x's and y's, one
OpenDP call).
"""

from __future__ import annotations

__all__ = ["THEORY_PER_UNIT", "register", "run", "step_cost", "strategy_stds"]

import argparse
import json
import math
import time
from typing import Any

import numpy as np

from dpstream.workers.noise import prefix_sum as ps

THEORY_PER_UNIT = {"independent": 37.95, "binary_tree": 10.49, "sqrt_factorization": 3.381}
"""Max std per unit σ (L/√(2ρ) = 1) at T = 1,440, from the issue: √T, √(10·11), Σ c_k²."""


def _tree(T: int) -> tuple[np.ndarray, np.ndarray]:
    """(S, B) of the binary tree: S's rows are the complete dyadic blocks, B picks each prefix's blocks."""
    levels = int(math.floor(math.log2(T))) + 1
    blocks = [(lv, s) for lv in range(levels) for s in range(0, T - (1 << lv) + 1, 1 << lv)]
    index = {b: i for i, b in enumerate(blocks)}
    S = np.zeros((len(blocks), T))
    for i, (lv, s) in enumerate(blocks):
        S[i, s : s + (1 << lv)] = 1.0
    B = np.zeros((T, len(blocks)))
    for t in range(T):
        n, start = t + 1, 0
        for lv in reversed(range(levels)):
            if n >> lv & 1:
                B[t, index[(lv, start)]] = 1.0
                start += 1 << lv
    return S, B


def _strategy(S: np.ndarray, B: np.ndarray, L: float, rho: float) -> dict[str, float]:
    """Sensitivity, σ at ρ, and max / mean std of the published totals B(Sx + z)."""
    sens = L * float(np.max(np.linalg.norm(S, axis=0)))
    sigma = sens / math.sqrt(2 * rho)
    std = sigma * np.linalg.norm(B, axis=1)
    return {"sensitivity": sens, "sigma": sigma, "max_std": float(std.max()), "mean_std": float(std.mean())}


def strategy_stds(T: int, L: float, rho: float) -> dict[str, dict[str, float]]:
    """Exact stds of the three strategies at one ρ, with max std per unit σ (L/√(2ρ))."""
    C = ps.toeplitz(ps.coefficients(T))
    A = np.tril(np.ones((T, T)))
    S_tree, B_tree = _tree(T)
    if not np.allclose(B_tree @ S_tree, A):
        raise AssertionError("binary tree does not factor the prefix sums")
    out = {
        "independent": _strategy(np.eye(T), A, L, rho),
        "binary_tree": _strategy(S_tree, B_tree, L, rho),
        "sqrt_factorization": _strategy(C, C, L, rho),
    }
    unit = L / math.sqrt(2 * rho)
    for row in out.values():
        row["max_std_per_unit"] = row["max_std"] / unit
        row["mean_std_per_unit"] = row["mean_std"] / unit
    return out


def step_cost(at: tuple[int, ...], reps: int) -> list[dict[str, Any]]:
    """Median µs of a step (`RunningState.step`, one key) with t stored steps, and of its two dots alone."""
    rows = []
    one = np.ones(1)
    for t0 in at:
        rt = ps.RunningState(t0 + reps, 1).restore(np.ones((1, t0)), np.ones((1, t0)))
        times = []
        for _ in range(reps):
            start = time.perf_counter_ns()
            rt.step(one, 5.0)
            times.append(time.perf_counter_ns() - start)
        c, xs = np.ones(t0), np.ones((1, t0))
        dots = []
        for _ in range(reps):
            start = time.perf_counter_ns()
            np.einsum("j,kj->k", c, xs) + one
            np.einsum("j,kj->k", c, xs) + one
            dots.append(time.perf_counter_ns() - start)
        rows.append(
            {
                "t": t0,
                "step_us": float(np.median(times)) / 1e3,
                "dots_us": float(np.median(dots)) / 1e3,
                "state_bytes_per_key": 16 * (t0 + reps),
            }
        )
    return rows


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench running-total`."""
    parser = subparsers.add_parser("running-total", help="running-total noise: exact stds of 3 strategies, step cost")
    parser.add_argument("--T", type=int, default=1440, help="steps per period (default 1440)")
    parser.add_argument("--L", type=float, default=1.0, help="per-unit L1 bound over the period (default 1)")
    parser.add_argument("--rho", type=float, default=0.5, help="ρ of the period, zCDP (default 0.5: σ unit = L)")
    parser.add_argument("--reps", type=int, default=200, help="steps timed per t (default 200; 0 skips timing)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the strategies' stds and ratios, OpenDP's ρ for (c), and the step cost."""
    rows = strategy_stds(args.T, args.L, args.rho)
    sqrt = rows["sqrt_factorization"]
    period = ps.period_measurement(args.T, args.L, sqrt["sigma"])
    cost = step_cost((1440, 86_400), args.reps) if args.reps > 0 else []
    if args.json:
        opendp = {"rho": period.rho, "rho_closed_form": period.rho_closed_form, "d_in": period.d_in}
        print(json.dumps({"T": args.T, "L": args.L, "rho": args.rho, "rows": rows, "opendp": opendp, "step": cost}))
        return 0
    unit = args.L / math.sqrt(2 * args.rho)
    print(f"running totals, T = {args.T}, L = {args.L:g}, ρ = {args.rho:g} (σ unit L/√(2ρ) = {unit:g})")
    print(f"{'strategy':<28} {'L2 sens':>8} {'σ':>9} {'max std':>9} {'mean std':>9} {'max/unit':>9} {'÷ (c)':>6}")
    for name, r in rows.items():
        print(
            f"{name:<28} {r['sensitivity']:>8.4f} {r['sigma']:>9.4f} {r['max_std']:>9.4f} {r['mean_std']:>9.4f} "
            f"{r['max_std_per_unit']:>9.4f} {r['max_std'] / sqrt['max_std']:>6.2f}"
        )
    if args.T == 1440:
        got, want = sqrt["max_std_per_unit"], THEORY_PER_UNIT["sqrt_factorization"]
        print(f"(c) max std per unit {got:.4f} vs theory {want} ({100 * (got / want - 1):+.3f} %)")
    print(
        f"(c) OpenDP privacy map at d_in = L·‖c‖₂ = {period.d_in:.6f}, σ = {sqrt['sigma']:.6f}: ρ = {period.rho!r} "
        f"(closed form {period.rho_closed_form!r})"
    )
    for r in cost:
        print(
            f"step at t = {r['t']:>6}: {r['step_us']:8.1f} µs median (two dots {r['dots_us']:.1f} µs, rest OpenDP), "
            f"state {r['state_bytes_per_key'] / 1e6:.2f} MB per key"
        )
    return 0
