"""Neighbouring streams on a keyed source whose adversary writes its own key to every partition.

D is the ordinary stream of `_neighbours`, produced as a keyed_by_unit source is meant to be: each
record keyed by its unit, in the partition the default partitioner (murmur2, checked here with
aiokafka's own partitioner) gives that key. D′ = D plus every event of one adversarial unit that
names the partitions itself: bursts over every per-window bound, the same burst on every partition.
Each partition's records go through its own pipeline (as a worker reads them, keys checked, the
partition count the topic's); the partials are merged across partitions. The true aggregates are
compared, so the margin is 0: a unit bounded once per partition would move a window by up to
`partitions` times its bound; bounded at one point it moves each by at most the declared bound, and
the windows without its events not at all.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, NamedTuple

import pytest
from aiokafka.partitioner import DefaultPartitioner

from dpstream.topology.model import Topology
from dpstream.workers.pipeline import PartialMerger, PartitionPipeline
from dpstream.workers.pipeline.fixed_point import from_units, value_exponent
from tests.privacy import _neighbours as nb

START = nb.T0
END = nb.T0 + nb.HOUR
ARRIVAL_DELAY = 0.5
"""Each record is appended this long after its event time (well inside every window's lateness)."""


class Rec(NamedTuple):
    offset: int
    value: bytes
    timestamp: int
    key: bytes


def _keyed_topology() -> Topology:
    topo = nb.topology()
    clicks = replace(topo.sources["clicks"], keyed_by_unit=True)
    return replace(topo, sources={"clicks": clicks})


def _home(unit: str, partitions: int) -> int:
    every = list(range(partitions))
    return int(DefaultPartitioner()(unit.encode(), every, every))


def _adversary(partitions: int) -> list[tuple[int, dict]]:
    """(partition, event) of a unit writing its own key to every partition: at each of 6 times, the
    same burst of 8 events (over max_per_key and max_keys, values at the bounds' edge) on each."""
    out = []
    for n, t0 in enumerate((START + 61.0, START + 605.0, START + 1_203.5, START + 1_800.0, START + 2_999.0, END - 30)):
        for p in range(partitions):
            for j in range(8):
                page = ("home", "search", "cart", "42", f"x{p}")[j % 5]
                out.append((p, {"user_id": "mallory", "ts": t0 + j, "page": page, "ref": f"r{n}", "amount": 20}))
    return out


def _run(topo: Topology, placed: dict[int, list[dict]], partitions: int) -> dict[str, dict]:
    """Every partition's events (in time order) through its pipeline, merged over all partitions:
    pseudo release records (metric, window, true values on the released keys, noise 0) by window."""
    mergers = {m: PartialMerger(m, range(partitions)) for m in topo.metrics}
    merged = []
    for p in range(partitions):
        events = sorted(placed.get(p, []), key=lambda e: e["ts"])
        recs = [
            Rec(i, json.dumps(e).encode(), round((e["ts"] + ARRIVAL_DELAY) * 1000), str(e["user_id"]).encode())
            for i, e in enumerate(events)
        ]
        pipe = PartitionPipeline(
            topo, "clicks", p, schedule_start=START, until=END, partitions=partitions, check_keys=True
        )
        out = pipe.process_batch(recs)
        assert {d.reason for d in out.dead_letters} <= {"wrong_partition"}
        for partial in [*out.partials, *pipe.flush().partials]:
            merged += mergers[partial.metric].add(partial)
    records: dict[str, dict] = {}
    for w in merged:
        metric = topo.metrics[w.metric]
        keys = metric.keys if metric.keys is not None else ("",) if metric.group_by is None else tuple(w.values)
        values: dict[str, Any] = {}
        for key in keys:
            v = w.values.get(key, 0)
            values[key] = float(from_units(v, value_exponent(metric.bounds))) if metric.bounds is not None else v
        records[f"{w.metric}@{w.start}"] = {
            "metric": w.metric,
            "window": {"start": str(w.start), "start_epoch": w.start, "end_epoch": w.end},
            "values": values,
            "noise": {"scale": 0.0, "stddev": 0.0},
        }
    return records


@pytest.mark.parametrize(("seed", "partitions"), [(1, 8), (2, 3)])
def test_a_unit_on_every_partition_moves_each_window_by_at_most_its_bound(seed: int, partitions: int) -> None:
    """D vs D′ (D plus a unit that writes its key to every partition): the same windows; every true
    value moves by at most the declared bound where the unit has events, not at all elsewhere."""
    topo = _keyed_topology()
    d_events = nb.ordinary_stream(seed, START, END)
    placed: dict[int, list[dict]] = {}
    for e in d_events:
        placed.setdefault(_home(e["user_id"], partitions), []).append(e)
    assert len(placed) == partitions  # D itself uses every partition
    adversary = _adversary(partitions)
    assert _home("mallory", partitions) in {p for p, _e in adversary}
    neighbour_placed = {p: list(events) for p, events in placed.items()}
    for p, e in adversary:
        neighbour_placed.setdefault(p, []).append(e)

    base = _run(topo, placed, partitions)
    neighbour = _run(topo, neighbour_placed, partitions)
    schedule, _values = nb.schedule_size(topo, START, END)
    assert len(base) == len(neighbour) == schedule
    problems = nb.compare(topo, base, neighbour, 0.0, unit_times=[e["ts"] for _p, e in adversary])
    assert not problems, "\n".join(problems[:20])
    # not vacuous: the adversary's home-partition records do move its windows
    moved = {r for r, rec in neighbour.items() if r.startswith("views@") and rec["values"] != base[r]["values"]}
    assert moved == {f"views@{int(e['ts']) // 60 * 60}" for _p, e in adversary}
