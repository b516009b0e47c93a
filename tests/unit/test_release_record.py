"""The DESIGN §6 release record: fields, canonical bytes, the ratio placeholder, true-value shaping."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from dpstream.topology.loader import load_topology_text
from dpstream.workers.ledger.types import RATIO_TOKEN
from dpstream.workers.pipeline.fixed_point import value_exponent
from dpstream.workers.release import RATIO_PLACEHOLDER, canonical_bytes, record_bytes, true_values_for

_YAML = """
version: 1
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts}
  ev: {topic: t2, privacy_unit: event, timestamp: ts}
budgets:
  z: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
  p: {epsilon: 2.0, delta: 1.0e-6, accounting: pure, period: 1d, reserve: 0.0}
metrics:
  hist:
    source: s
    budget: z
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    group_by: page
    keys: [a, b, c]
    mechanism: gaussian
  avg:
    source: s
    budget: z
    weight: 1
    window: {tumbling: 1m}
    aggregate: mean
    value: x
    bounds: [0, 10]
    mechanism: gaussian
  evsum:
    source: ev
    budget: p
    weight: 1
    window: {hopping: 2m, every: 1m}
    aggregate: sum
    value: x
    bounds: [0, 10]
    mechanism: laplace
sinks: {releases: r, dead_letter: d}
"""


@pytest.fixture(scope="module")
def topo():
    return load_topology_text(_YAML)


def _record(topo, metric: str, cost: float = 0.01):
    return json.loads(_raw(topo, metric, cost))


def _raw(topo, metric: str, cost: float = 0.01) -> bytes:
    m = topo.metrics[metric]
    return record_bytes(
        release_id="r" * 64,
        topology_version=topo.topology_version,
        metric=m,
        source=topo.sources[m.source],
        budget=topo.budgets[m.budget],
        period_id="2026-11-30",
        window_start=1_796_044_800,
        window_end=1_796_044_860,
        cost=cost,
        noise_fields={
            "values": {"a": 1.0},
            "mechanism": "discrete_gaussian",
            "noise": {"scale": 2.0, "stddev": 2.0},
            "ci": {"level": 0.95, "half_width": 4.0},
            "metric": "overwrite-attempt",
        },
        built_at=1_796_044_870.4,
        ledger="0f" * 16,
        conversion_delta=topo.budgets[m.budget].delta,
    )


def test_record_has_the_design_fields(topo):
    """Every DESIGN §6 field is present; windows carry ISO UTC and epoch; noise fields cannot overwrite ids."""
    rec = _record(topo, "hist")
    for name in (
        "release_id",
        "topology_version",
        "ledger",
        "metric",
        "window",
        "privacy_unit",
        "values",
        "mechanism",
        "noise",
        "cost",
        "ci",
        "bounds",
        "contribution",
        "budget",
        "published_at",
        "postprocess",
    ):
        assert name in rec
    assert rec["ledger"] == "0f" * 16  # the id of the ledger it is charged to
    assert rec["metric"] == "hist"
    assert rec["window"] == {
        "start": "2026-11-30T13:20:00Z",
        "end": "2026-11-30T13:21:00Z",
        "start_epoch": 1_796_044_800,
        "end_epoch": 1_796_044_860,
        "kind": "tumbling",
    }
    assert rec["budget"] == {"scope": "z", "period": "2026-11-30", "ratio_after": None}
    assert rec["event_level"] is False and rec["privacy_unit"] == "user_id"
    assert rec["cost"]["rho"] == 0.01 and rec["cost"]["delta"] == 1e-6 and rec["cost"]["epsilon_equiv"] > 0.01
    assert rec["published_at"] == "2026-11-30T13:21:10Z"


def test_canonical_bytes_hold_the_ratio_placeholder_once(topo):
    """Canonical JSON is key-sorted and compact, and contains the ledger's ratio token exactly once."""
    raw = _raw(topo, "avg")
    assert RATIO_PLACEHOLDER == RATIO_TOKEN
    assert raw.count(RATIO_PLACEHOLDER) == 1
    assert raw == canonical_bytes(json.loads(raw))
    assert b'": ' not in raw and b', "' not in raw
    assert list(json.loads(raw)) == sorted(json.loads(raw))
    assert json.loads(raw)["bounds"] == [0, 10]


def test_event_level_and_pure_costs_are_labelled(topo):
    """Event-level records say so (weaker); pure scopes report ε with δ = 0."""
    rec = _record(topo, "evsum", cost=0.5)
    assert rec["event_level"] is True and "weaker" in rec["privacy_note"]
    assert rec["cost"] == {"epsilon": 0.5, "epsilon_equiv": 0.5, "delta": 0.0}
    assert rec["window"]["kind"] == "hopping"


def test_true_values_zero_fill_declared_keys_and_shape_means(topo):
    """Declared keys are always present (zero when unseen); ungrouped uses ''; means become (sum, count);
    integer grid-unit sums become exact Fractions."""
    assert true_values_for(topo.metrics["hist"], {"b": 4}) == {"a": 0, "b": 4, "c": 0}
    scale = 2 ** value_exponent(topo.metrics["avg"].bounds)
    assert true_values_for(topo.metrics["avg"], {"": [int(12.5 * scale), 3]}) == {"": (Fraction(25, 2), 3)}
    assert true_values_for(topo.metrics["avg"], {}) == {"": (0.0, 0)}
    assert true_values_for(topo.metrics["evsum"], {}) == {"": 0.0}
