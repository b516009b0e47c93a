"""Neighbouring streams under a running total's `contribution.max_per_period: L` (topology: a unit moves a
period's increments by at most L in L1 norm, across steps and keys; the matrix mechanism's sensitivity
is L·‖c‖₂ on that promise).

D is an ordinary stream over one budget period; D′ is D plus every event of one adversarial unit active
in every window of the period, with awkward timestamps (on window edges, a millisecond before them, odd
fractions), odd keys (an integer page, an undeclared page), negative and out-of-bounds amounts, and past
every per-window bound. Both go through the worker's core (two partitions by unit, merged as the release
side merges them) over the same public schedule, and the true per-step increments x_t (each window's
merged partial, per key) compare:

- the set of (metric, window) merged is the same (the schedule is public);
- for each running total, Σ_t Σ_key |x′_t,key − x_t,key| ≤ L (in value units; for the adversary below,
  with room to use all of L, exactly L);
- every metric without max_per_period (a plain count, a max_windows count) has, in D′, exactly the
  partials it has when the topology holds no running total at all: the cut touches nothing else.
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

_OTHERS = """
  views:
    source: clicks
    budget: hourly
    window: {tumbling: 1m}
    aggregate: count
    contribution: {max_per_key: 3}
    mechanism: gaussian
  capped:
    source: clicks
    budget: hourly
    window: {tumbling: 1m}
    aggregate: count
    group_by: page
    keys: [home, search, cart, "42"]
    contribution: {max_keys: 2, max_per_key: 2, max_windows: 4}
    mechanism: gaussian
"""

_RUNNING = """
  total:
    source: clicks
    budget: hourly
    window: {tumbling: 1m}
    aggregate: count
    release: running_total
    contribution: {max_per_key: 3, max_per_period: 20}
    mechanism: gaussian
  pages:
    source: clicks
    budget: hourly
    window: {tumbling: 5m}
    aggregate: count
    group_by: page
    keys: [home, search, cart, "42"]
    release: running_total
    contribution: {max_keys: 3, max_per_key: 3, max_per_period: 15}
    mechanism: gaussian
  spend:
    source: clicks
    budget: hourly
    window: {tumbling: 2m}
    aggregate: sum
    group_by: page
    keys: [home, search, cart, "42"]
    value: amount
    bounds: [-5, 20]
    release: running_total
    contribution: {max_keys: 2, max_per_key: 2, max_per_period: 50}
    mechanism: gaussian
  flat:
    source: clicks
    budget: hourly
    window: {tumbling: 1m}
    aggregate: sum
    value: amount
    bounds: [-5, 20]
    release: running_total
    contribution: {max_per_key: 2, max_per_period: 33}
    mechanism: gaussian
"""

_HEAD = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts, allowed_lateness: 5s}
budgets:
  hourly: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1h}
metrics:
"""

_TAIL = """
sinks: {releases: r, dead_letter: d}
"""


class Rec(NamedTuple):
    offset: int
    value: bytes
    timestamp: int


def _topology(running: bool = True) -> Topology:
    return load_topology_text(_HEAD + _OTHERS + (_RUNNING if running else "") + _TAIL, env={})


def _merged(topo: Topology, events: list[dict], batch: int) -> dict[tuple[str, int], dict[str, Any]]:
    """The merged true values of every window of [START, END): events on their unit's partition, appended
    0.3 s after their event time, fed in batches of `batch` records."""
    parts: list[list[dict]] = [[] for _ in range(_PARTITIONS)]
    for e in sorted(events, key=lambda e: (e["ts"], json.dumps(e, sort_keys=True))):
        parts[zlib.crc32(str(e["user_id"]).encode()) % _PARTITIONS].append(e)
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


def _exact(topo: Topology, metric: str, value: Any) -> Fraction:
    """A merged value as an exact number (a sum's grid units as the sum)."""
    m = topo.metrics[metric]
    if m.aggregate is Aggregate.SUM:
        assert m.bounds is not None
        return from_units(int(value), value_exponent(m.bounds))
    return Fraction(value)


def _d(seed: int) -> list[dict]:
    """D: 30 units with a few events each across the hour (some over their bounds: the cut bites in D too)."""
    rng = random.Random(seed)
    return [
        {
            "user_id": f"d{u}",
            "ts": round(START + rng.uniform(0, nb.HOUR - 1), 3),
            "page": rng.choice(nb.DECLARED_PAGES),
            "amount": rng.choice([-5, 3, 20]),
        }
        for u in range(30)
        for _ in range(rng.randint(1, 25))
    ]


_PAGES: tuple[Any, ...] = ("home", "search", 42, "cart", "undeclared")
"""The adversary's pages: declared ones, the key '42' written as an integer, and one no metric declares."""


def _adversary(offsets: list[float], per_window: int, amounts: list[float]) -> list[dict]:
    """In every minute of the hour, at each of `offsets` seconds into the minute, one event on each of the
    first `per_window` pages, cycling through `amounts`."""
    out = []
    for minute in range(60):
        for i, off in enumerate(offsets):
            for j, page in enumerate(_PAGES[:per_window]):
                amount = amounts[(minute + i + j) % len(amounts)]
                out.append(
                    {"user_id": "adversary", "ts": round(START + minute * 60 + off, 3), "page": page, "amount": amount}
                )
    return out


def _increments_moved(topo: Topology, base: dict, neighbour: dict) -> dict[str, Fraction]:
    """Running total → Σ over its windows and keys of |x′ − x| (absent keys are 0)."""
    moved: dict[str, Fraction] = {}
    for (metric, start), a in base.items():
        if not topo.metrics[metric].running_total:
            continue
        b = neighbour[(metric, start)]
        moved[metric] = moved.get(metric, Fraction(0)) + sum(
            (abs(_exact(topo, metric, b.get(k, 0)) - _exact(topo, metric, a.get(k, 0))) for k in set(a) | set(b)),
            Fraction(0),
        )
    return moved


def _problems(topo: Topology, d: list[dict], adversary: list[dict], batch: int) -> tuple[list[str], dict]:
    base = _merged(topo, d, batch)
    neighbour = _merged(topo, d + adversary, batch)
    problems = []
    if set(base) != set(neighbour):
        problems.append(f"windows merged on one side only: {sorted(set(base) ^ set(neighbour))[:5]}")
    moved = _increments_moved(topo, base, neighbour)
    for metric, total in sorted(moved.items()):
        bound = topo.metrics[metric].contribution.max_per_period
        assert bound is not None
        if total > bound:
            problems.append(f"{metric}: the increments moved by {total} in L1 > max_per_period {bound}")
    # the metrics without max_per_period: the partials of a topology without any running total
    alone = _merged(_topology(running=False), d + adversary, batch)
    for key, values in sorted(alone.items()):
        if neighbour[key] != values:
            problems.append(f"{key}: {neighbour[key]} next to running totals, {values} without them")
    return problems, moved


def test_an_adversary_in_every_window_moves_each_running_total_by_at_most_l():
    """An adversary in all 60 minutes, at window edges and odd fractions, on odd keys, past every per-window
    bound: each running total's increments move by exactly L in L1 over the period (it has room for more),
    and the other metrics' partials are those of a topology without running totals."""
    topo = _topology()
    adversary = _adversary([0.0, 0.001, 29.999, 59.999], per_window=5, amounts=[20, -5, 1000, -1e6, 3.25])
    problems, moved = _problems(topo, _d(1), adversary, batch=50)
    assert not problems, "\n".join(problems[:20])
    bounds = {m.name: m.contribution.max_per_period for m in topo.metrics.values() if m.running_total}
    assert moved == bounds  # the whole of L, and no more


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 5),
    offsets=st.lists(st.floats(0, 59.999).map(lambda x: round(x, 3)), min_size=1, max_size=3),
    per_window=st.integers(1, 5),
    amounts=st.lists(st.sampled_from([20.0, -5.0, 0.0, 3.25, -1.5, 1e6, -1e6]), min_size=1, max_size=4),
    batch=st.integers(20, 400),
)
def test_any_everywhere_adversary_moves_each_running_total_by_at_most_l(seed, offsets, per_window, amounts, batch):
    """Any offsets, events per window, amounts (negative and out of bounds too) and batch cut: each running
    total moves by at most L in L1 over the period, the other metrics not at all."""
    topo = _topology()
    problems, _ = _problems(topo, _d(seed), _adversary(offsets, per_window, amounts), batch)
    assert not problems, "\n".join(problems[:20])
