"""Neighbouring streams under `contribution.max_windows: m` (topology docstring: a unit counts in at most m
windows of a metric per period).

D is an ordinary stream over one budget period; D′ is D plus every event of one adversarial unit active
in every window of the period, with awkward timestamps (on window edges, a millisecond before them, odd
fractions) and past every per-window bound. Both go through the worker's core (two partitions by unit,
merged as the release side merges them) over the same public schedule, and the true aggregates compare:

- the set of (metric, window) merged is the same (the schedule is public);
- at most m windows of each capped metric move, each by at most the metric's declared bound (L∞, L1, L0);
- a window the adversary has no event in is identical.
"""

from __future__ import annotations

import json
import random
import zlib
from fractions import Fraction
from typing import Any, NamedTuple

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import Aggregate, Topology
from dpstream.workers.pipeline import MergedWindow, PartialMerger, PartitionPipeline
from dpstream.workers.pipeline.fixed_point import from_units, value_exponent
from tests.privacy import _neighbours as nb

START = nb.T0
END = nb.T0 + nb.HOUR
_PARTITIONS = 2

_YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts, allowed_lateness: 5s}
budgets:
  hourly: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1h}
metrics:
  views:
    source: clicks
    budget: hourly
    window: {tumbling: 1m}
    aggregate: count
    contribution: {max_per_key: 3, max_windows: 5}
    mechanism: gaussian
  pages:
    source: clicks
    budget: hourly
    window: {tumbling: 5m}
    aggregate: sum
    group_by: page
    keys: [home, search, cart, "42"]
    value: amount
    bounds: [-5, 20]
    contribution: {max_keys: 2, max_per_key: 2, max_windows: 3}
    mechanism: gaussian
  users:
    source: clicks
    budget: hourly
    window: {tumbling: 1m}
    aggregate: count_units
    contribution: {max_windows: 7}
    mechanism: gaussian
  mean:
    source: clicks
    budget: hourly
    window: {tumbling: 2m}
    aggregate: mean
    value: amount
    bounds: [-5, 20]
    contribution: {max_windows: 1}
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""


class Rec(NamedTuple):
    offset: int
    value: bytes
    timestamp: int


def _topology() -> Topology:
    return load_topology_text(_YAML, env={})


def _merged(topo: Topology, events: list[dict], batch: int) -> dict[tuple[str, int], dict[str, Any]]:
    """The merged true values of every window of [START, END): events on their unit's partition, appended
    0.3 s after their event time, fed in batches of `batch` records."""
    parts: list[list[dict]] = [[] for _ in range(_PARTITIONS)]
    for e in sorted(events, key=lambda e: (e["ts"], json.dumps(e, sort_keys=True))):
        parts[zlib.crc32(e["user_id"].encode()) % _PARTITIONS].append(e)
    mergers = {m: PartialMerger(m, range(_PARTITIONS)) for m in topo.metrics}
    merged: list[MergedWindow] = []
    for p, part in enumerate(parts):
        recs = [Rec(o, json.dumps(e).encode(), round(e["ts"] * 1000) + 300) for o, e in enumerate(part)]
        pipe = PartitionPipeline(topo, "clicks", p, schedule_start=START, partitions=_PARTITIONS, until=END)
        outs = [pipe.process_batch(recs[i : i + batch]) for i in range(0, len(recs), batch)] + [pipe.flush()]
        for out in outs:
            for partial in out.partials:
                merged += mergers[partial.metric].add(partial)
    for merger in mergers.values():
        merged += merger.drain()
    return {(w.metric, w.start): w.values for w in merged}


def _exact(topo: Topology, metric: str, value: Any) -> tuple[Fraction, ...]:
    """A merged value as exact numbers (a sum's grid units as the sum; a mean's [sum, count] as both)."""
    m = topo.metrics[metric]
    if m.aggregate in (Aggregate.SUM, Aggregate.MEAN):
        assert m.bounds is not None
        e = value_exponent(m.bounds)
        if isinstance(value, list):
            return (from_units(int(value[0]), e), Fraction(value[1]))
        return (from_units(int(value), e),)
    return (Fraction(value),)


def _d(seed: int) -> list[dict]:
    """D: 30 units with a few events each across the hour."""
    rng = random.Random(seed)
    return [
        {
            "user_id": f"d{u}",
            "ts": round(START + rng.uniform(0, nb.HOUR - 1), 3),
            "page": rng.choice(nb.DECLARED_PAGES),
            "amount": rng.choice([-5, 3, 20]),
        }
        for u in range(30)
        for _ in range(rng.randint(1, 12))
    ]


def _adversary(offsets: list[float], per_window: int) -> list[dict]:
    """`per_window` events in every minute of the hour at each of `offsets` seconds into the minute."""
    return [
        {"user_id": "adversary", "ts": round(START + minute * 60 + off, 3), "page": page, "amount": 20}
        for minute in range(60)
        for off in offsets
        for page in nb.DECLARED_PAGES[: max(1, per_window)]
    ]


def _differences(topo: Topology, base: dict, neighbour: dict, adversary_times: list[float]) -> list[str]:
    problems = []
    if set(base) != set(neighbour):
        problems.append(f"windows merged on one side only: {sorted(set(base) ^ set(neighbour))[:5]}")
    moved_windows: dict[str, int] = {}
    for (metric, start), a in sorted(base.items()):
        b = neighbour.get((metric, start), {})
        m = topo.metrics[metric]
        zero = _exact(topo, metric, [0, 0] if m.aggregate is Aggregate.MEAN else 0)
        moved = {}
        for k in set(a) | set(b):
            da, db = (
                _exact(topo, metric, a.get(k, 0)) if k in a else zero,
                (_exact(topo, metric, b.get(k, 0)) if k in b else zero),
            )
            diff = tuple(y - x for x, y in zip(da, db, strict=True))
            if any(diff):
                moved[k] = diff
        if not moved:
            continue
        moved_windows[metric] = moved_windows.get(metric, 0) + 1
        if not any(start <= t < start + m.window.size_s for t in adversary_times):
            problems.append(f"{metric} window {start}: moved without an adversary event: {moved}")
        values = [abs(d[0]) for d in moved.values()]
        if m.aggregate is Aggregate.MEAN:  # [sum, count]: the sum by max_per_key·max|bound|, the count by 1
            if any(abs(d[0]) > 20 or abs(d[1]) > 1 for d in moved.values()):
                problems.append(f"{metric} window {start}: moved by {moved} past one unit's contribution")
            continue
        bound = nb.declared_bound(m)
        if any(v > bound.linf for v in values) or sum(values) > bound.l1 or len(moved) > bound.l0:
            problems.append(f"{metric} window {start}: moved by {moved} > bound {bound}")
    for metric, n in moved_windows.items():
        cap = topo.metrics[metric].contribution.max_windows
        assert cap is not None
        if n > cap:
            problems.append(f"{metric}: {n} windows moved > max_windows {cap}")
    return problems


def test_an_adversary_in_every_window_moves_at_most_m_windows():
    """An adversary in all 60 minutes, at window edges and odd fractions, past every per-window bound:
    each capped metric has at most m windows whose true values move, each within its declared bound."""
    topo = _topology()
    offsets = [0.0, 0.001, 29.999, 59.999]
    adversary = _adversary(offsets, per_window=4)
    base = _merged(topo, _d(1), batch=50)
    neighbour = _merged(topo, _d(1) + adversary, batch=50)
    assert len(base) == 60 + 12 + 60 + 30
    problems = _differences(topo, base, neighbour, [e["ts"] for e in adversary])
    assert not problems, "\n".join(problems[:20])
    moved = {m for (m, s), v in base.items() if v != neighbour[(m, s)]}
    assert moved == set(topo.metrics)  # the adversary did reach every metric


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 5),
    offsets=st.lists(st.floats(0, 59.999).map(lambda x: round(x, 3)), min_size=1, max_size=3),
    per_window=st.integers(1, 4),
    batch=st.integers(20, 400),
)
def test_any_everywhere_adversary_moves_at_most_m_windows(seed, offsets, per_window, batch):
    """Any offsets, any events per window, any batch cut: at most m windows move per capped metric."""
    topo = _topology()
    adversary = _adversary(offsets, per_window)
    base = _merged(topo, _d(seed), batch)
    neighbour = _merged(topo, _d(seed) + adversary, batch)
    problems = _differences(topo, base, neighbour, [e["ts"] for e in adversary])
    assert not problems, "\n".join(problems[:20])
