"""Contribution bounding per (unit, window): L0 max_keys, L∞ max_per_key, clamping, count_units."""

from __future__ import annotations

import hashlib
import json
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from dpstream.topology.loader import load_topology_text
from dpstream.workers.pipeline import PartitionPipeline
from dpstream.workers.pipeline.accumulator import MetricAccumulator
from dpstream.workers.pipeline.fixed_point import from_units, value_exponent
from dpstream.workers.pipeline.key_priority import key_priorities, key_priority, string_hashes
from dpstream.workers.pipeline.window_caps import unit_key

_YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
metrics:
  views:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    group_by: page
    keys: [a, b, c, d]
    contribution: {max_keys: 2, max_per_key: 3}
    mechanism: gaussian
  total:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    contribution: {max_per_key: 4}
    mechanism: gaussian
  users:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: count_units
    mechanism: gaussian
  spend:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: sum
    value: eur
    bounds: [-10, 100]
    contribution: {max_per_key: 2}
    mechanism: gaussian
  avg:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: mean
    value: eur
    bounds: [0, 50]
    contribution: {max_per_key: 1}
    mechanism: gaussian
sinks: {releases: t.rel, dead_letter: t.dlq}
"""


class Rec(NamedTuple):
    offset: int
    value: bytes
    timestamp: int | None = None


def _rec(offset: int, **fields: object) -> Rec:
    return Rec(offset, json.dumps(fields).encode())


def _partials(events: list[dict]) -> dict[str, dict]:
    topo = load_topology_text(_YAML)
    pipe = PartitionPipeline(topo, "clicks", 0, schedule_start=0)
    out = pipe.process_batch([_rec(i, **e) for i, e in enumerate(events)])
    partials = out.partials + pipe.flush().partials
    return {p.metric: p.values for p in partials if p.start == 0}, pipe.refresh_counts()


def _exact(metric: str, units: int) -> Fraction:
    """A partial sum (integer grid units) as the exact value it stands for."""
    topo = load_topology_text(_YAML)
    return from_units(units, value_exponent(topo.metrics[metric].bounds))


def test_heavy_unit_moves_count_by_at_most_l0_times_linf():
    """One unit sending 10,000 events over 4 keys adds at most max_keys × max_per_key to the histogram."""
    heavy = [{"user_id": "heavy", "ts": i % 60, "page": "abcd"[i % 4]} for i in range(10_000)]
    light = [{"user_id": f"u{i}", "ts": 30, "page": "a"} for i in range(5)]
    values, counts = _partials(light + heavy)
    assert sum(values["views"].values()) - 5 <= 2 * 3
    assert sum(values["views"].values()) == 5 + 2 * 3
    assert values["total"][""] == 5 + 4
    assert values["users"][""] == 6
    assert counts.capped >= 10_000 - 6


def test_l0_keeps_the_keys_of_smallest_priority_whatever_their_order():
    """The keys kept for a unit are its max_keys keys of smallest `key_priority` (a public hash of
    metric, unit, window and key), not the first ones it touched; the dropped keys' events are capped."""
    pages = ["c", "a", "d", "a", "b", "c"]
    ranked = sorted("abcd", key=lambda k: key_priority("views", "x", 0, k))
    want = {k: pages.count(k) for k in ranked[:2]}
    for order in (pages, list(reversed(pages)), sorted(pages), sorted(pages, reverse=True)):
        values, counts = _partials([{"user_id": "x", "ts": 1, "page": p} for p in order])
        assert values["views"] == want, order
        # views drops 6 − kept events; total (max_per_key 4) and the others drop none
        assert counts.capped == 6 - sum(want.values()) + 2, order


def test_values_are_clamped_and_counted():
    """Out-of-bounds values are clamped to bounds before summing; each clamp is counted."""
    events = [
        {"user_id": "a", "ts": 1, "eur": 1000},
        {"user_id": "b", "ts": 1, "eur": -50},
        {"user_id": "c", "ts": 1, "eur": 20.5},
        {"user_id": "d", "ts": 1},
    ]
    values, counts = _partials(events)
    assert _exact("spend", values["spend"][""]) == 100 - 10 + 20.5
    assert [_exact("avg", values["avg"][""][0]), values["avg"][""][1]] == [50 + 0 + 20.5, 3]
    assert counts.clamped == 2 + 2  # two metrics clamp the two outliers each
    assert counts.skipped >= 2  # the event without `eur` is skipped by spend and avg


def test_count_units_counts_a_unit_once_per_window():
    """count_units adds 1 per unit per window however many events the unit sends."""
    events = [{"user_id": f"u{i % 3}", "ts": i % 60} for i in range(300)]
    values, _ = _partials(events)
    assert values["users"][""] == 3


def test_unknown_declared_keys_do_not_use_l0_slots():
    """Events outside the declared keys are skipped before bounding, so they consume no L0 slot."""
    events = [{"user_id": "x", "ts": 1, "page": p} for p in ["zz", "yy", "a", "b"]]
    values, _ = _partials(events)
    assert values["views"] == {"a": 1, "b": 1}


def test_integer_and_string_units_are_the_same_person():
    """A unit given as 7 and as "7" is bounded as one unit (merging identities is the safe side)."""
    events = [{"user_id": 7, "ts": 1}, {"user_id": "7", "ts": 2}]
    values, _ = _partials(events)
    assert values["users"][""] == 1


def test_float_sums_are_exact_whatever_the_order():
    """Sums are integers on the bounds' grid: 0.1 added in any order and any split gives one answer
    (float `+` gives 0.30000000000000004 for 0.1 + 0.2 but 0.3 for 0.2 + 0.1)."""
    values = [0.1, 0.2, 0.7, 1e-9, 99.999999, 3.3]
    events = [{"user_id": f"u{i}", "ts": 1, "eur": v} for i, v in enumerate(values)]
    forward, _ = _partials(events)
    backward, _ = _partials(list(reversed(events)))
    assert isinstance(forward["spend"][""], int)
    assert forward["spend"][""] == backward["spend"][""]
    grid = value_exponent(load_topology_text(_YAML).metrics["spend"].bounds)
    assert forward["spend"][""] == sum(round(v * 2**grid) for v in values)
    assert abs(float(_exact("spend", forward["spend"][""])) - sum(values)) <= len(values) * 2.0**-grid


def test_rounded_values_stay_inside_the_bounds():
    """Rounding onto the grid is monotone and the bounds are whole grid units: a clamped value can
    never round past a bound (the declared sensitivity stays exact)."""
    topo = load_topology_text(_YAML)
    grid = value_exponent(topo.metrics["spend"].bounds)
    lo, hi = topo.metrics["spend"].bounds.lower, topo.metrics["spend"].bounds.upper
    assert (lo * 2**grid).is_integer() and (hi * 2**grid).is_integer()
    events = [{"user_id": "a", "ts": 1, "eur": 100 - 1e-15}, {"user_id": "b", "ts": 1, "eur": -10 + 1e-15}]
    values, _ = _partials(events)
    assert -10 * 2**grid <= values["spend"][""] <= 200 * 2**grid


def test_linf_keeps_the_contributions_of_smallest_order_key_not_the_first_to_arrive():
    """Sum with max_per_key 2: contributions arriving with order keys 5, 3, 9, 1 keep those of 1
    and 3 (a later, smaller-ordered one replaces the largest kept); the other two are capped."""
    topo = load_topology_text(_YAML)
    acc = MetricAccumulator(topo.metrics["spend"], topo.sources["clicks"], 0)
    for offset, (order, eur) in enumerate([(5, 50), (3, 30), (9, 90), (1, 10)]):
        acc.add("x", 1.0, {"eur": eur}, offset, 0.0, (1.0, 0, order))
    ((start, values),) = acc.close_through(1_000)[:1]
    assert start == 0 and _exact("spend", values[""]) == 10 + 30
    assert acc.capped == 2


def _spelled_priority(metric: str, unit: str, start: int, key: str) -> int:
    """The priority as documented, in Python ints: SplitMix64's finaliser over the BLAKE2b (unit_key)
    hashes of metric, unit and key and the window start modulo 2^64."""
    word = (1 << 64) - 1

    def mix(x: int) -> int:
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & word
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & word
        return x ^ (x >> 31)

    def h(text: str) -> int:
        digest = hashlib.blake2b(text.encode(), digest_size=16, person=b"dpstream-maxwin").digest()
        return int.from_bytes(digest[:8], "big")

    return mix(mix(mix(h(unit) ^ h(metric)) ^ (start & word)) ^ h(key))


def test_key_priorities_are_the_public_hash_of_each_key() -> None:
    """On arrays, each priority is the documented mix of (metric, unit, window start, key), for window
    starts in int64 and past it (an object array, taken modulo 2^64)."""
    keys = ["home", "search", "", "ü", "cart"]
    units = ["u7", "u8", "", "é", "u7"]
    for start in (0, 1_790_000_000, (1 << 63) + 5, 1 << 70):
        spelled = [_spelled_priority("views", u, start, k) for u, k in zip(units, keys, strict=True)]
        assert [key_priority("views", u, start, k) for u, k in zip(units, keys, strict=True)] == spelled
        starts = np.array([start] * 5, object if start >= 1 << 63 else np.int64)
        digests = np.empty(5, object)
        digests[:] = [unit_key(u) for u in units]
        key_digests = np.empty(5, object)
        key_digests[:] = [unit_key(k) for k in keys]
        got = key_priorities("views", string_hashes(digests), starts, string_hashes(key_digests))
        assert got.tolist() == spelled
