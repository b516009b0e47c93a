"""Quantile releases: the pipeline's grid cells, OpenDP's private quantile at its charge, the record."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import opendp.prelude as dp
import pytest

from dpstream.topology.calibration import calibrate, quantile_rank_error
from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import Accounting, Metric, Topology
from dpstream.workers.noise import build_release_mechanism
from dpstream.workers.noise.quantiles import QuantileRelease, rank_distance, scores, value_vector
from dpstream.workers.pipeline.accumulator import MetricAccumulator
from dpstream.workers.pipeline.merger import merge_values
from dpstream.workers.pipeline.quantile_cells import cell_count, cell_index
from dpstream.workers.release.display import release_line
from dpstream.workers.release.record import record_bytes, true_values_for

_YAML = """\
version: 1
sources:
  s: {topic: t, privacy_unit: u}
budgets:
  z: {epsilon: 1.0, delta: 1.0e-6, period: 1h}
  p: {epsilon: 1.0, accounting: pure, period: 1h}
sinks: {releases: r, dead_letter: d}
metrics:
  lat:
    source: s
    budget: z
    window: {tumbling: 1m}
    aggregate: quantile
    value: ms
    bounds: [0, 100]
    bins: 10
    quantiles: [0.5, 0.9, 0.99]
    contribution: {max_per_key: 2}
    mechanism: exponential
"""


def _topology() -> Topology:
    return load_topology_text(_YAML)


def _metric() -> Metric:
    return _topology().metrics["lat"]


def test_cells_put_candidates_in_their_own_cell_and_the_rest_between() -> None:
    grid = (0.0, 10.0, 20.0)
    assert cell_count(grid) == 7
    assert [cell_index(grid, v) for v in (-1.0, 0.0, 5.0, 10.0, 19.9, 20.0, 25.0)] == [0, 1, 2, 3, 4, 5, 6]


def test_the_rebuilt_vector_scores_every_candidate_as_the_values_do() -> None:
    """OpenDP's score on the cell points equals its score on the values themselves."""
    grid = tuple(float(c) for c in range(0, 101, 10))
    rng = random.Random(3)
    values = [float(rng.choice([rng.uniform(0, 100), rng.randrange(0, 101, 10)])) for _ in range(300)]
    cells = [0] * cell_count(grid)
    for v in values:
        cells[cell_index(grid, v)] += 1
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False))
    for alpha in (0.5, 0.9, 0.37):
        score = dp.t.make_quantile_score_candidates(domain, dp.symmetric_distance(), list(grid), alpha)
        assert list(score(value_vector(grid, cells))) == list(score(values))
        mine = scores(alpha, grid, cells)
        best = min(range(len(grid)), key=mine.__getitem__)
        assert rank_distance(alpha, grid, cells, grid[best]) <= mine[best] + 1e-9


def test_the_accumulator_bounds_a_quantile_as_a_sum_and_emits_cell_counts() -> None:
    """max_per_key 2: a unit's two smallest-ordered values count; values are clamped to the bounds."""
    topo = _topology()
    acc = MetricAccumulator(topo.metrics["lat"], topo.sources["s"], 0)
    for offset, (unit, ms) in enumerate([("a", 5.0), ("a", 10.0), ("a", 99.0), ("b", 250.0), ("c", -3.0)]):
        acc.add(unit, 1.0, {"ms": ms}, offset, 0.0)
    (start, values), *later = acc.close_through(60)
    assert start == 0 and later == []
    grid = topo.metrics["lat"].candidates or ()
    cells = values[""]
    assert sum(cells) == 4 and acc.capped == 1
    assert cells[cell_index(grid, 5.0)] == 1 and cells[cell_index(grid, 10.0)] == 1
    assert cells[cell_index(grid, 100.0)] == 1 and cells[cell_index(grid, 0.0)] == 1  # clamped to the bounds


def test_an_empty_window_releases_zero_cells_and_partials_merge_by_cell() -> None:
    metric = _metric()
    size = cell_count(metric.candidates or ())
    assert true_values_for(metric, {}) == {"": (0,) * size}
    merged: dict = {}
    merge_values(merged, {"": [1] * size})
    merge_values(merged, {"": [2] * size})
    assert true_values_for(metric, merged) == {"": (3,) * size}


@pytest.mark.parametrize("accounting", list(Accounting))
def test_each_level_costs_its_opendp_privacy_map_and_the_release_their_sum(accounting: Accounting) -> None:
    """The cost the plan charges equals OpenDP's privacy map of every level at d_in = max_per_key."""
    metric = _metric()
    cost = 0.05
    mech = build_release_mechanism(metric, accounting, cost)
    assert isinstance(mech, QuantileRelease)
    parts = calibrate(metric, accounting, cost)
    mapped = [q.meas.map(2) for q in mech.levels]
    for got, part in zip(mapped, parts, strict=True):
        assert got == pytest.approx(part.cost, rel=1e-9) and got <= part.cost
    assert math.fsum(mapped) == pytest.approx(cost, rel=1e-9) and math.fsum(mapped) <= cost * (1 + 1e-15)
    if accounting is Accounting.ZCDP:
        assert mapped[2] / mapped[0] == pytest.approx(3.9204, rel=1e-6)


def test_the_measurement_is_on_an_unknown_size_symmetric_distance_input() -> None:
    mech = build_release_mechanism(_metric(), Accounting.ZCDP, 0.05)
    assert isinstance(mech, QuantileRelease)
    q = mech.levels[0].meas
    assert q.input_metric == dp.symmetric_distance()
    assert q.input_domain.size is None


def test_a_release_carries_sorted_levels_and_a_data_free_rank_error() -> None:
    topo = _topology()
    metric = topo.metrics["lat"]
    grid = metric.candidates or ()
    cells = [0] * cell_count(grid)
    rng = np.random.default_rng(5)
    for v in rng.exponential(20.0, 2000):
        cells[cell_index(grid, float(min(v, 100.0)))] += 1
    mech = build_release_mechanism(metric, Accounting.ZCDP, 1.0)
    noisy = mech.release({"": tuple(cells)})
    fields = noisy.to_record_fields()
    assert list(fields["values"]) == ["p50", "p90", "p99"]
    assert list(fields["values"].values()) == sorted(fields["values"].values())
    assert set(fields["values"].values()) <= set(grid)
    assert fields["postprocess"]["sorted"] is True
    scale = fields["noise"]["scale"]
    assert fields["ci"]["level"] == 0.95
    assert fields["ci"]["rank_error"]["p50"] == pytest.approx(quantile_rank_error(scale, len(grid)))
    empty = mech.release({"": (0,) * cell_count(grid)}).to_record_fields()
    assert empty["ci"] == fields["ci"] and empty["noise"] == fields["noise"]  # nothing of the data in either
    record = json.loads(
        record_bytes(
            release_id="r1",
            topology_version=topo.topology_version,
            metric=metric,
            source=topo.sources["s"],
            budget=topo.budgets["z"],
            period_id="p",
            window_start=0,
            window_end=60,
            cost=1.0,
            noise_fields=fields,
            built_at=65,
            ledger=None,
            conversion_delta=1e-6,
        )
    )
    assert record["aggregate"] == "quantile" and record["quantiles"] == [0.5, 0.9, 0.99]
    line = release_line(record)
    assert line is not None and "p50" in line and "p99" in line and "rank ±" in line


@pytest.mark.parametrize("accounting", list(Accounting))
def test_the_report_cost_check_maps_a_quantile_record_to_its_charge(accounting: Accounting) -> None:
    """`budget report`'s per-record check maps each level of the record's event: Σ maps = cost."""
    from dpstream.workers.report.costcheck import components_of

    metric = _metric()
    mech = build_release_mechanism(metric, accounting, 0.05)
    fields = mech.release({"": (0,) * cell_count(metric.candidates or ())}).to_record_fields()
    key = "rho" if accounting is Accounting.ZCDP else "epsilon"
    parts = components_of(metric, accounting, {"cost": {key: 0.05}, "event": fields["event"]})
    assert [p.kind for p in parts] == ["exponential"] * 3
    assert math.fsum(p.mapped_cost for p in parts) == pytest.approx(0.05, rel=1e-9)


def test_an_event_level_quantile_counts_every_event_as_its_own_unit() -> None:
    """An event-level source names each event '#offset': every value counts, none is capped."""
    text = _YAML.replace("privacy_unit: u}", "privacy_unit: event}")
    topo = load_topology_text(text)
    acc = MetricAccumulator(topo.metrics["lat"], topo.sources["s"], 0)
    for offset, ms in enumerate([5.0, 5.0, 5.0, 50.0]):
        acc.add(f"#{offset}", 1.0, {"ms": ms}, offset, 0.0)
    (_, values), *later = acc.close_through(60)
    assert later == []
    grid = topo.metrics["lat"].candidates or ()
    assert values[""][cell_index(grid, 5.0)] == 3 and sum(values[""]) == 4 and acc.capped == 0


def test_verify_compare_checks_a_quantiles_levels_not_its_values() -> None:
    """Two runs' quantile releases of one window differ by their noise; only their levels must match."""
    from dpstream.workers.verify.checks import _value_problems

    a = {"aggregate": "quantile", "values": {"p50": 10.0, "p90": 50.0}}
    assert _value_problems(a, {**a, "values": {"p50": 20.0, "p90": 90.0}}, None) == []
    assert _value_problems(a, {**a, "values": {"p50": 20.0}}, None) != []
