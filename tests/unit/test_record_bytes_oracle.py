"""`record_bytes` (a template per cost and set of noise-field names, memoised noise metadata) writes
exactly what the tests' simple oracle (`_record_oracle`) writes, or raises where it raises, for any input:
any metric of the shipped examples and the record fixture, pure and zCDP costs, times outside the
1970..9999 fast range, hostile text, noise fields of any JSON shape (NaN and infinities included),
and noise objects reused or changed in place between releases."""

from __future__ import annotations

import math
from importlib.resources import files
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import Metric, Topology
from dpstream.workers.frozen import FrozenFields
from dpstream.workers.release.record import canonical_bytes, record_bytes
from tests.unit._record_oracle import oracle_bytes
from tests.unit.test_release_record import _YAML as _FIXTURE_YAML


def _topologies() -> list[Topology]:
    examples = files("dpstream.topology").joinpath("examples")
    texts = [
        (p.read_text(), p.name) for p in sorted(examples.iterdir(), key=lambda p: p.name) if p.name.endswith(".yaml")
    ]
    return [load_topology_text(_FIXTURE_YAML, "fixture")] + [load_topology_text(text, name) for text, name in texts]


_TOPOLOGIES = _topologies()
_METRICS = [(topo, metric) for topo in _TOPOLOGIES for metric in topo.metrics.values()]

_FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1e16, 1.5e-5, math.nan])
_SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | _FLOATS | st.text(max_size=6)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
_NAMES = (
    st.sampled_from(
        [
            "values",
            "mechanism",
            "noise",
            "ci",
            "postprocess",
            "keys",
            "partition_selection",
            # fixed fields a mechanism may replace, window fields, and protected names it may not
            "bounds",
            "aggregate",
            "privacy_note",
            "published_at",
            "metric",
            "window",
            "cost",
            "budget",
            "release_id",
        ]
    )
    | st.text(max_size=5)
    | st.integers(0, 2)
)  # a name that is not a str: refused by both paths
_HOSTILE = st.text(
    alphabet=st.characters(codec="utf-8") | st.sampled_from(['"', "\\", "é", "\u2028", "\x00", "\x7f", "\ud800"])
)  # a lone surrogate cannot be UTF-8: refused by both paths
_TIMES = st.integers(-(2**40), 2**40) | st.integers(0, 253_402_300_799) | st.sampled_from([0, -1, 253_402_300_800])


def _outcome(fn: Any, **args: Any) -> tuple[str, Any]:
    """The bytes a call returns, or 'error' when it raises."""
    try:
        return ("bytes", fn(**args))
    except Exception:  # which error each raises may differ (they fail at different steps)
        return ("error", None)


def _both(**args: Any) -> tuple[tuple[str, Any], tuple[str, Any]]:
    """(record_bytes, oracle) outcomes."""
    return _outcome(record_bytes, **args), _outcome(oracle_bytes, **args)


def _mechanism_fields(draw: st.DrawFn) -> dict[str, Any]:
    """What a mechanism's `to_record_fields()` looks like, with drawn numbers (its metadata plain
    dicts, or the read-only `FrozenFields` a value mechanism hands to every release at a cost)."""
    scale = draw(st.floats(1e-6, 1e6))
    wrap: Any = FrozenFields if draw(st.booleans()) else dict
    return {
        "values": draw(st.dictionaries(st.text(max_size=3), st.floats(-1e9, 1e9), max_size=4)),
        "mechanism": draw(st.sampled_from(["discrete_gaussian", "discrete_laplace", "noisy_top_k"])),
        "noise": wrap({"scale": scale, "stddev": scale}),
        "ci": wrap({"level": 0.95, "half_width": draw(st.floats(0, 1e6))}),
        "postprocess": wrap({"round": draw(st.booleans()), "clamp_zero": draw(st.booleans())}),
    }


@st.composite
def _noise_fields(draw: st.DrawFn) -> dict[str, Any]:
    fields = _mechanism_fields(draw) if draw(st.booleans()) else {}
    fields.update(draw(st.dictionaries(_NAMES, _JSON, max_size=4)))
    return fields


@st.composite
def _arguments(draw: st.DrawFn) -> dict[str, Any]:
    topo, metric = draw(st.sampled_from(_METRICS))
    budget = topo.budgets[draw(st.sampled_from(sorted(topo.budgets)))]  # pure and zCDP scopes alike
    start = draw(_TIMES)
    return dict(
        release_id=draw(_HOSTILE),
        topology_version=draw(st.just(topo.topology_version) | _HOSTILE),
        metric=metric,
        source=topo.sources[metric.source],
        budget=budget,
        period_id=draw(_HOSTILE),
        window_start=start,
        window_end=start + draw(st.sampled_from([60, 300, 3600]) | st.integers(-(2**41), 2**41)),
        cost=draw(st.floats(1e-12, 10.0) | _FLOATS | st.integers(0, 3)),
        noise_fields=draw(_noise_fields()),
        built_at=draw(st.floats(-1e13, 1e13) | _FLOATS | _TIMES),
        ledger=draw(st.none() | st.just("0f" * 16) | _HOSTILE),
        conversion_delta=draw(st.sampled_from([1e-6, 9e-7, 0.0])),
    )


def _containers(value: Any) -> list[Any]:
    """Every non-empty dict and list inside `value` (itself included), outermost first; not a
    `FrozenFields`, which cannot be changed in place (and holds scalars only)."""
    if type(value) is FrozenFields:
        return []
    if isinstance(value, dict):
        inner = list(value.values())
    elif isinstance(value, list):
        inner = list(value)
    else:
        return []
    found = [value] if inner else []
    for item in inner:
        found += _containers(item)
    return found


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=_arguments(), replacement=_JSON, data=st.data())
def test_record_bytes_are_the_oracle_bytes(args: dict[str, Any], replacement: Any, data: Any) -> None:
    """Same bytes as the oracle, or both raise: on the first call
    (template built), on a second release with the same noise objects (template and memo hit), and
    after something inside a noise field was changed in place, at any depth (a kept text must not
    hide a new value, NaN included)."""
    first = _both(**args)
    assert first[0] == first[1]
    again = _both(**{**args, "noise_fields": dict(args["noise_fields"])})
    assert again == first
    containers = [c for value in args["noise_fields"].values() for c in _containers(value)]
    if containers:
        target = data.draw(st.sampled_from(containers))
        if isinstance(target, dict):
            target[data.draw(st.sampled_from(sorted(target, key=repr)))] = replacement
        else:
            target[data.draw(st.integers(0, len(target) - 1))] = replacement
        changed = _both(**args)
        assert changed[0] == changed[1]


def _count_args(metric: Metric, topo: Topology, **fields: Any) -> dict[str, Any]:
    return dict(
        release_id="r",
        topology_version=topo.topology_version,
        metric=metric,
        source=topo.sources[metric.source],
        budget=topo.budgets[metric.budget],
        period_id="2026-11-30",
        window_start=1_796_044_800,
        window_end=1_796_044_860,
        cost=0.01,
        noise_fields=fields,
        built_at=1_796_044_870.4,
        ledger="0f" * 16,
        conversion_delta=topo.budgets[metric.budget].delta,
    )


@pytest.mark.parametrize(
    "before, after",
    [(2.0, 2), (1, 1.0), (1, True), (0.0, -0.0), (None, 0), ("a", "b"), (2.0, math.nan), (2.0, math.inf)],
)
def test_memoised_noise_text_follows_the_objects(before: Any, after: Any) -> None:
    """A noise dict whose text was kept is re-encoded once it holds another object, even an equal one
    of another type (1 and 1.0, 0.0 and -0.0); NaN and infinities still raise ValueError."""
    topo = _TOPOLOGIES[0]
    m = topo.metrics["hist"]
    noise = {"scale": before, "stddev": 3.0}
    args = _count_args(m, topo, values={"a": 1.0}, noise=noise)
    for _ in range(2):
        assert record_bytes(**args) == oracle_bytes(**args)
    for fresh in (False, True):  # changed in place, then a new dict with the same contents
        args["noise_fields"]["noise"] = {"scale": after, "stddev": 3.0} if fresh else noise
        noise["scale"] = after
        if isinstance(after, float) and not math.isfinite(after):
            with pytest.raises(ValueError):
                record_bytes(**args)
            with pytest.raises(ValueError):
                oracle_bytes(**args)
        else:
            assert record_bytes(**args) == oracle_bytes(**args)
            assert (b'"scale":' + canonical_bytes({"x": after})[5:-1]) in record_bytes(**args)


def test_noise_dicts_holding_containers_are_encoded_every_time() -> None:
    """A noise dict holding a list or a dict is not kept as text: a change inside it shows."""
    topo = _TOPOLOGIES[0]
    inner: list[Any] = [1.0]
    nested: dict[str, Any] = {"level": 0.95}
    args = _count_args(topo.metrics["hist"], topo, values={"a": 1.0}, noise={"scale": inner}, ci={"x": nested})
    for _ in range(2):
        assert record_bytes(**args) == oracle_bytes(**args)
    inner[0] = 2.5
    nested["level"] = 0.99
    assert b'"scale":[2.5]' in record_bytes(**args) and b'"level":0.99' in record_bytes(**args)
    assert record_bytes(**args) == oracle_bytes(**args)


@pytest.mark.parametrize("name", ["hist", "evsum"])
def test_an_input_with_two_faults_raises(name: str) -> None:
    """An infinite cost (its text fails) and a build time datetime cannot print: record_bytes raises,
    as the oracle does."""
    topo = _TOPOLOGIES[0]
    args = {**_count_args(topo.metrics[name], topo, values={"": 1.0}), "cost": math.inf, "built_at": 1e17}
    fast, oracle = _both(**args)
    assert oracle[0] == "error" and fast == oracle


@pytest.mark.parametrize("first, second", [(0.0, -0.0), (-0.0, 0.0), (1, 1.0), (1.0, True)])
def test_costs_equal_as_numbers_keep_their_own_text(first: Any, second: Any) -> None:
    """Costs that compare equal but print differently (0.0/-0.0, 1/1.0/True) each get their own text."""
    topo = _TOPOLOGIES[0]
    for name in ("hist", "evsum"):  # zCDP and pure
        m = topo.metrics[name]
        for cost in (first, second, first):
            args = {**_count_args(m, topo, values={"": 1.0}), "cost": cost}
            assert record_bytes(**args) == oracle_bytes(**args)


def test_frozen_metadata_text_follows_the_object_in_its_cell() -> None:
    """One noise cell sees frozen A, A again (kept text), frozen B with other numbers, a plain dict
    equal to A, then A: every record is the oracle's bytes."""
    topo = _TOPOLOGIES[0]
    m = topo.metrics["hist"]
    a, b = FrozenFields(scale=2.0, stddev=3.0), FrozenFields(scale=2, stddev=3.5)
    seen = []
    for noise in (a, a, b, dict(a), a):
        args = _count_args(m, topo, values={"a": 1.0}, noise=noise)
        seen.append(record_bytes(**args))
        assert seen[-1] == oracle_bytes(**args)
    assert seen[0] == seen[1] == seen[3] == seen[4] != seen[2]
