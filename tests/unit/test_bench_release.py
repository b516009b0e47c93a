"""`dpstream bench release` runs end to end at a tiny size: both widths, every figure a CPU time."""

from __future__ import annotations

import math
from dataclasses import asdict

from dpstream.workers.bench.release import measure


def test_bench_release_reports_cold_warm_and_price_figures_for_both_widths() -> None:
    rows = measure(releases=6, wide_releases=4, wide_keys=5, rounds=2)  # raises unless every release published
    assert [(r.keys, r.releases) for r in rows] == [(1, 6), (5, 4)]
    for row in rows:
        times = {k: v for k, v in asdict(row).items() if k.endswith("_us") and k != "overhead_us"}
        assert set(times) >= {"release_us", "baseline_us", "price_noise_us", "stream_release_us", "stream_baseline_us"}
        assert all(math.isfinite(v) and v > 0 for v in times.values()), times
        assert row.overhead_us == row.release_us - row.baseline_us
        assert row.scale > 0 and row.ratio > 0 and row.stream_ratio > 0
