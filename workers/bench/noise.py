"""`dpstream bench noise`: OpenDP's exact samplers against numpy's float samplers, in one run.

Per mechanism: scalar release latency (p50 / p99 µs, one `release()` per window) and vector
throughput (samples/s, one OpenDP vector call). numpy's Laplace / normal generator is the
baseline only (it never touches a published value; this module's path says `bench`).
"""

from __future__ import annotations

__all__ = ["register", "run", "measure"]

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dpstream.topology.model import Accounting, Aggregate, Bounds, Contribution, Mechanism, Metric, Window
from dpstream.workers.noise import build_release_mechanism

_W = Window(60, 60)


def _metric(aggregate: Aggregate, mechanism: Mechanism, **kw: Any) -> Metric:
    return Metric(
        name=f"bench_{aggregate.value}",
        source="bench",
        budget="bench",
        weight=1.0,
        window=_W,
        aggregate=aggregate,
        mechanism=mechanism,
        **kw,
    )


def _percentiles(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    times.sort()
    return times[len(times) // 2] / 1e3, times[min(len(times) - 1, int(len(times) * 0.99))] / 1e3


def _throughput(fn: Callable[[int], object], n: int) -> float:
    t0 = time.perf_counter()
    fn(n)
    return n / (time.perf_counter() - t0)


def measure(n: int, reps: int) -> list[dict[str, Any]]:
    """Rows of {mechanism, p50_us, p99_us, samples_per_s, baseline_*} for the table and --json."""
    rng = np.random.default_rng()
    count_g = build_release_mechanism(_metric(Aggregate.COUNT, Mechanism.GAUSSIAN), Accounting.ZCDP, 0.01)
    count_l = build_release_mechanism(_metric(Aggregate.COUNT, Mechanism.LAPLACE), Accounting.PURE, 0.1)
    sum_g = build_release_mechanism(
        _metric(Aggregate.SUM, Mechanism.GAUSSIAN, value="v", bounds=Bounds(0, 200), contribution=Contribution(1, 2)),
        Accounting.ZCDP,
        0.01,
    )
    keys = tuple(f"k{i}" for i in range(50))
    top = build_release_mechanism(
        _metric(Aggregate.TOP_K, Mechanism.EXPONENTIAL, k=5, group_by="r", keys=keys), Accounting.ZCDP, 0.01
    )
    scores = {k: 10 * i for i, k in enumerate(keys)}
    cases = [
        (
            "discrete Gaussian (count)",
            count_g,
            1000,
            "normal",
            lambda: rng.normal(1000.0, 10.0),
            lambda m: rng.normal(0.0, 10.0, m),
        ),
        (
            "discrete Laplace (count)",
            count_l,
            1000,
            "laplace",
            lambda: rng.laplace(1000.0, 10.0),
            lambda m: rng.laplace(0.0, 10.0, m),
        ),
        (
            "fixed-point Gaussian (sum)",
            sum_g,
            12345.5,
            "normal",
            lambda: rng.normal(12345.5, 10.0),
            lambda m: rng.normal(0.0, 10.0, m),
        ),
    ]
    rows: list[dict[str, Any]] = []
    for name, mech, value, base, base_scalar, base_vector in cases:
        p50, p99 = _percentiles(lambda: mech.release({"": value}), reps)  # noqa: B023 - called within this iteration
        b50, b99 = _percentiles(base_scalar, reps)
        rate = _throughput(lambda m: mech.noise_batch(value, m), n)  # noqa: B023 - called within this iteration
        brate = _throughput(base_vector, n)
        rows.append(
            {
                "mechanism": name,
                "p50_us": p50,
                "p99_us": p99,
                "samples_per_s": rate,
                "baseline": f"numpy {base}",
                "baseline_p50_us": b50,
                "baseline_p99_us": b99,
                "baseline_samples_per_s": brate,
            }
        )
    p50, p99 = _percentiles(lambda: top.release(scores), reps)

    def gumbel() -> int:
        return int(np.argmax(np.fromiter(scores.values(), float) + rng.gumbel(0.0, 1.0, len(scores))))

    b50, b99 = _percentiles(gumbel, reps)
    top_reps = max(1, n // 100)
    rate = top_reps * 5 / max(1e-9, _elapsed(lambda: [top.release(scores) for _ in range(top_reps)]))
    brate = top_reps / max(1e-9, _elapsed(lambda: [gumbel() for _ in range(top_reps)]))
    rows.append(
        {
            "mechanism": "noisy top-5 of 50 (Gumbel)",
            "p50_us": p50,
            "p99_us": p99,
            "samples_per_s": rate,
            "baseline": "numpy gumbel argmax (top-1)",
            "baseline_p50_us": b50,
            "baseline_p99_us": b99,
            "baseline_samples_per_s": brate,
        }
    )
    return rows


def _elapsed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench noise`."""
    parser = subparsers.add_parser("noise", help="noise sampler latency and throughput vs numpy")
    parser.add_argument("--n", type=int, default=100_000, help="samples per vector-throughput run (default 100000)")
    parser.add_argument("--reps", type=int, default=2_000, help="scalar releases timed per mechanism (default 2000)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the benchmark table (or JSON)."""
    rows = measure(args.n, args.reps)
    if args.json:
        print(json.dumps({"n": args.n, "reps": args.reps, "rows": rows}, indent=2))
        return 0
    print(
        f"{'mechanism':<28} {'p50 µs':>8} {'p99 µs':>8} {'samples/s':>11} | {'baseline':<28} {'p50 µs':>7} "
        f"{'p99 µs':>7} {'samples/s':>11} | {'p50 ×':>6} {'rate ÷':>7}"
    )
    for r in rows:
        print(
            f"{r['mechanism']:<28} {r['p50_us']:>8.1f} {r['p99_us']:>8.1f} {r['samples_per_s']:>11,.0f} | "
            f"{r['baseline']:<28} {r['baseline_p50_us']:>7.2f} {r['baseline_p99_us']:>7.2f} "
            f"{r['baseline_samples_per_s']:>11,.0f} | {r['p50_us'] / r['baseline_p50_us']:>6.0f} "
            f"{r['baseline_samples_per_s'] / r['samples_per_s']:>7.0f}"
        )
    print("p50 × = OpenDP scalar latency / numpy's; rate ÷ = numpy throughput / OpenDP's (top-k rate: keys selected/s)")
    return 0
